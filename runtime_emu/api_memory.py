"""The API of memory: device allocation (aclrtMalloc), pinned host memory (aclrtMallocHost) and
the framework's caching allocator (as torch_npu's), with the trace's memory instants and
counters. `Runtime` offers these as its methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from runtime_emu import errors as E
from runtime_emu.api_streams import PINNED_BASE, integer
from runtime_emu.caching import CachingAllocator
from runtime_emu.device import RECORD, Device, Event
from runtime_emu.errors import AclError
from runtime_emu.memory import InvalidPointer, MallocPolicy, OutOfMemory

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime


class HostMemory:
    """Pinned host buffers (aclrtMallocHost): addresses from PINNED_BASE up, 64-byte aligned."""

    def __init__(self) -> None:
        self.next_addr = PINNED_BASE
        self.sizes: dict[int, int] = {}


def malloc(rt: Runtime, size: Any, policy: Any, tag: str | None) -> int:
    th = rt._enter()
    size = integer(size, "size")
    dev = rt._device(th)
    t0 = th.clock
    try:
        alloc = dev.memory.malloc(size, MallocPolicy(policy))
    except OutOfMemory as exc:
        rt.rows.oom(th, dev, size, exc)
        raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, str(exc)) from None
    except ValueError as exc:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, str(exc)) from None
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtMalloc", t0, nbytes=alloc.bytes)
    rt.rows.mem_event(th, dev, "alloc", alloc.addr, alloc.bytes, "aclrtMalloc", dev.memory.used_bytes, tag)
    return alloc.addr


def free(rt: Runtime, ptr: Any) -> None:
    th = rt._enter()
    dev = rt._device(th)
    t0 = th.clock
    try:
        alloc = dev.memory.free(ptr)
    except InvalidPointer as exc:
        raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, str(exc)) from None
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtFree", t0, nbytes=alloc.bytes)
    rt.rows.mem_event(th, dev, "free", alloc.addr, alloc.bytes, "aclrtFree", dev.memory.used_bytes)


def malloc_host(rt: Runtime, size: Any) -> int:
    th = rt._enter()
    size = integer(size, "size")
    if size <= 0:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"size must be positive, got {size}")
    t0 = th.clock
    host = rt.host_memory
    ptr = host.next_addr
    host.next_addr += (size + 63) // 64 * 64 + 64
    host.sizes[ptr] = size
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtMallocHost", t0, nbytes=size)
    return ptr


def free_host(rt: Runtime, ptr: Any) -> None:
    th = rt._enter()
    host = rt.host_memory
    if ptr not in host.sizes:
        raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, f"free of unknown host pointer {ptr:#x}" if isinstance(ptr, int)
                       else f"free of unknown host pointer {ptr!r}")
    t0 = th.clock
    del host.sizes[ptr]
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtFreeHost", t0)


def cached_malloc(rt: Runtime, size: Any, stream: Any, tag: str | None) -> int:
    th = rt._enter()
    size = integer(size, "size")
    dev = rt._device(th)
    s = rt._check_stream(th, stream)
    cache = _cache(dev)
    try:
        alloc = cache.malloc(size, s.id)
    except OutOfMemory as exc:
        rt.rows.oom(th, dev, size, exc)
        raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, str(exc)) from None
    th.clock += rt.api_overhead_ns
    rt.rows.mem_event(th, dev, "alloc", alloc.addr, alloc.bytes, "caching", cache.allocated_bytes, tag)
    return alloc.addr


def cached_free(rt: Runtime, ptr: Any) -> None:
    th = rt._enter()
    dev = rt._device(th)
    cache = _cache(dev)

    def wait_for(streams: frozenset[int]) -> Callable[[], bool]:
        """As the allocator's insert_events: an event recorded now on each stream that used the
        block (aclrtRecordEvent on the stream); the block is free once they all executed."""
        marks = []
        for sid in sorted(streams):
            s = dev.streams.get(sid)
            if s is None or s.destroyed:
                continue  # a destroyed stream has no work left to wait for
            rt.events_made += 1
            ev = Event(rt.events_made, dev)
            ev.record_seq = 1
            task = rt.dispatch.new_task(RECORD, "EVENT_RECORD", s, th.clock)
            task.event, task.event_seq = ev, 1
            ev.last_record = task.corr
            rt.dispatch.launch(th, task, "aclrtRecordEvent", th.clock)
            marks.append(ev)
        return lambda: all(ev.executed(1) for ev in marks)

    try:
        alloc = cache.free(ptr, wait_for)
    except InvalidPointer as exc:
        raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, str(exc)) from None
    th.clock += rt.api_overhead_ns
    rt.rows.mem_event(th, dev, "free", alloc.addr, alloc.bytes, "caching", cache.allocated_bytes)


def record_stream(rt: Runtime, ptr: Any, stream: Any) -> None:
    """Tensor.record_stream: the caching allocator's block at `ptr` is used by `stream` too, so its
    free waits for the work queued on `stream` until then. Bookkeeping in the framework: no
    runtime call, no time."""
    th = rt._enter()
    s = rt._check_stream(th, stream)
    try:
        _cache(rt._device(th)).record_stream(ptr, s.id)
    except InvalidPointer as exc:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, str(exc)) from None


def empty_cache(rt: Runtime) -> int:
    th = rt._enter()
    dev = rt._device(th)
    t0 = th.clock
    released = _cache(dev).empty_cache()
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "empty_cache", t0, nbytes=released)
    rt.rows.memory_counters(th, dev)
    return released


def _cache(dev: Device) -> CachingAllocator:
    """The device's caching allocator, made at its first use."""
    if dev.caching is None:
        dev.caching = CachingAllocator(dev.memory)
    return dev.caching
