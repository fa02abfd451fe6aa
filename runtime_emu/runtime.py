"""The emulated runtime: host API calls on one side, device execution on the other, recording both.

Host calls run on the calling thread's virtual clock (each costs a configurable overhead;
synchronize calls, full queues and copies from pageable memory block it). Device work runs
on the engine. Every task remembers why it started when it did; that goes to
`ground_truth.json`, never to the trace analyzers read.
"""

from __future__ import annotations

import contextlib
import operator
import random
from pathlib import Path
from typing import Any, Callable, Final, Iterator

import greenlet

from msprof_py.trace.schema import Trace, TraceMeta
from runtime_emu import errors as E
from runtime_emu.device import (
    COLLECTIVE,
    KERNEL,
    MEMCPY,
    MEMSET,
    RECORD,
    WAIT,
    Device,
    Event,
    Kernel,
    Stream,
    Task,
)
from runtime_emu.engine import new_engine
from runtime_emu.errors import AclError
from runtime_emu.host import DONE, Coordinator, HostThread
from runtime_emu.links import Link, Network
from runtime_emu.presets import Preset
from runtime_emu.presets import preset as get_preset
from runtime_emu.recorder import (
    API_ROW,
    COUNTER_ROW,
    FLOW_ROW,
    HOST_PID_BASE,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    K_RECORD,
    K_WAIT,
    LINKS_PID,
    NULL,
    TASK_ROW,
    TASK_W,
    U_BYTES,
    U_DEPTH,
    Recorder,
    Switches,
    device_pid,
    host_pid,
)
from runtime_emu.topology import Topology

#: The ground-truth fields recorded per finished device task.
#: `record` is the correlation id of an event record: for a wait, the record it captured (None:
#: the event had none); for a task a wait held back (cause "event"), the record that wait waited
#: for; None for every other task.
_GT_FIELDS = ("corr", "rank", "device", "stream", "kind", "name", "launch_ns", "arrive_ns", "ready_ns", "start_ns",
              "end_ns", "cause", "producer", "queue_blocked_ns", "record")

# aclrtMemcpyKind
MEMCPY_HOST_TO_HOST: Final = 0
MEMCPY_HOST_TO_DEVICE: Final = 1
MEMCPY_DEVICE_TO_HOST: Final = 2
MEMCPY_DEVICE_TO_DEVICE: Final = 3
_COPY_NAMES = {1: "H2D", 2: "D2H", 3: "D2D"}
#: What `host_work` may record: host computation, or data loading (trace kinds of the same names).
HOST_WORK_KINDS: Final = ("host_work", "data_load")
PINNED_BASE: Final = 0x7F00_0000_0000
DEVICE_SPAN: Final = 1 << 40
HOST_MEMCPY_GBPS: Final = 10.0  # DEFAULT: host memcpy bandwidth for host-to-host copies
#: Streaming: task rows recorded between two cuts of the recorder (about 6x as many rows in all).
CUT_TASK_ROWS: Final = 16_384
_NEVER: Final = 1 << 62  # a ts no row reaches

# Public API arguments come from user programs. The runtime checks them itself and raises the
# AclError the real runtime would; compiled code (mypyc checks annotated argument types on entry)
# would otherwise reject a wrong handle with a bare TypeError first. So the public signatures
# take these loose aliases, and the calls check and convert.
Handle = Any  # a Stream / Event / Kernel handle (a stream may be None: the default stream)
Integer = Any  # an integer: Python or numpy; anything else is ACL_ERROR_RT_PARAM_INVALID


def _address(ptr: Any) -> int | None:
    """A copy's source or destination as the trace records it: an address, or None for a
    pointer the emulator does not model as one."""
    return ptr if type(ptr) is int and ptr >= 0 else None


def _json_text(text: str) -> str:
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def _stream_attrs(stream: Stream) -> str:
    """A stream's priority (0 highest) and queue depth (tasks it holds before a launch blocks)
    as JSON members, for its create call's args and its track's name metadata."""
    return ',"Priority":%d,"Queue Depth":%d' % (stream.priority, stream.capacity)


def _integer(value: Any, what: str) -> int:
    """An API argument as an int, or the AclError for a non-integer."""
    if type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{what} must be an integer, got {value!r}") from None


class EmuResult:
    """What one emulation produced: the trace table and the ground truth (for tests only).

    A run streamed to Parquet (`Runtime(trace_path=...)`) has its table on disk at
    `trace_path`; `trace` reads it back on first use. `stream_fallback` says why streaming
    had to stop early, if it did (the output is complete and sorted either way). The ground
    truth may be given as the function that makes it: it is made on first use (most runs are
    profiled, not scored)."""

    def __init__(self, trace: Trace | None = None,
                 ground_truth: "dict[str, Any] | Callable[[], dict[str, Any]] | None" = None, *,
                 trace_path: Path | None = None, stream_fallback: str | None = None) -> None:
        self._trace = trace
        self._ground_truth = ground_truth if ground_truth is not None else {}
        self.trace_path = trace_path
        self.stream_fallback = stream_fallback

    @property
    def ground_truth(self) -> dict[str, Any]:
        made = self._ground_truth
        if callable(made):
            made = self._ground_truth = made()
        return made

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            from msprof_py.trace import read_trace

            assert self.trace_path is not None, "an emulation result has its trace or its trace path"
            self._trace = read_trace(self.trace_path)
        return self._trace

    def save(self, directory: str | Path) -> Path:
        """Write `trace/` (Parquet, partitioned by rank) and `ground_truth.json` into directory."""
        import msgspec

        from msprof_py.trace import write_trace
        from msprof_py.trace.atomic import atomic_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_trace(self.trace, directory / "trace")
        with atomic_file(directory / "ground_truth.json") as tmp:
            tmp.write_bytes(msgspec.json.encode(self.ground_truth))
        return directory


class Runtime:
    """One emulated job: devices (per rank), host threads, the engine and the recorder."""

    def __init__(self, *, seed: int = 0, preset: "str | Preset" = "910B3", devices: int = 1, ranks: int = 1,
                 topology: "Topology | None" = None, switches: Switches | None = None, preemption: bool = False,
                 batch_mode: bool = False, queue_depth_counters: bool = True,
                 trace_path: "str | Path | None" = None, trace_cut_tasks: int = CUT_TASK_ROWS) -> None:
        """`trace_path`: write the trace to this Parquet file (one-rank jobs) or rank-partitioned
        directory while the program runs (see runtime_emu.streaming); finish() completes it.
        `trace_cut_tasks`: device-task rows recorded between two cuts of rows for the writer."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.engine = new_engine()
        self.net = Network(self.engine)
        self.recorder = Recorder(switches or Switches())
        self.sw = self.recorder.switches
        self.preset = get_preset(preset)
        # The launch path's two overheads as plain ints (a Preset's fields are generic lookups
        # from compiled code; the preset is frozen, so these never go stale).
        self._launch_overhead_ns: int = self.preset.launch_overhead_ns
        self._dispatch_latency_ns: int = self.preset.dispatch_latency_ns
        self.coord = Coordinator(self)
        self.coord.register(greenlet.getcurrent(), 0)
        self.devices: dict[tuple[int, int], Device] = {}
        self.topology = topology
        if topology is not None:
            # One process per NPU, as HCCL jobs run: rank r drives device r % devices_per_server.
            self.world_size = topology.world_size
            for rank in range(self.world_size):
                self._add_device(rank, topology.local_of(rank), self.preset, preemption, batch_mode)
            topology.attach(self)
        else:
            self.world_size = ranks
            for rank in range(ranks):
                for d in range(devices):
                    self._add_device(rank, d, self.preset, preemption, batch_mode)
        #: Collective-communication state (communicators, in-flight collectives), set by hccl.
        self.hccl: Any = None
        self.queue_depth_counters = queue_depth_counters
        self._corr = 0
        self._next_event = 0
        self._pinned_next = PINNED_BASE
        self._pinned: dict[int, int] = {}
        self._step_next: dict[tuple[int, int], int] = {}
        #: Ground truth of every finished task, flat: _GT_FIELDS values per task, in finish order.
        self._gt: list[Any] = []
        self.gt_host_blocks: list[tuple] = []
        self.problems: list[dict[str, Any]] = []
        self.finished = False
        #: Starts of the ProfilerStep ranges still open (their rows are recorded at the end).
        self._open_steps: list[int] = []
        #: Streaming the trace out while running: the writer, the recorder size (bytes of task
        #: rows) at which to cut next, and the ts every row still to come is at or after.
        self._stream: Any = None
        self._cut_base = max(1, trace_cut_tasks)  # rows (task rows, and full rows) between cuts
        self._cut_every = self._cut_base
        self._cut_at = 0  # bytes of task rows at which to cut next (0: not streaming)
        self._cut_rows_at = 0  # full rows at which to cut next
        self._cut_floor = 0
        if trace_path is not None:
            from runtime_emu.streaming import TraceStream

            self._stream = TraceStream(trace_path, self.world_size)
            self.engine.pulse = self._stream.pulse
            self._cut_at = self._cut_base * TASK_W * 8
            self._cut_rows_at = self._cut_base

    # ================================================================ setup
    def _add_device(self, rank: int, dev_id: int, preset: Preset, preemption: bool, batch_mode: bool) -> Device:
        from runtime_emu.memory import DriverAllocator

        dev = Device(self, dev_id, rank, preset)
        for pool in dev.pools.values():
            pool.preemption = preemption
            pool.batch_mode = batch_mode
        base = 0x1_0000_0000 + (len(self.devices)) * DEVICE_SPAN
        dev.memory = DriverAllocator(preset.hbm_bytes, preset.huge_page_bytes, base_addr=base)
        dev.pid = device_pid(rank, dev_id)
        for link in (dev.pcie_h2d, dev.pcie_d2h, dev.hbm):
            link.on_rate = self._link_rate
        self.devices[(rank, dev_id)] = dev
        self.recorder.name_process(rank, dev.pid, "Ascend Hardware", label=f"NPU {dev_id}" + (f" (rank {rank})" if self.world_size > 1 else ""), sort=100 + rank * 10 + dev_id)
        self.recorder.name_process(rank, host_pid(rank), "CANN", label="CPU" + (f" (rank {rank})" if self.world_size > 1 else ""), sort=rank * 10)
        dev.default_stream = self._new_stream(dev, 0)
        return dev

    @property
    def api_overhead_ns(self) -> int:
        return self.preset.api_overhead_ns

    def _new_stream(self, dev: Device, priority: int, used_by: str = "") -> Stream:
        """A stream; its track's name metadata carries its priority and queue depth, facts the
        trace has no other place for (the default stream is made without an API call)."""
        s = Stream(dev.next_stream, dev, priority, dev.preset.queue_tasks)
        dev.next_stream += 1
        dev.streams[s.id] = s
        s.qcode = self.recorder.code(f"Queue depth stream {s.id}")
        self.recorder.name_thread(dev.rank, dev.pid, s.id, f"Stream {s.id}",
                                  _stream_attrs(s) + (',"Used By":%s' % _json_text(used_by) if used_by else ""))
        return s

    # ================================================================ host side helpers
    def _enter(self) -> HostThread:
        if self.finished:
            raise AclError(E.ACL_ERROR_UNINITIALIZE, "the runtime was finalized; call acl.init() again")
        th = self.coord.current()
        self.coord.enter(th)
        key = (th.rank, th.tid)  # thread ids restart at 1 in every rank
        if key not in self._step_next:
            self._step_next[key] = 0
            self.recorder.name_thread(th.rank, host_pid(th.rank), th.tid, th.name)
        return th

    def _device(self, th: HostThread) -> Device:
        if th.device is None:
            raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR, "no device set for this thread; call acl.rt.set_device(id) first")
        return th.device

    def _api(self, th: HostThread, name: str, t0: int, kind: str = "api", stream: Stream | None = None,
             corr: int | None = None, nbytes: int | None = None, blocks: int | None = None,
             blocked: str | None = None, blocked_ns: int = 0, src: int | None = None, dst: int | None = None) -> None:
        """Record a host API slice [t0, th.clock] on the thread's track: the whole time the call
        held the thread, so it is recorded when the call returns. `blocked` says why the call
        held the thread past its own overhead (a full queue, a copy, a synchronize) and
        `blocked_ns` for how long; without them a reader would take a long slice for a slow
        call. `src` / `dst`: a copy's addresses (dst also goes to the row's `addr`), so a copy
        racing a kernel on the same buffer can be found."""
        if not self.sw.runtime_api:
            return
        dev = th.device
        strings = self.recorder.strings
        self.recorder.apis += API_ROW(
            th.rank, HOST_PID_BASE + th.rank, th.tid, strings[name], t0, th.clock - t0, strings[kind],
            NULL if dev is None else dev.id, NULL if stream is None else stream.id, NULL if corr is None else corr,
            NULL if nbytes is None else nbytes, NULL if th.step is None else th.step, NULL if blocks is None else blocks,
            NULL if blocked is None or blocked_ns <= 0 else strings[blocked], blocked_ns if blocked_ns > 0 else NULL,
            NULL if src is None else src, NULL if dst is None else dst)

    def _check_stream(self, th: HostThread, stream: Any) -> Stream:
        if stream is None:
            return self._device(th).default_stream
        if not isinstance(stream, Stream):
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid stream handle {stream!r}")
        if stream.destroyed:
            raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT, f"stream {stream.id} was destroyed")
        return stream

    def _launch(self, th: HostThread, task: Task, api: str, t0: int, kind: str = "launch", blocks: int | None = None,
                record_api: bool = True, src: int | None = None, dst: int | None = None) -> None:
        """Common path of every task-creating call: queue space, overhead, flow, arrival.
        The API slice covers a wait for queue space, with "queue full" as the reason; a call
        that goes on holding its thread after the launch (a blocking copy) passes
        `record_api=False` and records the slice itself when it returns."""
        stream = task.stream
        if stream.pending >= stream.capacity:
            blocked_from = th.clock
            self.coord.block(th, lambda: stream.pending < stream.capacity,
                             f"queue of stream {stream.id} is full and nothing retires")
            task.queue_blocked_ns = th.clock - blocked_from
            self.gt_host_blocks.append((th.rank, th.tid, blocked_from, th.clock, "queue_full", stream.id, task.corr))
        clock = th.clock = th.clock + self._launch_overhead_ns
        task.launch_ns = t0
        step = task.step = th.step
        pending = stream.pending = stream.pending + 1
        dev = stream.device
        sw = self.sw
        rec = self.recorder
        corr = task.corr
        if sw.runtime_api:
            if record_api:
                self._api(th, api, t0, kind, stream, corr, task.bytes or None, blocks,
                          "queue full" if task.queue_blocked_ns > 0 else None, task.queue_blocked_ns,
                          src, dst)
            if sw.task_time:
                rank = th.rank
                rec.flows += FLOW_ROW(rank, 0, t0, HOST_PID_BASE + rank, th.tid, corr, dev.id, stream.id,
                                      NULL if step is None else step)
        if sw.task_time and self.queue_depth_counters:
            rec.counters += COUNTER_ROW(dev.rank, dev.pid, stream.qcode, clock, pending, U_DEPTH, dev.id, stream.id, NULL)
        arrive = clock + self._dispatch_latency_ns
        task.arrive_ns = arrive
        # A busy stream picks the task up when it gets to it; only an idle one needs waking.
        stream.queue.append(task)
        if not stream.busy and len(stream.queue) == 1:
            self.engine.at(arrive, self._wake, stream)

    def _new_task(self, kind: str, name: str, stream: Stream, t0: int) -> Task:
        self._corr += 1
        return Task(kind, name, stream, self._corr, t0)

    # ================================================================ device side
    def _wake(self, stream: Stream) -> None:
        self._advance(stream)

    def _advance(self, stream: Stream) -> None:
        if stream.busy or not stream.queue:
            return
        task = stream.queue[0]
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
            stream.device.pools[kernel.core].submit(task)
        elif kind == MEMCPY or kind == MEMSET:
            self._task_started(task)
            # A device-to-device copy reads and writes HBM: twice its size crosses the link.
            moved = task.bytes * 2 if task.copy_kind == "D2D" else task.bytes
            self.net.transfer(task.path, moved, self._task_finished, task)
        elif kind == RECORD:
            self._task_started(task)
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
            self._task_finished(task)
            for w in released:
                self._event_ready(w, producer)
        elif kind == WAIT:
            ev = task.event
            assert ev is not None, "a wait task has its event"
            self._task_started(task)
            if ev.executed(task.event_seq):
                task.extra = "satisfied"
                self._task_finished(task)
            else:
                ev.waiters.append(task)
        elif kind == COLLECTIVE:
            self._task_started(task)
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
        self._task_finished(task)

    def _task_started(self, task: Task) -> None:
        now = self.engine.now
        task.start_ns = now
        if now > task.ready_ns:
            task.cause = "cores"
        if self.sw.task_time and self.sw.runtime_api and task.kind is not RECORD and task.kind is not WAIT:
            stream = task.stream
            dev = stream.device
            self.recorder.flows += FLOW_ROW(dev.rank, 1, now, dev.pid, stream.id, task.corr, dev.id, stream.id,
                                            NULL if task.step is None else task.step)

    def _task_finished(self, task: Task) -> None:
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
        self._gt.extend((task.corr, dev.rank, dev.id, stream.id, task.kind, task.name, task.launch_ns,
                         task.arrive_ns, task.ready_ns, task.start_ns, now, task.cause, task.producer,
                         task.queue_blocked_ns, record or None))
        if self.sw.task_time:
            self._record_task(task, now)
            if self.queue_depth_counters:
                self.recorder.counters += COUNTER_ROW(dev.rank, dev.pid, stream.qcode, now, stream.pending, U_DEPTH,
                                                      dev.id, stream.id, NULL)
        self._advance(stream)
        if self._cut_at and (len(self.recorder.tasks) >= self._cut_at or len(self.recorder.rows) >= self._cut_rows_at):
            self._cut()

    def _cut(self) -> None:
        """Hand the rows no later row can precede to the trace writer (streaming only)."""
        before = self._watermark()
        rec = self.recorder
        held = len(rec)
        taken = 0
        if before > self._cut_floor:
            chunk = rec.cut(before, self._cut_floor)
            if chunk is None:
                # A row arrived with a ts before an earlier cut: stop streaming; finish() merges.
                self._stream.fallback = "a row was recorded after rows later than it had been written"
                self._cut_at = 0
                return
            self._cut_floor = before
            taken = len(chunk)
            self._stream.submit(chunk)
        # While the watermark lags (a long step, a long-running task) most rows stay: try less
        # often, so the rows left over are not copied again at every try.
        self._cut_every = self._cut_base if 2 * taken >= held else min(2 * self._cut_every, 64 * self._cut_base)
        self._cut_at = len(rec.tasks) + self._cut_every * TASK_W * 8
        self._cut_rows_at = len(rec.rows) + self._cut_every

    def _watermark(self) -> int:
        """The earliest ts a row recorded from now on can have: no earlier than the engine's
        clock, the start of any host call in progress, device task running or step open."""
        w = self.engine.now
        for th in self.coord.order:
            if th.state != DONE and th.busy_from < w:
                w = th.busy_from
        for dev in self.devices.values():
            for stream in dev.streams.values():
                if stream.queue:
                    start = stream.queue[0].start_ns
                    if 0 <= start < w:
                        w = start
        for t0 in self._open_steps:
            if t0 < w:
                w = t0
        return w

    def _record_task(self, task: Task, end: int) -> None:
        stream = task.stream
        dev = stream.device
        kind = task.kind
        rec = self.recorder
        code = rec.code
        if kind is KERNEL:  # the common row, without the generic path's tuple shuffling
            k = task.kernel
            assert k is not None, "a kernel task has its kernel"
            strings = rec.strings
            type_code = strings[k.task_type or ("AI_CORE" if k.core == "cube" else "AI_VECTOR_CORE")]
            start = task.start_ns
            rec.tasks += TASK_ROW(dev.rank, dev.id, dev.pid, stream.id, start, end - start, strings[task.name], K_KERNEL,
                                  type_code, task.corr, task.blocks, task.waves, NULL, NULL, NULL,
                                  NULL if task.step is None else task.step)
            return
        if kind is MEMCPY:
            row = (K_MEMCPY, code("MEMCPY_ASYNC"), NULL, NULL, task.bytes, code(task.copy_kind), NULL)
        elif kind is MEMSET:
            row = (K_MEMSET, code("MEMSET"), NULL, NULL, task.bytes, NULL, NULL)
        elif kind is WAIT or kind is RECORD:
            if kind is WAIT and task.extra != "waited":
                return  # an already-satisfied wait takes no device time
            ev = task.event
            assert ev is not None, "an event task has its event"
            row = (K_WAIT if kind is WAIT else K_RECORD, code("EVENT_WAIT" if kind is WAIT else "EVENT_RECORD"),
                   NULL, NULL, NULL, NULL, ev.id)
        else:  # a collective records its own rows (waiting and transfer parts)
            task.extra.record(self, task, end)
            return
        kcode, ttype, blocks, waves, nbytes, copy_kind, event_id = row
        self.recorder.tasks += TASK_ROW(dev.rank, dev.id, dev.pid, stream.id, task.start_ns, end - task.start_ns,
                                        code(task.name), kcode, ttype, task.corr, blocks, waves, nbytes, copy_kind,
                                        event_id, NULL if task.step is None else task.step)

    def _link_rate(self, link: Link, now: int, bytes_per_ns: float) -> None:
        if not self.sw.sys_hardware_mem:
            return
        self.recorder.name_process(0, LINKS_PID, "Links", sort=1000)
        self.recorder.rows.append((0, "C", f"{link.name} GB/s", None, now, None, LINKS_PID, 0, None,
                                   '{"GB/s":%.6g}' % bytes_per_ns, None, "counter", None, None, None, None, None,
                                   float(bytes_per_ns), None))

    # ================================================================ API: devices and streams
    def set_device(self, device_id: Integer) -> None:
        th = self._enter()
        t0 = th.clock
        dev = self.devices.get((th.rank, device_id))
        if dev is None:
            have = sorted(d for r, d in self.devices if r == th.rank)
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"device {device_id!r} does not exist (rank {th.rank} has {have})")
        th.device = dev
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtSetDevice", t0)

    def create_stream(self, priority: Integer = 0) -> Stream:
        th = self._enter()
        priority = _integer(priority, "priority")
        if not 0 <= priority <= 7:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"stream priority must be 0..7 (0 highest), got {priority}")
        t0 = th.clock
        dev = self._device(th)
        stream = self._new_stream(dev, priority)
        th.clock += self.api_overhead_ns
        if self.sw.runtime_api:
            # A full row: the stream's priority and queue depth go in its args (the packed API
            # slices have no fields for them), so a stream that ran late because of its
            # priority can be told from the trace.
            self.recorder.rows.append((th.rank, "X", "aclrtCreateStream", "AscendCL", t0, th.clock - t0,
                                       host_pid(th.rank), th.tid, None,
                                       '{"Thread Id":%d,"Stream Id":%d%s}' % (th.tid, stream.id, _stream_attrs(stream)),
                                       None, "api", dev.id, stream.id, None, None, None, None, th.step))
        return stream

    def destroy_stream(self, stream: Handle) -> None:
        th = self._enter()
        stream = self._check_stream(th, stream)
        t0 = th.clock
        stream.destroyed = True
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtDestroyStream", t0, stream=stream)

    # ================================================================ API: kernels and copies
    def launch_kernel(self, kernel: Handle, num_blocks: Integer, stream: Handle = None, *,
                      reads: tuple[int, ...] = (), writes: tuple[int, ...] = ()) -> int:
        """aclrtLaunchKernel. `reads` / `writes` name the device buffers the kernel touches; they
        are recorded as mem_read / mem_write instants (a sanitizer's view) so races between
        streams show."""
        th = self._enter()
        if not isinstance(kernel, Kernel):
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid kernel handle {kernel!r}")
        num_blocks = _integer(num_blocks, "numBlocks")
        if num_blocks <= 0:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"numBlocks must be positive, got {num_blocks}")
        stream = self._check_stream(th, stream)
        t0 = th.clock
        task = self._new_task(KERNEL, kernel.name, stream, t0)
        task.kernel, task.blocks, task.remaining = kernel, num_blocks, num_blocks
        self._launch(th, task, "aclrtLaunchKernel", t0, blocks=num_blocks)
        if reads or writes:
            self._accesses(th, task, reads, writes)
        return task.corr

    def _accesses(self, th: HostThread, task: Task, reads: tuple[int, ...], writes: tuple[int, ...]) -> None:
        dev = task.stream.device
        for name, kind, ptrs in (("[access] read", "mem_read", reads), ("[access] write", "mem_write", writes)):
            for ptr in ptrs:
                self.recorder.rows.append((th.rank, "i", name, "access", th.clock, None, host_pid(th.rank), th.tid,
                                           None, '{"Addr":%d,"Task Id":%d}' % (ptr, task.corr), '{"s":"t"}', kind,
                                           dev.id, task.stream.id, task.corr, None, ptr, None, th.step))

    def memcpy_async(self, dst: Any, dest_max: Integer, src: Any, count: Integer, kind: Integer,
                     stream: Handle = None) -> int:
        th = self._enter()
        stream = self._check_stream(th, stream)
        dest_max, count, kind = _integer(dest_max, "destMax"), _integer(count, "count"), _integer(kind, "kind")
        t0 = th.clock
        task, pageable = self._copy_task(th, dst, dest_max, src, count, kind, stream, t0)
        src_addr, dst_addr = _address(src), _address(dst)
        if task is None:
            th.clock += int(count / HOST_MEMCPY_GBPS)
            self._api(th, "aclrtMemcpyAsync", t0, nbytes=count, blocked="copy", blocked_ns=th.clock - t0,
                      src=src_addr, dst=dst_addr)
            return 0
        self._launch(th, task, "aclrtMemcpyAsync", t0, record_api=not pageable, src=src_addr, dst=dst_addr)
        if pageable:
            # From pageable host memory the call returns only when the copy is done, and its
            # slice says so: a 5 us slice would show the host idle while it was held.
            start = th.clock
            self.coord.block(th, lambda: task.end_ns >= 0, f"pageable copy {task.corr}")
            self.gt_host_blocks.append((th.rank, th.tid, start, th.clock, "pageable_copy", stream.id, task.corr))
            self._held(th, "aclrtMemcpyAsync", t0, "launch", task, "pageable host memory", th.clock - start,
                       src_addr, dst_addr)
        return task.corr

    def memcpy(self, dst: Any, dest_max: Integer, src: Any, count: Integer, kind: Integer) -> None:
        """aclrtMemcpy: copy now and return when the copy is done.

        AscendCL documents that the call copies at once, with no implicit device or stream
        synchronisation, and that it does not use the default stream. So the copy is not
        ordered after work queued on any stream, the default one included: it runs on the
        device's own copy queue (an internal stream, made at the first such copy) and may run
        alongside kernels of every stream. A program that needs a kernel's result copied must
        synchronize (or use aclrtMemcpyAsync on the kernel's stream) first. The API slice spans
        the whole copy, its reason "copy"."""
        th = self._enter()
        dest_max, count, kind = _integer(dest_max, "destMax"), _integer(count, "count"), _integer(kind, "kind")
        dev = self._device(th)
        t0 = th.clock
        src_addr, dst_addr = _address(src), _address(dst)
        task, _ = self._copy_task(th, dst, dest_max, src, count, kind, dev.default_stream, t0)
        if task is None:  # host to host: the calling thread copies
            th.clock += int(count / HOST_MEMCPY_GBPS)
            self._api(th, "aclrtMemcpy", t0, "sync", nbytes=count, blocked="copy", blocked_ns=th.clock - t0,
                      src=src_addr, dst=dst_addr)
            return
        stream = task.stream = self._copy_stream(dev)  # checked: now off the default stream
        self._launch(th, task, "aclrtMemcpy", t0, kind="sync", record_api=False, src=src_addr, dst=dst_addr)
        start = th.clock
        self.coord.block(th, lambda: task.end_ns >= 0, f"copy {task.corr}")
        self.gt_host_blocks.append((th.rank, th.tid, start, th.clock, "sync_copy", stream.id, task.corr))
        self._held(th, "aclrtMemcpy", t0, "sync", task, "copy", th.clock - start, src_addr, dst_addr)

    def _held(self, th: HostThread, api: str, t0: int, kind: str, task: Task, reason: str, waited_ns: int,
              src: int | None, dst: int | None) -> None:
        """The API slice of a call that launched `task` and then held its thread `waited_ns`
        for `reason`; a wait for queue space before the launch is added to it."""
        if task.queue_blocked_ns > 0:
            reason, waited_ns = "queue full; " + reason, waited_ns + task.queue_blocked_ns
        self._api(th, api, t0, kind, task.stream, task.corr, task.bytes or None, None, reason, waited_ns, src, dst)

    def _copy_stream(self, dev: Device) -> Stream:
        """The device's queue for synchronous copies (aclrtMemcpy), apart from every stream the
        program can name: such a copy waits for no stream's work (AscendCL documents no
        implicit synchronisation), only for earlier synchronous copies of the device."""
        stream = dev.copy_stream
        if stream is None:
            stream = dev.copy_stream = self._new_stream(dev, 0, "aclrtMemcpy")
        return stream

    def _copy_task(self, th: HostThread, dst: Any, dest_max: int, src: Any, count: int, kind: int,
                   stream: Stream, t0: int) -> tuple[Task | None, bool]:
        if count < 0 or count > dest_max:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"copy of {count} bytes into a destination of {dest_max} bytes")
        dev = stream.device
        src_dev, dst_dev = self._is_device_ptr(dev, src), self._is_device_ptr(dev, dst)
        expect = {MEMCPY_HOST_TO_HOST: (False, False), MEMCPY_HOST_TO_DEVICE: (False, True),
                  MEMCPY_DEVICE_TO_HOST: (True, False), MEMCPY_DEVICE_TO_DEVICE: (True, True)}
        if kind not in expect:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"unknown memcpy kind {kind}")
        if (src_dev, dst_dev) != expect[kind]:
            where = lambda d: "device" if d else "host"  # noqa: E731
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"memcpy kind {kind} ({_COPY_NAMES.get(kind, 'H2H')}) but src is {where(src_dev)} "
                           f"memory and dst is {where(dst_dev)} memory")
        if kind == MEMCPY_HOST_TO_HOST:
            return None, False
        host_side = src if kind == MEMCPY_HOST_TO_DEVICE else dst
        pageable = kind != MEMCPY_DEVICE_TO_DEVICE and not self._is_pinned(host_side)
        name = f"MEMCPY_ASYNC {_COPY_NAMES[kind]}"
        task = self._new_task(MEMCPY, name, stream, t0)
        task.copy_kind = _COPY_NAMES[kind]
        task.bytes = count
        if kind == MEMCPY_HOST_TO_DEVICE:
            task.path = (dev.pcie_h2d,)
        elif kind == MEMCPY_DEVICE_TO_HOST:
            task.path = (dev.pcie_d2h,)
        else:
            task.path = (dev.hbm,)
        return task, pageable

    def memset_async(self, dev_ptr: Any, max_count: Integer, value: Integer, count: Integer,
                     stream: Handle = None) -> int:
        th = self._enter()
        stream = self._check_stream(th, stream)
        max_count, count = _integer(max_count, "maxCount"), _integer(count, "count")
        if count > max_count:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"memset of {count} bytes into {max_count} bytes")
        if not self._is_device_ptr(stream.device, dev_ptr):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"memset target {dev_ptr!r} is not device memory")
        t0 = th.clock
        task = self._new_task(MEMSET, "MEMSET", stream, t0)
        task.bytes = count
        task.path = (stream.device.hbm,)
        self._launch(th, task, "aclrtMemsetAsync", t0)
        return task.corr

    def _is_device_ptr(self, dev: Device, ptr: Any) -> bool:
        return isinstance(ptr, int) and ptr < PINNED_BASE and ptr >= 0x1_0000_0000

    def _is_pinned(self, ptr: Any) -> bool:
        return isinstance(ptr, int) and ptr >= PINNED_BASE

    # ================================================================ API: events and synchronisation
    def create_event(self) -> Event:
        th = self._enter()
        t0 = th.clock
        self._next_event += 1
        ev = Event(self._next_event, self._device(th))
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtCreateEvent", t0)
        return ev

    def destroy_event(self, event: Handle) -> None:
        th = self._enter()
        self._check_event(event)
        t0 = th.clock
        event.destroyed = True
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtDestroyEvent", t0)

    def _check_event(self, event: Any) -> Event:
        if not isinstance(event, Event):
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid event handle {event!r}")
        if event.destroyed:
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"event {event.id} was destroyed")
        return event

    def record_event(self, event: Handle, stream: Handle = None) -> None:
        """aclrtRecordEvent: capture the work issued to `stream` so far (the record runs on the
        stream after it). Recording again re-captures: waits issued from then on wait for the
        new record, waits issued before keep the record they captured."""
        th = self._enter()
        event = self._check_event(event)
        stream = self._check_stream(th, stream)
        t0 = th.clock
        event.record_seq += 1
        task = self._new_task(RECORD, "EVENT_RECORD", stream, t0)
        task.event, task.event_seq = event, event.record_seq
        event.last_record = task.corr
        self._launch(th, task, "aclrtRecordEvent", t0)

    def stream_wait_event(self, stream: Handle, event: Handle) -> None:
        """aclrtStreamWaitEvent: the work issued to `stream` after this call starts only once the
        most recent record_event(event, ...) made before this call (in host program order) has
        executed on its stream, whichever stream or device that is. Records made later do not
        affect this wait. An event never recorded has captured nothing, so the wait completes at
        once (AscendCL: a reusable event reports complete before its first record; CUDA: the
        wait is a no-op)."""
        th = self._enter()
        event = self._check_event(event)
        stream = self._check_stream(th, stream)
        t0 = th.clock
        task = self._new_task(WAIT, "EVENT_WAIT", stream, t0)
        task.event, task.event_seq = event, event.record_seq
        task.record = event.last_record
        self._launch(th, task, "aclrtStreamWaitEvent", t0)

    def synchronize_event(self, event: Handle) -> None:
        """aclrtSynchronizeEvent: block the host until the most recent record of `event` made
        before this call has executed (at once if it has none)."""
        th = self._enter()
        event = self._check_event(event)
        t0 = th.clock
        target = event.record_seq
        self.coord.block(th, lambda: event.executed(target), f"event {event.id} is never reached")
        self._sync_done(th, t0, "aclrtSynchronizeEvent", None)

    def synchronize_stream(self, stream: Handle = None) -> None:
        th = self._enter()
        stream = self._check_stream(th, stream)
        t0 = th.clock
        self.coord.block(th, lambda: stream.pending == 0, f"stream {stream.id} never drains")
        self._sync_done(th, t0, "aclrtSynchronizeStream", stream)

    def synchronize_device(self) -> None:
        th = self._enter()
        dev = self._device(th)
        t0 = th.clock
        streams = list(dev.streams.values())
        self.coord.block(th, lambda: all(s.pending == 0 for s in streams), f"device {dev.id} never drains")
        self._sync_done(th, t0, "aclrtSynchronizeDevice", None)

    def _sync_done(self, th: HostThread, t0: int, name: str, stream: Stream | None) -> None:
        waited = th.clock - t0
        if waited > 0:
            self.gt_host_blocks.append((th.rank, th.tid, t0, th.clock, "sync", stream.id if stream else None, None))
        th.clock += self.preset.sync_overhead_ns
        self._api(th, name, t0, "sync", stream=stream, blocked="synchronize", blocked_ns=waited)

    # ================================================================ API: memory
    def malloc(self, size: Integer, policy: Integer = 0, tag: str | None = None) -> int:
        """aclrtMalloc; `tag` names the call site in the trace (`[memory] <tag>`)."""
        from runtime_emu.memory import MallocPolicy, OutOfMemory

        th = self._enter()
        size = _integer(size, "size")
        dev = self._device(th)
        t0 = th.clock
        try:
            alloc = dev.memory.malloc(size, MallocPolicy(policy))
        except OutOfMemory as exc:
            self._oom(th, dev, size, exc)
            raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, str(exc)) from None
        except ValueError as exc:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, str(exc)) from None
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtMalloc", t0, nbytes=alloc.bytes)
        self._mem_event(th, dev, "alloc", alloc.addr, alloc.bytes, "aclrtMalloc", dev.memory.used_bytes, None, tag)
        return alloc.addr

    def free(self, ptr: Any) -> None:
        from runtime_emu.memory import InvalidPointer

        th = self._enter()
        dev = self._device(th)
        t0 = th.clock
        try:
            alloc = dev.memory.free(ptr)
        except InvalidPointer as exc:
            raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, str(exc)) from None
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtFree", t0, nbytes=alloc.bytes)
        self._mem_event(th, dev, "free", alloc.addr, alloc.bytes, "aclrtFree", dev.memory.used_bytes, None)

    def malloc_host(self, size: Integer) -> int:
        th = self._enter()
        size = _integer(size, "size")
        if size <= 0:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"size must be positive, got {size}")
        t0 = th.clock
        ptr = self._pinned_next
        self._pinned_next += (size + 63) // 64 * 64 + 64
        self._pinned[ptr] = size
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtMallocHost", t0, nbytes=size)
        return ptr

    def free_host(self, ptr: Any) -> None:
        th = self._enter()
        if ptr not in self._pinned:
            raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, f"free of unknown host pointer {ptr:#x}" if isinstance(ptr, int)
                           else f"free of unknown host pointer {ptr!r}")
        t0 = th.clock
        del self._pinned[ptr]
        th.clock += self.api_overhead_ns
        self._api(th, "aclrtFreeHost", t0)

    def cached_malloc(self, size: Integer, stream: Handle = None, tag: str | None = None) -> int:
        """Framework-level allocation through the caching allocator (as torch_npu does)."""
        from runtime_emu.memory import OutOfMemory

        th = self._enter()
        size = _integer(size, "size")
        dev = self._device(th)
        stream = self._check_stream(th, stream)
        cache = self._cache(dev)
        try:
            alloc = cache.malloc(size, stream.id)
        except OutOfMemory as exc:
            self._oom(th, dev, size, exc)
            raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, str(exc)) from None
        th.clock += self.api_overhead_ns
        self._mem_event(th, dev, "alloc", alloc.addr, alloc.bytes, "caching", cache.allocated_bytes, cache.reserved_bytes,
                        tag)
        return alloc.addr

    def cached_free(self, ptr: Any) -> None:
        from runtime_emu.memory import InvalidPointer

        th = self._enter()
        dev = self._device(th)
        cache = self._cache(dev)
        try:
            alloc = cache.free(ptr)
        except InvalidPointer as exc:
            raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, str(exc)) from None
        th.clock += self.api_overhead_ns
        self._mem_event(th, dev, "free", alloc.addr, alloc.bytes, "caching", cache.allocated_bytes, cache.reserved_bytes)

    def empty_cache(self) -> int:
        th = self._enter()
        dev = self._device(th)
        t0 = th.clock
        released = self._cache(dev).empty_cache()
        th.clock += self.api_overhead_ns
        self._api(th, "empty_cache", t0, nbytes=released)
        cache = dev.caching
        self._memory_counters(th, dev, cache.allocated_bytes, cache.reserved_bytes)
        return released

    def _cache(self, dev: Device):
        if dev.caching is None:
            from runtime_emu.caching import CachingAllocator

            dev.caching = CachingAllocator(dev.memory)
        return dev.caching

    def _oom(self, th: HostThread, dev: Device, size: int, exc: Any) -> None:
        """A failed allocation: an `[OutOfMemory]` instant (PyTorch's name) with the request (bytes)
        and the largest free block (value)."""
        if not self.sw.memory:
            return
        largest = getattr(exc, "largest_free_bytes", None)
        self.recorder.rows.append((th.rank, "i", "[OutOfMemory]", "memory", th.clock, None,
                                   host_pid(th.rank), th.tid, None,
                                   '{"Bytes":%d,"Largest Free":%d,"Free":%d,"Device Id":%d}' % (
                                       size, largest or 0, getattr(exc, "free_bytes", 0) or 0, dev.id),
                                   '{"s":"t"}', "alloc_fail", dev.id, None, None, size, None,
                                   None if largest is None else float(largest), th.step))
        # A failed caching allocation empties the cache before giving up: reserved changed.
        self._memory_counters(th, dev)

    def _mem_event(self, th: HostThread, dev: Device, kind: str, addr: int, nbytes: int, source: str,
                   allocated: int, reserved: int | None, tag: str | None = None) -> None:
        if not self.sw.memory:
            return
        self.recorder.rows.append((th.rank, "i", "[memory]" if tag is None else f"[memory] {tag}", "memory", th.clock, None, host_pid(th.rank), th.tid, None,
                                   '{"Addr":%d,"Bytes":%d,"Total Allocated":%d,"Device Id":%d,"Allocator":"%s"}' % (
                                       addr, nbytes if kind == "alloc" else -nbytes, allocated, dev.id, source),
                                   '{"s":"t"}', kind, dev.id, None, None, nbytes, addr, float(allocated), th.step))
        self._memory_counters(th, dev, allocated, reserved)

    def _memory_counters(self, th: HostThread, dev: Device, *_ignored: Any) -> None:
        """The device's memory state after a change: driver memory in use ("Device memory used"),
        and, once a caching allocator exists, its allocated and reserved bytes (PyTorch's terms)."""
        if not self.sw.memory:
            return
        rec = self.recorder
        code = rec.code
        step = NULL if th.step is None else th.step
        rec.counters += COUNTER_ROW(dev.rank, dev.pid, code("Device memory used"), th.clock, dev.memory.used_bytes,
                                    U_BYTES, dev.id, NULL, step)
        cache = dev.caching
        if cache is not None:
            rec.counters += COUNTER_ROW(dev.rank, dev.pid, code("Device memory allocated"), th.clock,
                                        cache.allocated_bytes, U_BYTES, dev.id, NULL, step)
            rec.counters += COUNTER_ROW(dev.rank, dev.pid, code("Device memory reserved"), th.clock,
                                        cache.reserved_bytes, U_BYTES, dev.id, NULL, step)

    # ================================================================ API: steps, host work
    @contextlib.contextmanager
    def step(self) -> Iterator[int]:
        """Mark one training/inference iteration (recorded as `ProfilerStep#N`)."""
        th = self._enter()
        n = self._step_next[(th.rank, th.tid)]
        self._step_next[(th.rank, th.tid)] = n + 1
        t0 = th.clock
        outer, th.step = th.step, n
        self._open_steps.append(t0)
        try:
            yield n
        finally:
            th.step = outer
            self._open_steps.remove(t0)
            self.recorder.rows.append((th.rank, "X", f"ProfilerStep#{n}", "user_annotation", t0, th.clock - t0,
                                       host_pid(th.rank), th.tid, None, None, None, "step", None, None, None, None,
                                       None, None, n))

    def host_work(self, name: str, duration_ns: Any, kind: str = "host_work") -> None:
        """Host-side computation the device waits on: the thread is busy for duration_ns.
        `kind` says what it is: "host_work" (preprocessing, NMS...) or "data_load" (reading
        and decoding the next batch, as a DataLoader does)."""
        th = self._enter()
        if kind not in HOST_WORK_KINDS:
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"host work kind must be one of {', '.join(HOST_WORK_KINDS)}, got {kind!r}")
        if duration_ns < 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"duration must be >= 0, got {duration_ns}")
        t0 = th.clock
        th.clock += int(duration_ns)
        if self.sw.runtime_api:
            self.recorder.rows.append((th.rank, "X", name, kind, t0, th.clock - t0, host_pid(th.rank), th.tid,
                                       None, None, None, kind, None, None, None, None, None, None, th.step))

    def now(self) -> int:
        """The calling thread's virtual time (ns)."""
        return self.coord.current().clock

    def rank(self) -> int:
        """The rank the calling host thread belongs to."""
        return self.coord.current().rank

    def run_ranks(self, program: Any, *args: Any) -> list[Any]:
        """Run program(rank, *args) once per rank, each on its own host thread; return the results."""
        from runtime_emu.host import Thread

        threads = [Thread(program, (rank, *args), rank=rank, name=f"rank {rank}", runtime=self)
                   for rank in range(self.world_size)]
        for t in threads:
            t.start()
        return [t.join() for t in threads]

    # ================================================================ finishing
    def finish(self) -> EmuResult:
        """Wait for all device work, then build the trace table and the ground truth."""
        th = self.coord.current()
        if self.finished:
            raise AclError(E.ACL_ERROR_UNINITIALIZE, "the runtime was already finalized")
        others = [t for t in self.coord.order if t is not th]
        try:
            if any(t.state != DONE for t in others):
                self.coord.enter(th)
                self.coord.block(th, lambda: all(t.state == DONE for t in others), "host threads never finish")
            self.engine.run()
        except BaseException:
            if self._stream is not None:  # no half-written trace is left behind
                self._stream.abort()
                self._stream, self._cut_at = None, 0
            raise
        self.finished = True
        end = max([self.engine.now] + [t.clock for t in self.coord.order])
        extra = {"seed": self.seed, "preset": _preset_dict(self.preset), "end_ns": end}
        if self.topology is not None:
            extra["topology"] = self.topology.describe()
        meta = TraceMeta(origin_ns=0, source_format="emulator", producer="msprof-py runtime_emu",
                         world_size=self.world_size, extra=extra)
        if self._stream is not None:
            stream, self._stream, self._cut_at = self._stream, None, 0
            rest = self.recorder.cut(_NEVER, self._cut_floor) if stream.fallback is None else None
            if rest is None and stream.fallback is None:
                stream.fallback = "a row was recorded after rows later than it had been written"
            rebuilt = stream.close(meta, rest if rest is not None else self.recorder.take())
            return EmuResult(rebuilt, self.ground_truth, trace_path=stream.path, stream_fallback=stream.fallback)
        trace = self.recorder.to_trace(meta)
        return EmuResult(trace=trace, ground_truth=self.ground_truth)  # made when first asked for

    def _gt_column(self, field_name: str) -> list[Any]:
        return self._gt[_GT_FIELDS.index(field_name)::len(_GT_FIELDS)]

    @property
    def gt_tasks(self) -> list[tuple]:
        """Ground truth per finished task, as tuples in _GT_FIELDS order (finish order)."""
        w = len(_GT_FIELDS)
        return list(zip(*(self._gt[i::w] for i in range(w))))

    @property
    def task_log(self) -> list[tuple]:
        """(name, stream, start_ns, end_ns) per finished task, in finish order: a SimPy-style test log."""
        return list(zip(*(self._gt_column(c) for c in ("name", "stream", "start_ns", "end_ns"))))

    def ground_truth(self) -> dict[str, Any]:
        tasks = {c: self._gt_column(c) for c in _GT_FIELDS}
        hcols = ("rank", "thread", "start_ns", "end_ns", "reason", "stream", "corr")
        blocks = ({c: list(v) for c, v in zip(hcols, zip(*self.gt_host_blocks))} if self.gt_host_blocks
                  else {c: [] for c in hcols})
        return {"schema": 1, "seed": self.seed, "problems": list(self.problems), "tasks": tasks, "host_blocks": blocks,
                "hccl": self.hccl.ground_truth() if self.hccl is not None else None}


def _preset_dict(p: Preset) -> dict[str, Any]:
    return {k: getattr(p, k) for k in p.__dataclass_fields__ if k != "extra"}
