"""The emulated runtime: one job's devices, host threads, engine and recording, and its API.

Host calls run on the calling thread's virtual clock (each costs a configurable overhead;
synchronize calls, full queues and copies from pageable memory block it). Device work runs
on the engine. The parts, each in its own module:

- `engine`: the event loop; `host`: host threads taking turns in virtual-time order;
- `dispatch`: stream queues, from a launch to a finished task;
- `api_streams`, `api_events`, `api_memory`: the calls of the pyACL-shaped API, offered here
  as `Runtime` methods (and by `runtime_emu.acl` as `acl.rt.*`);
- `rows`: what the trace records of each happening, into the `recorder`; `cuts`: which rows
  go to a trace writer while the program runs;
- `ground_truth`: why each task started when it did, for `ground_truth.json`, never for the
  trace analyzers read.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any, Callable, Final, Iterator

import greenlet

from msprof_py.trace.schema import Trace, TraceMeta
from runtime_emu import api_events, api_memory, api_streams
from runtime_emu import errors as E
from runtime_emu.api_memory import HostMemory
from runtime_emu.api_streams import (
    MEMCPY_DEVICE_TO_DEVICE,
    MEMCPY_DEVICE_TO_HOST,
    MEMCPY_HOST_TO_DEVICE,
    MEMCPY_HOST_TO_HOST,
)
from runtime_emu.cuts import CUT_TASK_ROWS, CutPolicy
from runtime_emu.device import Device, Event, Stream
from runtime_emu.dispatch import Dispatch
from runtime_emu.engine import new_engine
from runtime_emu.errors import AclError
from runtime_emu.ground_truth import GroundTruth
from runtime_emu.host import DONE, Coordinator, HostThread
from runtime_emu.memory import DriverAllocator
from runtime_emu.presets import Preset
from runtime_emu.presets import preset as get_preset
from runtime_emu.recorder import Recorder, Switches, device_pid, host_pid
from runtime_emu.result import EmuResult
from runtime_emu.rows import Rows, json_text, stream_attrs
from runtime_emu.topology import Topology
from simcore.links import Network

__all__ = ["CUT_TASK_ROWS", "HOST_WORK_KINDS", "MEMCPY_DEVICE_TO_DEVICE", "MEMCPY_DEVICE_TO_HOST", "MEMCPY_HOST_TO_DEVICE",
           "MEMCPY_HOST_TO_HOST", "EmuResult", "Runtime", "Switches"]

#: What `host_work` may record: host computation, or data loading (trace kinds of the same names).
HOST_WORK_KINDS: Final = ("host_work", "data_load", "host_idle", "op_compile")
DEVICE_SPAN: Final = 1 << 40

# Public API arguments come from user programs. The runtime checks them itself and raises the
# AclError the real runtime would; compiled code (mypyc checks annotated argument types on entry)
# would otherwise reject a wrong handle with a bare TypeError first. So the public signatures
# take these loose aliases, and the calls check and convert.
Handle = Any  # a Stream / Event / Kernel handle (a stream may be None: the default stream)
Integer = Any  # an integer: Python or numpy; anything else is ACL_ERROR_RT_PARAM_INVALID


class Runtime:
    """One emulated job: devices (per rank), host threads, the engine and the recorder."""

    def __init__(self, *, seed: int = 0, preset: "str | Preset" = "910B3", devices: int = 1, ranks: int = 1,
                 topology: "Topology | None" = None, switches: Switches | None = None, preemption: bool = False,
                 batch_mode: bool = False, queue_depth_counters: bool = True,
                 trace_path: "str | Path | None" = None, trace_cut_tasks: int = CUT_TASK_ROWS,
                 trace_writer: Any = None, ground_truth: bool = True) -> None:
        """`trace_writer`: a sink the recording streams to while the program runs (its
        `submit(chunk)`, `pulse()`, `close(meta, rest, fallback=...)`, `abort()` and `path`, as
        msprof_py.trace.writer.TraceWriter has); finish() closes it. `trace_path`: stream to a
        TraceWriter of this Parquet file (one-rank jobs) or rank-partitioned directory.
        `trace_cut_tasks`: device-task rows recorded between two cuts of rows for the writer.
        `ground_truth=False` keeps no ground truth (per task, host block and collective), so a
        long streamed run holds only what is still running, not a record of everything run."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.engine = new_engine()
        self.net = Network(self.engine)
        self.recorder = Recorder(switches or Switches())
        self.sw = self.recorder.switches
        self.preset = get_preset(preset)
        self.queue_depth_counters = queue_depth_counters
        self.rows = Rows(self.recorder, queue_depth_counters)
        self.truth = GroundTruth(seed, ground_truth)
        self.coord = Coordinator(self)
        self.coord.register(greenlet.getcurrent(), 0)
        self.dispatch = Dispatch(self.engine, self.net, self.coord, self.rows, self.truth,
                                 self.preset.launch_overhead_ns, self.preset.dispatch_latency_ns)
        #: The C core's launch of a kernel (its common case; NotImplemented: this class's path),
        #: or None without the C core. acl.rt.launch_kernel calls it directly.
        self._fast_launch: Any = None if self.dispatch.native is None else self.dispatch.native.try_launch
        self.coord.native = self.dispatch.native
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
        self.events_made = 0
        self.host_memory = HostMemory()
        #: ProfilerStep numbers: the next one per host thread of each rank (thread ids restart
        #: at 1 in every rank).
        self._step_next: dict[tuple[int, int], int] = {}
        #: Starts of the ProfilerStep ranges still open (their rows are recorded at the end).
        self.open_steps: list[int] = []
        self.finished = False
        #: Called as hook(rank, n) when a thread of `rank` ends its step n (a profiler's progress
        #: bar, say); the runtime knows nothing of who listens.
        self.on_step_end: list[Callable[[int, int], None]] = []
        #: Streaming the trace out while running: the writer (cuts decide when to hand it rows).
        if trace_writer is None and trace_path is not None:
            from msprof_py.trace.writer import TraceWriter

            trace_writer = TraceWriter(trace_path, self.world_size)
        self._writer: Any = trace_writer
        if trace_writer is not None:
            self.engine.pulse = trace_writer.pulse
            self.dispatch.cuts = CutPolicy(self, trace_writer, trace_cut_tasks)

    # ================================================================ setup
    def _add_device(self, rank: int, dev_id: int, preset: Preset, preemption: bool, batch_mode: bool) -> Device:
        dev = Device(self, dev_id, rank, preset)
        for pool in dev.pools.values():
            pool.preemption = preemption
            pool.batch_mode = batch_mode
        base = 0x1_0000_0000 + (len(self.devices)) * DEVICE_SPAN
        dev.memory = DriverAllocator(preset.hbm_bytes, preset.huge_page_bytes, base_addr=base)
        dev.pid = device_pid(rank, dev_id)
        for link in (dev.pcie_h2d, dev.pcie_d2h, dev.hbm):
            link.on_rate = self.rows.link_rate
        self.devices[(rank, dev_id)] = dev
        self.recorder.name_process(rank, dev.pid, "Ascend Hardware", label=f"NPU {dev_id}" + (f" (rank {rank})" if self.world_size > 1 else ""), sort=100 + rank * 10 + dev_id)
        self.recorder.name_process(rank, host_pid(rank), "CANN", label="CPU" + (f" (rank {rank})" if self.world_size > 1 else ""), sort=rank * 10)
        dev.default_stream = self.new_stream(dev, 0)
        return dev

    @property
    def api_overhead_ns(self) -> int:
        return self.preset.api_overhead_ns

    def new_stream(self, dev: Device, priority: int, used_by: str = "") -> Stream:
        """A stream; its track's name metadata carries its priority and queue depth, facts the
        trace has no other place for (the default stream is made without an API call)."""
        s = Stream(dev.next_stream, dev, priority, dev.preset.queue_tasks)
        dev.next_stream += 1
        dev.streams[s.id] = s
        s.qcode = self.recorder.code(f"Queue depth stream {s.id}")
        self.recorder.name_thread(dev.rank, dev.pid, s.id, f"Stream {s.id}",
                                  stream_attrs(s) + (',"Used By":%s' % json_text(used_by) if used_by else ""))
        return s

    # ================================================================ what every call does first
    def _enter(self) -> HostThread:
        """The calling host thread, once it is its turn (the device simulated up to its clock)."""
        if self.finished:
            raise AclError(E.ACL_ERROR_UNINITIALIZE, "the runtime was finalized; call acl.init() again")
        th = self.coord.current()
        self.coord.enter(th)
        if not th.named:
            th.named = True
            self.recorder.name_thread(th.rank, host_pid(th.rank), th.tid, th.name)
        return th

    def _device(self, th: HostThread) -> Device:
        if th.device is None:
            raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR, "no device set for this thread; call acl.rt.set_device(id) first")
        return th.device

    def _check_stream(self, th: HostThread, stream: Any) -> Stream:
        if stream is None:
            return self._device(th).default_stream
        if not isinstance(stream, Stream):
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid stream handle {stream!r}")
        if stream.destroyed:
            raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT, f"stream {stream.id} was destroyed")
        return stream

    # ================================================================ API: devices and streams
    def set_device(self, device_id: Integer) -> None:
        api_streams.set_device(self, device_id)

    def create_stream(self, priority: Integer = 0) -> Stream:
        return api_streams.create_stream(self, priority)

    def destroy_stream(self, stream: Handle) -> None:
        api_streams.destroy_stream(self, stream)

    # ================================================================ API: kernels and copies
    def launch_kernel(self, kernel: Handle, num_blocks: Integer, stream: Handle = None, *,
                      reads: tuple[int, ...] = (), writes: tuple[int, ...] = ()) -> int:
        """aclrtLaunchKernel. `reads` / `writes` name the device buffers the kernel touches; they
        are recorded as mem_read / mem_write instants (a sanitizer's view) so races between
        streams show."""
        fast = self._fast_launch
        if fast is not None and not reads and not writes:
            corr = fast(kernel, num_blocks, stream)
            if corr is not NotImplemented:
                return corr  # type: ignore[no-any-return]
        return api_streams.launch_kernel(self, kernel, num_blocks, stream, reads, writes)

    def memcpy_async(self, dst: Any, dest_max: Integer, src: Any, count: Integer, kind: Integer,
                     stream: Handle = None) -> int:
        """aclrtMemcpyAsync: a copy task on `stream`. From pageable host memory the call holds its
        thread until the copy is done, and its API slice spans that wait."""
        return api_streams.memcpy_async(self, dst, dest_max, src, count, kind, stream)

    def memcpy(self, dst: Any, dest_max: Integer, src: Any, count: Integer, kind: Integer) -> None:
        """aclrtMemcpy: copy now and return when the copy is done.

        AscendCL documents that the call copies at once, with no implicit device or stream
        synchronisation, and that it does not use the default stream. So the copy is not
        ordered after work queued on any stream, the default one included: it runs on the
        device's own copy queue (an internal stream, made at the first such copy) and may run
        alongside kernels of every stream. A program that needs a kernel's result copied must
        synchronize (or use aclrtMemcpyAsync on the kernel's stream) first. The API slice spans
        the whole copy, its reason "copy"."""
        api_streams.memcpy(self, dst, dest_max, src, count, kind)

    def memset_async(self, dev_ptr: Any, max_count: Integer, value: Integer, count: Integer,
                     stream: Handle = None) -> int:
        return api_streams.memset_async(self, dev_ptr, max_count, value, count, stream)

    # ================================================================ API: events and synchronisation
    def create_event(self) -> Event:
        return api_events.create_event(self)

    def destroy_event(self, event: Handle) -> None:
        api_events.destroy_event(self, event)

    def record_event(self, event: Handle, stream: Handle = None) -> None:
        """aclrtRecordEvent: capture the work issued to `stream` so far (the record runs on the
        stream after it). Recording again re-captures: waits issued from then on wait for the
        new record, waits issued before keep the record they captured."""
        api_events.record_event(self, event, stream)

    def stream_wait_event(self, stream: Handle, event: Handle) -> None:
        """aclrtStreamWaitEvent: the work issued to `stream` after this call starts only once the
        most recent record_event(event, ...) made before this call (in host program order) has
        executed on its stream, whichever stream or device that is. Records made later do not
        affect this wait. An event never recorded has captured nothing, so the wait completes at
        once (AscendCL: a reusable event reports complete before its first record; CUDA: the
        wait is a no-op)."""
        api_events.stream_wait_event(self, stream, event)

    def synchronize_event(self, event: Handle) -> None:
        """aclrtSynchronizeEvent: block the host until the most recent record of `event` made
        before this call has executed (at once if it has none)."""
        api_events.synchronize_event(self, event)

    def synchronize_stream(self, stream: Handle = None) -> None:
        api_events.synchronize_stream(self, stream)

    def synchronize_device(self) -> None:
        api_events.synchronize_device(self)

    # ================================================================ API: memory
    def malloc(self, size: Integer, policy: Integer = 0, tag: str | None = None) -> int:
        """aclrtMalloc; `tag` names the call site in the trace (`[memory] <tag>`)."""
        return api_memory.malloc(self, size, policy, tag)

    def free(self, ptr: Any) -> None:
        api_memory.free(self, ptr)

    def malloc_host(self, size: Integer) -> int:
        return api_memory.malloc_host(self, size)

    def free_host(self, ptr: Any) -> None:
        api_memory.free_host(self, ptr)

    def cached_malloc(self, size: Integer, stream: Handle = None, tag: str | None = None) -> int:
        """Framework-level allocation through the caching allocator (as torch_npu does)."""
        return api_memory.cached_malloc(self, size, stream, tag)

    def cached_free(self, ptr: Any) -> None:
        api_memory.cached_free(self, ptr)

    def record_stream(self, ptr: Any, stream: Handle) -> None:
        """Tensor.record_stream: the cached block at `ptr` is also used by `stream`, so when it is
        freed it goes back to the cache only once the work queued on `stream` until then is done
        (an event the allocator records there at the free)."""
        api_memory.record_stream(self, ptr, stream)

    def empty_cache(self) -> int:
        return api_memory.empty_cache(self)

    # ================================================================ API: steps, host work
    @contextlib.contextmanager
    def step(self) -> Iterator[int]:
        """Mark one training/inference iteration (recorded as `ProfilerStep#N`)."""
        th = self._enter()
        key = (th.rank, th.tid)
        n = self._step_next.get(key, 0)
        self._step_next[key] = n + 1
        t0 = th.clock
        outer, th.step = th.step, n
        self.open_steps.append(t0)
        try:
            yield n
        finally:
            th.step = outer
            self.open_steps.remove(t0)
            self.rows.step(th, n, t0)
            for hook in self.on_step_end:
                hook(th.rank, n)

    def host_work(self, name: str, duration_ns: Any, kind: str = "host_work") -> None:
        """Host-side computation the device waits on: the thread is busy for duration_ns.
        `kind` says what it is: "host_work" (preprocessing, NMS...), "data_load" (reading
        and decoding the next batch, as a DataLoader does), "host_idle" (waiting with nothing
        to do: for the next request, a lock, a queue) or "op_compile" (compiling an operator
        before its first launch, as single-op mode's aclopCompileAndExecute does)."""
        th = self._enter()
        if kind not in HOST_WORK_KINDS:
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"host work kind must be one of {', '.join(HOST_WORK_KINDS)}, got {kind!r}")
        if duration_ns < 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"duration must be >= 0, got {duration_ns}")
        t0 = th.clock
        th.clock += int(duration_ns)
        self.rows.host_work(th, name, kind, t0)

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
            if self._writer is not None:  # no half-written trace is left behind
                self._writer.abort()
                self._writer, self.dispatch.cuts = None, None
            raise
        self.finished = True
        if self.dispatch.native is not None:
            self.dispatch.native.closed = True  # its launch path declines: the runtime's raises
        meta = self.trace_meta()
        cuts = self.dispatch.cuts
        if self._writer is not None and cuts is not None:
            writer, self._writer, self.dispatch.cuts = self._writer, None, None
            rest = cuts.rest()
            rebuilt = writer.close(meta, rest, fallback=cuts.fallback)
            return EmuResult(rebuilt, self.ground_truth, trace_path=writer.path, stream_fallback=cuts.fallback)
        trace = self.recorder.to_trace(meta)
        return EmuResult(trace=trace, ground_truth=self.ground_truth)  # made when first asked for

    def snapshot(self) -> Trace:
        """The trace recorded so far, while the program goes on (a profiler's periodic flush, a
        program stopped early): built from a copy of the recording, so another thread may ask."""
        return self.recorder.snapshot().to_trace(self.trace_meta())

    def trace_meta(self) -> TraceMeta:
        """The trace's file metadata as of now: seed, preset, topology and the job's end so far."""
        end = max([self.engine.now] + [t.clock for t in list(self.coord.order)])
        preset = self.preset
        extra: dict[str, Any] = {"seed": self.seed,
                                 "preset": {k: getattr(preset, k) for k in preset.__dataclass_fields__ if k != "extra"},
                                 "end_ns": end}
        if self.topology is not None:
            extra["topology"] = self.topology.describe()
        return TraceMeta(origin_ns=0, source_format="emulator", producer="msprof-py runtime_emu",
                         world_size=self.world_size, extra=extra)

    # ================================================================ ground truth
    @property
    def problems(self) -> list[dict[str, Any]]:
        """The problems a scenario injected (it appends its reports here)."""
        return self.truth.problems

    @property
    def gt_tasks(self) -> list[tuple]:
        """Ground truth per finished task, as tuples in ground_truth.TASK_FIELDS order (finish order)."""
        return self.truth.task_rows()

    @property
    def task_log(self) -> list[tuple]:
        """(name, stream, start_ns, end_ns) per finished task, in finish order: a SimPy-style test log."""
        return self.truth.task_log()

    def ground_truth(self) -> dict[str, Any]:
        return self.truth.as_dict(self.hccl.ground_truth() if self.hccl is not None else None)
