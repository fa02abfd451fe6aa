"""The discrete-event core: integer nanoseconds, a heap of (time, seq, callback, arg) tuples.

`seq` breaks ties in scheduling order, so the same program gives the same event order on
every run. The engine does no I/O and knows nothing of devices: components schedule plain
callbacks on it.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Callable


class Engine:
    """Event loop with a virtual clock `now` in integer nanoseconds."""

    __slots__ = ("now", "_heap", "_seq")

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0  # scheduling order of the last callback scheduled: 1, 2, 3, ...

    def at(self, t_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Call fn(arg) at time t_ns (never earlier than now)."""
        if t_ns < self.now:
            t_ns = self.now
        seq = self._seq = self._seq + 1
        heappush(self._heap, (t_ns, seq, fn, arg))

    def after(self, dt_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        seq = self._seq = self._seq + 1
        heappush(self._heap, (self.now + dt_ns, seq, fn, arg))

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def step(self) -> None:
        """Run the earliest pending callback."""
        t, _seq, fn, arg = heappop(self._heap)
        self.now = t
        fn(arg)

    def run_until(self, t_ns: int) -> None:
        """Run every callback due at or before t_ns; the clock ends at t_ns."""
        heap = self._heap
        while heap and heap[0][0] <= t_ns:
            t, _seq, fn, arg = heappop(heap)
            self.now = t
            fn(arg)
        if t_ns > self.now:
            self.now = t_ns

    def run_while(self, pending: Callable[[], bool]) -> bool:
        """Run callbacks while `pending()` holds; False when the queue ran dry first."""
        heap = self._heap
        while pending():
            if not heap:
                return False
            t, _seq, fn, arg = heappop(heap)
            self.now = t
            fn(arg)
        return True

    def run(self) -> None:
        """Run until no callback is left."""
        heap = self._heap
        while heap:
            t, _seq, fn, arg = heappop(heap)
            self.now = t
            fn(arg)

    def __len__(self) -> int:
        return len(self._heap)
