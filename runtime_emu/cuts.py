"""When to cut rows out of the recorder while the trace streams out, and which rows.

A row may be handed to the trace writer once no row recorded later can precede it: its ts is
below the watermark, the earliest time a host call in progress, a device task running or a
step still open can record at. Cuts are tried every so many finished tasks (or full rows);
while the watermark lags (a long step, a long task) most rows stay behind, so tries back off.
Should a row turn up with a ts before an earlier cut, streaming stops and the writer merges
at the end (its `fallback` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from runtime_emu import tables  # noqa: F401 - chunks build with it: imported now, not by a writer thread mid-run
from runtime_emu.device import Task
from runtime_emu.host import DONE
from runtime_emu.recorder import TASK_W, Chunk, Recorder

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

#: Task rows recorded between two cuts (about 6x as many rows in all).
CUT_TASK_ROWS: Final = 16_384
#: How much less often cuts are tried, at most, while the watermark lags.
MAX_BACKOFF: Final = 64
_NEVER: Final = 1 << 62  # a ts no row reaches
LATE_ROW: Final = "a row was recorded after rows later than it had been written"


class CutPolicy:
    """Cuts one runtime's recorder into chunks for `writer` (a sink: its `submit(chunk)`)."""

    def __init__(self, rt: Runtime, writer: Any, cut_tasks: int = CUT_TASK_ROWS) -> None:
        self.rt = rt
        self.recorder: Recorder = rt.recorder
        self.writer = writer
        self.base = max(1, cut_tasks)  # rows (task rows, and full rows) between cuts
        self.every = self.base
        self.at_bytes = self.base * TASK_W * 8  # bytes of task rows at which to cut next (0: stopped)
        self.at_rows = self.base  # full rows at which to cut next
        self.floor = 0  # the `before` of the latest cut: every row still to come is at or after it
        #: Why streaming stopped early, if it did.
        self.fallback: str | None = None

    def due(self) -> bool:
        """Whether enough rows were recorded since the last try."""
        rec = self.recorder
        return self.at_bytes != 0 and (len(rec.tasks) >= self.at_bytes or len(rec.rows) >= self.at_rows)

    def cut(self) -> None:
        """Hand the rows no later row can precede to the writer."""
        before = self.watermark()
        rec = self.recorder
        held = len(rec)
        taken = 0
        if before > self.floor:
            chunk = rec.cut(before, self.floor)
            if chunk is None:
                # A row arrived with a ts before an earlier cut: stop streaming; the writer merges.
                self.fallback = LATE_ROW
                self.at_bytes = 0
                return
            self.floor = before
            taken = len(chunk)
            self.writer.submit(chunk)
        # While the watermark lags (a long step, a long-running task) most rows stay: try less
        # often, so the rows left over are not copied again at every try.
        self.every = self.base if 2 * taken >= held else min(2 * self.every, MAX_BACKOFF * self.base)
        self.at_bytes = len(rec.tasks) + self.every * TASK_W * 8
        self.at_rows = len(rec.rows) + self.every

    def watermark(self) -> int:
        """The earliest ts a row recorded from now on can have: no earlier than the engine's
        clock, the start of any host call in progress, device task running or step open."""
        rt = self.rt
        w = rt.engine.now
        for th in rt.coord.order:
            if th.state != DONE and th.busy_from < w:
                w = th.busy_from
        for dev in rt.devices.values():
            for stream in dev.streams.values():
                if stream.queue:
                    head = stream.queue[0]  # a packed launch (a Kernel) has not started
                    start = head.start_ns if isinstance(head, Task) else -1
                    if 0 <= start < w:
                        w = start
        native = rt.dispatch.native
        if native is not None:  # kernels the C core runs: their heads stay packed launches
            w = native.earliest(w)
        for t0 in rt.open_steps:
            if t0 < w:
                w = t0
        return w

    def rest(self) -> Chunk:
        """At the end: every row not cut yet (after a fallback, every row the recorder holds)."""
        self.at_bytes = 0
        if self.fallback is None:
            rest = self.recorder.cut(_NEVER, self.floor)
            if rest is not None:
                return rest
            self.fallback = LATE_ROW
        return self.recorder.take()
