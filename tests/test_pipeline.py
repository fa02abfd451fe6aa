"""Pipeline parallelism: the llm-pipeline scenario, the pipeline read from its transfers, the
schedule model, PIPELINE_BUBBLE and the more-micro-batches remedy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import analyzers
from analyzers import Frames
from analyzers.causality import pipeline as pl
from analyzers.causality.replay import Remedy, replay
from msprof_py.whatif_eval import device_span_ns
from runtime_emu import scenarios

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    return {"bad": scenarios.run("llm-pipeline", switches=["pipeline-bubble"], seed=0),
            "good": scenarios.run("llm-pipeline", seed=0),
            "1f1b": scenarios.run("llm-pipeline", switches=["pipeline-bubble"], seed=0, schedule="1f1b"),
            "two": scenarios.run("llm-pipeline", seed=0, ranks=2)}


# ---------------------------------------------------------------- the schedule model, by hand
@pytest.mark.parametrize("work, fwd, bwd, m, k, schedule, span", [
    # Two stages, one micro-batch of 100 ns forward and 200 ns backward each: F0 F1 B1 B0.
    ([300, 300], [0, 0], [0, 0], 1, 1, "gpipe", 600),
    # Two micro-batches of half the work: (K + P - 1) (f + b) = 3 x 150.
    ([300, 300], [0, 0], [0, 0], 1, 2, "gpipe", 450),
    ([300, 300], [0, 0], [0, 0], 1, 2, "1f1b", 450),
    # A 10 ns transfer into stage 1 forward and into stage 0 backward.
    ([300, 300], [0, 10], [10, 0], 1, 1, "gpipe", 620),
    # Three stages, three micro-batches: 5 x 100.
    ([300, 300, 300], [0, 0, 0], [0, 0, 0], 1, 3, "gpipe", 500),
    # The slowest stage sets the pace: stage 1 takes 600 per micro-batch.
    ([300, 600], [0, 0], [0, 0], 1, 2, "gpipe", 50 + 100 + 100 + 200 + 200 + 100),
])
def test_the_schedule_model_times_a_pipeline_as_worked_out_by_hand(work, fwd, bwd, m, k, schedule, span):
    got = pl.schedule_ns(np.array(work, float), np.array(fwd, float), np.array(bwd, float), m, k, schedule)
    assert got == span


def test_one_forward_one_backward_runs_the_warm_up_then_alternates():
    assert pl._orders(3, 4, "1f1b") == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]]
    from runtime_emu.scenarios.llm_pipeline import units
    assert [units("1f1b", 3, s, 4) for s in range(3)] == pl._orders(3, 4, "1f1b")
    assert units("gpipe", 3, 1, 2) == pl._orders(3, 2, "gpipe")[1]


# ---------------------------------------------------------------- the scenario and its ground truth
def test_the_scenario_records_one_bubble_per_stage_and_stage_layers_balance_the_head(runs):
    from runtime_emu.scenarios.llm_pipeline import stage_layers

    assert stage_layers(7, 4) == [2, 2, 2, 1] and stage_layers(11, 4) == [3, 3, 3, 2] and stage_layers(3, 2) == [2, 1]
    problems = runs["bad"].ground_truth["problems"]
    assert sorted(p["where"]["rank"] for p in problems) == [0, 1, 2, 3]
    assert {p["problem"] for p in problems} == {"pipeline-bubble"}
    assert {(p["expected"]["micro_batches"], p["expected"]["stages"], p["expected"]["bubble_share"])
            for p in problems} == {(4, 4, 0.4286)}
    assert runs["good"].ground_truth["problems"] == []


@pytest.mark.parametrize("params, message", [
    (["micro_batches=5"], "batch (16) must be a multiple of the micro-batches (5)"),
    (["schedule=zigzag"], "schedule"),
    (["layers=2"], "layers must be at least 3 for 4 stages, got 2"),
])
def test_emulate_refuses_a_pipeline_it_cannot_run_in_one_line(tmp_path, params, message):
    args = [str(Path(sys.executable).with_name("msprof-py")), "emulate", "llm-pipeline", "-o", str(tmp_path / "x")]
    for p in params:
        args += ["--param", p]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


# ---------------------------------------------------------------- the pipeline read from the trace
def test_the_pipeline_is_read_from_the_transfers(runs):
    (bad,) = pl.find(Frames(runs["bad"].trace))
    assert (bad.stages, bad.micro_batches, bad.schedule) == ((0, 1, 2, 3), 4, "gpipe")
    assert round(bad.bubble_share, 4) == 0.4286 and sorted(bad.steps["step"].unique()) == [0, 1]
    (good,) = pl.find(Frames(runs["good"].trace))
    assert (good.micro_batches, good.schedule) == (16, "gpipe")
    (one,) = pl.find(Frames(runs["1f1b"].trace))
    assert (one.micro_batches, one.schedule) == (4, "1f1b")
    (two,) = pl.find(Frames(runs["two"].trace))
    assert (two.stages, two.micro_batches) == ((0, 1), 16)
    # Each stage receives forward from the one before, backward from the one after.
    st = bad.steps
    assert (st.loc[st["stage"] == 0, "fwd_ns"] == 0).all() and (st.loc[st["stage"] == 3, "bwd_ns"] == 0).all()
    assert (st.loc[st["stage"].isin([1, 2]), ["fwd_ns", "bwd_ns"]] > 0).all().all()


def test_a_data_parallel_job_is_no_pipeline():
    trace = scenarios.run("bert-train-dp", seed=0, steps=1, ranks=2).trace
    assert pl.find(Frames(trace)) == []


# ---------------------------------------------------------------- the finding and its fix
def test_pipeline_bubble_costs_what_more_micro_batches_save_and_is_no_slow_rank(runs):
    frames = Frames(runs["bad"].trace)
    res = analyzers.run(runs["bad"].trace)
    (f,) = [f for f in res.findings if f.code == "PIPELINE_BUBBLE"]
    saving = int(pl.savings(pl.find(frames)[0], 16)["saving_ns"].sum())
    assert f.lost_ns == saving and f.severity == analyzers.Severity.CRITICAL
    assert (f.rank, sorted(f.ranks)) == (0, [1, 2, 3]) and [o["rank"] for o in f.occurrences] == [0, 1, 2, 3]
    assert "4 micro-batches per step (gpipe)" in f.message and "16 micro-batches instead of 4" in f.message
    # A receiver waiting for its sender is the pipeline's dependency, not a straggler.
    assert not [f for f in res.findings if f.code == "SLOW_RANK"]
    good = [f for f in analyzers.run(runs["good"].trace).findings if f.code == "PIPELINE_BUBBLE"]
    assert [(f.severity, f.lost_ns) for f in good] == [(analyzers.Severity.INFO, 0)]


def test_more_micro_batches_predict_the_real_fix_and_fewer_save_nothing(runs):
    bad, good = runs["bad"].trace, runs["good"].trace
    frames = Frames(bad)
    r = replay(frames, [Remedy.parse("microbatches=16")])
    real = device_span_ns(bad) - device_span_ns(good)
    assert real > 100_000_000 and abs(r.saving_ns - real) <= 0.05 * real
    assert r.new_span_ns == r.span_ns - r.saving_ns
    # Every stage's last kernel moved up: the first stage's (the step's end) by the saving, the
    # others' (inside the last step's drain) by most of it.
    old, new = bad.table.to_pandas(), r.trace.table.to_pandas()
    k = old["kind"] == "kernel"
    moved = (old["ts"] + old["dur"])[k].groupby(old["rank"][k]).max() \
        - (new["ts"] + new["dur"])[k].groupby(new["rank"][k]).max()
    assert moved[0] == r.saving_ns and (moved <= r.saving_ns).all() and (moved > 0.8 * r.saving_ns).all()
    assert replay(frames, [Remedy("microbatches", 2)]).saving_ns == 0
    assert replay(Frames(good), [Remedy("microbatches")]).saving_ns == 0  # already 4 per stage


# ---------------------------------------------------------------- the pipeline view (stage x micro-batch)
def test_the_view_shows_the_fill_and_drain_per_stage_and_micro_batch(runs):
    v = pl.view(pl.own_transfers(Frames(runs["bad"].trace)))
    # 4 micro-batches, 2 steps: 3 forward and 3 backward hand-overs of 4 each per step.
    assert len(v) == 48 and sorted(v["stage"].unique()) == [0, 1, 2, 3]
    assert set(v.loc[v["direction"] == "forward", "stage"]) == {1, 2, 3}
    assert set(v.loc[v["direction"] == "backward", "stage"]) == {0, 1, 2}
    assert (v["peer"] == np.where(v["direction"] == "forward", v["stage"] - 1, v["stage"] + 1)).all()
    mean = v.groupby(["stage", "direction", "micro_batch"])["waited_ns"].mean()
    for s in (1, 2, 3):  # the fill: only the first micro-batch waits, longer the deeper the stage
        assert mean[s, "forward", 0] > 10_000_000 and max(mean[s, "forward", j] for j in (1, 2, 3)) < 10_000
    assert mean[3, "forward", 0] > mean[2, "forward", 0] > mean[1, "forward", 0]
    # The drain: the backward's first hand-over waits longest at the first stage.
    assert mean[0, "backward", 0] > mean[1, "backward", 0] > mean[2, "backward", 0] > 10_000_000
    assert (v["transfer_ns"] > 0).all()
    assert pl.view(pl.own_transfers(Frames(scenarios.run("bert-train-dp", seed=0, steps=1, ranks=2).trace))).empty


def test_cluster_prints_the_pipeline_view_partition_by_partition_as_from_the_whole_trace(runs, tmp_path):
    from msprof_py import cluster, report

    trace = runs["bad"].trace
    got = cluster.analyze(report.split_by_rank(trace))["pipeline"]
    assert got == pl.view_cells(pl.view(pl.own_transfers(Frames(trace))))
    assert len(got) == 24 and got[0] == {**got[0], "stage": 0, "rank": 0, "direction": "backward",
                                         "micro_batch": 0, "peer": 1, "steps": 2}
    runs["bad"].save(tmp_path / "run")
    res = subprocess.run([str(Path(sys.executable).with_name("msprof-py")), "cluster", str(tmp_path / "run" / "trace")],
                         capture_output=True, text=True, timeout=300, env={"COLUMNS": "250", "PATH": ""})
    assert res.returncode == 0, res.stderr
    assert "pipeline: each stage's wait for its neighbour's hand-over" in res.stdout
    assert "forward (r2)" in res.stdout and "backward (r1)" in res.stdout


def test_a_send_and_its_receive_are_one_op_in_communication_json_and_the_matrix(runs):
    from msprof_py import communication
    from msprof_py.summaries import Rows

    rows = Rows(runs["bad"].trace)
    comm, matrix = communication.summaries(rows)
    # Named by their pair, as a collective by its members: the matrix has both directions of
    # every neighbour pair, 4 micro-batches x 2 steps, each 4 sequences x 2048 tokens x 2048
    # bf16 values (32 MiB, as the link counters integrate it to within bytes).
    links: dict[str, list[float]] = {}
    for steps in matrix.values():
        for kinds in steps.values():
            assert not kinds["collective"]
            for op, pairs in kinds["p2p"].items():
                assert op.split("@")[1] in ("0-1", "1-2", "2-3")
                for pair, link in pairs.items():
                    links.setdefault(pair, []).append(link["Transit Size(MB)"])
    assert sorted(links) == ["0-1", "1-0", "1-2", "2-1", "2-3", "3-2"]
    assert all(v == [pytest.approx(32.0, abs=1e-4)] * 8 for v in links.values())
    assert set(comm["0"]["step0"]["p2p"]) == {f"hcom_send__{k}@0-1" for k in range(4)} | {
        f"hcom_receive__{k}@0-1" for k in range(4)}
