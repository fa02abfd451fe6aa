"""The strict accuracy harness (msprof_py.evaluate): the matching rule on hand-built findings and
problems, the plan of runs, and the targets on the CI subset (the full table: `msprof-py eval`)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from msprof_py import evaluate as ev
from msprof_py.cli import app
from runtime_emu import scenarios
from runtime_emu.scenarios import configure


def problem(kind="queue-congestion", rank=0, device=0, stream=2, start=1_000, end=2_000, **where):
    return {"problem": kind, "where": {"rank": rank, "device": device, "stream": stream, **where},
            "when": {"start_ns": start, "end_ns": end}, "expected": {}}


def finding(code="QUEUE_CONGESTION", rank=0, device=0, stream=None, ts=1_500, dur=100, severity="warning",
            **extra):
    return {"code": code, "severity": severity, "message": f"{code} here", "rank": rank, "device": device,
            "stream": stream, "ts_ns": ts, "dur_ns": dur, **extra}


def matched(findings, problems):
    m = ev.match(findings, problems)
    return m, sorted(m.claim_problem.values())


# ---------------------------------------------------------------- location
def test_a_finding_on_the_problems_rank_and_stream_matches():
    m, hit = matched([finding(stream=2)], [problem()])
    assert hit == [0] and m.claim_reason == {} and m.problem_reason == {}


def test_a_finding_on_another_rank_does_not_match():
    m, hit = matched([finding(rank=1)], [problem()])
    assert hit == []
    assert m.problem_reason == {0: "wrong rank"} and m.claim_reason == {0: "wrong rank"}


def test_device_and_stream_are_compared_only_when_both_sides_name_one():
    assert matched([finding(stream=3)], [problem(stream=2)])[0].problem_reason == {0: "wrong stream"}
    assert matched([finding(device=1)], [problem()])[0].problem_reason == {0: "wrong device"}
    assert matched([finding(stream=None, device=None)], [problem()])[1] == [0]
    assert matched([finding(stream=5)], [problem(stream=None)])[1] == [0]


def test_a_finding_without_rank_does_not_match_a_problem_on_a_rank():
    assert matched([finding(rank=None)], [problem()])[0].problem_reason == {0: "no rank"}


def test_slow_rank_matches_only_the_straggler_on_any_of_its_streams():
    p = problem("slow-rank", rank=3, device=3, stream=1, start=0, end=10_000)
    assert matched([finding("SLOW_RANK", rank=3, device=None, ts=0, dur=10_000)], [p])[1] == [0]
    assert matched([finding("SLOW_RANK", rank=3, device=3, stream=2, ts=0, dur=10_000)], [p])[1] == [0]
    m, hit = matched([finding("SLOW_RANK", rank=0, device=None, ts=0, dur=10_000)], [p])
    assert hit == [] and m.problem_reason == {0: "wrong rank"}


def test_link_problems_need_the_link_named_in_evidence_or_occurrence():
    p = problem("slow-link", rank=2, device=2, stream=2, links=["r2->r6.hccs", "r6->r2.hccs"], start=0, end=5_000)
    right = finding("SLOW_LINK", rank=None, device=None, ts=100, evidence=[{"link": "r2->r6.hccs", "gbps": 7.5}])
    wrong = finding("SLOW_LINK", rank=None, device=None, ts=100, evidence=[{"link": "r0->r4.hccs"}])
    unnamed = finding("SLOW_LINK", rank=2, device=2, ts=100)
    other_end = finding("SLOW_LINK", rank=6, device=6, stream=9, ts=100, evidence=[{"links": ["r6->r2.hccs"]}])
    elsewhere = finding("SLOW_LINK", rank=5, device=5, ts=100, evidence=[{"link": "r2->r6.hccs"}])
    assert matched([right], [p])[1] == [0]
    assert matched([other_end], [p])[1] == [0]  # the link's other end names its own device / stream
    assert matched([wrong], [p])[0].problem_reason == {0: "wrong link"}
    assert matched([unnamed], [p])[0].problem_reason == {0: "no link"}
    # A finding that names the problem's link has its location, whichever rank it leads with
    # (a fault seen from both ends is reported once, under one of them).
    assert matched([elsewhere], [p])[1] == [0]
    elsewhere_unnamed = finding("SLOW_LINK", rank=5, device=5, ts=100, evidence=[{"link": "r0->r4.hccs"}])
    assert matched([elsewhere_unnamed], [p])[0].problem_reason == {0: "wrong rank"}
    occ = finding("SLOW_LINK", rank=None, device=None, ts=None, dur=None,
                  occurrences=[{"rank": 2, "ts_ns": 200, "dur_ns": 50, "link": "r2->r6.hccs"}])
    assert matched([occ], [p])[1] == [0]


def test_the_link_of_a_bandwidth_problem_must_agree_too():
    p = problem("bandwidth-contention", stream=1, link="r0.d0.pcie_h2d")
    assert matched([finding("BANDWIDTH_CONTENTION", evidence=[{"link": "r0.d0.pcie_h2d"}])], [p])[1] == [0]
    assert matched([finding("BANDWIDTH_CONTENTION", evidence=[{"link": "r0.d0.pcie_d2h"}])],
                   [p])[0].problem_reason == {0: "wrong link"}
    # a link named without its rank is the finding's rank and device's
    assert matched([finding("BANDWIDTH_CONTENTION", evidence=[{"link": "pcie_h2d"}])], [p])[1] == [0]
    assert matched([finding("BANDWIDTH_CONTENTION", device=1, evidence=[{"link": "pcie_h2d"}])],
                   [p])[0].problem_reason == {0: "wrong link"}
    # every stream crossing the link suffers: the competing copy's stream names the problem too
    assert matched([finding("BANDWIDTH_CONTENTION", stream=3, evidence=[{"link": "pcie_h2d"}])], [p])[1] == [0]


# ---------------------------------------------------------------- time
def test_a_finding_outside_the_window_does_not_match():
    m, hit = matched([finding(ts=2_500, dur=100)], [problem(start=1_000, end=2_000)])
    assert hit == [] and m.problem_reason == {0: "time outside window"}


def test_overlap_is_half_open_on_the_finding_and_closed_on_the_window():
    p = [problem(start=1_000, end=2_000)]
    assert matched([finding(ts=900, dur=100)], p)[1] == []  # [900, 1000) ends where the window starts
    assert matched([finding(ts=900, dur=101)], p)[1] == [0]
    assert matched([finding(ts=2_000, dur=50)], p)[1] == [0]  # starts on the window's last instant
    assert matched([finding(ts=2_001, dur=0)], p)[1] == []
    assert matched([finding(ts=1_000, dur=None)], p)[1] == [0]  # an instant inside
    assert matched([finding(ts=500, dur=5_000)], p)[1] == [0]  # a span covering the window


def test_a_finding_without_time_never_matches():
    m, hit = matched([finding(ts=None, dur=None)], [problem()])
    assert hit == [] and m.problem_reason == {0: "no time"} and m.claim_reason == {0: "no time"}


# ---------------------------------------------------------------- one to one
def test_one_finding_over_two_problems_detects_one():
    problems = [problem(start=1_000, end=2_000), problem(start=3_000, end=4_000)]
    m, hit = matched([finding(ts=1_500, dur=2_000)], problems)
    assert hit == [0]
    assert m.problem_reason == {1: "the finding that agrees already matched another problem"}
    rows = {r["problem"]: r for r in ev.Scores([ev.score_run(ev.case("x", ["queue-congestion"]),
                                                             [finding(ts=1_500, dur=2_000)], problems)]).table()}
    assert rows["queue-congestion"] == {"problem": "queue-congestion", "codes": ["QUEUE_CONGESTION"],
                                             "injected": 2, "minor": 0, "matched": 1, "recall": 0.5, "findings": 1,
                                             "true": 1, "precision": 1.0, "target": "MISS"}


def test_occurrences_listed_by_one_finding_each_match_a_problem():
    problems = [problem(start=1_000, end=2_000), problem(start=3_000, end=4_000)]
    f = finding(ts=1_000, dur=3_000, stream=2, occurrences=[
        {"ts_ns": 1_200, "dur_ns": 100}, {"ts_ns": 3_500, "dur_ns": 100, "stream": 2}, {"ts_ns": 9_000}])
    m, hit = matched([f], problems)
    assert hit == [0, 1]
    assert [(c.occurrence, c.stream) for c in m.claims] == [(0, 2), (1, 2), (2, 2)]  # location inherited
    assert m.claim_reason == {2: "time outside window"}
    row = ev.Scores([ev.score_run(ev.case("x", ["queue-congestion"]), [f], problems)]).table()[0]
    assert (row["injected"], row["matched"], row["findings"], row["true"]) == (2, 2, 3, 2)


def test_an_occurrence_without_time_does_not_take_the_findings_time():
    f = finding(ts=1_000, dur=1_000, occurrences=[{"rank": 0}])
    assert matched([f], [problem()])[0].problem_reason == {0: "no time"}


def test_two_findings_on_one_problem_one_is_false():
    m, hit = matched([finding(ts=1_100), finding(ts=1_600)], [problem()])
    assert hit == [0]
    assert list(m.claim_reason.values()) == ["its problem is already matched by another finding"]


def test_several_occurrences_of_one_problem_are_one_detection_the_rest_left_out():
    f = finding(ts=1_000, dur=1_000, occurrences=[{"ts_ns": 1_100, "dur_ns": 10}, {"ts_ns": 1_500, "dur_ns": 10},
                                                  {"ts_ns": 7_000, "dur_ns": 10}])
    m, hit = matched([f], [problem()])
    assert hit == [0]
    assert list(m.claim_reason.values()) == [ev.SIBLING, "time outside window"]
    # The sibling is neither true nor false; the occurrence outside every window is false.
    row = ev.Scores([ev.score_run(ev.case("x", ["queue-congestion"]), [f], [problem()])]).table()[0]
    assert (row["matched"], row["findings"], row["true"], row["precision"]) == (1, 2, 1, 0.5)
    # A second finding on the same problem stays false.
    row = ev.Scores([ev.score_run(ev.case("x", ["queue-congestion"]), [f, finding(ts=1_600)], [problem()])]).table()[0]
    assert (row["findings"], row["true"]) == (3, 1)


# ---------------------------------------------------------------- worth a warning
def costly(share, kind="bandwidth-contention", start=1_000, end=2_000, **where):
    p = problem(kind, start=start, end=end, **where)
    p["expected"]["cost"] = {"ns": 1, "share": share, "of": "device span"}
    return p


def test_a_problem_is_owed_a_warning_by_the_severity_rule_on_its_summed_cost_share():
    # 2% + 2% at one place (rank 0, link r0.d0.pcie_h2d) is 4%: over the rule's 3% line, both owed;
    # 2% alone on another link is minor; a problem that states no cost is always owed.
    link = {"link": "r0.d0.pcie_h2d"}
    problems = [costly(0.02, **link), costly(0.02, start=3_000, end=4_000, **link),
                costly(0.02, link="r0.d0.pcie_d2h"), costly(0.029), problem()]
    assert ev.worth_a_warning(problems) == [True, True, False, False, True]
    assert ev.worth_a_warning([costly(0.03)]) == [True]  # the line itself is a warning


def test_minor_problems_are_left_out_of_recall_and_a_finding_on_one_is_true():
    minor, owed = costly(0.01, stream=2), costly(0.2, start=3_000, end=4_000, stream=5)
    # Nothing claimed: the owed problem is missed, the minor one is not.
    run = ev.score_run(ev.case("x", ["bandwidth-contention"]), [], [minor, owed])
    row = ev.Scores([run]).table()[0]
    assert {k: row[k] for k in ("injected", "minor", "matched", "recall", "findings", "precision", "target")} == {
        "injected": 2, "minor": 1, "matched": 0, "recall": 0.0, "findings": 0, "precision": None, "target": "MISS"}
    assert ev.Scores([run]).reasons()["bandwidth-contention"]["missed"] == {"no warning-or-worse finding of its codes": 1}
    # A warning on each: both true, recall over the owed one only.
    claims = [finding("BANDWIDTH_CONTENTION", stream=2, ts=1_500), finding("BANDWIDTH_CONTENTION", stream=5, ts=3_500)]
    row = ev.Scores([ev.score_run(ev.case("x", ["bandwidth-contention"]), claims, [minor, owed])]).table()[0]
    assert (row["matched"], row["recall"], row["findings"], row["true"], row["target"]) == (1, 1.0, 2, 2, "PASS")
    # Only minor problems and nothing claimed: nothing to score.
    row = ev.Scores([ev.score_run(ev.case("x", ["bandwidth-contention"]), [], [minor])]).table()[0]
    assert (row["injected"], row["minor"], row["recall"], row["precision"], row["target"]) == (1, 1, None, None, "-")


def test_the_assignment_is_a_maximum_matching_not_first_come():
    # A (earlier) overlaps both problems, B only the first: first-come would give A the first
    # problem and leave B and the second problem unmatched.
    problems = [problem(start=1_000, end=2_000), problem(start=1_500, end=3_000)]
    a, b = finding(ts=1_400, dur=1_000), finding(ts=1_800, dur=100)
    m, hit = matched([a, b], problems)
    assert hit == [0, 1] and m.claim_reason == {} and m.problem_reason == {}
    assert {m.claims[c].finding: p for c, p in m.claim_problem.items()} == {0: 1, 1: 0}


def test_only_warning_or_worse_findings_of_the_kinds_codes_count():
    m, hit = matched([finding(severity="info"), finding("MEMORY_LEAK"), finding("BUBBLE_DATA")], [problem()])
    assert hit == [] and m.problem_reason == {0: "no warning-or-worse finding of its codes"}
    assert [c.code for c in m.claims] == ["MEMORY_LEAK"]  # BUBBLE_DATA detects no kind; info is ignored
    assert m.claim_reason == {0: "no injected problem of its kind in the run"}


def test_false_alarms_are_any_serious_finding_on_a_healthy_run():
    healthy = ev.score_run(ev.case("bert-train-dp", [], {"intra": "pcie"}, seed=3),
                           [finding("BUBBLE_COLLECTIVE", severity="critical"), finding(severity="info")], [])
    sick = ev.score_run(ev.case("x", ["queue-congestion"]), [finding("BUBBLE_DATA")], [problem()])
    scores = ev.Scores([healthy, sick])
    assert scores.false_alarms() == [{"scenario": "bert-train-dp", "params": {"intra": "pcie"}, "seed": 3,
                                      "code": "BUBBLE_COLLECTIVE", "severity": "critical", "rank": 0,
                                      "message": "BUBBLE_COLLECTIVE here"}]
    row = scores.table()[0]
    assert (row["problem"], row["recall"], row["precision"]) == ("queue-congestion", 0.0, None)


def test_precision_counts_findings_on_healthy_runs():
    healthy = ev.score_run(ev.case("x"), [finding()], [])
    sick = ev.score_run(ev.case("x", ["queue-congestion"]), [finding()], [problem()])
    row = ev.Scores([healthy, sick]).table()[0]
    assert (row["findings"], row["true"], row["precision"], row["recall"]) == (2, 1, 0.5, 1.0)
    assert ev.Scores([healthy, sick]).reasons()["queue-congestion"]["false"] == {"healthy run": 1}


# ---------------------------------------------------------------- plan
def test_seeds_option_forms():
    assert ev.parse_seeds("5") == [0, 1, 2, 3, 4]
    assert ev.parse_seeds("10..12") == [10, 11, 12]
    assert ev.parse_seeds("7,3,3") == [3, 7]
    for bad in ("0", "x", "-1,2", "3..1"):
        with pytest.raises(ev.MsprofError):
            ev.parse_seeds(bad)


def test_the_full_plan_runs_every_switch_and_variant_over_five_seeds_and_every_case_is_valid():
    cases = ev.plan(scenarios.SCENARIOS)
    assert {c.seed for c in cases} == set(range(5))
    variants = {c.variant for c in cases}
    for name, sc in scenarios.SCENARIOS.items():
        assert (name, (), ()) in variants
        assert {(name, (sw,), ()) for sw in sc.switches} <= variants
        for params in ev.HEALTHY_VARIANTS[name]:
            assert (name, (), tuple(sorted(params.items()))) in variants
    # every non-default parameter a scenario documents runs healthy, except those left out on purpose
    for name, sc in scenarios.SCENARIOS.items():
        varied = {k for p in ev.HEALTHY_VARIANTS[name] for k in p}
        left_out = {k for what, (p, _) in ev.NOT_HEALTHY.items() if what.startswith(name) for k in p}
        assert set(sc.params) - {"problem_rank"} <= varied | left_out, name
    for c in cases:  # the scenarios accept every case (no run needed to know)
        configure(scenarios.SCENARIOS[c.scenario], c.switches, seed=c.seed, params=dict(c.params))


def test_kinds_injected_too_rarely_get_more_seeds():
    def runner(c):  # a fake scenario: "rare" injects one problem a run, "common" five
        n = {"rare": 1, "common": 5}.get(c.switches[0] if c.switches else "", 0)
        return ev.score_run(c, [], [problem("leak" if n == 1 else "launch-bound")] * n)

    cases = [ev.case("s", sw, seed=s) for s in range(5) for sw in ((), ("rare",), ("common",))]
    scores = ev.evaluate(cases, runner=runner, min_injections=20)
    rows = {r["problem"]: r for r in scores.table()}
    assert rows["leak"]["injected"] == 20 and rows["launch-bound"]["injected"] == 25
    assert sorted(r.case.seed for r in scores.runs if r.case.switches == ("rare",)) == list(range(20))


# ---------------------------------------------------------------- the targets, on the CI subset
@pytest.fixture(scope="module")
def quick_scores():
    t0 = time.perf_counter()
    scores = ev.evaluate(ev.plan(scenarios.SCENARIOS, quick=True), min_injections=None)
    return scores, time.perf_counter() - t0


def test_ci_subset_is_small(quick_scores):
    scores, seconds = quick_scores
    assert seconds < 60
    kinds = {r["problem"] for r in scores.table()}
    assert kinds >= set(ev.CODES)


def test_ci_subset_meets_the_strict_targets(quick_scores):
    scores, _ = quick_scores
    alarms = scores.false_alarms()
    assert alarms == [], alarms
    misses = [r for r in scores.table() if r["target"] != "PASS"]
    assert misses == [], (misses, scores.reasons())


# ---------------------------------------------------------------- the command
def test_eval_command_prints_strict_json():
    result = CliRunner().invoke(app, ["eval", "--scenario", "resnet50-infer", "--quick", "--json"])
    assert result.exit_code == 0, result.output

    def no_nan(text):
        raise ValueError(f"not JSON: {text}")

    doc = json.loads(result.stdout, parse_constant=no_nan)
    assert doc["runs"] == len([q for q in ev.QUICK if q[0] == "resnet50-infer"]) and doc["seeds"] == [0]
    assert {r["problem"] for r in doc["problems"]} >= {"leak", "queue-congestion", "bandwidth-contention"}
    assert set(doc["problems"][0]) >= {"injected", "matched", "recall", "findings", "true", "precision", "target"}
    assert isinstance(doc["false_alarms"], list) and isinstance(doc["why"], dict)


def test_eval_prints_the_table():
    result = CliRunner().invoke(app, ["eval", "--scenario", "resnet50-infer", "--quick"])
    assert result.exit_code == 0, result.output
    assert "strict rule" in result.stdout and "false alarms on healthy runs" in result.stdout
    assert "seeds 0" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--scenario", "nope"], "unknown scenario(s) nope"),
    (["--seeds", "many"], "--seeds 'many'"),
])
def test_eval_rejects_bad_input_in_one_line(args, message):
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
