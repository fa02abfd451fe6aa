"""Row encoding: what the emulated runtime's host calls and device tasks look like in the trace.

`Rows` turns runtime happenings (an API slice, a launch, a finished task, an allocation...)
into recorder rows, honouring the recording switches (which a profiler may flip while the
program runs, so they are read at every row). It decides what a row says; the `Recorder`
only buffers rows, and the runtime only decides when things happen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime_emu.device import KERNEL, MEMCPY, MEMSET, RECORD, WAIT, Device, Stream, Task
from runtime_emu.recorder import (
    API_W,
    COUNTER_W,
    FLOW_W,
    HOST_PID_BASE,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    K_RECORD,
    K_WAIT,
    LINKS_PID,
    NULL,
    TASK_W,
    U_BYTES,
    U_DEPTH,
    Recorder,
    Switches,
    append_row,
    host_pid,
)
from simcore.links import Link

if TYPE_CHECKING:
    from runtime_emu.host import HostThread


def json_text(text: str) -> str:
    """`text` as a JSON string literal."""
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def stream_attrs(stream: Stream) -> str:
    """A stream's priority (0 highest) and queue depth (tasks it holds before a launch blocks)
    as JSON members, for its create call's args and its track's name metadata."""
    return ',"Priority":%d,"Queue Depth":%d' % (stream.priority, stream.capacity)


class Rows:
    """Encodes the runtime's happenings as rows of one recorder."""

    def __init__(self, recorder: Recorder, queue_depth_counters: bool) -> None:
        self.recorder = recorder
        self.sw: Switches = recorder.switches
        self.queue_depth_counters = queue_depth_counters

    # ---------------------------------------------------------------- host side
    def api(self, th: HostThread, name: str, t0: int, kind: str = "api", stream: Stream | None = None,
            corr: int | None = None, nbytes: int | None = None, blocks: int | None = None,
            blocked: str | None = None, blocked_ns: int = 0, src: int | None = None, dst: int | None = None) -> None:
        """A host API slice [t0, th.clock] on the thread's track: the whole time the call held
        the thread, so it is recorded when the call returns. `blocked` says why the call held
        the thread past its own overhead (a full queue, a copy, a synchronize) and `blocked_ns`
        for how long; without them a reader would take a long slice for a slow call. `src` /
        `dst`: a copy's addresses (dst also goes to the row's `addr`), so a copy racing a
        kernel on the same buffer can be found."""
        if not self.sw.runtime_api:
            return
        dev = th.device
        strings = self.recorder.strings
        append_row(self.recorder.apis, API_W,
            th.rank, HOST_PID_BASE + th.rank, th.tid, strings[name], t0, th.clock - t0, strings[kind],
            NULL if dev is None else dev.id, NULL if stream is None else stream.id, NULL if corr is None else corr,
            NULL if nbytes is None else nbytes, NULL if th.step is None else th.step, NULL if blocks is None else blocks,
            NULL if blocked is None or blocked_ns <= 0 else strings[blocked], blocked_ns if blocked_ns > 0 else NULL,
            NULL if src is None else src, NULL if dst is None else dst)

    def launched(self, th: HostThread, task: Task, api: str, t0: int, kind: str, blocks: int | None,
                 record_api: bool, src: int | None, dst: int | None, pending: int) -> None:
        """A task was launched at th.clock: its API slice (unless the call records it when it
        returns), the launch's flow start and the stream's queue depth."""
        self.launched_as(th, task.stream, task.corr, task.step, task.bytes, task.queue_blocked_ns, api, t0, kind,
                         blocks, record_api, src, dst, pending)

    def launched_as(self, th: HostThread, stream: Stream, corr: int, step: int | None, nbytes: int,
                    queue_blocked_ns: int, api: str, t0: int, kind: str, blocks: int | None, record_api: bool,
                    src: int | None, dst: int | None, pending: int) -> None:
        """`launched`, given the task's fields (a kernel launch has no Task yet)."""
        sw = self.sw
        dev = stream.device
        if sw.runtime_api:
            if record_api:
                self.api(th, api, t0, kind, stream, corr, nbytes or None, blocks,
                         "queue full" if queue_blocked_ns > 0 else None, queue_blocked_ns, src, dst)
            if sw.task_time:
                rank = th.rank
                append_row(self.recorder.flows, FLOW_W, rank, 0, t0, HOST_PID_BASE + rank, th.tid, corr, dev.id, stream.id,
                                                NULL if step is None else step)
        if sw.task_time and self.queue_depth_counters:
            append_row(self.recorder.counters, COUNTER_W, dev.rank, dev.pid, stream.qcode, th.clock, pending, U_DEPTH, dev.id,
                                                  stream.id, NULL)

    def held(self, th: HostThread, api: str, t0: int, kind: str, task: Task, reason: str, waited_ns: int,
             src: int | None, dst: int | None) -> None:
        """The API slice of a call that launched `task` and then held its thread `waited_ns`
        for `reason`; a wait for queue space before the launch is added to it."""
        if task.queue_blocked_ns > 0:
            reason, waited_ns = "queue full; " + reason, waited_ns + task.queue_blocked_ns
        self.api(th, api, t0, kind, task.stream, task.corr, task.bytes or None, None, reason, waited_ns, src, dst)

    def stream_created(self, th: HostThread, stream: Stream, t0: int) -> None:
        """aclrtCreateStream as a full row: the stream's priority and queue depth go in its args
        (the packed API slices have no fields for them), so a stream that ran late because of
        its priority can be told from the trace."""
        if not self.sw.runtime_api:
            return
        dev = stream.device
        self.recorder.rows.append((th.rank, "X", "aclrtCreateStream", "AscendCL", t0, th.clock - t0,
                                   host_pid(th.rank), th.tid, None,
                                   '{"Thread Id":%d,"Stream Id":%d%s}' % (th.tid, stream.id, stream_attrs(stream)),
                                   None, "api", dev.id, stream.id, None, None, None, None, th.step))

    def accesses(self, th: HostThread, stream: Stream, corr: int, reads: tuple[int, ...],
                 writes: tuple[int, ...]) -> None:
        """The device buffers a task (a kernel, a copy; `corr`) reads and writes, as mem_read /
        mem_write instants (a sanitizer's view), so races between streams show; with the tasks
        they name."""
        if not self.sw.task_time:
            return
        dev = stream.device
        for name, kind, ptrs in (("[access] read", "mem_read", reads), ("[access] write", "mem_write", writes)):
            for ptr in ptrs:
                self.recorder.rows.append((th.rank, "i", name, "access", th.clock, None, host_pid(th.rank), th.tid,
                                           None, '{"Addr":%d,"Task Id":%d}' % (ptr, corr), '{"s":"t"}', kind,
                                           dev.id, stream.id, corr, None, ptr, None, th.step))

    def step(self, th: HostThread, n: int, t0: int) -> None:
        """Iteration `n` of the thread, [t0, th.clock], as `ProfilerStep#n`."""
        self.recorder.rows.append((th.rank, "X", f"ProfilerStep#{n}", "user_annotation", t0, th.clock - t0,
                                   host_pid(th.rank), th.tid, None, None, None, "step", None, None, None, None,
                                   None, None, n))

    def host_work(self, th: HostThread, name: str, kind: str, t0: int) -> None:
        if self.sw.runtime_api:
            self.recorder.rows.append((th.rank, "X", name, kind, t0, th.clock - t0, host_pid(th.rank), th.tid,
                                       None, None, None, kind, None, None, None, None, None, None, th.step))

    # ---------------------------------------------------------------- memory
    def oom(self, th: HostThread, dev: Device, size: int, exc: Any) -> None:
        """A failed allocation: an `[OutOfMemory]` instant (PyTorch's name) with the request
        (bytes) and the largest free block (value)."""
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
        self.memory_counters(th, dev)

    def mem_event(self, th: HostThread, dev: Device, kind: str, addr: int, nbytes: int, source: str,
                  allocated: int, tag: str | None = None) -> None:
        """An allocation or free instant, then the device's memory counters."""
        if not self.sw.memory:
            return
        self.recorder.rows.append((th.rank, "i", "[memory]" if tag is None else f"[memory] {tag}", "memory", th.clock,
                                   None, host_pid(th.rank), th.tid, None,
                                   '{"Addr":%d,"Bytes":%d,"Total Allocated":%d,"Device Id":%d,"Allocator":"%s"}' % (
                                       addr, nbytes if kind == "alloc" else -nbytes, allocated, dev.id, source),
                                   '{"s":"t"}', kind, dev.id, None, None, nbytes, addr, float(allocated), th.step))
        self.memory_counters(th, dev)

    def memory_counters(self, th: HostThread, dev: Device) -> None:
        """The device's memory state after a change: driver memory in use ("Device memory used"),
        and, once a caching allocator exists, its allocated and reserved bytes (PyTorch's terms)."""
        if not self.sw.memory:
            return
        rec = self.recorder
        code = rec.code
        step = NULL if th.step is None else th.step
        append_row(rec.counters, COUNTER_W, dev.rank, dev.pid, code("Device memory used"), th.clock, dev.memory.used_bytes,
                                    U_BYTES, dev.id, NULL, step)
        cache = dev.caching
        if cache is not None:
            append_row(rec.counters, COUNTER_W, dev.rank, dev.pid, code("Device memory allocated"), th.clock,
                                        cache.allocated_bytes, U_BYTES, dev.id, NULL, step)
            append_row(rec.counters, COUNTER_W, dev.rank, dev.pid, code("Device memory reserved"), th.clock,
                                        cache.reserved_bytes, U_BYTES, dev.id, NULL, step)

    # ---------------------------------------------------------------- device side
    def task_started(self, task: Task, now: int) -> None:
        """The flow's end on the device track (records and waits have no flow)."""
        sw = self.sw
        if sw.task_time and sw.runtime_api and task.kind is not RECORD and task.kind is not WAIT:
            stream = task.stream
            dev = stream.device
            append_row(self.recorder.flows, FLOW_W, dev.rank, 1, now, dev.pid, stream.id, task.corr, dev.id, stream.id,
                                            NULL if task.step is None else task.step)

    def task_finished(self, task: Task, end: int, pending: int) -> None:
        """A finished task's row and its stream's queue depth after it."""
        if not self.sw.task_time:
            return
        self.task(task, end)
        if self.queue_depth_counters:
            stream = task.stream
            dev = stream.device
            append_row(self.recorder.counters, COUNTER_W, dev.rank, dev.pid, stream.qcode, end, pending, U_DEPTH, dev.id,
                                                  stream.id, NULL)

    def task(self, task: Task, end: int) -> None:
        """A device task's row (a collective records its own: waiting and transfer parts)."""
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
            append_row(rec.tasks, TASK_W, dev.rank, dev.id, dev.pid, stream.id, start, end - start, strings[task.name], K_KERNEL,
                                  type_code, task.corr, task.blocks, task.waves, NULL, strings[k.op_type or task.name],
                                  dev.pools[k.core].total,  # a kernel's event_id field: its pool's cores
                                  NULL if task.step is None else task.step)
            return
        if kind is MEMCPY:
            row = (K_MEMCPY, code("MEMCPY_ASYNC"), NULL, NULL, task.bytes, code(task.copy_kind), NULL)
        elif kind is MEMSET:
            row = (K_MEMSET, code("MEMSET"), NULL, NULL, task.bytes, NULL, NULL)
        elif kind is WAIT or kind is RECORD:
            # A wait whose event had fired already is recorded too (no time), as the device logs every
            # EVENT_WAIT task: it is the trace's evidence of what the stream's next task waited for.
            ev = task.event
            assert ev is not None, "an event task has its event"
            row = (K_WAIT if kind is WAIT else K_RECORD, code("EVENT_WAIT" if kind is WAIT else "EVENT_RECORD"),
                   NULL, NULL, NULL, NULL, ev.id)
        else:
            task.extra.record(self, task, end)
            return
        kcode, ttype, blocks, waves, nbytes, copy_kind, event_id = row
        append_row(rec.tasks, TASK_W, dev.rank, dev.id, dev.pid, stream.id, task.start_ns, end - task.start_ns,
                              code(task.name), kcode, ttype, task.corr, blocks, waves, nbytes, copy_kind,
                              event_id, NULL if task.step is None else task.step)

    def link_rate(self, link: Link, now: int, bytes_per_ns: float) -> None:
        """A link's bandwidth changed (a flow started or finished on it)."""
        if not self.sw.sys_hardware_mem:
            return
        self.recorder.name_process(0, LINKS_PID, "Links", sort=1000)
        self.recorder.rows.append((0, "C", f"{link.name} GB/s", None, now, None, LINKS_PID, 0, None,
                                   '{"GB/s":%.6g}' % bytes_per_ns, None, "counter", None, None, None, None, None,
                                   float(bytes_per_ns), None))
