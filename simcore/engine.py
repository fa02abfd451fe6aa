"""The discrete-event core the emulator and the replay both run on: integer nanoseconds, a binary
heap of pending callbacks.

A callback due at time t is ordered by (t, seq), where `seq` counts scheduling calls, so the
same program gives the same event order on every run. The engine does no I/O and knows
nothing of devices: components schedule plain callbacks on it.

`Engine` sifts its own heap of `_Pending` objects rather than using heapq: compiled, their
fields are native ints, so a comparison is a machine instruction, where heapq compares
(t, seq, fn, arg) tuples through the generic rich comparison, element by element (the heap
was a fifth of the emulator's time). The compiled core is the one that has to be fast; the
pure-Python fallback runs the same loop, slower.
"""

from __future__ import annotations

from typing import Any, Callable, Final, Protocol

#: Callbacks between two calls of Engine.pulse while a host thread waits (see run_while).
PULSE_EVENTS: Final = 256


class Clock(Protocol):
    """What a simulation's components use of an engine: this module's `Engine`, or the same
    engine in C (runtime_emu._core.Engine, which also runs the emulator's kernel lifecycle
    natively). Components hold it through this protocol, so compiled code calls either one."""

    now: int
    pulse: Callable[[], None] | None

    def at(self, t_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...

    def after(self, dt_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None: ...

    def next_time(self) -> int | None: ...

    def step(self) -> None: ...

    def run_until(self, t_ns: int) -> None: ...

    def run_while(self, pending: Callable[[], bool]) -> bool: ...

    def run(self) -> None: ...

    def __len__(self) -> int: ...


class _Pending:
    """One scheduled callback."""

    __slots__ = ("t", "seq", "fn", "arg")

    def __init__(self, t: int, seq: int, fn: Callable[[Any], None], arg: Any) -> None:
        self.t = t
        self.seq = seq
        self.fn = fn
        self.arg = arg


class Engine:
    """Event loop with a virtual clock `now` in integer nanoseconds."""

    __slots__ = ("now", "_heap", "_seq", "pulse")

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[_Pending] = []
        self._seq = 0  # scheduling order of the last callback scheduled: 1, 2, 3, ...
        #: Called every PULSE_EVENTS callbacks of a run_while (a host thread waiting on the device).
        self.pulse: Callable[[], None] | None = None

    def _push(self, item: _Pending) -> None:
        heap = self._heap
        heap.append(item)
        t = item.t
        seq = item.seq
        pos = len(heap) - 1
        while pos > 0:
            parent_pos = (pos - 1) >> 1
            parent = heap[parent_pos]
            if parent.t < t or (parent.t == t and parent.seq < seq):
                break
            heap[pos] = parent
            pos = parent_pos
        heap[pos] = item

    def _pop(self) -> _Pending:
        heap = self._heap
        last = heap.pop()
        if not heap:
            return last
        top = heap[0]
        n = len(heap)
        t = last.t
        seq = last.seq
        pos = 0
        child = 1
        while child < n:
            c = heap[child]
            right = child + 1
            if right < n:
                r = heap[right]
                if r.t < c.t or (r.t == c.t and r.seq < c.seq):
                    child = right
                    c = r
            if t < c.t or (t == c.t and seq < c.seq):
                break
            heap[pos] = c
            pos = child
            child = 2 * pos + 1
        heap[pos] = last
        return top

    def at(self, t_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Call fn(arg) at time t_ns (never earlier than now)."""
        if t_ns < self.now:
            t_ns = self.now
        seq = self._seq = self._seq + 1
        self._push(_Pending(t_ns, seq, fn, arg))

    def after(self, dt_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        seq = self._seq = self._seq + 1
        self._push(_Pending(self.now + dt_ns, seq, fn, arg))

    def next_time(self) -> int | None:
        return self._heap[0].t if self._heap else None

    def step(self) -> None:
        """Run the earliest pending callback."""
        item = self._pop()
        self.now = item.t
        item.fn(item.arg)

    def run_until(self, t_ns: int) -> None:
        """Run every callback due at or before t_ns; the clock ends at t_ns."""
        heap = self._heap
        while heap and heap[0].t <= t_ns:
            item = self._pop()
            self.now = item.t
            item.fn(item.arg)
        if t_ns > self.now:
            self.now = t_ns

    def run_while(self, pending: Callable[[], bool]) -> bool:
        """Run callbacks while `pending()` holds; False when the queue ran dry first."""
        heap = self._heap
        count = 0
        while pending():
            if not heap:
                return False
            item = self._pop()
            self.now = item.t
            item.fn(item.arg)
            count += 1
            if count == PULSE_EVENTS:
                count = 0
                if self.pulse is not None:
                    self.pulse()
        return True

    def run(self) -> None:
        """Run until no callback is left."""
        heap = self._heap
        while heap:
            item = self._pop()
            self.now = item.t
            item.fn(item.arg)

    def __len__(self) -> int:
        return len(self._heap)
