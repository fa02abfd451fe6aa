"""One finding per problem across the ranks of a job (analyzers.grouping)."""

from __future__ import annotations

import pytest

import analyzers
from analyzers import Finding, Severity
from analyzers.grouping import group_across_ranks, job_loss, rank_text


def _f(rank, lost, *, code="BUBBLE_DATA", occ=(), stream=1, ts=0, dur=10, sev=Severity.INFO, ranks=(),
       lost_bytes=None, evidence=()):
    return Finding(code=code, severity=sev, title="Device idle: data", message=f"rank {rank}: idle", rank=rank,
                   device=rank, stream=stream, ts_ns=ts, dur_ns=dur, lost_ns=lost, lost_bytes=lost_bytes,
                   occurrences=[dict(o) for o in occ], ranks=list(ranks), evidence=[dict(e) for e in evidence])


def test_rank_text_runs():
    assert rank_text([7, 0, 1, 2, 3, 5, 8]) == "0-3, 5, 7-8"
    assert rank_text([4]) == "4"


def test_one_rank_and_cross_rank_findings_stay_as_they_are():
    one = _f(3, 100)
    straggler = _f(2, 50, code="SLOW_RANK", ranks=[0, 1])
    nowhere = Finding(code="LOW_OVERLAP", severity=Severity.INFO, title="t", message="m")
    out = group_across_ranks([one, straggler, nowhere])
    assert out == [one, straggler, nowhere]


def test_same_step_on_several_ranks_costs_the_job_the_worst_rank_once():
    a = _f(0, 30, occ=[{"step": 0, "ts_ns": 0, "dur_ns": 10, "lost_ns": 10},
                       {"step": 1, "ts_ns": 100, "dur_ns": 20, "lost_ns": 20}], evidence=[{"ts": 5, "dur": 1}])
    b = _f(1, 45, occ=[{"step": 0, "ts_ns": 2, "dur_ns": 40, "lost_ns": 40},
                       {"step": 1, "ts_ns": 101, "dur_ns": 5, "lost_ns": 5}], sev=Severity.WARNING,
           evidence=[{"ts": 9, "dur": 2}])
    other = _f(1, 7, code="BUBBLE_COPY")
    (g, o) = group_across_ranks([a, other, b])
    assert o is other  # its own problem, on one rank
    # step 0: max(10, 40); step 1: max(20, 5)
    assert g.lost_ns == 60
    assert (g.rank, g.ranks, g.severity) == (1, [0], Severity.WARNING)  # the costliest rank leads
    assert [(x["rank"], x["step"], x["lost_ns"]) for x in g.occurrences] == [
        (0, 0, 10), (1, 0, 40), (0, 1, 20), (1, 1, 5)]
    assert all(x["device"] == x["rank"] and x["stream"] == 1 for x in g.occurrences)
    assert [e["rank"] for e in g.evidence] == [1, 0]
    assert (g.ts_ns, g.dur_ns) == (0, 10)
    assert g.message.startswith("on 2 ranks (0-1); the costliest, rank 1: idle; the job loses")


def test_without_steps_overlapping_occurrences_count_once_and_disjoint_ones_add():
    a = _f(0, 10, ts=0, dur=10)
    b = _f(1, 8, ts=5, dur=10)       # overlaps a: the stretch costs max(10, 8)
    c = _f(2, 4, ts=100, dur=10)     # alone: adds
    d = _f(2, 3, ts=200, dur=10)     # rank 2 again, alone: adds
    g, = group_across_ranks([a, b, c, d])
    assert g.lost_ns == 10 + 4 + 3
    assert g.ranks == [1, 2] and g.rank == 0


def test_a_member_whose_occurrences_do_not_carry_its_cost_counts_whole():
    a = _f(0, 50, ts=0, dur=100, occ=[{"ts_ns": 0, "dur_ns": 5}])  # occurrences without a cost
    b = _f(1, 20, ts=10, dur=10)
    assert job_loss(group_across_ranks([a, b])[0].occurrences, [a, b]) == 50


def test_memory_cost_is_the_largest_device_s():
    a = _f(0, None, code="MEMORY_LEAK", lost_bytes=3 << 20)
    b = _f(1, None, code="MEMORY_LEAK", lost_bytes=5 << 20)
    g, = group_across_ranks([a, b])
    assert (g.lost_ns, g.lost_bytes, g.rank, g.ranks) == (None, 5 << 20, 1, [0])
    assert g.message.endswith("up to 5.0 MiB on one device")


@pytest.fixture(scope="module")
def llm16():
    from runtime_emu import scenarios

    return scenarios.run("llm-train", ranks=16, steps=3, seed=0)


def test_a_healthy_16_rank_run_gives_one_finding_per_problem(llm16):
    res = analyzers.run(llm16.trace)
    codes = [f.code for f in res.findings]
    assert sorted(codes) == sorted(set(codes))  # each problem once
    assert set(codes) == {"BUBBLE_COLLECTIVE", "BUBBLE_COPY", "LOW_OVERLAP", "SYNC_STALL"}
    for f in res.findings:
        assert sorted([f.rank, *f.ranks]) == list(range(16)), f.code
        assert {o["rank"] for o in f.occurrences} == set(range(16)), f.code
    copy = next(f for f in res.findings if f.code == "BUBBLE_COPY")
    per_rank: dict[int, int] = {}
    for o in copy.occurrences:
        per_rank[o["rank"]] = per_rank.get(o["rank"], 0) + o["lost_ns"]
    # Every rank waits the same on its copies, in the same steps: the job loses one rank's worth.
    assert len(set(per_rank.values())) == 1
    assert copy.lost_ns == next(iter(per_rank.values()))
    assert [o["step"] for o in copy.occurrences] == [s for s in (0, 1, 2) for _ in range(16)]


def test_the_partitioned_engine_groups_as_the_whole_trace_run_does(llm16):
    from msprof_py import report

    whole = analyzers.run(llm16.trace)
    parts = report.analyze(report.split_by_rank(llm16.trace))
    assert [(f.code, f.rank, f.ranks, f.lost_ns, len(f.occurrences)) for f in parts.findings] == \
           [(f.code, f.rank, f.ranks, f.lost_ns, len(f.occurrences)) for f in whole.findings]


def test_the_what_if_of_a_grouped_finding_is_the_job_s_saving(llm16):
    from analyzers import Frames
    from analyzers.whatif import predict

    res = analyzers.run(llm16.trace)
    predict(Frames(llm16.trace), res.findings)
    copy = next(f for f in res.findings if f.code == "BUBBLE_COPY")
    assert copy.what_if is not None and copy.what_if["remedy"] == "copy"
    # The fix on all 16 ranks gives the job back what one rank lost per step, no more.
    assert 0 < copy.what_if["saving_ns"] <= copy.lost_ns


def test_a_problem_reported_per_stream_folds_per_stream_and_otherwise_whatever_the_stream():
    # Two streams on each of two ranks: one finding per stream across the ranks.
    per_stream = [_f(0, 5, stream=2), _f(0, 6, stream=3), _f(1, 7, stream=2), _f(1, 8, stream=3)]
    a, b = group_across_ranks(per_stream)
    assert [(a.stream, a.rank, a.ranks), (b.stream, b.rank, b.ranks)] == [(2, 1, [0]), (3, 1, [0])]
    # One finding per rank, naming different streams (or none): one finding, each occurrence its stream.
    g, = group_across_ranks([_f(0, 5, stream=7), _f(1, 9, stream=None), _f(2, 1, stream=84)])
    assert (g.rank, g.ranks, g.stream) == (1, [0, 2], None)
    assert [(o["rank"], o["stream"]) for o in g.occurrences] == [(0, 7), (1, None), (2, 84)]
