"""The C core (runtime_emu/_core.c: engine, core pools, kernel lifecycle) against the Python one.

The same program runs twice in this process: with the C core (the default when it is built)
and with MSPROF_PY_PURE=1 set while its Runtime is made, which gives the Python engine,
device.CorePool and Dispatch's own kernel path (the compiled modules stay loaded; the flag is
read when a runtime is made). Both must give the same trace table, row for row, the same
ground truth and the same host clocks. Programs: every scenario with each of its problem
switches, and small programs written for what the scenarios do not reach (batch mode,
preemption, priorities, partial waves, Vector and Cube kernels, an event wait, copies
between kernels, full queues, host threads, recording switches flipped while running,
streamed cuts, no ground truth).
"""

from __future__ import annotations

import json

import pytest

from msprof_py.trace import read_trace
from runtime_emu import PRESETS, Kernel, Runtime, Switches, Thread, scenarios
from runtime_emu._loader import native
from simcore.engine import PULSE_EVENTS, Engine

CORE = native("_core")
pytestmark = pytest.mark.skipif(CORE is None, reason="the C core is off (not compiled, or MSPROF_PY_PURE=1)")


def both(monkeypatch, make):
    """make() run with the C core and with the Python one: (C result, Python result)."""
    monkeypatch.delenv("MSPROF_PY_PURE", raising=False)
    fast = make()
    monkeypatch.setenv("MSPROF_PY_PURE", "1")
    slow = make()
    monkeypatch.delenv("MSPROF_PY_PURE")
    return fast, slow


def rows(table) -> list[dict]:
    return table.to_pylist()


def assert_same_tables(a, b) -> None:
    assert a.schema.equals(b.schema)
    assert a.num_rows == b.num_rows
    ra, rb = rows(a), rows(b)
    for i, (x, y) in enumerate(zip(ra, rb)):
        assert x == y, f"row {i}: {x} != {y}"


# ---------------------------------------------------------------- scenarios
CASES = [(name, ()) for name in sorted(scenarios.SCENARIOS)] + [
    (name, (switch,)) for name in sorted(scenarios.SCENARIOS) for switch in sorted(scenarios.SCENARIOS[name].switches)]


@pytest.mark.parametrize(("name", "switches"), CASES, ids=[f"{n}-{'-'.join(s) or 'healthy'}" for n, s in CASES])
def test_scenarios_give_the_same_trace_and_ground_truth(monkeypatch, name, switches):
    def make():
        rt_made = []
        real = Runtime.__init__

        def spy(self, *a, **kw):
            real(self, *a, **kw)
            rt_made.append(self)

        monkeypatch.setattr(Runtime, "__init__", spy)
        res = scenarios.run(name, switches=switches, steps=2)
        monkeypatch.setattr(Runtime, "__init__", real)
        return res, rt_made

    (fast, fast_rts), (slow, slow_rts) = both(monkeypatch, make)
    assert all(rt.dispatch.native is not None for rt in fast_rts) and fast_rts
    assert all(rt.dispatch.native is None for rt in slow_rts) and slow_rts
    assert_same_tables(fast.trace.table, slow.trace.table)
    assert json.dumps(fast.ground_truth, sort_keys=True, default=str) == \
        json.dumps(slow.ground_truth, sort_keys=True, default=str)


# ---------------------------------------------------------------- programs
def program(**options):
    """A program over kernels of both core types, priorities, several block counts (partial
    waves on 4 cores), an event wait, copies between kernels and a host thread; returns the
    finished runtime's trace, ground truth and the host clocks it saw."""

    def make():
        # Few cores, so kernels wait for them (partial waves, started kernels going first,
        # priorities), and launch costs that let the device catch up with the host at times.
        rt = Runtime(preset=PRESETS["910B3"].with_(cube_cores=4, vector_cores=2), **options)
        rt.set_device(0)
        clocks = []
        hi, lo, side = rt.create_stream(0), rt.create_stream(5), rt.create_stream(2)
        conv = Kernel("Conv2D", block_ns=30_000, core="cube")
        add = Kernel("Add", block_ns=9_000, core="vector", task_type="AI_VECTOR_CORE", op_type="Add")
        mm = Kernel("MatMul", block_ns=21_000)
        ev = rt.create_event()
        dev = rt.malloc(1 << 20)
        host = rt.malloc_host(1 << 20)
        for i in range(40):
            rt.launch_kernel(conv, 1 + i % 11, lo)
            rt.launch_kernel(add, 1 + i % 5, hi)
            if i % 7 == 3:
                rt.record_event(ev, lo)
                rt.stream_wait_event(side, ev)
                rt.launch_kernel(mm, 3, side)
            if i % 9 == 4:
                rt.memcpy_async(dev, 1 << 20, host, 1 << 19, 1, hi)
                rt.launch_kernel(add, 2, hi)
            clocks.append(rt.coord.current().clock)

        def worker():
            s = rt.create_stream(1)
            for j in range(30):
                rt.launch_kernel(mm, 1 + j % 4, s)
            rt.synchronize_stream(s)

        t = Thread(worker, runtime=rt)
        t.start()
        rt.synchronize_stream(hi)
        clocks.append(rt.coord.current().clock)
        t.join()
        rt.synchronize_device()
        clocks.append(rt.coord.current().clock)
        res = rt.finish()
        return res, clocks, rt.dispatch.native is not None

    return make


@pytest.mark.parametrize("options", [
    {}, {"batch_mode": True}, {"preemption": True}, {"ground_truth": False}, {"queue_depth_counters": False},
    {"switches": Switches(runtime_api=False)}, {"switches": Switches(task_time=False)},
], ids=["normal", "batch", "preemption", "no-truth", "no-depth", "no-api", "no-tasks"])
def test_programs_give_the_same_trace_truth_and_clocks(monkeypatch, options):
    (fast, fc, fn), (slow, sc, sn) = both(monkeypatch, lambda: program(**dict(options))())
    assert fn and not sn
    assert fc == sc
    assert_same_tables(fast.trace.table, slow.trace.table)
    assert fast.ground_truth == slow.ground_truth
    assert fast.trace.table.num_rows > (100 if options.get("switches") else 500)


def test_full_queues_block_the_host_the_same(monkeypatch):
    """Queues of 8 tasks: the host blocks again and again, in the Python loop of the
    wait, while the C core retires the kernels that make room."""

    def make():
        rt = Runtime(preset=Runtime().preset.with_(queue_tasks=8))
        rt.set_device(0)
        ss = [rt.create_stream() for _ in range(3)]
        k = Kernel("k", block_ns=40_000)
        for i in range(300):
            rt.launch_kernel(k, 1 + i % 3, ss[i % 3])
        rt.synchronize_device()
        return rt.finish(), rt.coord.current().clock

    (fast, fclock), (slow, sclock) = both(monkeypatch, make)
    assert fclock == sclock
    assert_same_tables(fast.trace.table, slow.trace.table)
    assert fast.ground_truth == slow.ground_truth
    blocks = fast.ground_truth["host_blocks"]["reason"]
    assert blocks.count("queue_full") > 50


def test_switches_flipped_while_running(monkeypatch):
    """A profiler turns task recording off and on between launches: the C core reads the
    switches again after every call from Python."""

    def make():
        rt = Runtime()
        rt.set_device(0)
        s = rt.create_stream()
        k = Kernel("k", block_ns=400)
        for i in range(200):
            rt.sw.task_time = (i // 50) % 2 == 0
            rt.launch_kernel(k, 2, s)
            if i % 10 == 9:
                rt.synchronize_stream(s)
        rt.synchronize_device()
        return rt.finish()

    fast, slow = both(monkeypatch, make)
    assert_same_tables(fast.trace.table, slow.trace.table)
    kernels = [r for r in rows(fast.trace.table) if r["kind"] == "kernel"]
    assert 0 < len(kernels) < 200


def test_streamed_cuts_give_the_same_file(monkeypatch, tmp_path):
    def make(tag):
        def run():
            path = tmp_path / f"{tag}-{len(list(tmp_path.iterdir()))}.parquet"
            rt = Runtime(trace_path=path, trace_cut_tasks=64)
            rt.set_device(0)
            ss = [rt.create_stream(p) for p in (0, 3)]
            k = Kernel("k", block_ns=250)
            for i in range(3000):
                rt.launch_kernel(k, 1 + i % 6, ss[i % 2])
            rt.synchronize_device()
            res = rt.finish()
            return res, path
        return run

    (fast, fpath), (slow, spath) = both(monkeypatch, make("t"))
    assert fast.stream_fallback is None and slow.stream_fallback is None
    assert_same_tables(read_trace(fpath).table, read_trace(spath).table)


# ---------------------------------------------------------------- the engine on its own
def log_of(engine) -> list[tuple[int, str]]:
    log: list[tuple[int, str]] = []

    def note(tag):
        log.append((engine.now, tag))
        if tag == "a":
            engine.after(5, note, "a2")
            engine.at(0, note, "clamped")  # in the past: runs now, after what is due now
    engine.at(10, note, "a")
    engine.at(10, note, "b")
    engine.after(3, note, "c")
    engine.at(15, note)
    engine.run_until(12)
    assert engine.now == 12 and len(engine) == 2
    engine.run()
    return log


def test_c_engine_orders_like_the_python_one():
    assert log_of(CORE.Engine()) == log_of(Engine())
    assert log_of(CORE.Engine()) == [(3, "c"), (10, "a"), (10, "b"), (10, "clamped"), (15, None), (15, "a2")]


@pytest.mark.parametrize("make", [lambda: CORE.Engine(), Engine], ids=["C", "Python"])
def test_c_engine_run_while_and_pulse(make):
    engine = make()
    seen: list[int] = []
    for i in range(1000):
        engine.at(i, seen.append, i)
    pulses: list[int] = []
    engine.pulse = lambda: pulses.append(engine.now)
    assert engine.run_while(lambda: len(seen) < 600) is True
    assert len(seen) == 600 and engine.now == 599
    assert pulses == [PULSE_EVENTS - 1, 2 * PULSE_EVENTS - 1]
    assert engine.run_while(lambda: True) is False and len(seen) == 1000
    assert engine.next_time() is None


def test_c_engine_errors():
    engine = CORE.Engine()
    with pytest.raises(TypeError, match="t_ns must be an int"):
        engine.at("soon", print)
    with pytest.raises(TypeError, match="pulse must be callable"):
        engine.pulse = 3
    with pytest.raises(IndexError):
        engine.step()

    def boom(_):
        raise ValueError("callback failed")
    engine.at(1, boom)
    engine.at(2, print)
    with pytest.raises(ValueError, match="callback failed"):
        engine.run()
    assert engine.now == 1 and len(engine) == 1  # the failed callback is gone, the rest stays


def test_a_launch_arriving_as_its_stream_frees_waited_for_the_host(monkeypatch):
    """With no host costs, a launch right after synchronize arrives the very nanosecond the
    stream's last kernel ended: the host was what it waited for (cause "launch")."""

    def make():
        rt = Runtime(preset=PRESETS["910B3"].with_(launch_overhead_ns=0, api_overhead_ns=0, sync_overhead_ns=0,
                                                   dispatch_latency_ns=0))
        rt.set_device(0)
        s = rt.create_stream()
        k = Kernel("k", block_ns=100)
        for _ in range(3):
            rt.launch_kernel(k, 1, s)
            rt.synchronize_stream(s)
        rt.launch_kernel(k, 1, s)
        rt.launch_kernel(k, 1, s)
        rt.synchronize_device()
        return rt.finish()

    fast, slow = both(monkeypatch, make)
    tasks = fast.ground_truth["tasks"]
    assert tasks["start_ns"] == [0, 100, 200, 300, 400]
    assert tasks["cause"] == ["launch", "launch", "launch", "launch", "stream"]
    assert fast.ground_truth == slow.ground_truth
