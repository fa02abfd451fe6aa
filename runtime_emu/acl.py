"""A pyACL-shaped API over the emulated runtime, so a user script reads like an AscendCL program.

    from runtime_emu import acl
    acl.init()
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    ptr = acl.rt.malloc(1 << 20, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    acl.rt.launch_kernel(kernel, 24, stream)
    acl.rt.synchronize_stream(stream)
    result = acl.finalize()          # -> EmuResult(trace, ground_truth)

Differences from pyACL, on purpose: calls raise AclError instead of returning an error code,
and calls that create something return it directly (no `(value, ret)` pairs).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from runtime_emu import errors as _errors
from runtime_emu._loader import native
from runtime_emu.errors import AclError
from runtime_emu.runtime import (
    MEMCPY_DEVICE_TO_DEVICE,
    MEMCPY_DEVICE_TO_HOST,
    MEMCPY_HOST_TO_DEVICE,
    MEMCPY_HOST_TO_HOST,
    EmuResult,
    Runtime,
    Switches,
)

ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY = 0, 1, 2
ACL_MEMCPY_HOST_TO_HOST = MEMCPY_HOST_TO_HOST
ACL_MEMCPY_HOST_TO_DEVICE = MEMCPY_HOST_TO_DEVICE
ACL_MEMCPY_DEVICE_TO_HOST = MEMCPY_DEVICE_TO_HOST
ACL_MEMCPY_DEVICE_TO_DEVICE = MEMCPY_DEVICE_TO_DEVICE
ACL_SUCCESS = 0

_current: Runtime | None = None
#: Called with the new Runtime at every acl.init(), before the program's first runtime call: a
#: profiler attaches here (as msprof attaches to CANN through its profiling switches), so the
#: runtime never has to know which profiler, if any, is watching.
on_init: list = []
#: Called with the EmuResult when a program finalizes (the profiler's capture hooks in here).
on_finalize: list = []


def init(**config: Any) -> Runtime:
    """Start an emulated runtime (aclInit). Keyword config goes to Runtime (seed, preset, ...).

    The environment variable MSPROF_PY_EMU_CONFIG may hold JSON config the capture sets
    (`{"switches": {"task_time": false, ...}}` included). Then every `on_init` hook is called
    with the new runtime.
    """
    global _current
    if _current is not None and not _current.finished:
        raise AclError(_errors.ACL_ERROR_REPEAT_INITIALIZE, "acl.init() called twice without acl.finalize()")
    env = os.environ.get("MSPROF_PY_EMU_CONFIG")
    if env:
        import json

        config = {**json.loads(env), **config}
    if isinstance(config.get("switches"), dict):  # JSON config names the switches
        config["switches"] = Switches(**config["switches"])
    _current = Runtime(**config)
    if _Forward is not None:  # acl.rt.launch_kernel tries the runtime's native launch first
        rt.launch_kernel.fast = _current._fast_launch
    for hook in list(on_init):
        hook(_current)
    return _current


def current() -> Runtime:
    """The runtime of the calling host thread: the one acl.init() made, or the Runtime a
    multi-rank job's thread belongs to (so hccl and Thread work on any Runtime)."""
    if _current is not None and not _current.finished:
        return _current
    rt = _runtime_of_thread()
    if rt is None:
        raise AclError(_errors.ACL_ERROR_UNINITIALIZE, "the runtime is not initialized; call acl.init() first")
    return rt


def _runtime_of_thread() -> Runtime | None:
    from runtime_emu.host import runtime_of_current_thread

    return runtime_of_current_thread()


def finalize() -> EmuResult:
    """Wait for all device work and return the recording (aclFinalize)."""
    result = current().finish()
    for hook in list(on_finalize):
        hook(result)
    return result


def _native_forward() -> Any:
    """`_acl.Forward` (the compiled forwarder), or None when it is not built or MSPROF_PY_PURE=1."""
    module = native("_acl")
    return None if module is None else module.Forward


_Forward = _native_forward()


def _call(name: str):
    """acl's function `name`: the method of that name on the calling thread's runtime. Natively
    (runtime_emu/_acl.c) it is the same call without the wrapper's frame, tuple and dict: a
    quarter of a kernel launch's instructions went to them."""
    doc = getattr(Runtime, name).__doc__
    if _Forward is not None:
        return _Forward(name, globals(), current, doc)

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(current(), name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = doc
    return call


rt = SimpleNamespace(**{n: _call(n) for n in (
    "set_device", "create_stream", "destroy_stream", "launch_kernel", "memcpy", "memcpy_async", "memset_async",
    "create_event", "destroy_event", "record_event", "stream_wait_event", "synchronize_event",
    "synchronize_stream", "synchronize_device", "malloc", "free", "malloc_host", "free_host")})
#: Framework-level (torch_npu-style) caching allocator.
caching = SimpleNamespace(malloc=_call("cached_malloc"), free=_call("cached_free"), empty_cache=_call("empty_cache"),
                         record_stream=_call("record_stream"))
#: Profiling annotations and host-side work.
prof = SimpleNamespace(step=_call("step"), host_work=_call("host_work"), now=_call("now"))
