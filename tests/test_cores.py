"""Core contention and under-occupancy (analyzers.cores, analyzers.causality.contention): hand-built
tables with exact answers, and user-style programs whose costs are checked against the real fix
(the same program fixed, profiled, and timed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import analyzers
from analyzers import Frames, Severity
from analyzers.causality.contention import MIN_KERNEL_NS, TURNAROUND_NS, _alone, core_waits, under_occupancy
from analyzers.causality.critical_path import critical_path
from msprof_py import prof_dir
from tests.test_causality import launch, table

ROOT = Path(__file__).resolve().parents[1]
MSPROF = str(Path(sys.executable).parent / "msprof-py")


def kernel(name, stream, ts, dur, corr, blocks=None, cores=None):
    return {"ph": "X", "name": name, "kind": "kernel", "pid": 9, "tid": stream, "ts": ts, "dur": dur, "corr": corr,
            "device": 0, "stream": stream, "value": blocks, "addr": cores}


def test_time_alone_is_each_interval_less_the_time_others_overlap_it():
    ts = np.array([0, 50, 100, 300])
    end = np.array([100, 80, 200, 310])
    # [0, 50) alone, [50, 80) shared, [80, 100) alone -> 70; [50, 80) all shared -> 0;
    # [100, 200) alone (the first ended at 100) -> 100; [300, 310) -> 10.
    assert _alone(ts, end).tolist() == [70, 0, 100, 10]


def test_a_ready_kernel_waiting_behind_a_saturating_kernel_of_another_stream_waits_for_cores():
    # B (stream 2, 20 blocks on 20 cores) runs 0-500 us. A (stream 1) is launched 10-15 us and
    # starts at 500 us: ready at 15 us, the turnaround's 5 us is the device's, the rest waited
    # for B's cores: 500 - 20 = 480 us.
    rows = [launch(0, 5_000, 1), kernel("Big", 2, 6_000, 494_000, 1, 20, 20),
            launch(10_000, 5_000, 2), kernel("Small", 1, 500_000, 50_000, 2, 20, 20)]
    w = core_waits(Frames(table(rows)))
    assert w[["stream", "name", "ready", "contended_ns", "holder"]].values.tolist() == [
        [1, "Small", 15_000, 500_000 - 15_000 - TURNAROUND_NS, 2]]


def test_no_wait_for_cores_without_a_saturating_kernel_or_without_the_core_count():
    # The same timing with B using half the cores (its blocks leave room), or with no core count
    # recorded: nothing says the cores were full, so no contention is claimed.
    for big in ((10, 20), (20, None)):
        rows = [launch(0, 5_000, 1), kernel("Big", 2, 6_000, 494_000, 1, *big),
                launch(10_000, 5_000, 2), kernel("Small", 1, 500_000, 50_000, 2, 20, 20)]
        assert core_waits(Frames(table(rows))).empty, big


def test_contention_on_the_critical_path_is_its_own_cause_and_the_path_still_sums_to_its_region():
    rows = [launch(0, 5_000, 1), kernel("Big", 2, 6_000, 494_000, 1, 20, 20),
            launch(10_000, 5_000, 2), kernel("Small", 1, 500_000, 50_000, 2, 20, 20)]
    cp = critical_path(Frames(table(rows)), 0)
    blame = cp.blame()
    assert int(blame.sum()) == cp.region_ns
    # Small hangs off its launch (10 us call); the wait past ready + turnaround is contention.
    seg = cp.segments
    assert seg.loc[seg["cause"] == "contention", ["name", "weight_ns"]].values.tolist() == [["Small", 480_000]]


def test_under_occupancy_counts_idle_cores_while_the_kernel_runs_alone_and_keeps_a_minimal_kernel_time():
    rows = [launch(0, 1_000, 1), kernel("Narrow", 1, 10_000, 100_000, 1, 4, 20),  # alone: 100 us x 80%
            launch(1_000, 1_000, 2), kernel("Tail", 1, 200_000, 100_000, 2, 30, 20),  # 2 waves, 30 of 40 used
            launch(2_000, 1_000, 3), kernel("Tiny", 1, 400_000, 4_000, 3, 1, 20)]  # below the minimal time
    f = Frames(table(rows))
    ascend = under_occupancy(f, True)
    assert ascend[["name", "saving_ns"]].values.tolist() == [["Narrow", 80_000], ["Tail", 25_000]]
    # Where a core runs several blocks at once, a wave's tail is no evidence: only b < c counts.
    assert under_occupancy(f, False)[["name", "saving_ns"]].values.tolist() == [["Narrow", 80_000]]
    assert MIN_KERNEL_NS > 4_000


def test_the_cores_analyzer_says_why_it_is_skipped_when_kernels_carry_no_shape():
    rows = [launch(0, 1_000, 1), kernel("K", 1, 10_000, 100_000, 1)]
    r = analyzers.run(table(rows), names=["cores"])
    assert r.findings == [] and "no kernel records its blocks" in r.skipped["cores"]


# ---------------------------------------------------------------- programs and their fixes
def _profile(app: str, out: Path):
    subprocess.run([MSPROF, f"--application=python tests/apps/{app}.py", f"--output={out}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    trace = prof_dir.read_raw(prof_dir.prof_dirs(out)[-1])
    df = trace.table.to_pandas()
    steps = df[df["kind"] == "step"]
    return trace, int((steps["ts"] + steps["dur"]).max() - steps["ts"].min())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cores")
    return {app: _profile(app, base / app) for app in
            ("core_starvation", "core_priority_twin", "narrow_kernels", "wide_kernels")}


def _top(trace, code):
    fs = [f for f in analyzers.run(trace).ranked() if f.code == code]
    return fs[0] if fs else None


def test_a_starved_decode_stream_is_critical_core_contention_and_its_cost_predicts_the_fix(runs):
    (starved, loop), (fixed, loop_fixed) = runs["core_starvation"], runs["core_priority_twin"]
    f = _top(starved, "CORE_CONTENTION")
    top = analyzers.run(starved).ranked()[0]
    assert top.code == "CORE_CONTENTION" and top.stream == 2 and f.severity == Severity.CRITICAL
    assert (f.value, f.lost_ns) == (3_772_000, 2_880_000) and "held by stream 1" in f.message
    # Preemption (the twin) gives the decode kernels the cores at the next block boundary: the
    # loop gets faster by about the cost (the part of the waits past the blocks already running).
    measured = loop - loop_fixed
    assert measured == 2_616_000 and abs(f.lost_ns - measured) <= 0.2 * measured
    # A wait inside the wave already running is latency no priority recovers: the healthy
    # training loop's forward waiting for the optimizer's single wave costs nothing.
    g = _top(fixed, "CORE_CONTENTION")
    assert g.lost_ns < f.lost_ns


def test_narrow_kernels_are_critical_under_occupancy_and_the_saving_is_what_one_block_per_core_gives(runs):
    (narrow, loop), (wide, loop_wide) = runs["narrow_kernels"], runs["wide_kernels"]
    f = _top(narrow, "UNDER_OCCUPANCY")
    assert f.severity == Severity.CRITICAL and "FlashAttentionScore (4 blocks on 20 cores, 20.0% used)" in f.message
    assert f.lost_ns == loop - loop_wide == 7_680_000
    assert _top(wide, "UNDER_OCCUPANCY") is None
