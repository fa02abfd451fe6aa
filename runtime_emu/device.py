"""Devices, streams, events and the AI Core scheduler.

A stream is a FIFO: its head task starts when the previous task has finished, the task has
reached the device, and what it needs is there (an event, cores, link bandwidth). Kernels
run `num_blocks` blocks on Cube or Vector cores in waves; the pool hands free cores to the
highest-priority waiting kernel (0 is highest). A running block is never interrupted; with
`preemption` on, a kernel gives its cores back at every wave boundary so that higher-priority
work can take them (checkpoint-style preemption as a what-if; off by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, Callable, Final

from runtime_emu.links import Link
from runtime_emu.presets import Preset
from runtime_emu.state import Stream

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

# Task kinds (the trace's `kind` for device rows, plus the stream-control tasks).
KERNEL: Final = "kernel"
MEMCPY: Final = "memcpy"
MEMSET: Final = "memset"
RECORD: Final = "record"
WAIT: Final = "wait"
COLLECTIVE: Final = "collective"


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel: each of its blocks takes `block_ns` on one core of `core` type."""

    name: str
    block_ns: int
    core: str = "cube"  # "cube" (AI Core) or "vector"
    task_type: str = ""  # msprof "Task Type"; defaults from `core`
    op_type: str = ""  # msprof "OP Type" (the operator, e.g. Conv2D, of instance Conv2D12); defaults to `name`

    def __post_init__(self) -> None:
        if self.core not in ("cube", "vector"):
            raise ValueError(f"kernel {self.name!r}: core must be 'cube' or 'vector', got {self.core!r}")
        if self.block_ns <= 0:
            raise ValueError(f"kernel {self.name!r}: block_ns must be positive, got {self.block_ns}")


class Task:
    """One entry of a stream's queue."""

    __slots__ = ("kind", "name", "stream", "corr", "launch_ns", "arrive_ns", "ready_ns", "start_ns", "end_ns",
                 "kernel", "blocks", "remaining", "cores", "bytes", "path", "event", "event_seq", "on_start",
                 "copy_kind", "step", "cause", "producer", "queue_blocked_ns", "waves", "extra", "record")

    def __init__(self, kind: str, name: str, stream: Stream, corr: int, launch_ns: int) -> None:
        self.kind = kind
        self.name = name
        self.stream = stream
        self.corr = corr
        self.launch_ns = launch_ns
        self.arrive_ns = launch_ns
        self.ready_ns = 0
        self.start_ns = -1
        self.end_ns = -1
        self.kernel: Kernel | None = None
        self.blocks = 0
        self.remaining = 0
        self.cores = 0
        self.bytes = 0
        self.path: tuple[Link, ...] = ()
        self.event: Event | None = None
        self.event_seq = 0
        self.on_start: Callable[[Task], None] | None = None
        self.copy_kind = ""
        self.step: int | None = None
        self.cause = ""
        self.producer = ""
        self.queue_blocked_ns = 0
        self.waves = 0
        self.extra: Any = None
        # A wait: the correlation id of the record it captured (0: the event had none). A task
        # whose cause is "event": that of the record that released the wait before it.
        self.record = 0


class Event:
    """aclrtEvent, as AscendCL documents it for reusable events (and CUDA does).

    A record captures the work issued to its stream so far; a wait captures the latest record
    issued before it, in host program order, and completes when that record has executed.
    Later records do not affect it, and an event with no record yet has nothing to wait for.

    Records are numbered in issue order (`record_seq` is the latest, `last_record` its
    correlation id). Records on different streams can execute out of order, so the executed
    ones are kept as a prefix (every record up to `done_seq` has executed) plus those beyond
    it (`done_ahead`, usually empty). `waiters` are waits whose record has not executed yet.
    """

    __slots__ = ("id", "device", "record_seq", "last_record", "done_seq", "done_ahead", "done_ns", "waiters",
                 "destroyed")

    def __init__(self, event_id: int, device: "Device") -> None:
        self.id = event_id
        self.device = device
        self.record_seq = 0
        self.last_record = 0
        self.done_seq = 0
        self.done_ahead: set[int] = set()
        self.done_ns = 0
        self.waiters: list[Task] = []
        self.destroyed = False

    def executed(self, seq: int) -> bool:
        """Whether record number `seq` has executed (0, no record, always has)."""
        return seq <= self.done_seq or seq in self.done_ahead

    def record_done(self, seq: int) -> None:
        """Record number `seq` has executed."""
        if seq != self.done_seq + 1:
            self.done_ahead.add(seq)
            return
        ahead = self.done_ahead
        while seq + 1 in ahead:
            seq += 1
            ahead.remove(seq)
        self.done_seq = seq


#: A launch's step when it has none, in its packed form.
NULL_STEP: Final = -1
#: A kernel launch waiting in its stream's queue, packed (Stream.launches): blocks, corr,
#: launch_ns, step (NULL: none), arrive_ns, queue_blocked_ns. Its Task is made when the stream
#: gets to it (Dispatch.advance), so a host that runs far ahead of the device leaves packed
#: bytes in the queues instead of a Task object per launch, which the garbage collector would
#: walk again and again (a third of a 400k-launch loop's time went to that).
LAUNCH_W: Final = 6
LAUNCH: Final = struct.Struct(f"{LAUNCH_W}q")
LAUNCH_BYTES: Final = LAUNCH.size
LAUNCH_READ: Final = LAUNCH.unpack_from


class CorePool:
    """The Cube (or Vector) cores of one device and the kernels waiting for them.

    Blocks are dispatched one core at a time as cores free up (normal mode), so kernels share
    the cores and a block count that does not divide the core count leaves a partial last
    wave. In batch mode a kernel waits until all the cores it can use are free at once and
    runs in lockstep waves. A started kernel's remaining blocks go before waiting kernels (run
    to completion) unless `preemption` is on, in which case priority decides at every block.
    """

    __slots__ = ("device", "kind", "total", "free", "waiting", "seq", "batch_mode", "preemption", "_done_cb",
                 "engine", "dispatcher")

    def __init__(self, device: "Device", kind: str, total: int) -> None:
        self.device = device
        self.kind = kind
        self.total = total
        self.free = total
        self.waiting: list[tuple[int, int, int, Task]] = []
        self.seq = 0
        self.batch_mode = False
        self.preemption = False
        self._done_cb = self._blocks_done  # bound once: one is made per call otherwise
        # Direct calls once compiled (through device.rt each would be an attribute chain).
        self.engine = device.rt.engine
        self.dispatcher = device.rt.dispatch

    def submit(self, task: Task) -> None:
        self.seq += 1
        task.remaining = task.blocks
        task.cores = 0
        heappush(self.waiting, (1, task.stream.priority, self.seq, task))
        self.dispatch()

    def dispatch(self) -> None:
        waiting = self.waiting
        free = self.free
        while free and waiting:
            head = waiting[0]
            task = head[3]
            remaining = task.remaining
            grant = free if free < remaining else remaining
            if self.batch_mode and grant < min(remaining, self.total):
                break  # a batch-mode kernel starts a wave only with all its cores at once
            free -= grant
            remaining -= grant
            task.remaining = remaining
            task.cores += grant  # blocks in flight
            if task.start_ns < 0:
                self.dispatcher.task_started(task)
            task.waves += 1
            kernel = task.kernel
            assert kernel is not None, "only kernels go to the core pools"
            self.engine.after(kernel.block_ns, self._done_cb, (task, grant))
            if remaining:
                # Still first in line (its key only drops to "started"): update the root in place.
                if head[0] and not self.preemption:
                    waiting[0] = (0, head[1], head[2], task)
            else:
                heappop(waiting)
        self.free = free

    def _blocks_done(self, done: tuple[Task, int]) -> None:
        task, count = done
        task.cores -= count
        remaining = task.remaining
        if remaining and not self.preemption and not self.batch_mode and self.waiting[0][3] is task:
            # Run to completion: the started kernel at the head of the line takes the cores it
            # just freed straight back (the common case; no heap traffic).
            grant = count if count < remaining else remaining
            remaining -= grant
            task.remaining = remaining
            task.cores += grant
            task.waves += 1
            if not remaining:
                heappop(self.waiting)
            self.free += count - grant
            kernel = task.kernel
            assert kernel is not None, "only kernels go to the core pools"
            self.engine.after(kernel.block_ns, self._done_cb, (task, grant))
            if self.free:
                self.dispatch()
            return
        self.free += count
        if not remaining and not task.cores:
            self.dispatcher.task_finished(task)
        self.dispatch()


class Device:
    __slots__ = ("rt", "id", "rank", "preset", "pools", "streams", "events", "memory", "caching", "pcie_h2d",
                 "pcie_d2h", "hbm", "pid", "next_stream", "default_stream", "copy_stream")
    #: Stream 0, made by the runtime right after the device (it records the stream's name).
    default_stream: Stream

    def __init__(self, rt: "Runtime", device_id: int, rank: int, preset: Preset) -> None:
        self.rt = rt
        self.id = device_id
        self.rank = rank
        self.preset = preset
        native = rt.dispatch.native  # the C core's pools when it runs the kernels
        self.pools: dict[str, Any] = {
            "cube": CorePool(self, "cube", preset.cube_cores) if native is None else native.pool("cube", preset.cube_cores),
            "vector": CorePool(self, "vector", preset.vector_cores) if native is None else
            native.pool("vector", preset.vector_cores)}
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.memory: Any = None  # DriverAllocator, set by the runtime
        self.caching: Any = None  # CachingAllocator, created on first use
        where = f"r{rank}.d{device_id}"
        self.pcie_h2d = Link(f"{where}.pcie_h2d", preset.pcie_gbps, preset.copy_latency_ns)
        self.pcie_d2h = Link(f"{where}.pcie_d2h", preset.pcie_gbps, preset.copy_latency_ns)
        self.hbm = Link(f"{where}.hbm", preset.hbm_gbps, preset.copy_latency_ns)
        self.pid = 0
        self.next_stream = 0
        #: The queue of synchronous copies (aclrtMemcpy), made by the runtime at the first one.
        self.copy_stream: Stream | None = None
