"""A device's core pools: kernels' blocks on Cube (or Vector) cores, as the emulator and the replay
both run them.

Blocks are dispatched one core at a time as cores free up (normal mode), so kernels share the
cores and a block count that does not divide the core count leaves a partial last wave. In batch
mode a kernel waits until all the cores it can use are free at once and runs in lockstep waves.
Waiting kernels are in line by (started first, priority (0 highest), arrival): a started kernel's
remaining blocks go before waiting kernels (run to completion) unless `preemption` is on, in which
case priority decides at every block. A running block is never interrupted.

The pool knows nothing of streams or traces: a user subclasses `CorePool` and hears of a job's
first blocks taking cores (`started`), of its last block ending (`finished`), and of the cores a
finished job gave back (`freed`, which dispatches them at once unless overridden).
"""

from __future__ import annotations

from heapq import heappop, heappush

from mypy_extensions import mypyc_attr

from simcore.engine import Clock


# Compiled, the classes still take subclasses written in plain Python (the replay's kernels and pools).
@mypyc_attr(allow_interpreted_subclasses=True)
class Job:
    """A kernel's blocks, as a pool runs them: `blocks` of `block_ns` each at `priority`;
    `remaining` not yet dispatched, `cores` in flight, `waves` grants so far."""

    __slots__ = ("blocks", "block_ns", "priority", "remaining", "cores", "waves")

    def __init__(self, blocks: int = 0, block_ns: int = 0, priority: int = 0) -> None:
        self.blocks = blocks
        self.block_ns = block_ns
        self.priority = priority
        self.remaining = 0
        self.cores = 0
        self.waves = 0


@mypyc_attr(allow_interpreted_subclasses=True)
class CorePool:
    """The cores of one kind of one device and the jobs waiting for them."""

    __slots__ = ("engine", "total", "free", "waiting", "seq", "batch_mode", "preemption", "_done_cb")

    def __init__(self, engine: Clock, total: int) -> None:
        self.engine = engine
        self.total = total
        self.free = total
        self.waiting: list[tuple[int, int, int, Job]] = []
        self.seq = 0
        self.batch_mode = False
        self.preemption = False
        self._done_cb = self._blocks_done  # bound once: one is made per call otherwise

    def started(self, job: Job) -> None:
        """The job's first blocks took cores (now)."""

    def finished(self, job: Job) -> None:
        """The job's last block ended (now)."""

    def freed(self) -> None:
        """A finished job's cores are free: hand them out (now, after `finished`)."""
        self.dispatch()

    def submit(self, job: Job) -> None:
        """The job is ready for cores (now)."""
        self.seq += 1
        job.remaining = job.blocks
        job.cores = 0
        heappush(self.waiting, (1, job.priority, self.seq, job))
        self.dispatch()

    def dispatch(self) -> None:
        waiting = self.waiting
        free = self.free
        while free and waiting:
            head = waiting[0]
            job = head[3]
            remaining = job.remaining
            grant = free if free < remaining else remaining
            if self.batch_mode and grant < min(remaining, self.total):
                break  # a batch-mode kernel starts a wave only with all its cores at once
            free -= grant
            remaining -= grant
            job.remaining = remaining
            job.cores += grant  # blocks in flight
            if not job.waves:
                self.started(job)
            job.waves += 1
            self.engine.after(job.block_ns, self._done_cb, (job, grant))
            if remaining:
                # Still first in line (its key only drops to "started"): update the root in place.
                if head[0] and not self.preemption:
                    waiting[0] = (0, head[1], head[2], job)
            else:
                heappop(waiting)
        self.free = free

    def _blocks_done(self, done: tuple[Job, int]) -> None:
        job, count = done
        job.cores -= count
        remaining = job.remaining
        if remaining and not self.preemption and not self.batch_mode and self.waiting[0][3] is job:
            # Run to completion: the started kernel at the head of the line takes the cores it
            # just freed straight back (the common case; no heap traffic).
            grant = count if count < remaining else remaining
            remaining -= grant
            job.remaining = remaining
            job.cores += grant
            job.waves += 1
            if not remaining:
                heappop(self.waiting)
            self.free += count - grant
            self.engine.after(job.block_ns, self._done_cb, (job, grant))
            if self.free:
                self.dispatch()
            return
        self.free += count
        if not remaining and not job.cores:
            self.finished(job)
            self.freed()
            return
        self.dispatch()
