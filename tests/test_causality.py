"""The causal attribution's invariants, on every shared real trace and every built-in scenario:
every kernel-idle nanosecond has exactly one cause, a copy cause never exceeds the copy time
inside the idle, launch overhead never exceeds the launch calls' own time, unexplained idle is
never critical; and the causes the dependency graph names on hand-built tables."""

from __future__ import annotations

import numpy as np
import pytest

import analyzers
from analyzers import Frames, Severity
from analyzers.causality import CAUSES, attribution, device_windows, idle_by_rank
from analyzers.causality.attribution import DISPATCH_NS
from analyzers.frames import Cover, intersect_intervals, merge_intervals, union_ns
from analyzers.severity import COST_OF, adds_up
from msprof_py.trace.importers import import_trace
from msprof_py.trace.schema import COLUMN_NAMES, TraceMeta, build_table
from runtime_emu import scenarios
from tests.conftest import REAL_TRACES

KINETO = sorted(p.name for p in (REAL_TRACES / "kineto").glob("*.json.gz"))
DLRM = sorted(p.name for p in (REAL_TRACES / "kineto" / "dlrm_8rank").glob("*.json.gz"))
ASCEND = ["torch_npu_trace_view.json.gz", *[f"resnet_2rank_level1_text/rank{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/"
                                             f"trace_view.json" for r in (0, 1)]]
REAL = [f"kineto/{n}" for n in KINETO] + [f"kineto/dlrm_8rank/{n}" for n in DLRM] + [f"ascend/{n}" for n in ASCEND]


def check_invariants(frames: Frames) -> dict[str, int]:
    """Assert the attribution's invariants on `frames`; the idle by cause (ns)."""
    table = attribution(frames)
    ops = frames.device_ops
    kinds = ops["kind"].astype(str)
    assert set(table["cause"]) <= set(CAUSES)
    assert (table["idle_ns"] > 0).all()
    assert (table["idle_ns"] <= table["end"] - table["ts"]).all()
    calls = frames.host_calls
    for (rank, device), w in device_windows(frames).items():
        d = ops[(ops["rank"] == rank) & (ops["device"] == device)]
        k = d[kinds.loc[d.index] == "kernel"]
        if k.empty:
            continue
        lo, hi = int(w["start"].min()), int(w["end"].max())
        busy = union_ns(k["ts"].clip(lo, hi).to_numpy(), k["end"].clip(lo, hi).to_numpy())
        mine = table[(table["rank"] == rank) & (table["device"] == device)]
        # Conserved: the causes sum to the kernel-idle time of the device's windows, exactly.
        assert int(mine["idle_ns"].sum()) == (hi - lo) - busy, (rank, device)
        per_window = mine.groupby("step_start")["idle_ns"].sum()
        assert (per_window <= (w.set_index("start")["end"] - w.set_index("start").index).reindex(per_window.index)).all()
        idle = merge_intervals(np.array([lo, *k["end"].clip(lo, hi)]), np.array([lo, *k["end"].clip(lo, hi)]))
        kernel_union = merge_intervals(k["ts"].clip(lo, hi).to_numpy(), k["end"].clip(lo, hi).to_numpy())
        # Idle = [lo, hi) minus the kernels' union.
        starts = np.concatenate([[lo], kernel_union[1]])
        ends = np.concatenate([kernel_union[0], [hi]])
        keep = ends > starts
        idle = (starts[keep], ends[keep])
        c = d[kinds.loc[d.index].isin(["memcpy", "memset"])]
        copy_in_idle = intersect_intervals(idle, merge_intervals(c["ts"].to_numpy(), c["end"].to_numpy()))
        copy_ns = int((copy_in_idle[1] - copy_in_idle[0]).sum())
        assert int(mine.loc[mine["cause"] == "copy", "idle_ns"].sum()) <= copy_ns, (rank, device)
        launches = calls[(calls["rank"] == rank) & calls["kind"].astype(str).isin(("launch", "wait"))]
        launch_cover = Cover(launches["ts"].to_numpy(), (launches["ts"] + launches["dur"].fillna(0)).to_numpy())
        launch_in_idle = int(sum(launch_cover.between(a, b) for a, b in zip(*idle)))
        # Launch overhead: the launch calls' own time, plus at most one dispatch latency after
        # each launch that ended an idle span.
        dispatch = DISPATCH_NS * int(mine["next_corr"].notna().sum())
        assert int(mine.loc[mine["cause"] == "launch", "idle_ns"].sum()) <= launch_in_idle + dispatch, (rank, device)
    return table.groupby("cause")["idle_ns"].sum().astype(int).to_dict()


def check_findings(trace) -> None:
    result = analyzers.run(trace)
    for f in result.findings:
        assert not (f.code == "BUBBLE_OTHER" and f.severity == Severity.CRITICAL), f.message
        if f.code.startswith("BUBBLE_") or f.code == "LAUNCH_BOUND":
            assert f.value is None or f.value <= 1.0, f.message
        if f.code == "SYNC_STALL":
            assert f.value <= 1.0, f.message
    for f in result.findings:
        # Core contention is latency while the device is busy: its cost (on the critical path)
        # never exceeds the wait it measured; under-occupancy never exceeds the kernels' time.
        if f.code == "CORE_CONTENTION":
            assert 0 <= f.lost_ns <= f.value, f.message
        if f.code == "UNDER_OCCUPANCY":
            ops = Frames(trace).device_ops
            assert f.lost_ns <= int(ops.loc[ops["kind"].astype(str) == "kernel", "dur"].sum()), f.message
    check_costs(Frames(trace), result.findings)


def _own_loss(f, rank, device) -> int:
    """What finding `f` costs on (rank, device): a finding grouped across ranks costs the job the
    per-step largest loss of any rank (analyzers.grouping.job_loss), which may be another rank's
    than its lead's, so each rank's own occurrences are what its device's idle must cover."""
    if f.ranks and f.occurrences:
        mine = [o for o in f.occurrences if o.get("rank") == rank and o.get("device", f.device) == device]
        if all(o.get("lost_ns") is not None for o in mine):
            return sum(int(o["lost_ns"]) for o in mine)
    return int(f.lost_ns) if (f.rank, f.device) == (rank, device) else 0


def check_costs(frames: Frames, findings) -> None:
    """No nanosecond is counted twice (analyzers.severity.COST_OF): per device the idle codes add
    up to at most its attributed idle; blocked launches to at most the launch calls' time; busy
    latency to at most the kernels' time; a finer cause never exceeds the idle of the causes it
    is part of; and the costs that add up never exceed the run's idle + blocked + busy time."""
    table = attribution(frames)
    idle = idle_by_rank(frames)
    ops = frames.device_ops
    kernels = ops[ops["kind"].astype(str) == "kernel"]
    calls = frames.host_calls
    launch_calls = calls[calls["kind"].astype(str) == "launch"]
    timed = [f for f in findings if f.lost_ns is not None]
    for f in timed:
        assert f.code in COST_OF, f"{f.code} costs time but COST_OF does not say what of"
        assert f.lost_ns >= 0, f.message
    budget = {"idle": int(table["idle_ns"].sum()), "blocked": 0, "busy": 0}
    for (rank, device), g in table.groupby(["rank", "device"]):
        lost = sum(_own_loss(f, rank, device) for f in timed if COST_OF[f.code] == "idle")
        assert lost <= int(g["idle_ns"].sum()), (rank, device)
        mine = [f for f in timed if f.code == "BANDWIDTH_CONTENTION" and (f.rank, f.device) == (rank, device)]
        held = int(g.loc[g["cause"].isin(COST_OF["BANDWIDTH_CONTENTION"]), "idle_ns"].sum())
        assert sum(f.lost_ns for f in mine) <= held, (rank, device)
    for rank, g in launch_calls.groupby("rank"):
        blocked = int(g["dur"].fillna(0).sum())
        budget["blocked"] += blocked
        assert sum(f.lost_ns for f in timed if COST_OF[f.code] == "blocked" and f.rank == rank) <= blocked, rank
    for rank, g in kernels.groupby("rank"):
        busy = int((g["end"] - g["ts"]).sum())
        budget["busy"] += busy
        assert sum(f.lost_ns for f in timed if COST_OF[f.code] == "busy" and f.rank == rank) <= busy, rank
    for f in timed:
        if f.code == "LOW_OVERLAP":
            for o in f.occurrences:
                assert o["lost_ns"] <= idle[o["rank"]]["transfer_ns"], f.message
        if f.code == "SLOW_LINK":
            assert f.lost_ns <= max(r["transfer_ns"] for r in idle.values()), f.message
        if f.code == "SLOW_RANK":
            caused = sum(r["peer_ns"].get(f.rank, 0) for r in idle.values())
            assert f.lost_ns * max(len(f.ranks), 1) <= caused, f.message
    assert sum(f.lost_ns for f in timed if adds_up(f.code)) <= sum(budget.values())


@pytest.mark.parametrize("name", REAL)
def test_invariants_hold_on_every_shared_real_trace(real_traces, name):
    trace = import_trace(real_traces / name)
    check_invariants(Frames(trace))
    check_findings(trace)


SINGLE = [s.name for s in scenarios.SCENARIOS.values() if not s.multi_rank]
MULTI = [s.name for s in scenarios.SCENARIOS.values() if s.multi_rank]


@pytest.mark.parametrize("name", SINGLE)
def test_invariants_hold_on_every_single_rank_scenario_and_switch(name):
    scenario = scenarios.SCENARIOS[name]
    for switches in [(), *((s,) for s in sorted(scenario.switches))]:
        result = scenarios.run(name, switches=switches, seed=1)
        check_invariants(Frames(result.trace))
        check_findings(result.trace)


@pytest.mark.parametrize("name", MULTI)
def test_invariants_hold_on_every_multi_rank_scenario(name):
    result = scenarios.run(name, seed=1, steps=2)
    check_invariants(Frames(result.trace))
    check_findings(result.trace)


# ---------------------------------------------------------------- hand-built tables
def table(rows: list[dict]):
    base = {"rank": 0, "pid": 1, "tid": 1}
    rows = [{**base, **r} for r in rows]
    return build_table({c: [r.get(c) for r in rows] for c in COLUMN_NAMES}, TraceMeta(source_format="chrome"))


def task(name, kind, stream, ts, dur, corr):
    return {"ph": "X", "name": name, "kind": kind, "pid": 9, "tid": stream, "ts": ts, "dur": dur, "corr": corr,
            "device": 0, "stream": stream}


def launch(ts, dur, corr, kind="launch", name="launch"):
    return {"ph": "X", "name": name, "kind": kind, "ts": ts, "dur": dur, "corr": corr}


def causes(rows) -> list[tuple[int, int, str, int]]:
    t = attribution(Frames(table(rows)))
    return [(int(r.ts), int(r.end), r.cause, int(r.idle_ns)) for r in t.sort_values(["ts", "cause"]).itertuples()]


def test_a_kernel_launched_in_time_behind_a_copy_waited_for_the_copy_not_the_memset_before_the_gap():
    # K1 ends at 100 us; a copy launched at 0 runs 300-800 us on K2's stream; K2 starts at 800
    # us. The 200 us before the copy started have no release in the trace (longer than any
    # dispatch latency): unexplained, and the copy costs its own 500 us, not the whole gap.
    us = 1_000
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 20 * us, 80 * us, 1),
            launch(10, 10, 2), task("copy", "memcpy", 2, 300 * us, 500 * us, 2),
            launch(20, 10, 3), task("K2", "kernel", 2, 800 * us, 50 * us, 3),
            launch(30, 10, 4), task("K3", "kernel", 1, 900 * us, 50 * us, 4)]
    assert causes(rows) == [(100 * us, 300 * us, "unexplained", 200 * us), (300 * us, 800 * us, "copy", 500 * us),
                            (850 * us, 900 * us, "unexplained", 50 * us)]  # K3: released at 100 us


def test_a_late_launch_is_the_host_what_the_thread_did_decides_each_nanosecond_once():
    # Device idle 100-400: the thread ran a data-loading span 100-300 with an api call nested in
    # it (counted once, as data loading), then an untraced 300-340, then the launch 340-390.
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 20, 80, 1),
            {"ph": "X", "name": "next_batch", "kind": "data_load", "ts": 100, "dur": 200},
            {"ph": "X", "name": "aten::to", "kind": "api", "ts": 150, "dur": 50},
            launch(340, 50, 2), task("K2", "kernel", 1, 400, 50, 2)]
    assert causes(rows) == [(100, 390, "data", 200), (100, 390, "host", 40), (100, 390, "launch", 50),
                            (390, 400, "launch", 10)]


def test_an_event_wait_is_charged_to_the_other_streams_task_that_released_it():
    # K2 on stream 2 waits (EVENT_WAIT 100-600) for a copy on stream 1 that ends at 600.
    rows = [launch(0, 5, 1), task("K1", "kernel", 1, 10, 90, 1),
            launch(5, 5, 2), task("copy", "memcpy", 1, 100, 500, 2),
            launch(10, 5, 3), task("EVENT_RECORD", "marker", 1, 600, 0, 3),
            launch(15, 5, 4, kind="launch"), task("EVENT_WAIT", "wait", 2, 20, 580, 4),
            launch(20, 5, 5), task("K2", "kernel", 2, 602, 50, 5)]
    got = attribution(Frames(table(rows)))
    assert [(int(r.ts), int(r.end), r.cause, int(r.via)) for r in got.itertuples()] == [
        (100, 600, "copy", 1), (600, 602, "dispatch", 2)]


def test_a_wait_that_names_its_event_is_released_by_that_events_record_not_by_whatever_ended_last():
    # The copy on stream 1 ends at 600 and fires event 7's record; a copy on stream 3 ends at 601,
    # just before the wait on stream 2 ends (602). By timing alone stream 3 released it; the
    # wait and the record name event 7 (`addr`), so it was stream 1's copy.
    rows = [launch(0, 5, 1), task("K1", "kernel", 1, 10, 90, 1),
            launch(5, 5, 2), task("copy", "memcpy", 1, 100, 500, 2),
            launch(6, 2, 6), task("other copy", "memcpy", 3, 100, 501, 6),
            launch(10, 5, 3), {**task("EVENT_RECORD", "marker", 1, 600, 0, 3), "addr": 7},
            launch(15, 5, 4, kind="launch"), {**task("EVENT_WAIT", "wait", 2, 20, 582, 4), "addr": 7},
            launch(20, 5, 5), task("K2", "kernel", 2, 602, 50, 5)]
    got = attribution(Frames(table(rows)))
    assert [(int(r.ts), int(r.end), r.cause, int(r.via)) for r in got.itertuples()] == [
        (100, 600, "copy", 1), (600, 602, "dispatch", 1)]
    for r in rows:
        r.pop("addr", None)
    got = attribution(Frames(table(rows)))
    assert [(r.cause, int(r.via)) for r in got.itertuples()][0] == ("copy", 3)


def test_a_wait_launched_with_a_collective_is_waiting_on_the_collective():
    rows = [launch(0, 5, 1), task("K1", "kernel", 1, 10, 90, 1),
            launch(5, 5, 2), task("Notify_Wait", "wait", 1, 100, 400, 2), task("allReduce", "collective", 1, 500, 100, 2),
            launch(10, 5, 3), task("K2", "kernel", 1, 600, 50, 3)]
    assert causes(rows) == [(100, 500, "collective", 400), (500, 600, "collective", 100)]


def test_host_time_after_a_draining_sync_is_the_syncs_up_to_its_wait():
    # The sync waits 20-100 for K1 (80 ns), returns at 101; 101-130 framework, 130-140 launch.
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 10, 90, 1),
            {"ph": "X", "name": "synchronize", "kind": "sync", "ts": 20, "dur": 81},
            {"ph": "X", "name": "aten::add", "kind": "api", "ts": 101, "dur": 29},
            launch(130, 10, 2), task("K2", "kernel", 1, 140, 50, 2)]
    assert causes(rows) == [(100, 140, "sync", 40)]


def _flood(compute_first: bool, gemm_ns: int = 1_000_000):
    """Three steps of one host thread: 200 1 MiB uploads on a copy stream whose queue holds 64
    tasks, and 20 GEMMs of 1 ms on a compute stream; the user's order (uploads first) or the fix
    (compute first, the uploads running under it)."""
    from runtime_emu import Kernel, Runtime, acl

    acl.init(seed=0, preset=Runtime().preset.with_(queue_tasks=64))
    acl.rt.set_device(0)
    copies, compute = acl.rt.create_stream(), acl.rt.create_stream()
    host, dev = acl.rt.malloc_host(1 << 20), acl.rt.malloc(1 << 20)

    def gemms():
        for _ in range(20):
            acl.rt.launch_kernel(Kernel("gemm", block_ns=gemm_ns), 20, compute)

    for _ in range(3):
        with acl.prof.step():
            if compute_first:
                gemms()
            for _ in range(200):
                acl.rt.memcpy_async(dev, 1 << 20, host, 1 << 20, acl.ACL_MEMCPY_HOST_TO_DEVICE, copies)
            if not compute_first:
                gemms()
            acl.rt.synchronize_stream(compute)
            acl.rt.synchronize_stream(copies)
    return acl.finalize().trace


def test_a_launch_blocked_at_a_full_queue_is_the_queues_not_launch_overhead():
    from analyzers.causality.critical_path import step_paths

    flooded, fixed = _flood(compute_first=False), _flood(compute_first=True)
    frames = Frames(flooded)
    by = attribution(frames).groupby("cause")["idle_ns"].sum().to_dict()
    # Steps 2 and 3: the GEMMs' launches waited behind 136 blocked upload launches each; step 1's
    # wait is before the first kernel (fill). Only the uploads' own launch calls are launch time.
    assert by == {"queue": 9_974_768, "fill": 5_987_384, "launch": 2_012_000, "sync": 8_000}
    check_invariants(frames)
    # The fix (compute first) recovers that idle: the run is 17.96 ms shorter, which queue + fill
    # + launch account for to within 0.2%.
    ops, ops_fixed = frames.device_ops, Frames(fixed).device_ops
    saving = int(ops["end"].max() - ops["ts"].min()) - int(ops_fixed["end"].max() - ops_fixed["ts"].min())
    assert saving == 17_962_152
    assert by["queue"] + by["fill"] + by["launch"] == pytest.approx(saving, rel=0.002)
    result = analyzers.run(flooded)
    (queue,) = [f for f in result.findings if f.code == "QUEUE_CONGESTION"]
    assert queue.stream == 1 and "9.97 ms of it with the device idle" in queue.message
    (launch,) = [f for f in result.findings if f.code == "LAUNCH_BOUND"]
    assert launch.lost_ns == 2_012_000 and launch.severity == Severity.INFO  # was 10.4 ms, critical
    # On the critical path the blocked launches return when an upload retires: each step is the
    # uploads the GEMMs waited behind, then the GEMMs (before: 5.99 ms of "launch").
    for _, path in step_paths(frames, 0):
        blame = path.blame()
        assert (blame["compute"], blame["copy"], blame["launch"]) == (20_000_000, 5_976_384, 12_000)


def test_host_work_after_a_draining_sync_that_moved_launch_time_keeps_its_own_budget():
    # With 0.1 ms GEMMs the uploads outlast the compute: the sync on the upload stream drains
    # the device, and the launch time after it moves to the sync before the data pass runs.
    frames = Frames(_flood(compute_first=False, gemm_ns=100_000))
    by = check_invariants(frames)
    assert by == {"copy": 1_602_832, "drain": 801_416, "fill": 5_987_384, "launch": 413_168, "queue": 9_974_768,
                  "sync": 1_602_832}


def test_a_blocking_copy_on_the_host_is_named_as_such():
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 10, 90, 1),
            {"ph": "X", "name": "cudaMemcpy", "kind": "sync", "ts": 100, "dur": 300, "corr": 2},
            task("copy", "memcpy", 1, 120, 270, 2),
            launch(400, 10, 3), task("K2", "kernel", 1, 410, 50, 3)]
    # The device waited for the host, and the host sat in a synchronous copy: the remedy is an
    # asynchronous copy from pinned memory, not overlapping two asynchronous ones.
    assert causes(rows) == [(100, 410, "blocking_copy", 300), (100, 410, "launch", 10)]


def test_an_async_copy_call_that_returned_after_its_copy_is_a_blocking_copy():
    # cudaMemcpyAsync from pageable memory (hipMemcpyWithStream likewise) returns only when the
    # copy is done: a launch call by its kind, a blocking copy by what the trace shows.
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 10, 90, 1),
            launch(100, 300, 2, name="cudaMemcpyAsync"), task("copy", "memcpy", 1, 120, 270, 2),
            launch(400, 10, 3), task("K2", "kernel", 1, 410, 50, 3)]
    assert causes(rows) == [(100, 410, "blocking_copy", 300), (100, 410, "launch", 10)]
    # One that returned while its copy still ran is an ordinary launch.
    rows[2] = launch(100, 10, 2, name="cudaMemcpyAsync")
    assert ("blocking_copy" not in {c for *_, c, _ in causes(rows)})


def test_a_host_waiting_with_nothing_to_do_is_host_idle_not_host_work():
    """An inference loop that waits for each request (the emulator's `host_idle` kind): the
    device idle while it waits is BUBBLE_HOST_IDLE, the preprocessing after it BUBBLE_DATA."""
    from runtime_emu import Kernel, Runtime

    rt = Runtime()
    rt.set_device(0)
    s = rt.create_stream()
    for _ in range(4):
        with rt.step():
            rt.host_work("wait_for_request", 300_000, kind="host_idle")
            rt.host_work("decode", 100_000)
            rt.launch_kernel(Kernel("Net", 200_000), 20, s)
            rt.synchronize_stream(s)
    trace = rt.finish().trace
    kinds = trace.table.column("kind").to_pylist()
    assert kinds.count("host_idle") == 4
    table = attribution(Frames(trace))
    by = table.groupby("cause")["idle_ns"].sum().to_dict()
    assert by["host_idle"] == 3 * 300_000 and by["data"] == 3 * 100_000
    codes = {f.code: f for f in analyzers.run(trace).findings}
    assert codes["BUBBLE_HOST_IDLE"].lost_ns == 900_000
    assert codes["BUBBLE_HOST_IDLE"].lookup.remedy.startswith("Batch requests")


# ---------------------------------------------------------------- races from happens-before
def test_an_operator_compiled_before_its_launch_is_op_compile_and_the_call_still_launches_it():
    # torch_npu single-op mode: AscendCL@aclopCompileAndExecute compiles K2 for 300 then
    # launches it (its corr): the device's wait is the compile's, not launch overhead.
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 10, 90, 1),
            launch(105, 305, 2, kind="op_compile", name="AscendCL@aclopCompileAndExecute"),
            task("K2", "kernel", 1, 420, 50, 2)]
    assert causes(rows) == [(100, 410, "compile", 305), (100, 410, "host", 5), (410, 420, "launch", 10)]
    result = analyzers.run(table(rows), names=["bubbles"])
    top = result.ranked()[0]
    assert (top.code, top.lost_ns, top.severity) == ("BUBBLE_OP_COMPILE", 305, Severity.CRITICAL)
    # On the critical path the call is compile time too, and the launch edge holds.
    from analyzers.causality.critical_path import critical_path

    blame = critical_path(Frames(table(rows)), 0).blame()
    assert blame["compile"] == 315 and blame["compute"] == 50


def test_the_emulator_records_operator_compile_as_its_own_kind():
    from runtime_emu import Kernel, Runtime

    rt = Runtime()
    rt.set_device(0)
    s = rt.create_stream()
    with rt.step():
        rt.launch_kernel(Kernel("Cast", 100_000), 20, s)
        rt.host_work("aclopCompile MatMul", 2_000_000, kind="op_compile")
        rt.launch_kernel(Kernel("MatMul", 100_000), 20, s)
        rt.synchronize_stream(s)
    trace = rt.finish().trace
    df = trace.table.to_pandas()
    compile_end = int((df.loc[df["kind"] == "op_compile", "ts"] + df.loc[df["kind"] == "op_compile", "dur"]).iloc[0])
    cast_end = int((df.loc[df["name"] == "Cast", "ts"] + df.loc[df["name"] == "Cast", "dur"]).iloc[0])
    by = attribution(Frames(trace)).groupby("cause")["idle_ns"].sum().to_dict()
    # The device idles from Cast's end until the compile is done; then the launch call's own time.
    assert by["compile"] == compile_end - cast_end and set(by) == {"compile", "launch"}


def access(kind, addr, corr, ts):
    return {"ph": "i", "name": kind, "kind": kind, "ts": ts, "addr": addr, "corr": corr, "device": 0}


def race_pairs(rows):
    from analyzers.causality.happens_before import races

    r = races(Frames(table(rows)))
    return [(int(x.w_corr), int(x.r_corr), int(x.w_stream), int(x.r_stream)) for x in r.itertuples()]


BUF = 0xA000


def test_a_read_on_another_stream_with_nothing_ordering_it_after_the_write_is_a_race_even_if_it_ran_later():
    rows = [launch(0, 5, 1), task("W", "kernel", 1, 10, 90, 1), access("mem_write", BUF, 1, 10),
            launch(5, 5, 2), task("R", "kernel", 2, 200, 100, 2), access("mem_read", BUF, 2, 200)]
    assert race_pairs(rows) == [(1, 2, 1, 2)]
    (f,) = [f for f in analyzers.run(table(rows), ["sync"]).findings if f.code == "MISSING_SYNC"]
    assert "ordered only by luck" in f.message and f.value == 0.0


def test_a_host_synchronize_between_write_and_read_orders_them():
    rows = [launch(0, 5, 1), task("W", "kernel", 1, 10, 90, 1), access("mem_write", BUF, 1, 10),
            {"ph": "X", "name": "aclrtSynchronizeStream", "kind": "sync", "ts": 10, "dur": 140},
            launch(160, 5, 2), task("R", "kernel", 2, 200, 100, 2), access("mem_read", BUF, 2, 200)]
    assert race_pairs(rows) == []


def test_an_event_wait_orders_the_read_after_the_write_and_a_read_launched_first_is_no_race():
    waited = [launch(0, 5, 1), task("W", "kernel", 1, 10, 90, 1), access("mem_write", BUF, 1, 10),
              launch(5, 5, 2), task("EVENT_WAIT", "wait", 2, 20, 80, 2),
              launch(10, 5, 3), task("R", "kernel", 2, 100, 100, 3), access("mem_read", BUF, 3, 100)]
    assert race_pairs(waited) == []
    read_first = [launch(0, 5, 2), task("R", "kernel", 2, 10, 90, 2), access("mem_read", BUF, 2, 10),
                  launch(5, 5, 1), task("W", "kernel", 1, 20, 90, 1), access("mem_write", BUF, 1, 20)]
    assert race_pairs(read_first) == []


def test_races_are_linear_one_check_per_read_and_writing_stream():
    # 3,000 writes on stream 1 and 3,000 reads of the same buffer on stream 2, interleaved and never
    # ordered: each read races with the last write launched before it, and only with it (a
    # pairwise join would hold 4.5M pairs).
    rows, n = [], 3_000
    for i in range(n):
        w, r = 2 * i + 1, 2 * i + 2
        rows += [launch(20 * i, 5, w), task("W", "kernel", 1, 100 + 200 * i, 100, w), access("mem_write", BUF, w, 0),
                 launch(20 * i + 10, 5, r), task("R", "kernel", 2, 200 + 200 * i, 100, r), access("mem_read", BUF, r, 0)]
    got = race_pairs(rows)
    assert len(got) == n and got[:2] == [(1, 2, 1, 2), (3, 4, 1, 2)]


def _allreduce_program(wait: bool):
    """2 ranks: backward writes a gradient bucket on the compute stream, the comm stream
    all-reduces it (in place), the optimizer reads it after the all-reduce."""
    from runtime_emu import Kernel, acl, hccl, topology

    backward = Kernel("Backward", block_ns=140_000, core="cube")
    optimizer = Kernel("AdamW", block_ns=20_000, core="vector")

    def train(rank: int) -> None:
        acl.rt.set_device(rank)
        comm = hccl.comm_init_all()
        compute, comm_s = acl.rt.create_stream(), acl.rt.create_stream()
        grads = acl.rt.malloc(1 << 22)
        ready, reduced = acl.rt.create_event(), acl.rt.create_event()
        for _ in range(3):
            with acl.prof.step():
                acl.rt.launch_kernel(backward, 20, compute, writes=(grads,))
                acl.rt.record_event(ready, compute)
                if wait:
                    acl.rt.stream_wait_event(comm_s, ready)
                hccl.all_reduce(grads, grads, 1 << 20, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, comm_s)
                acl.rt.record_event(reduced, comm_s)
                acl.rt.stream_wait_event(compute, reduced)
                acl.rt.launch_kernel(optimizer, 20, compute, reads=(grads,), writes=(grads,))
                acl.rt.synchronize_stream(compute)

    rt = acl.init(seed=0, topology=topology.server(2))
    rt.run_ranks(train)
    return acl.finalize().trace


def test_a_collective_records_its_buffers_so_an_allreduce_racing_the_backward_is_a_missing_sync():
    racy = _allreduce_program(wait=False)
    kinds = Frames(racy).accesses
    coll = kinds[kinds["corr"].isin(Frames(racy).device_ops.query("kind == 'collective'")["corr"])]
    assert sorted(set(coll["kind"].astype(str))) == ["mem_read", "mem_write"]
    found = [f for f in analyzers.run(racy, ["sync"]).findings if f.code == "MISSING_SYNC"]
    # On each rank the comm stream read the bucket the compute stream was writing: one problem,
    # found on both ranks, one finding with an occurrence per rank.
    assert [(f.rank, f.ranks, f.stream) for f in found] == [(0, [1], 2)]
    assert sorted({(o["rank"], o["stream"]) for o in found[0].occurrences}) == [(0, 2), (1, 2)]
    ordered = _allreduce_program(wait=True)
    assert [f for f in analyzers.run(ordered, ["sync"]).findings if f.code == "MISSING_SYNC"] == []
