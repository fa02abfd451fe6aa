"""The critical path (analyzers.causality.critical_path): its length agrees with Holistic Trace
Analysis' critical_path_analysis on the shared traces HTA ships for it; on every shared real
trace and every scenario it is a chain forward in time whose causes sum to the region; and on
hand-built tables it is the exact chain of releases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzers import Frames
from analyzers.causality.critical_path import CP_CAUSES, EDGE_TYPES, critical_path, step_paths
from msprof_py.trace.importers import import_trace
from runtime_emu import scenarios
from tests.conftest import REAL_TRACES
from tests.test_causality import REAL, launch, table, task

#: HTA 0.5's figures on the same files, computed by tests/data/make_hta_critical_path.py in an
#: environment with pandas < 3 (HTA's critical path analysis fails with pandas 3).
HTA = json.loads((Path(__file__).parent / "data" / "hta_critical_path.json").read_text())["traces"]


@pytest.mark.parametrize("name", sorted(HTA))
def test_path_length_agrees_with_hta_within_one_percent(real_traces, name):
    cp = critical_path(Frames(import_trace(real_traces / "kineto" / f"{name}.json.gz")), 0)
    ours_us = cp.length_ns / 1_000  # the table is in ns, the trace (and HTA's figures) in us
    assert abs(ours_us - HTA[name]["length"]) <= 0.01 * HTA[name]["length"], (ours_us, HTA[name]["length"])


def test_event_sync_trace_matches_hta_edge_by_edge_type(real_traces):
    """cudaEventQuery carries CUPTI's Event Sync record: a sync whose wait is the device's, as HTA counts it."""
    cp = critical_path(Frames(import_trace(real_traces / "kineto" / "event_sync_multi_stream.json.gz")), 0)
    theirs = HTA["event_sync_multi_stream"]["by_edge_type"]
    assert {k: v // 1_000 for k, v in cp.by_edge().items()} == {
        e: theirs.get(f"critical_path_{e}", 0) for e in EDGE_TYPES}
    assert cp.length_ns == 1_178_000


def check_path(cp) -> None:
    s = cp.segments
    blame = cp.blame()
    assert list(blame.index) == list(CP_CAUSES)
    assert int(blame.sum()) == cp.region_ns  # conserved: the causes sum to the region exactly
    assert blame["untraced"] >= 0 and (blame >= 0).all()
    assert cp.length_ns <= cp.region_ns
    if len(s):
        ts, end, w = s["ts"].to_numpy(), s["end"].to_numpy(), s["weight_ns"].to_numpy()
        assert (end[:-1] == ts[1:]).all()  # one chain: each edge starts where the one before ended
        assert ((w >= 0) & (w <= end - ts)).all()  # forward in time, never more than its span
        assert ts[0] >= cp.start and end[-1] <= cp.end


@pytest.mark.parametrize("name", REAL)
def test_the_path_is_a_forward_chain_whose_causes_sum_to_the_region_on_every_real_trace(real_traces, name):
    frames = Frames(import_trace(real_traces / name))
    for rank in np.unique(frames.table.column("rank").to_numpy()):
        check_path(critical_path(frames, int(rank)))


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_the_path_is_a_forward_chain_on_every_scenario_and_per_step(name):
    spec = scenarios.SCENARIOS[name]
    result = scenarios.run(name, seed=1, steps=2) if spec.multi_rank else scenarios.run(name, seed=1)
    frames = Frames(result.trace)
    for rank in np.unique(frames.table.column("rank").to_numpy()):
        cp = critical_path(frames, int(rank))
        check_path(cp)
        # An emulated run is the device's work: the path is mostly device time.
        device = sum(int(cp.blame()[c]) for c in ("compute", "copy", "collective"))
        assert device >= 0.5 * cp.length_ns, cp.blame().to_dict()
        for _step, sp in step_paths(frames, int(rank)):
            check_path(sp)


# ---------------------------------------------------------------- hand-built tables
def call(name, kind, ts, dur):
    """A host call with no device work of its own."""
    return {"ph": "X", "name": name, "kind": kind, "ts": ts, "dur": dur}


def path(rows):
    return critical_path(Frames(table(rows)), 0)


def chain(cp) -> list[tuple[int, int, str, str]]:
    return [(int(r.ts), int(r.end), r.cause, r.name) for r in cp.segments.itertuples() if r.weight_ns > 0]


def test_a_full_queue_is_device_bound_the_path_runs_through_the_kernels():
    rows = [launch(0, 10, 1), task("K1", "kernel", 1, 20, 100, 1),
            launch(10, 10, 2), task("K2", "kernel", 1, 125, 100, 2),
            launch(20, 10, 3), task("K3", "kernel", 1, 230, 100, 3),
            launch(30, 10, 4), task("K4", "kernel", 1, 335, 100, 4)]
    cp = path(rows)
    assert chain(cp) == [(0, 20, "launch", "K1"), (20, 120, "compute", "K1"), (120, 125, "dispatch", "K2"),
                         (125, 225, "compute", "K2"), (225, 230, "dispatch", "K3"), (230, 330, "compute", "K3"),
                         (330, 335, "dispatch", "K4"), (335, 435, "compute", "K4")]
    assert cp.length_ns == 435 and cp.blame()["untraced"] == 0


def test_a_host_bound_loop_the_path_runs_through_the_host_work_between_launches():
    rows = [call("next_batch", "data_load", 0, 1000),
            launch(1000, 10, 1), task("K1", "kernel", 1, 1020, 50, 1),
            call("next_batch", "data_load", 1100, 1000),
            launch(2100, 10, 2), task("K2", "kernel", 1, 2120, 50, 2)]
    cp = path(rows)
    assert chain(cp) == [(0, 1000, "data", "next_batch"), (1000, 1010, "launch", "launch"),
                         (1100, 2100, "data", "next_batch"), (2100, 2120, "launch", "K2"), (2120, 2170, "compute", "K2")]
    b = cp.blame()
    assert (b["data"], b["launch"], b["compute"], b["untraced"]) == (2000, 30, 50, 90)


#: K2 on stream 2 was launched at 40, after a stream-wait call; it starts as K1 on stream 1 ends.
STREAM_WAIT = [launch(0, 10, 1), task("K1", "kernel", 1, 10, 500, 1), call("cudaEventRecord", "api", 20, 5),
               call("cudaStreamWaitEvent", "wait", 30, 5), launch(40, 10, 2), task("K2", "kernel", 2, 515, 100, 2)]
#: The host synchronizes on K1, preprocesses, launches K2.
SYNC_THEN_WORK = [launch(0, 10, 1), task("K1", "kernel", 1, 20, 500, 1), call("cudaStreamSynchronize", "sync", 15, 510),
                  call("preprocess", "host_work", 530, 500), launch(1030, 10, 2), task("K2", "kernel", 1, 1050, 50, 2)]


@pytest.mark.parametrize("rows, expected, edges", [
    pytest.param(STREAM_WAIT, [(0, 10, "launch", "K1"), (10, 510, "compute", "K1"), (515, 615, "compute", "K2")],
                 ["kernel_launch_delay", "operator", "sync_dependency", "operator"],
                 id="a stream wait goes through the other stream's task"),
    # The sync's wait weighs nothing; the kernel it waited for does, through the sync edge.
    pytest.param(SYNC_THEN_WORK, [(0, 20, "launch", "K1"), (20, 520, "compute", "K1"),
                                  (530, 1030, "data", "preprocess"), (1030, 1050, "launch", "K2"),
                                  (1050, 1100, "compute", "K2")],
                 ["kernel_launch_delay", "operator", "sync_dependency", "dependency", "operator", "dependency",
                  "kernel_launch_delay", "operator"],
                 id="a synchronize's wait weighs nothing, the kernel it waited for does"),
])
def test_waits_are_crossed_by_zero_weight_edges_to_what_released_them(rows, expected, edges):
    cp = path(rows)
    assert chain(cp) == expected
    assert list(cp.segments["edge"]) == edges


def test_without_the_stream_wait_call_the_launch_delay_is_the_release():
    no_wait = path([r for r in STREAM_WAIT if r["name"] != "cudaStreamWaitEvent"])
    assert chain(no_wait)[-2:] == [(40, 515, "launch", "K2"), (515, 615, "compute", "K2")]


def test_steps_each_get_their_own_path():
    rows = [{"ph": "X", "name": "ProfilerStep#1", "kind": "step", "step": 1, "ts": 0, "dur": 300},
            launch(0, 10, 1), task("K1", "kernel", 1, 20, 200, 1),
            {"ph": "X", "name": "ProfilerStep#2", "kind": "step", "step": 2, "ts": 300, "dur": 300},
            launch(300, 10, 2), task("K2", "kernel", 1, 320, 100, 2)]
    got = [(step, sp.length_ns, sp.region_ns) for step, sp in step_paths(Frames(table(rows)), 0)]
    assert got == [(1, 220, 300), (2, 120, 300)]


# ---------------------------------------------------------------- the command
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "msprof_py.cli", *args], capture_output=True, text=True)


def test_cli_prints_the_path_as_json_and_rejects_a_missing_rank_or_step():
    trace = str(REAL_TRACES / "kineto" / "event_sync_multi_stream.json.gz")
    ok = run_cli("critical-path", trace, "--json", "--top", "3")
    assert ok.returncode == 0, ok.stderr
    got = json.loads(ok.stdout)
    r = got["ranks"][0]
    assert (r["rank"], r["length_ns"], got["longest_rank"]) == (0, 1_178_000, 0)
    assert sum(r["blame_ns"].values()) == r["region_ns"]
    assert [o["name"] for o in r["top_ops"]] == ["cudaMalloc", "aten::mm", "ampere_sgemm_128x64_nn"]
    bad = run_cli("critical-path", trace, "--rank", "3")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "msprof-py: error: no rank 3 in the trace (its ranks are 0)\n"
    bad = run_cli("critical-path", trace, "--step", "7")
    assert bad.returncode == 2
    assert bad.stderr == "msprof-py: error: rank 0 has no step 7 (the trace records no steps; leave out --step)\n"


def test_a_delay_past_the_launch_and_dispatch_is_unexplained_not_launch_overhead():
    # K1 is launched at 0 (a 10 us call) and starts 1 ms later with nothing recorded in between:
    # the launch accounts for its call and one dispatch latency (50 us), the rest is unexplained.
    us = 1_000
    rows = [launch(0, 10 * us, 1), task("K1", "kernel", 1, 1_000 * us, 100 * us, 1),
            launch(20 * us, 10 * us, 2), task("K2", "kernel", 1, 1_300 * us, 100 * us, 2)]
    cp = path(rows)
    assert chain(cp) == [(0, 60 * us, "launch", "K1"), (60 * us, 1_000 * us, "unexplained", "K1"),
                         (1_000 * us, 1_100 * us, "compute", "K1"), (1_100 * us, 1_150 * us, "dispatch", "K2"),
                         (1_150 * us, 1_300 * us, "unexplained", "K2"), (1_300 * us, 1_400 * us, "compute", "K2")]
    check_path(cp)
    assert cp.length_ns == 1_400 * us  # the length is HTA's: only the blame is split


def test_per_step_names_the_slow_rank_the_others_waited_for():
    """bert-train-dp-slow-rank: rank 3's kernels run 1.4x as long and the other ranks wait for it in
    Notify_Wait. A wait weighs nothing on the path, so rank 3's path is the longest in every step,
    by about the others' wait; on the healthy sample the ranks' paths are within 0.5% of each other."""
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "emulated"
    slow = run_cli("critical-path", str(sample / "bert-train-dp-slow-rank"), "--per-step", "--json")
    assert slow.returncode == 0, slow.stderr
    steps = json.loads(slow.stdout)["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2] and {s["longest_rank"] for s in steps} == {3}
    for s in steps:
        by_rank = {r["rank"]: r["length_ns"] for r in s["ranks"]}
        others = max(v for k, v in by_rank.items() if k != 3)
        assert by_rank[3] - others > 0.15 * by_rank[3]
    healthy = json.loads(run_cli("critical-path", str(sample / "bert-train-dp"), "--per-step", "--json").stdout)
    for s in healthy["steps"]:
        lengths = [r["length_ns"] for r in s["ranks"]]
        assert max(lengths) - min(lengths) < 0.005 * max(lengths)


def test_per_step_needs_steps_and_contradicts_step():
    trace = str(REAL_TRACES / "kineto" / "event_sync_multi_stream.json.gz")
    bad = run_cli("critical-path", trace, "--per-step")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "msprof-py: error: the trace records no steps (leave out --per-step for the whole run)\n"
    bad = run_cli("critical-path", trace, "--per-step", "--step", "1")
    assert bad.returncode == 2
    assert bad.stderr == "msprof-py: error: --per-step contradicts --step; give one of them\n"
