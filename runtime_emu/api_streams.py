"""The API of devices, streams, kernels and copies (aclrtSetDevice .. aclrtMemsetAsync).

Each call checks its arguments as AscendCL does (raising the AclError the real runtime would
return), advances the calling thread's clock, and hands tasks to the dispatcher; `Runtime`
offers these as its methods.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Final

from runtime_emu import errors as E
from runtime_emu.device import MEMCPY, MEMSET, Device, Kernel, Stream, Task
from runtime_emu.errors import AclError
from runtime_emu.host import HostThread

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

# aclrtMemcpyKind
MEMCPY_HOST_TO_HOST: Final = 0
MEMCPY_HOST_TO_DEVICE: Final = 1
MEMCPY_DEVICE_TO_HOST: Final = 2
MEMCPY_DEVICE_TO_DEVICE: Final = 3
_COPY_NAMES = {1: "H2D", 2: "D2H", 3: "D2D"}
_COPY_ENDS = {MEMCPY_HOST_TO_HOST: (False, False), MEMCPY_HOST_TO_DEVICE: (False, True),
              MEMCPY_DEVICE_TO_HOST: (True, False), MEMCPY_DEVICE_TO_DEVICE: (True, True)}
#: Host memory from aclrtMallocHost lies at and above this address; device memory below it.
PINNED_BASE: Final = 0x7F00_0000_0000
DEVICE_BASE: Final = 0x1_0000_0000
HOST_MEMCPY_GBPS: Final = 10.0  # DEFAULT: host memcpy bandwidth for host-to-host copies


def integer(value: Any, what: str) -> int:
    """An API argument as an int, or the AclError for a non-integer."""
    if type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{what} must be an integer, got {value!r}") from None


def _address(ptr: Any) -> int | None:
    """A copy's source or destination as the trace records it: an address, or None for a
    pointer the emulator does not model as one."""
    return ptr if type(ptr) is int and ptr >= 0 else None


def is_device_ptr(ptr: Any) -> bool:
    return isinstance(ptr, int) and ptr < PINNED_BASE and ptr >= DEVICE_BASE


def is_pinned(ptr: Any) -> bool:
    return isinstance(ptr, int) and ptr >= PINNED_BASE


# ==================================================================== devices and streams
def set_device(rt: Runtime, device_id: Any) -> None:
    th = rt._enter()
    t0 = th.clock
    dev = rt.devices.get((th.rank, device_id))
    if dev is None:
        have = sorted(d for r, d in rt.devices if r == th.rank)
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"device {device_id!r} does not exist (rank {th.rank} has {have})")
    th.device = dev
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtSetDevice", t0)


def create_stream(rt: Runtime, priority: Any) -> Stream:
    th = rt._enter()
    priority = integer(priority, "priority")
    if not 0 <= priority <= 7:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"stream priority must be 0..7 (0 highest), got {priority}")
    t0 = th.clock
    stream = rt.new_stream(rt._device(th), priority)
    th.clock += rt.api_overhead_ns
    rt.rows.stream_created(th, stream, t0)
    return stream


def destroy_stream(rt: Runtime, stream: Any) -> None:
    th = rt._enter()
    stream = rt._check_stream(th, stream)
    t0 = th.clock
    stream.destroyed = True
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtDestroyStream", t0, stream=stream)


# ==================================================================== kernels
def launch_kernel(rt: Runtime, kernel: Any, num_blocks: Any, stream: Any, reads: tuple[int, ...],
                  writes: tuple[int, ...]) -> int:
    th = rt._enter()
    if not isinstance(kernel, Kernel):
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid kernel handle {kernel!r}")
    num_blocks = integer(num_blocks, "numBlocks")
    if num_blocks <= 0:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"numBlocks must be positive, got {num_blocks}")
    stream = rt._check_stream(th, stream)
    corr = rt.dispatch.launch_kernel(th, kernel, num_blocks, stream, th.clock)
    if reads or writes:
        rt.rows.accesses(th, stream, corr, reads, writes)
    return corr


# ==================================================================== copies
def memcpy_async(rt: Runtime, dst: Any, dest_max: Any, src: Any, count: Any, kind: Any, stream: Any) -> int:
    th = rt._enter()
    stream = rt._check_stream(th, stream)
    dest_max, count, kind = integer(dest_max, "destMax"), integer(count, "count"), integer(kind, "kind")
    t0 = th.clock
    task, pageable = _copy_task(rt, dst, dest_max, src, count, kind, stream, t0)
    src_addr, dst_addr = _address(src), _address(dst)
    if task is None:
        th.clock += int(count / HOST_MEMCPY_GBPS)
        rt.rows.api(th, "aclrtMemcpyAsync", t0, nbytes=count, blocked="copy", blocked_ns=th.clock - t0,
                    src=src_addr, dst=dst_addr)
        return 0
    rt.dispatch.launch(th, task, "aclrtMemcpyAsync", t0, record_api=not pageable, src=src_addr, dst=dst_addr)
    _copy_accesses(rt, th, task, src, dst)
    if pageable:
        # From pageable host memory the call returns only when the copy is done, and its
        # slice says so: a 5 us slice would show the host idle while it was held.
        start = _wait_for_copy(rt, th, task, f"pageable copy {task.corr}", "pageable_copy")
        rt.rows.held(th, "aclrtMemcpyAsync", t0, "launch", task, "pageable host memory", th.clock - start,
                     src_addr, dst_addr)
    return task.corr


def memcpy(rt: Runtime, dst: Any, dest_max: Any, src: Any, count: Any, kind: Any) -> None:
    """aclrtMemcpy: on the device's own copy queue, ordered after no stream's work (see
    Runtime.memcpy)."""
    th = rt._enter()
    dest_max, count, kind = integer(dest_max, "destMax"), integer(count, "count"), integer(kind, "kind")
    dev = rt._device(th)
    t0 = th.clock
    src_addr, dst_addr = _address(src), _address(dst)
    task, _ = _copy_task(rt, dst, dest_max, src, count, kind, dev.default_stream, t0)
    if task is None:  # host to host: the calling thread copies
        th.clock += int(count / HOST_MEMCPY_GBPS)
        rt.rows.api(th, "aclrtMemcpy", t0, "sync", nbytes=count, blocked="copy", blocked_ns=th.clock - t0,
                    src=src_addr, dst=dst_addr)
        return
    task.stream = _copy_stream(rt, dev)  # checked: now off the default stream
    rt.dispatch.launch(th, task, "aclrtMemcpy", t0, kind="sync", record_api=False, src=src_addr, dst=dst_addr)
    _copy_accesses(rt, th, task, src, dst)
    start = _wait_for_copy(rt, th, task, f"copy {task.corr}", "sync_copy")
    rt.rows.held(th, "aclrtMemcpy", t0, "sync", task, "copy", th.clock - start, src_addr, dst_addr)


def _wait_for_copy(rt: Runtime, th: HostThread, task: Task, what: str, reason: str) -> int:
    """Hold the thread until `task` (a copy it launched) is done; returns when the wait began."""
    start = th.clock
    rt.coord.block(th, lambda: task.end_ns >= 0, what)
    if rt.truth.keep:
        rt.truth.host_blocks.append((th.rank, th.tid, start, th.clock, reason, task.stream.id, task.corr))
    return start


def _copy_stream(rt: Runtime, dev: Device) -> Stream:
    """The device's queue for synchronous copies (aclrtMemcpy), apart from every stream the
    program can name: such a copy waits for no stream's work (AscendCL documents no
    implicit synchronisation), only for earlier synchronous copies of the device."""
    stream = dev.copy_stream
    if stream is None:
        stream = dev.copy_stream = rt.new_stream(dev, 0, "aclrtMemcpy")
    return stream


def _copy_task(rt: Runtime, dst: Any, dest_max: int, src: Any, count: int, kind: int, stream: Stream,
               t0: int) -> tuple[Task | None, bool]:
    """The copy's task (None for host to host) and whether its host side is pageable memory."""
    if count < 0 or count > dest_max:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"copy of {count} bytes into a destination of {dest_max} bytes")
    dev = stream.device
    src_dev, dst_dev = is_device_ptr(src), is_device_ptr(dst)
    if kind not in _COPY_ENDS:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"unknown memcpy kind {kind}")
    if (src_dev, dst_dev) != _COPY_ENDS[kind]:
        where = lambda d: "device" if d else "host"  # noqa: E731
        raise AclError(E.ACL_ERROR_INVALID_PARAM,
                       f"memcpy kind {kind} ({_COPY_NAMES.get(kind, 'H2H')}) but src is {where(src_dev)} "
                       f"memory and dst is {where(dst_dev)} memory")
    if kind == MEMCPY_HOST_TO_HOST:
        return None, False
    host_side = src if kind == MEMCPY_HOST_TO_DEVICE else dst
    pageable = kind != MEMCPY_DEVICE_TO_DEVICE and not is_pinned(host_side)
    name = f"MEMCPY_ASYNC {_COPY_NAMES[kind]}"
    task = rt.dispatch.new_task(MEMCPY, name, stream, t0)
    task.copy_kind = _COPY_NAMES[kind]
    task.bytes = count
    if kind == MEMCPY_HOST_TO_DEVICE:
        task.path = (dev.pcie_h2d,)
    elif kind == MEMCPY_DEVICE_TO_HOST:
        task.path = (dev.pcie_d2h,)
    else:
        task.path = (dev.hbm,)
    return task, pageable


def memset_async(rt: Runtime, dev_ptr: Any, max_count: Any, value: Any, count: Any, stream: Any) -> int:
    th = rt._enter()
    stream = rt._check_stream(th, stream)
    max_count, count = integer(max_count, "maxCount"), integer(count, "count")
    if count > max_count:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"memset of {count} bytes into {max_count} bytes")
    if not is_device_ptr(dev_ptr):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"memset target {dev_ptr!r} is not device memory")
    t0 = th.clock
    task = rt.dispatch.new_task(MEMSET, "MEMSET", stream, t0)
    task.bytes = count
    task.path = (stream.device.hbm,)
    rt.dispatch.launch(th, task, "aclrtMemsetAsync", t0)
    _copy_accesses(rt, th, task, None, dev_ptr)
    return task.corr


def _copy_accesses(rt: Runtime, th: HostThread, task: Task, src: Any, dst: Any) -> None:
    """A copy reads its source and writes its destination where they are device memory: buffer
    accesses, recorded as a kernel's are, so a copy racing a kernel on one buffer shows."""
    reads: tuple[int, ...] = (src,) if is_device_ptr(src) else ()
    writes: tuple[int, ...] = (dst,) if is_device_ptr(dst) else ()
    if reads or writes:
        rt.rows.accesses(th, task.stream, task.corr, reads, writes)
