"""acl's functions as native forwarders (runtime_emu/_acl.c) against the Python closures.

Both call the method of the same name on the calling thread's runtime: the one acl.init()
made while it is not finished, else the runtime of a multi-rank job's thread, else the "not
initialized" error. They must give the same results, errors and traces.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime_emu import Kernel, Runtime, acl
from runtime_emu.errors import AclError

NATIVE = acl._Forward
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the acl forwarders are off (not compiled, or MSPROF_PY_PURE=1)")
K = Kernel("Add", 1_000)


def python_call(name: str):
    def call(*args, **kwargs):
        return getattr(acl.current(), name)(*args, **kwargs)

    return call


def program(call) -> tuple:
    """A small acl program written against `call(name)`: its results and its trace."""
    acl.init(seed=4)
    call("set_device")(0)
    s = call("create_stream")(priority=3)
    ptr = call("malloc")(1 << 20)
    corr = [call("launch_kernel")(K, 4, s, reads=(ptr,), writes=(ptr,)), call("launch_kernel")(K, 1)]
    ev = call("create_event")()
    call("record_event")(ev, s)
    call("stream_wait_event")(None, ev)
    call("memcpy_async")(ptr, 1 << 20, 0x7F00_0000_0000, 4096, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    call("synchronize_device")()
    call("free")(ptr)
    result = acl.finalize()
    return corr, result.trace.table


def test_the_forwarders_give_the_closures_results_and_trace():
    native = program(lambda name: getattr(acl.rt, name))
    closures = program(python_call)
    assert native[0] == closures[0]
    assert native[1].equals(closures[1])


def test_they_are_forwarders_with_the_method_name():
    assert type(acl.rt.launch_kernel) is NATIVE
    assert acl.rt.launch_kernel.__name__ == "launch_kernel"
    assert repr(acl.caching.malloc) == "<acl function cached_malloc>"


def test_errors_come_through_as_the_runtime_raises_them():
    acl.init()
    with pytest.raises(AclError, match="no device set"):
        acl.rt.create_stream()
    acl.rt.set_device(0)
    with pytest.raises(AclError, match="numBlocks must be positive"):
        acl.rt.launch_kernel(K, 0)
    with pytest.raises(TypeError):
        acl.rt.launch_kernel(K, 1, None, colour="red")
    acl.finalize()
    with pytest.raises(AclError, match="not initialized; call acl.init"):
        acl.rt.launch_kernel(K, 1)


def test_a_finished_runtime_gives_way_to_the_calling_rank_thread_runtime():
    acl.init()
    acl.finalize()  # acl's current runtime is finished: each rank's calls go to its own job's runtime
    rt = Runtime(ranks=2)
    seen = []

    def rank_program(rank: int) -> int:
        acl.rt.set_device(0)
        seen.append(acl.prof.now())
        return acl.rt.launch_kernel(K, 1)

    corrs = rt.run_ranks(rank_program)
    assert len(corrs) == 2 and len(seen) == 2
    assert rt.finish().trace.table.num_rows > 0


def test_the_pure_switch_gives_the_python_closures():
    code = "from runtime_emu import acl; print(type(acl.rt.launch_kernel).__name__, acl._Forward)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MSPROF_PY_PURE": "1"})
    assert (out.returncode, out.stdout) == (0, "function None\n")
