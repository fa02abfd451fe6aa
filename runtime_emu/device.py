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
from typing import TYPE_CHECKING, Any, Callable, Final, cast

import simcore.cores
from runtime_emu.presets import Preset
from runtime_emu.state import Stream
from simcore.links import Link

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


class Task(simcore.cores.Job):
    """One entry of a stream's queue (a kernel's: a job of its device's core pool, `blocks`,
    `block_ns` and `priority` set when it goes to the pool)."""

    __slots__ = ("kind", "name", "stream", "corr", "launch_ns", "arrive_ns", "ready_ns", "start_ns", "end_ns",
                 "kernel", "bytes", "path", "event", "event_seq", "on_start",
                 "copy_kind", "step", "cause", "producer", "queue_blocked_ns", "extra", "record")

    def __init__(self, kind: str, name: str, stream: Stream, corr: int, launch_ns: int) -> None:
        super().__init__()
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


class CorePool(simcore.cores.CorePool):
    """The Cube (or Vector) cores of one device (`simcore.cores.CorePool`: how blocks take cores),
    telling the dispatcher when a kernel starts and ends. Without the C core: with it, its
    `_core.Pool` runs the same rules natively."""

    __slots__ = ("device", "kind", "dispatcher")

    def __init__(self, device: "Device", kind: str, total: int) -> None:
        super().__init__(device.rt.engine, total)
        self.device = device
        self.kind = kind
        # Direct calls once compiled (through device.rt each would be an attribute chain).
        self.dispatcher = device.rt.dispatch

    def started(self, job: simcore.cores.Job) -> None:
        self.dispatcher.task_started(cast(Task, job))

    def finished(self, job: simcore.cores.Job) -> None:
        self.dispatcher.task_finished(cast(Task, job))


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
