"""Stream and task dispatch: from a host launch to a finished device task.

A launch takes queue space on its stream (blocking the host thread while the queue is full),
costs the launch overhead, and reaches the device a dispatch latency later. A stream runs its
head task once the task has arrived and the task before it has finished: a kernel goes to its
core pool, a copy or memset to the links, an event record releases the waits that captured
it, a wait completes at once or when its record executes, a collective joins its peers. Every
task remembers why it started when it did (the ground truth), and each one that finishes is
handed to the row encoder and, when the trace streams out, to the cut policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Final

from runtime_emu import errors as E
from runtime_emu._loader import native
from runtime_emu.device import (
    COLLECTIVE,
    KERNEL,
    LAUNCH_BYTES,
    LAUNCH_READ,
    LAUNCH_W,
    MEMCPY,
    MEMSET,
    NULL_STEP,
    RECORD,
    WAIT,
    Kernel,
    Stream,
    Task,
)
from runtime_emu.errors import AclError
from runtime_emu.ground_truth import NO_RECORD, TASK_FIELDS, GroundTruth
from runtime_emu.host import Coordinator, HostThread
from runtime_emu.recorder import NULL, Recorder, append_row
from runtime_emu.rows import Rows
from simcore.engine import Clock
from simcore.links import Network

if TYPE_CHECKING:
    from runtime_emu.cuts import CutPolicy

#: Fields of a ground-truth row.
TRUTH_W: Final = len(TASK_FIELDS)


class Dispatch:
    """The device side of one emulated job: stream queues, task start and finish."""

    def __init__(self, engine: Clock, net: Network, coord: Coordinator, rows: Rows, truth: GroundTruth,
                 launch_overhead_ns: int, dispatch_latency_ns: int) -> None:
        self.engine = engine
        self.net = net
        self.coord = coord
        self.rows = rows
        self.recorder: Recorder = rows.recorder
        #: Ground truth of finished tasks (GroundTruth's packed rows, its text codes) and the
        #: host blocks (its list).
        self.truth: Any = truth.tasks
        self.truth_codes: dict[str, int] = truth.codes
        self.host_blocks: list[tuple] = truth.host_blocks
        self.keep_truth = truth.keep
        # The launch path's two overheads as plain ints (a Preset's fields are generic lookups
        # from compiled code; the preset is frozen, so these never go stale).
        self.launch_overhead_ns = launch_overhead_ns
        self.dispatch_latency_ns = dispatch_latency_ns
        #: Set by the runtime when the trace streams out: cuts the recorder as tasks finish.
        self.cuts: CutPolicy | None = None
        self.corr = 0  # correlation id of the latest task (the C core counts them when it runs)
        #: The kernel lifecycle in C (runtime_emu._core.Core: core pools, a packed launch's start,
        #: finish and rows), when the engine is the C one; None: the Python code here and in
        #: device.CorePool runs it.
        self.native: Any = None
        #: native.launched, bound once: calling it through `native` looked the method up by
        #: name at every launch.
        self._launched: Any = None
        core = native("_core")
        # The C core runs the kernels when the engine is its own and the streams and host threads
        # are its types (runtime_emu.state: they are, unless the package was imported pure).
        if core is not None and isinstance(engine, core.Engine) and Stream is core.Stream:
            self.native = core.Core(engine, self, self.recorder, self.truth, self.truth_codes, self.keep_truth,
                                    rows.queue_depth_counters, Task, coord=coord, kernel_type=Kernel,
                                    launch_overhead_ns=launch_overhead_ns, dispatch_latency_ns=dispatch_latency_ns)
            self._launched = self.native.launched

    # ---------------------------------------------------------------- host side
    def next_corr(self) -> int:
        """The correlation id of a new task: one more than the latest."""
        native = self.native
        if native is not None:
            return native.next_corr()  # type: ignore[no-any-return]
        self.corr += 1
        return self.corr

    def new_task(self, kind: str, name: str, stream: Stream, t0: int) -> Task:
        return Task(kind, name, stream, self.next_corr(), t0)

    def launch(self, th: HostThread, task: Task, api: str, t0: int, kind: str = "launch", blocks: int | None = None,
               record_api: bool = True, src: int | None = None, dst: int | None = None) -> None:
        """Common path of every task-creating call: queue space, overhead, flow, arrival.
        The API slice covers a wait for queue space, with "queue full" as the reason; a call
        that goes on holding its thread after the launch (a blocking copy) passes
        `record_api=False` and records the slice itself when it returns."""
        stream = task.stream
        task.queue_blocked_ns = self._queue_space(th, stream, task.corr)
        clock = th.clock = th.clock + self.launch_overhead_ns
        task.launch_ns = t0
        task.step = th.step
        pending = stream.pending = stream.pending + 1
        self.rows.launched(th, task, api, t0, kind, blocks, record_api, src, dst, pending)
        arrive = clock + self.dispatch_latency_ns
        task.arrive_ns = arrive
        self._enqueue(stream, task, arrive)

    def launch_kernel(self, th: HostThread, kernel: Kernel, blocks: int, stream: Stream, t0: int) -> int:
        """`launch` for a kernel, without a Task: the launch is packed into the stream's queue
        (see device.LAUNCH) and becomes a Task when the stream gets to it. Returns its corr."""
        corr = self.next_corr()
        queue_blocked = self._queue_space(th, stream, corr)
        clock = th.clock = th.clock + self.launch_overhead_ns
        step = th.step
        pending = stream.pending = stream.pending + 1
        arrive = clock + self.dispatch_latency_ns
        launched = self._launched
        if launched is not None:  # the same rows, packed launch and wake, written by the C core
            rec, sw, dev = self.recorder, self.recorder.switches, th.device
            launched(stream, kernel, rec.apis, rec.flows, rec.counters, sw.runtime_api, sw.task_time, th.rank,
                     th.tid, NULL if dev is None else dev.id, NULL_STEP if step is None else step, corr, t0,
                     clock, blocks, queue_blocked, pending, arrive)
            return corr
        self.rows.launched_as(th, stream, corr, step, 0, queue_blocked, "aclrtLaunchKernel", t0, "launch", blocks,
                              True, None, None, pending)
        append_row(stream.launches, LAUNCH_W, blocks, corr, t0, NULL_STEP if step is None else step, arrive,
                   queue_blocked)
        self._enqueue(stream, kernel, arrive)
        return corr

    def _queue_space(self, th: HostThread, stream: Stream, corr: int) -> int:
        """Hold the host thread until the stream's queue has room for launch `corr`; the ns it
        waited (0: there was room), kept as a host block in the ground truth."""
        if stream.pending < stream.capacity:
            return 0
        blocked_from = th.clock
        self.coord.block(th, self.drained((stream,), True), f"queue of stream {stream.id} is full and nothing retires")
        if self.keep_truth:
            self.host_blocks.append((th.rank, th.tid, blocked_from, th.clock, "queue_full", stream.id, corr))
        return th.clock - blocked_from

    def drained(self, streams: tuple[Stream, ...], room: bool = False) -> Callable[[], bool]:
        """A host wait's predicate: every stream has retired all it was given (with `room`: the one
        stream's queue has room for a launch). The C core's (its fields read in C), or a lambda."""
        native = self.native
        if native is not None:
            return native.drained(streams, room)  # type: ignore[no-any-return]
        if room:
            s = streams[0]
            return lambda: s.pending < s.capacity
        return lambda: all(s.pending == 0 for s in streams)

    def _enqueue(self, stream: Stream, entry: Task | Kernel, arrive: int) -> None:
        """Put a launch in the stream's queue. A busy stream picks it up when it gets to it; only
        an idle one needs waking, when the launch arrives."""
        queue = stream.queue
        queue.append(entry)
        if not stream.busy and len(queue) == 1:
            self.engine.at(arrive, self._wake, stream)

    # ---------------------------------------------------------------- device side
    def _wake(self, stream: Stream) -> None:
        self.advance(stream)

    def _unpack(self, stream: Stream, kernel: Kernel) -> Task:
        """The Task of the packed launch at the head of the stream's queue."""
        at = stream.launches_at
        blocks, corr, t0, step, arrive, queue_blocked = LAUNCH_READ(stream.launches, at)
        at += LAUNCH_BYTES
        if at == len(stream.launches):  # every packed launch has its Task: start afresh
            stream.launches = bytearray()
            at = 0
        elif at >= 1 << 20 and 2 * at >= len(stream.launches):  # a long backlog: drop what was read
            del stream.launches[:at]
            at = 0
        stream.launches_at = at
        task = Task(KERNEL, kernel.name, stream, corr, t0)
        task.kernel, task.blocks, task.remaining = kernel, blocks, blocks
        task.step = None if step == NULL_STEP else step
        task.arrive_ns = arrive
        task.queue_blocked_ns = queue_blocked
        stream.queue[0] = task
        return task

    def advance(self, stream: Stream) -> None:
        """Start the stream's head task if it can start now."""
        if stream.busy or not stream.queue:
            return
        head = stream.queue[0]
        if not isinstance(head, Task) and self.native is not None:
            self.native.advance(stream)  # a packed kernel launch: the C core runs kernels
            return
        task = head if isinstance(head, Task) else self._unpack(stream, head)
        now = self.engine.now
        if task.arrive_ns > now:  # launched, still on its way to the device
            self.engine.at(task.arrive_ns, self._wake, stream)
            return
        stream.busy = True
        task.ready_ns = now
        # Why the task could not start earlier: the host had not launched it yet, or the stream
        # was still busy with what came before (a copy, an event wait, ordinary work).
        if task.arrive_ns >= stream.last_end_ns:
            task.cause = "launch"  # the device had nothing queued: it waited for the host
        elif stream.last_kind == WAIT and stream.last_cause == "event":
            task.cause, task.producer, task.record = "event", stream.last_producer, stream.last_record
        elif stream.last_kind == MEMCPY:
            task.cause = "copy"
        else:
            task.cause = "stream"
        kind = task.kind
        if kind == KERNEL:
            kernel = task.kernel
            assert kernel is not None, "a kernel task has its kernel"
            task.block_ns, task.priority = kernel.block_ns, stream.priority
            stream.device.pools[kernel.core].submit(task)
        elif kind == MEMCPY or kind == MEMSET:
            self.task_started(task)
            # A device-to-device copy reads and writes HBM: twice its size crosses the link.
            moved = task.bytes * 2 if task.copy_kind == "D2D" else task.bytes
            self.net.transfer(task.path, moved, self.task_finished, task)
        elif kind == RECORD:
            self.task_started(task)
            ev = task.event
            assert ev is not None, "a record task has its event"
            seq = task.event_seq
            ev.record_done(seq)
            ev.done_ns = now
            # Only the waits that captured this very record go: a wait captured the latest record
            # issued before it, and a later record (or an earlier one) must not release it.
            released: list[Task] = []
            if ev.waiters:
                kept: list[Task] = []
                for w in ev.waiters:
                    if w.event_seq == seq:
                        released.append(w)
                    else:
                        kept.append(w)
                ev.waiters = kept
            producer = stream.last_kind or "none"  # what ran on the record's stream just before it
            self.task_finished(task)
            for w in released:
                self._event_ready(w, producer)
        elif kind == WAIT:
            ev = task.event
            assert ev is not None, "a wait task has its event"
            self.task_started(task)
            if ev.executed(task.event_seq):
                task.extra = "satisfied"
                self.task_finished(task)
            else:
                ev.waiters.append(task)
        elif kind == COLLECTIVE:
            self.task_started(task)
            on_start = task.on_start
            assert on_start is not None, "a collective task has its start hook"
            on_start(task)
        else:  # pragma: no cover - every kind is handled above
            raise AclError(E.ACL_ERROR_RT_INTERNAL_ERROR, f"unknown task kind {kind}")

    def _event_ready(self, task: Task, producer: str) -> None:
        """The record a wait captured has executed: the wait ends now. `producer` is the kind of
        the task that ran before that record on its stream."""
        task.extra = "waited"
        task.producer = producer
        self.task_finished(task)

    def task_started(self, task: Task) -> None:
        now = self.engine.now
        task.start_ns = now
        if now > task.ready_ns:
            task.cause = "cores"
        self.rows.task_started(task, now)

    def task_finished(self, task: Task) -> None:
        now = self.engine.now
        task.end_ns = now
        stream = task.stream
        stream.queue.popleft()
        stream.busy = False
        stream.pending -= 1
        stream.last_end_ns = now
        stream.last_kind = task.kind
        waited = task.kind == WAIT and task.extra == "waited"
        stream.last_cause = "event" if waited else task.cause
        stream.last_producer = task.producer
        record = task.record
        stream.last_record = record
        dev = stream.device
        if self.keep_truth:
            codes = self.truth_codes
            append_row(self.truth, TRUTH_W, task.corr, dev.rank, dev.id, stream.id, codes[task.kind],
                       codes[task.name], task.launch_ns, task.arrive_ns, task.ready_ns, task.start_ns, now,
                       codes[task.cause], codes[task.producer], task.queue_blocked_ns, record if record else NO_RECORD)
        self.rows.task_finished(task, now, stream.pending)
        self.advance(stream)
        cuts = self.cuts
        if cuts is not None and cuts.due():
            cuts.cut()
