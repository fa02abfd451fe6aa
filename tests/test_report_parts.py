"""The report of a trace in rank partitions (`report --engine dask`, msprof_py.report_parts): built from
each partition's pieces and the driver's bounded read, it is the whole-trace report exactly when the
trace fits the driver's budget, and names the steps its fixes were replayed on when it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzers import Frames
from analyzers.causality.replay import replay
from msprof_py import loading, report, report_parts, summaries

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "emulated"
REAL = ROOT.parent / "shared" / "real_traces"


def _whole(path) -> dict:
    return report._strict(report.build(loading.load_any(path, analysis_only=True)))


@pytest.fixture
def rank_by_rank(monkeypatch):
    """The local engine's batches hold one rank each, as Dask's tasks do: every figure is reduced
    from per-rank pieces."""
    monkeypatch.setattr(report, "LOCAL_BATCH_ROWS", 1)


@pytest.mark.parametrize("sample", ["llm-pipeline-bubble", "bert-train-dp-slow-rank", "llm-train-2server-slow-link"])
def test_a_partitioned_report_is_the_whole_trace_report(sample, rank_by_rank):
    path = SAMPLES / sample / "trace"
    parts = report.rank_partitions(path)
    assert len(parts) > 1
    got = report_parts.build(parts, engine="local")
    whole = _whole(path)
    assert got == whole
    assert got["summary"]["steps"] == whole["summary"]["steps"] and got["timelines"] and got["critical_path"]["job"]


@pytest.mark.parametrize("real", ["kineto/dlrm_8rank", "ascend/resnet_2rank_level1_text"])
def test_a_real_job_split_by_rank_reports_as_the_whole_trace(real, rank_by_rank):
    trace = loading.load_any(REAL / real, analysis_only=True)
    got = report_parts.build(report.split_by_rank(trace), engine="local")
    assert got == report._strict(report.build(trace))


def test_the_driver_reads_a_window_of_middle_steps_when_the_trace_exceeds_its_budget(rank_by_rank):
    path = SAMPLES / "bert-train-dp-slow-rank" / "trace"
    parts = report.rank_partitions(path)
    whole = _whole(path)
    rows = whole["summary"]["events"]
    ranks = summaries.rank_steps(Frames(loading.load_any(path, analysis_only=True)).steps)
    assert report_parts.driver_window(ranks, rows, rows) is None  # fits: the whole trace
    t0, t1, steps, scale = report_parts.driver_window(ranks, rows, 16_000)
    assert steps == [1] and scale > 2.9
    assert report_parts.driver_trace(parts, (t0, t1, steps, scale)).table.num_rows <= 16_000

    got = report_parts.build(parts, engine="local", driver_rows=16_000)
    assert got["skipped"]["what_if"] == (
        f"the fixes were replayed on job steps 1..1 of 3 (the trace's {rows:,} rows are more than the driver "
        "reads, 16,000); savings scaled by the run's job-step time over theirs")
    window = {"steps": [1, 1], "of_steps": 3, "start_ns": t0, "end_ns": t1}
    assert got["critical_path"]["window"] == window
    fixed = [f for f in got["findings"] if f.get("what_if")]
    assert fixed and all(f["what_if"]["window"] == window for f in fixed)
    # What the pieces give does not depend on the driver's read.
    for key in ("summary", "devices", "streams", "copies", "breakdown", "job_steps", "step_table", "unmapped"):
        assert got[key] == whole[key], key
    # The straggler, replayed on one step and scaled to three, is still the top finding, and its
    # saving within 10% of the whole run's replay.
    top, ref = got["findings"][0], whole["findings"][0]
    assert (top["code"], top["severity"], ref["code"]) == ("SLOW_RANK", "critical", "SLOW_RANK")
    assert abs(top["what_if"]["saving_ns"] / ref["what_if"]["saving_ns"] - 1) <= 0.10


def test_a_window_whose_kernels_lost_their_launches_replays_as_recorded():
    # The window's first kernels have no launch call before them (it ran before the window): their
    # start nodes are roots of the graph, and still go to their cores.
    path = SAMPLES / "bert-train-dp-slow-rank" / "trace"
    parts = report.rank_partitions(path)
    trace = loading.load_any(path, analysis_only=True)
    window = report_parts.driver_window(summaries.rank_steps(Frames(trace).steps), trace.table.num_rows, 16_000)
    r = replay(Frames(report_parts.driver_trace(parts, window)))
    assert r.moved == 0 and r.new_span_ns == r.span_ns
