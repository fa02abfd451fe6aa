"""Accuracy harness: run every scenario healthy and with each problem switch, and score the
analyzers' findings against the emulator's ground truth (which analyzers never see).

Scoring, per problem kind:
- recall: injected problems of that kind that a warning-or-worse finding of a matching code
  (on the problem's rank, when it names one) detected;
- precision: warning-or-worse findings of that kind's codes that match an injected problem of
  that kind in the same run, over all such findings in all runs (healthy twins included);
- false alarms: warning-or-worse findings of any code on healthy twins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from analyzers.finding import Severity, run

#: Which finding codes detect each problem switch.
CODES: dict[str, tuple[str, ...]] = {
    "serial-copies": ("BUBBLE_COPY", "BUBBLE_SYNC"),
    "launch-bound": ("LAUNCH_BOUND",),
    "queue-congestion": ("QUEUE_CONGESTION",),
    "leak": ("MEMORY_LEAK",),
    "fragmentation": ("MEMORY_FRAGMENTATION",),
    "bandwidth-contention": ("BANDWIDTH_CONTENTION",),
    "missing-sync": ("MISSING_SYNC",),
    "slow-rank": ("SLOW_RANK",),
    "slow-link": ("SLOW_LINK",),
}
#: The problem kinds with accuracy targets (precision and recall >= 0.95).
TARGETED = ("serial-copies", "queue-congestion", "leak", "bandwidth-contention")


@dataclass
class RunScore:
    scenario: str
    switches: tuple[str, ...]
    problems: list[dict[str, Any]]
    findings: list[dict[str, Any]]  # warning or worse
    detected: dict[int, bool] = field(default_factory=dict)  # problem index -> detected


@dataclass
class Scores:
    runs: list[RunScore]

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for kind, codes in CODES.items():
            injected = [(r, i) for r in self.runs for i, p in enumerate(r.problems) if p["problem"] == kind]
            if not injected:
                continue
            hits = sum(1 for r, i in injected if r.detected.get(i))
            reported = [(r, f) for r in self.runs for f in r.findings if f["code"] in codes]
            # A code several kinds share is true when it matches any injected problem it detects.
            true = sum(1 for r, f in reported
                       if _matches_any(f, [p for p in r.problems if f["code"] in CODES.get(p["problem"], ())]))
            rows.append({"problem": kind, "injected": len(injected), "detected": hits,
                         "recall": hits / len(injected) if injected else None,
                         "findings": len(reported), "true": true,
                         "precision": true / len(reported) if reported else None,
                         "targeted": kind in TARGETED})
        return rows

    def false_alarms(self) -> list[dict[str, Any]]:
        return [{"scenario": r.scenario, "code": f["code"], "severity": f["severity"], "message": f["message"]}
                for r in self.runs if not r.switches for f in r.findings]


def evaluate(cases: Iterable[tuple[str, tuple[str, ...]]], runner: Callable[..., Any], seed: int = 0,
             progress: Callable[[str], None] | None = None) -> Scores:
    """Score analyzers on each (scenario, switches) case; `runner` is scenarios.run."""
    runs = []
    for scenario, switches in cases:
        if progress:
            progress(f"{scenario} {'+'.join(switches) or 'healthy'}")
        result = runner(scenario, switches=switches, seed=seed)
        problems = result.ground_truth.get("problems", [])
        analysis = run(result.trace)
        serious = [f.to_dict() for f in analysis.findings if f.severity >= Severity.WARNING]
        score = RunScore(scenario, tuple(switches), problems, serious)
        for i, p in enumerate(problems):
            codes = CODES.get(p["problem"], ())
            score.detected[i] = any(f["code"] in codes and _matches(f, p) for f in serious)
        runs.append(score)
    return Scores(runs)


def cases_for(scenarios: dict[str, Any], names: Iterable[str] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """Every scenario healthy and with each switch it supports, one at a time."""
    out = []
    for name in sorted(names or scenarios):
        out.append((name, ()))
        out.extend((name, (switch,)) for switch in sorted(scenarios[name].switches))
    return out


def _matches(finding: dict[str, Any], problem: dict[str, Any]) -> bool:
    """Same rank as the problem; for link problems, one of the problem's links among the evidence."""
    where = problem.get("where") or {}
    links = where.get("links")
    if links and finding.get("evidence") and any("link" in e for e in finding["evidence"]):
        return any(e.get("link") in links for e in finding["evidence"])
    rank = where.get("rank")
    return rank is None or finding.get("rank") is None or finding["rank"] == rank


def _matches_any(finding: dict[str, Any], problems: list[dict[str, Any]]) -> bool:
    return any(_matches(finding, p) for p in problems)
