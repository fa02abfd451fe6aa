"""Streams and host threads as the C core's types (runtime_emu/state.py), and its launch path.

With the C core built, runtime_emu.state.Stream and HostThread are _core.Stream and
_core.HostThread: the Python modules read and write them as attributes, the core as C fields.
They must behave as the pure-Python classes do. The core's try_launch runs aclrtLaunchKernel's
common case (acl.rt.launch_kernel and Runtime.launch_kernel call it first) and declines every
other case before changing anything, so the Python path gives exactly what it always gave: the
same result or the same error, the same trace.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow.compute as pc
import pytest

from runtime_emu import PRESETS, Kernel, Runtime, acl, state
from runtime_emu._loader import native
from runtime_emu.errors import AclError

CORE = native("_core")
pytestmark = pytest.mark.skipif(CORE is None or state.Stream is state.PyStream,
                                reason="the C core is off (not compiled, or MSPROF_PY_PURE=1)")
P = PRESETS["910B3"].with_(cube_cores=2, launch_overhead_ns=3_000, dispatch_latency_ns=1_000, queue_tasks=4)
K = Kernel("MatMul", block_ns=10_000)

STREAM_FIELDS = ("id", "device", "priority", "busy", "pending", "capacity", "destroyed", "last_end_ns", "last_kind",
                 "last_cause", "last_producer", "last_record", "qcode", "launches_at")
THREAD_FIELDS = ("glet", "tid", "clock", "state", "pred", "what", "error", "device", "rank", "step", "name",
                 "busy_from", "named")


def test_the_state_module_is_never_compiled():
    # Compiled code reads a native class's attributes from its own struct layout; the C types
    # would be read as if they were that class. The compiled modules must see these names as
    # plain Python classes, whichever runs (state.py's docstring).
    from simcore import _loader

    assert "runtime_emu.state" not in _loader.COMPILED and state.__file__.endswith(".py")


def test_the_native_types_start_as_the_python_classes_do():
    dev = object()
    c, p = state.Stream(3, dev, 5, 2013), state.PyStream(3, dev, 5, 2013)
    assert {f: getattr(c, f) for f in STREAM_FIELDS} == {f: getattr(p, f) for f in STREAM_FIELDS}
    assert type(c.queue) is type(p.queue) and len(c.queue) == 0
    assert type(c.launches) is bytearray and c.launches == p.launches == bytearray()
    glet = object()
    t, q = state.HostThread(glet, 2, 1500, rank=1), state.PyHostThread(glet, 2, 1500, rank=1)
    assert {f: getattr(t, f) for f in THREAD_FIELDS} == {f: getattr(q, f) for f in THREAD_FIELDS}
    assert t.name == "Thread 2" and t.busy_from == 1500 and t.state == state.RUNNING


def test_their_attributes_round_trip_and_refuse_what_the_fields_cannot_hold():
    s = state.Stream(1, None, 0, 8)
    s.pending += 3
    s.busy, s.destroyed, s.last_kind, s.last_record = True, True, "kernel", 41
    assert (s.pending, s.busy, s.destroyed, s.last_kind, s.last_record) == (3, True, True, "kernel", 41)
    with pytest.raises(AttributeError):
        s.colour = "red"  # no attribute beyond device.Stream's (it had __slots__)
    with pytest.raises(OverflowError):
        s.pending = 1 << 64
    t = state.HostThread(None, 1, 0)
    t.step = 7
    assert t.step == 7
    t.step = None
    assert t.step is None
    t.clock += np.int64(250)  # an index-able int, as a host_work duration may be
    assert t.clock == 250 and type(t.clock) is int


def test_a_host_thread_keeps_its_device_and_its_id():
    rt = Runtime(preset=P)
    rt.set_device(0)
    th = rt.coord.current()
    assert type(th) is CORE.HostThread and th.device is rt.devices[(0, 0)]
    th.device = None
    assert th.device is None


def test_the_runtime_uses_the_native_types_and_the_core_counts_correlation_ids():
    rt = Runtime(preset=P)
    rt.set_device(0)
    s = rt.create_stream()
    assert type(s) is CORE.Stream and type(rt.coord.current()) is CORE.HostThread
    corrs = [rt.launch_kernel(K, 1, s) for _ in range(3)]
    ev = rt.create_event()
    rt.record_event(ev, s)  # a Task: its id from the same count
    assert corrs == [1, 2, 3] and rt.dispatch.native.corr == 4
    rt.synchronize_device()
    rt.finish()


def launches(through: str) -> tuple:
    """Launches, through acl or a Runtime, that take each of try_launch's ways and each of its
    declines: their results (a corr or the error's text), the trace and the ground truth."""
    if through == "acl":
        rt = acl.init(preset=P)
        launch, set_device = acl.rt.launch_kernel, acl.rt.set_device
    else:
        rt = Runtime(preset=P)
        launch, set_device = rt.launch_kernel, rt.set_device
    out: list = []

    def attempt(*args):
        try:
            out.append(launch(*args))
        except AclError as exc:
            out.append(str(exc))

    set_device(0)
    s = rt.create_stream()
    attempt(K, 1, s)  # the common case
    attempt(K, 2)  # the default stream
    attempt(K, True, s)  # a bool: not an int to the core, one to the runtime (operator.index)
    attempt(K, np.int64(3), s)  # a numpy int, likewise
    attempt(K, 0, s)  # not positive: the runtime's error
    attempt("k", 1, s)  # not a kernel
    attempt(K, 1, "s")  # not a stream
    for _ in range(6):  # past the queue's 4: the host waits for room on the runtime's path
        attempt(K, 1, s)
    dead = rt.create_stream()
    rt.destroy_stream(dead)
    attempt(K, 1, dead)
    rt.synchronize_device()
    result = acl.finalize() if through == "acl" else rt.finish()
    attempt(K, 1, s)  # after finish
    return out, result.trace.table, result.ground_truth


@pytest.mark.parametrize("through", ["Runtime", "acl"])
def test_every_decline_gives_what_the_python_path_gives(monkeypatch, through):
    fast = launches(through)
    monkeypatch.setenv("MSPROF_PY_PURE", "1")  # the Python engine, pools and launch path
    slow = launches(through)
    monkeypatch.delenv("MSPROF_PY_PURE")
    assert fast[0] == slow[0]
    assert fast[0][:4] == [1, 2, 3, 4] and fast[0][7:13] == list(range(5, 11))
    assert "numBlocks must be positive" in fast[0][4]
    assert "invalid kernel handle" in fast[0][5] and "invalid stream handle" in fast[0][6]
    assert "destroyed" in fast[0][-2]
    assert ("not initialized" if through == "acl" else "finalized") in fast[0][-1]
    assert fast[1].to_pylist() == slow[1].to_pylist()
    assert fast[2] == slow[2]
    blocked = [r for r in fast[2]["host_blocks"]["reason"]]
    assert blocked.count("queue_full") >= 1  # the full queue was waited on, on the runtime's path


def test_a_thread_the_runtime_does_not_know_gets_the_runtimes_error():
    rt = acl.init(preset=P)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    errors = []

    def foreign():
        try:
            rt.launch_kernel(K, 1, s)
        except AclError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=foreign)
    t.start()
    t.join()
    acl.finalize()
    assert len(errors) == 1 and "thread the runtime does not know" in errors[0]


def test_the_forwarders_fast_path_is_the_current_runtimes_and_can_be_taken_away():
    rt = acl.init(preset=P)
    assert acl.rt.launch_kernel.fast == rt._fast_launch
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    acl.rt.launch_kernel.fast = None  # the forwarder calls the runtime's method alone
    assert acl.rt.launch_kernel(K, 1, s) == 1
    with pytest.raises(TypeError, match="callable or None"):
        acl.rt.launch_kernel.fast = 5
    acl.rt.synchronize_device()
    acl.finalize()
    rt2 = acl.init(preset=P)
    assert acl.rt.launch_kernel.fast == rt2._fast_launch
    acl.finalize()


def test_a_stream_wait_predicate_reads_the_streams_as_the_lambdas_did():
    rt = Runtime(preset=P)
    rt.set_device(0)
    a, b = rt.create_stream(), rt.create_stream()
    drained, room = rt.dispatch.native.drained((a, b)), rt.dispatch.native.drained((a,), True)
    assert drained() is True and room() is True
    for _ in range(4):  # P's queues hold 4
        rt.launch_kernel(K, 1, a)
    assert drained() is False and room() is False
    rt.synchronize_stream(a)
    assert drained() is True and room() is True
    with pytest.raises(TypeError, match="tuple of runtime_emu._core.Stream"):
        rt.dispatch.native.drained(("a",))
    with pytest.raises(ValueError, match="one stream"):
        rt.dispatch.native.drained((a, b), True)
    rt.finish()


def test_the_core_keeps_a_bounded_number_of_kernels_however_many_a_program_makes():
    import gc

    rt = Runtime(preset=PRESETS["910B3"].with_(queue_tasks=10_000))
    rt.set_device(0)
    s = rt.create_stream()
    for i in range(5000):  # a Kernel per launch, as the scenarios make them (each its own time)
        rt.launch_kernel(Kernel("Op", block_ns=1000 + i), 1, s)
    rt.synchronize_device()
    kept = [o for o in gc.get_referents(rt.dispatch.native) if type(o) is Kernel]
    assert 0 < len(kept) <= 1024  # its cache of kernels' numbers and codes, not every kernel run
    table = rt.finish().trace.table
    assert table.filter(pc.equal(table["kind"], "kernel")).num_rows == 5000
