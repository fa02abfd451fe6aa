"""The strict accuracy harness: run the emulator's scenarios healthy and with each problem switch,
and score the analyzers' findings against the ground truth the emulator recorded (which the
analyzers never see; this module is the only place that reads both).

The findings are those `msprof-py analyze` prints by default: each time finding's fix replayed
(analyzers.whatif), its severity following what the fix saves.

Matching rule. A finding counts only when it is warning or worse and its code detects the
problem's kind (`CODES`). It *claims* one place and one time: its own (rank, device, stream,
ts_ns, dur_ns), or, when it lists the separate occurrences it covers (`Finding.occurrences`),
one claim per occurrence (an occurrence's missing rank / device / stream default to the
finding's; its time never does: an occurrence without `ts_ns` has no time). A claim matches an
injected problem only when

- the location agrees: the same rank (a link problem also accepts either end of its link, or a
  claim naming the link itself); the
  same device and the same stream when both the problem and the claim name one; for a problem
  on a link (`where.link` / `where.links`), the claim names one of those links (in its
  occurrence, or in the finding's evidence, as `link` / `links`); for slow-rank, the claim's
  rank is the straggler (the problem's rank);
- the times agree: the claim's interval [ts_ns, ts_ns + dur_ns) overlaps the problem's window
  [start_ns, end_ns] (no dur_ns: the instant ts_ns). A claim without a time never matches.

Each claim matches at most one problem and each problem at most one claim: a maximum bipartite
matching over the (claim, problem) pairs that agree, per run (augmenting paths; claims and
problems in time order, so ties resolve the same way every time). One finding that spans
several problems without listing them as occurrences therefore detects only one of them. An
occurrence that agrees only with a problem another occurrence of the *same* finding matched is
one problem seen in parts: it is left out of precision (neither true nor false); a second
finding on a matched problem is false.

Worth a warning. A problem whose ground truth states what it cost (`expected.cost.share`: the
time the run lost as a share of the device's span, the memory held as a share of the device's
capacity, as the emulator measured it) is judged by the analyzers' own severity rule
(analyzers.severity) on that share, summed over the problems of its kind at its place (rank,
device, and its link or stream: what one finding groups). Under the warning line it is minor:
no warning is owed, so it is left out of recall, and a claim that matches it is still true (the
problem is real and in its place). A problem whose truth states no cost is always owed one.

Scores per problem kind, over all runs (healthy runs included):
- recall = problems worth a warning matched / problems worth a warning;
- precision = claims of that kind's codes that matched a problem / all such claims (sibling
  occurrences of one matched problem left out, see above);
- false alarms: every warning-or-worse finding, of any code, on a healthy run.
Targets: precision and recall >= 0.95 for every kind; no false alarm.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from msprof_py.errors import MsprofError
from msprof_py.trace.units import NS_PER_MS, ms, ms_at, sig

#: Which finding codes detect each problem kind (the `problem` of a ground-truth entry).
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
    "no-overlap": ("LOW_OVERLAP",),
    "pipeline-bubble": ("PIPELINE_BUBBLE",),
}
TARGET = 0.95  # precision and recall, every kind
MIN_INJECTIONS = 20  # per kind, in a full evaluation
DEFAULT_SEEDS = 5

SEVERITIES = {"info": 0, "warning": 1, "critical": 2}

#: Healthy runs with non-default values of the parameters each scenario documents (its
#: docstring, Scenario.params, the README's scenario table, the common `preset`); each must
#: raise no warning-or-worse finding.
HEALTHY_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {
    "resnet50-infer": ({"batch": 8}, {"batch": 32}, {"preset": "910B2"}),
    "yolo-pipeline": ({"preset": "910B2"},),
    "bert-train-dp": ({"intra": "pcie"}, {"layers": 2, "batch": 8}),
    "llm-train-2server": ({"zero": False}, {"roce_over_pcie": True}, {"layers": 2, "batch": 1},
                          # three servers of 8: the inter-server phase over a count that is no power of two
                          {"servers": 3, "layers": 2, "batch": 1}),
    # More micro-batches than 4 per stage, 11 layers (3 per stage with the head), the 1F1B schedule.
    "llm-pipeline": ({"micro_batches": 32, "batch": 32}, {"layers": 11}, {"schedule": "1f1b"}),
}
#: Non-default parameters left out of the healthy variants, and why.
NOT_HEALTHY: dict[str, tuple[dict[str, Any], str]] = {
    "yolo-pipeline triple_buffer=False": (
        {"triple_buffer": False},
        "the scenario documents it as the serial baseline: every stage waits for the previous one and "
        "the Cube cores idle through host preprocessing (~35% of each step) and NMS, and the device "
        "waits for every copy (one stream, no overlap): problems by design that its ground truth does "
        "not record, so it is neither checked for false alarms nor run with the switches (its copy "
        "bubbles would count against serial-copies)"),
}
#: Problem switches also run with non-default parameters (other link types, ranks, batch sizes):
#: scenario -> (params, switches).
PROBLEM_VARIANTS: dict[str, tuple[tuple[dict[str, Any], tuple[str, ...]], ...]] = {
    "resnet50-infer": (({"batch": 32}, ("bandwidth-contention", "fragmentation", "launch-bound", "leak",
                                        "missing-sync", "queue-congestion", "serial-copies")),),
    "yolo-pipeline": (({"preset": "910B2"}, ("fragmentation", "leak")),),
    "bert-train-dp": (({"intra": "pcie"}, ("leak", "slow-link", "slow-rank")),
                      ({"problem_rank": 6}, ("slow-rank",))),
    "llm-train-2server": (({"zero": False}, ("slow-link",)),),
    "llm-pipeline": (({"layers": 11}, ("pipeline-bubble",)), ({"schedule": "1f1b"}, ("pipeline-bubble",))),
}
#: The CI subset (`--quick`): one seed, the single-rank scenarios with every switch, the
#: data-parallel one with its cross-rank switches, and two healthy variants.
QUICK: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    *(("resnet50-infer", sw, {}) for sw in ((), ("bandwidth-contention",), ("fragmentation",), ("launch-bound",),
                                            ("leak",), ("missing-sync",), ("queue-congestion",),
                                            ("serial-copies",))),
    ("resnet50-infer", (), {"batch": 32}),
    *(("yolo-pipeline", sw, {}) for sw in ((), ("bandwidth-contention",), ("fragmentation",), ("launch-bound",),
                                           ("leak",), ("missing-sync",), ("queue-congestion",),
                                           ("serial-copies",))),
    *(("bert-train-dp", sw, {}) for sw in ((), ("bandwidth-contention",), ("no-overlap",), ("slow-link",),
                                          ("slow-rank",))),
    ("bert-train-dp", (), {"intra": "pcie"}),
    *(("llm-pipeline", sw, {}) for sw in ((), ("pipeline-bubble",))),
)


# ---------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One run: a scenario, the switches on, non-default parameters, a seed."""

    scenario: str
    switches: tuple[str, ...] = ()
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0

    @property
    def healthy(self) -> bool:
        return not self.switches

    @property
    def variant(self) -> tuple[str, tuple[str, ...], tuple[tuple[str, Any], ...]]:
        """The case without its seed."""
        return self.scenario, self.switches, self.params

    def params_text(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in self.params) or "-"

    def label(self) -> str:
        what = "+".join(self.switches) or "healthy"
        params = f" {self.params_text()}" if self.params else ""
        return f"{self.scenario} {what}{params} seed {self.seed}"


def case(scenario: str, switches: Iterable[str] = (), params: Mapping[str, Any] | None = None, seed: int = 0) -> Case:
    return Case(scenario, tuple(sorted(switches)), tuple(sorted((params or {}).items())), seed)


def plan(scenarios: Mapping[str, Any], names: Iterable[str] | None = None, seeds: Sequence[int] | None = None,
         quick: bool = False) -> list[Case]:
    """The runs of an evaluation: every scenario (or those named) healthy and with each switch,
    its healthy variants and its problem variants, over every seed (default: DEFAULT_SEEDS of
    them); `quick`: the CI subset (default: seed 0 only)."""
    if seeds is None:
        seeds = [0] if quick else range(DEFAULT_SEEDS)
    chosen = sorted(names or scenarios)
    unknown = [n for n in chosen if n not in scenarios]
    if unknown:
        raise MsprofError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(sorted(scenarios))}")
    variants: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
    if quick:
        variants = [v for v in QUICK if v[0] in chosen]
    else:
        for name in chosen:
            variants.append((name, (), {}))
            variants.extend((name, (sw,), {}) for sw in sorted(scenarios[name].switches))
            variants.extend((name, (), p) for p in HEALTHY_VARIANTS.get(name, ()))
            variants.extend((name, (sw,), p) for p, sws in PROBLEM_VARIANTS.get(name, ()) for sw in sws)
    return [case(name, sws, params, seed) for seed in seeds for name, sws, params in variants]


def parse_seeds(text: str) -> list[int]:
    """`N`: seeds 0..N-1; `A..B`: A to B inclusive; `A,B,C`: those seeds."""
    text = text.strip()
    try:
        if ".." in text:
            lo, hi = (int(part) for part in text.split("..", 1))
            seeds = list(range(lo, hi + 1))
        elif "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            n = int(text)
            if n < 1:
                raise MsprofError(f"--seeds {text}: need at least one seed")
            seeds = list(range(n))
    except ValueError:
        raise MsprofError(f"--seeds {text!r}: expected a count (5), a range (10..14) or a list (0,3,7)") from None
    if not seeds or min(seeds) < 0:
        raise MsprofError(f"--seeds {text!r}: seeds are integers >= 0, at least one")
    return sorted(set(seeds))


# ---------------------------------------------------------------------------------------- matching
@dataclass(frozen=True)
class Claim:
    """One place and time a finding says its problem happened: the finding itself, or one of
    the occurrences it lists."""

    finding: int  # index into the run's warning-or-worse findings
    occurrence: int | None  # index into that finding's occurrences; None: the finding itself
    code: str
    rank: int | None
    device: int | None
    stream: int | None
    ts_ns: int | None
    dur_ns: int | None
    links: frozenset[str] = frozenset()


def serious(finding: Mapping[str, Any]) -> bool:
    sev = finding.get("severity")
    level = SEVERITIES.get(str(sev).lower(), 0) if not isinstance(sev, int) else int(sev)
    return level >= SEVERITIES["warning"]


def _links_of(items: Iterable[Mapping[str, Any]]) -> set[str]:
    out: set[str] = set()
    for item in items:
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("link"), str):
            out.add(item["link"])
        if isinstance(item.get("links"), (list, tuple)):
            out.update(x for x in item["links"] if isinstance(x, str))
    return out


def _int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v)


def claims_of(index: int, finding: Mapping[str, Any]) -> list[Claim]:
    """The claims of one finding (a dict as `Finding.to_dict()` gives)."""
    links = frozenset(_links_of(finding.get("evidence") or ()))
    occurrences = finding.get("occurrences") or []
    if not occurrences:
        return [Claim(index, None, finding["code"], _int(finding.get("rank")), _int(finding.get("device")),
                      _int(finding.get("stream")), _int(finding.get("ts_ns")), _int(finding.get("dur_ns")), links)]
    out = []
    for k, occ in enumerate(occurrences):
        own = frozenset(_links_of([occ]))
        loc = {key: _int(occ[key]) if key in occ else _int(finding.get(key)) for key in ("rank", "device", "stream")}
        out.append(Claim(index, k, finding["code"], loc["rank"], loc["device"], loc["stream"],
                         _int(occ.get("ts_ns")), _int(occ.get("dur_ns")), own or links))
    return out


_LINK_RANK = re.compile(r"(?:^|[^a-z])r(\d+)")
#: Kinds located by rank alone: a straggler is a rank, whichever of its streams shows it.
RANK_ONLY = frozenset({"slow-rank"})


def _qualified(link: str, claim: Claim) -> set[str]:
    """A link name as the ground truth spells it (r<rank>[.d<device>].<name>): names that carry
    no rank ("pcie_h2d") are qualified with the claim's rank and device."""
    if _LINK_RANK.match(link) or claim.rank is None:
        return {link}
    out = {link, f"r{claim.rank}.{link}"}
    if claim.device is not None:
        out.add(f"r{claim.rank}.d{claim.device}.{link}")
    return out


def problem_links(problem: Mapping[str, Any]) -> set[str]:
    where = problem.get("where") or {}
    out = set(where.get("links") or ())
    if where.get("link"):
        out.add(where["link"])
    return out


def disagreement(claim: Claim, problem: Mapping[str, Any]) -> str | None:
    """Why `claim` cannot be `problem` (a short reason), or None when location and time agree."""
    where = problem.get("where") or {}
    when = problem.get("when") or {}
    links = problem_links(problem)
    if claim.ts_ns is None:
        return "no time"
    rank = where.get("rank")
    named = {q for link in claim.links for q in _qualified(link, claim)}
    if rank is not None and claim.rank != rank:
        # A link problem may be named from either end of its link, or by the link itself: a
        # claim that names the problem's link has its location, whichever rank it leads with.
        ends = {int(m) for link in links for m in _LINK_RANK.findall(link)}
        if not (links and (claim.rank is None or claim.rank in ends or named & links)):
            return "no rank" if claim.rank is None else "wrong rank"
    if not links and problem.get("problem") not in RANK_ONLY:
        for key in ("device", "stream"):
            mine, theirs = getattr(claim, key), where.get(key)
            if mine is not None and theirs is not None and mine != theirs:
                return f"wrong {key}"
    if links:
        if not named:
            return "no link"
        if not named & links:
            return "wrong link"
    start, end = when.get("start_ns"), when.get("end_ns")
    if start is None or end is None:
        return "problem without window"
    a = claim.ts_ns
    b = a + max(0, claim.dur_ns or 0)
    overlap = a <= end and (b > start if b > a else a >= start)
    return None if overlap else "time outside window"


def _max_matching(edges: dict[int, list[int]], n_claims: int) -> dict[int, int]:
    """Maximum bipartite matching claim -> problem over `edges` (claim -> problems in order)."""
    owner: dict[int, int] = {}  # problem -> claim

    def augment(c: int, seen: set[int]) -> bool:
        for p in edges.get(c, ()):
            if p in seen:
                continue
            seen.add(p)
            if p not in owner or augment(owner[p], seen):
                owner[p] = c
                return True
        return False

    for c in range(n_claims):
        augment(c, set())
    return {c: p for p, c in owner.items()}


@dataclass
class Matching:
    """The outcome of matching one run's findings to its injected problems."""

    claims: list[Claim]
    problems: list[Mapping[str, Any]]
    claim_problem: dict[int, int]  # claim index -> problem index
    claim_reason: dict[int, str]  # unmatched claim -> why
    problem_reason: dict[int, str]  # unmatched problem -> why

    def problem_matched(self, i: int) -> bool:
        return i in self.claim_problem.values()


def worth_a_warning(problems: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Per problem, whether it is worth a warning by the analyzers' one severity rule on the cost
    share its ground truth states (`expected.cost.share`), summed over the problems of its kind at
    its place (rank, device, and its links or else its stream); True when it states no cost."""
    from analyzers.finding import Severity
    from analyzers.severity import severity

    shares: dict[tuple, float] = defaultdict(float)
    keys: list[tuple | None] = []
    for prob in problems:
        cost = (prob.get("expected") or {}).get("cost")
        share = cost.get("share") if isinstance(cost, Mapping) else None
        if share is None:
            keys.append(None)
            continue
        where = prob.get("where") or {}
        key = (prob["problem"], where.get("rank"), where.get("device"),
               tuple(sorted(problem_links(prob))) or where.get("stream"))
        shares[key] += float(share)
        keys.append(key)
    return [k is None or severity(shares[k], CODES.get(k[0], ("",))[0]) >= Severity.WARNING for k in keys]


def match(findings: Sequence[Mapping[str, Any]], problems: Sequence[Mapping[str, Any]]) -> Matching:
    """Match one run's findings (dicts; only warning-or-worse ones count) to its problems."""
    claims: list[Claim] = []
    for i, f in enumerate(findings):
        if serious(f) and any(f["code"] in codes for codes in CODES.values()):
            claims.extend(claims_of(i, f))
    order = sorted(range(len(claims)), key=lambda c: (claims[c].ts_ns is None, claims[c].ts_ns or 0, c))
    claims = [claims[c] for c in order]
    porder = sorted(range(len(problems)), key=lambda p: ((problems[p].get("when") or {}).get("start_ns", 0), p))
    reasons: dict[tuple[int, int], str | None] = {}
    edges: dict[int, list[int]] = defaultdict(list)
    for c, claim in enumerate(claims):
        for p in porder:
            prob = problems[p]
            if claim.code not in CODES.get(prob["problem"], ()):
                continue
            reasons[c, p] = why = disagreement(claim, prob)
            if why is None:
                edges[c].append(p)
    assigned = _max_matching(edges, len(claims))
    taken = set(assigned.values())
    claim_reason: dict[int, str] = {}
    for c in range(len(claims)):
        if c in assigned:
            continue
        mine = [(p, r) for (cc, p), r in reasons.items() if cc == c]
        if not mine:
            claim_reason[c] = "no injected problem of its kind in the run"
        elif any(r is None for _, r in mine):
            agree = {p for p, r in mine if r is None}
            same = any(cc != c and claims[cc].finding == claims[c].finding and p in agree
                       for cc, p in assigned.items())
            claim_reason[c] = SIBLING if same else "its problem is already matched by another finding"
        else:
            claim_reason[c] = _closest(r for _, r in mine)
    problem_reason: dict[int, str] = {}
    for p in range(len(problems)):
        if p in taken:
            continue
        mine = [(c, r) for (c, pp), r in reasons.items() if pp == p]
        if not mine:
            problem_reason[p] = "no warning-or-worse finding of its codes"
        elif any(r is None for _, r in mine):
            problem_reason[p] = "the finding that agrees already matched another problem"
        else:
            problem_reason[p] = _closest(r for _, r in mine)
    return Matching(claims, list(problems), assigned, claim_reason, problem_reason)


#: An occurrence whose problem another occurrence of the same finding already matched: one
#: finding seen in several parts (a bubble split at a step edge, back-to-back slowed copies).
#: It is neither a detection nor a false claim, so precision leaves it out; a second *finding*
#: on an already matched problem is still false.
SIBLING = "its problem is already matched by another occurrence of the same finding"

# The most telling reason first: a near miss (right place, wrong time) says more than a far one.
_REASON_ORDER = ("time outside window", "no time", "wrong link", "no link", "wrong stream", "wrong device",
                 "no rank", "wrong rank", "problem without window")


def _closest(reasons: Iterable[str]) -> str:
    seen = set(reasons)
    return next((r for r in _REASON_ORDER if r in seen), sorted(seen)[0])


# ---------------------------------------------------------------------------------------- scoring
@dataclass
class RunScore:
    case: Case
    problems: list[dict[str, Any]]
    findings: list[dict[str, Any]]  # warning or worse, slimmed (no evidence, no lookup)
    matching: Matching
    seconds: float = 0.0
    #: Per problem: worth a warning by the severity rule on its measured cost (`worth_a_warning`).
    worth: list[bool] = field(default_factory=list)

    def owed(self, p: int) -> bool:
        """Whether problem `p` is owed a warning-or-worse finding (counts in recall)."""
        return self.worth[p] if p < len(self.worth) else True


@dataclass
class Scores:
    runs: list[RunScore] = field(default_factory=list)

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for kind, codes in CODES.items():
            injected = minor = matched = claims = true = 0
            for r in self.runs:
                for p, prob in enumerate(r.problems):
                    if prob["problem"] == kind:
                        injected += 1
                        if r.owed(p):
                            matched += r.matching.problem_matched(p)
                        else:
                            minor += 1
                for c, claim in enumerate(r.matching.claims):
                    if claim.code in codes and r.matching.claim_reason.get(c) != SIBLING:
                        claims += 1
                        true += c in r.matching.claim_problem
            if not injected and not claims:
                continue
            owed = injected - minor
            recall = matched / owed if owed else None
            precision = true / claims if claims else None
            # Nothing owed a warning and nothing claimed: nothing to score.
            ok = (recall is not None or precision is not None) and all(
                v is None or v >= TARGET for v in (recall, precision))
            rows.append({"problem": kind, "codes": list(codes), "injected": injected, "minor": minor,
                         "matched": matched, "recall": recall, "findings": claims, "true": true,
                         "precision": precision,
                         "target": "PASS" if ok else "-" if recall is None and precision is None else "MISS"})
        return rows

    def false_alarms(self) -> list[dict[str, Any]]:
        return [{"scenario": r.case.scenario, "params": dict(r.case.params), "seed": r.case.seed,
                 "code": f["code"], "severity": f["severity"], "rank": f.get("rank"), "message": f["message"]}
                for r in self.runs if r.case.healthy for f in r.findings]

    def reasons(self) -> dict[str, dict[str, Any]]:
        """Per kind, why problems went unmatched and why claims were false, with one example each."""
        out: dict[str, dict[str, Any]] = {}
        for kind, codes in CODES.items():
            missed: Counter[str] = Counter()
            false: Counter[str] = Counter()
            examples: dict[str, str] = {}
            for r in self.runs:
                m = r.matching
                for p, why in m.problem_reason.items():
                    prob = m.problems[p]
                    if prob["problem"] != kind or not r.owed(p):
                        continue
                    missed[why] += 1
                    examples.setdefault(f"missed: {why}", f"{r.case.label()}: {_problem_text(prob)}"
                                        + _nearest_claim_text(m, p, codes, r.findings))
                for c, why in m.claim_reason.items():
                    claim = m.claims[c]
                    if claim.code not in codes or why == SIBLING:
                        continue
                    why = "healthy run" if r.case.healthy else why
                    false[why] += 1
                    examples.setdefault(f"false: {why}", f"{r.case.label()}: {_claim_text(claim, r.findings)}")
            if missed or false:
                out[kind] = {"missed": dict(missed.most_common()), "false": dict(false.most_common()),
                             "examples": examples}
        return out

    def seeds(self) -> list[int]:
        return sorted({r.case.seed for r in self.runs})

    def to_dict(self) -> dict[str, Any]:
        return {"rule": "location (rank, device/stream, link) and time window agree; one claim per problem",
                "target": TARGET, "runs": len(self.runs), "seeds": self.seeds(),
                "variants": len({r.case.variant for r in self.runs}),
                "seconds": sum(r.seconds for r in self.runs),
                "problems": self.table(), "false_alarms": self.false_alarms(), "why": self.reasons(),
                "not_healthy": {k: why for k, (_, why) in NOT_HEALTHY.items()}}


def _fmt_ns(ns: Any) -> str:
    """A problem's or finding's time stamp: to the microsecond, since whether two windows overlap is the point."""
    return ms_at(ns)


def _problem_text(prob: Mapping[str, Any]) -> str:
    where = {k: v for k, v in (prob.get("where") or {}).items() if k in ("rank", "device", "stream", "link", "links")}
    when = prob.get("when") or {}
    return f"problem at {where} [{_fmt_ns(when.get('start_ns'))}, {_fmt_ns(when.get('end_ns'))}]"


def _claim_text(claim: Claim, findings: Sequence[Mapping[str, Any]]) -> str:
    what = "finding" if claim.occurrence is None else f"occurrence {claim.occurrence} of"
    span = ("no time" if claim.ts_ns is None else
            f"[{_fmt_ns(claim.ts_ns)}, {_fmt_ns(claim.ts_ns + (claim.dur_ns or 0))})")
    links = f" links {sorted(claim.links)}" if claim.links else ""
    return (f"{what} {claim.code} rank {claim.rank} device {claim.device} stream {claim.stream} {span}{links}: "
            f"{findings[claim.finding]['message'][:160]}")


def _nearest_claim_text(m: Matching, p: int, codes: tuple[str, ...], findings: Sequence[Mapping[str, Any]]) -> str:
    mine = [c for c, claim in enumerate(m.claims) if claim.code in codes]
    if not mine:
        return ""
    prob = m.problems[p]

    def rank(c: int) -> int:
        why = disagreement(m.claims[c], prob)
        return _REASON_ORDER.index(why) if why in _REASON_ORDER else -1

    c = min(mine, key=rank)
    return f"; nearest: {_claim_text(m.claims[c], findings)}"


def slim(finding: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("code", "severity", "title", "message", "rank", "device", "stream", "ts_ns", "dur_ns")
    out = {k: finding.get(k) for k in keep}
    out["severity"] = str(out["severity"])
    out["occurrences"] = len(finding.get("occurrences") or ())
    return out


def score_run(c: Case, findings: Sequence[Mapping[str, Any]], problems: Sequence[Mapping[str, Any]],
              seconds: float = 0.0) -> RunScore:
    kept = [dict(f) for f in findings if serious(f)]
    return RunScore(c, list(problems), [slim(f) for f in kept], match(kept, problems), seconds,
                    worth_a_warning(problems))


def run_case(c: Case) -> RunScore:
    """Run one case on the emulator and score the analyzers on its trace."""
    import analyzers
    from msprof_py.report import predict_fixes
    from runtime_emu import scenarios

    t0 = time.perf_counter()
    try:
        result = scenarios.run(c.scenario, switches=c.switches, seed=c.seed, **dict(c.params))
    except ValueError as exc:
        raise MsprofError(f"{c.label()}: {exc}") from None
    # The findings as `msprof-py analyze` gives them by default: each time finding's fix replayed,
    # its severity following what the fix saves.
    frames = analyzers.Frames(result.trace)
    analysis = analyzers.run(result.trace, frames=frames)
    predict_fixes(analysis, frames)
    findings = [f.to_dict() for f in analysis.findings]
    problems = _cost_by_fix(c, result.ground_truth.get("problems", []), result.trace)
    return score_run(c, findings, problems, time.perf_counter() - t0)


#: Problem kinds whose run cannot measure what they cost (the host blocked while the device stayed
#: busy: what is lost is the work the host did not get to), and their real fix: the preset override
#: the switch needs dropped (the shipped device).
FIXED_BY_PRESET = ("queue-congestion",)


def _cost_by_fix(c: Case, problems: list[dict[str, Any]], trace: Any) -> list[dict[str, Any]]:
    """`problems` with the cost of each kind in FIXED_BY_PRESET measured by its fix: the same run on
    the shipped device, the span it takes off (first to last device task), shared evenly by the
    problems of that kind."""
    todo = [k for k in FIXED_BY_PRESET if k in c.switches and any(p["problem"] == k for p in problems)]
    if not todo:
        return problems
    from msprof_py.whatif_eval import _scenario, device_span_ns

    span = device_span_ns(trace)
    fixed = device_span_ns(_scenario(c.scenario, c.switches, c.seed, dict(c.params), drop_override=True)())
    out = [dict(p) for p in problems]
    for kind in todo:
        mine = [p for p in out if p["problem"] == kind]
        saved = max(span - fixed, 0)
        for p in mine:
            p["expected"] = {**(p.get("expected") or {}),
                             "cost": {"ns": saved // len(mine), "share": round(saved / len(mine) / span, 6) if span else 0.0,
                                      "of": "device span", "by": "the run on the shipped device"}}
    return out


def evaluate(cases: Sequence[Case], progress: Callable[[int, int], None] | None = None,
             min_injections: int | None = MIN_INJECTIONS,
             runner: Callable[[Case], RunScore] = run_case) -> Scores:
    """Score every case; then, when `min_injections` is set, add seeds to the switch runs of every
    kind injected fewer times than that (the next unused seeds) until each kind reaches it."""
    scores = Scores()
    todo = list(cases)
    done = 0
    for _ in range(8):  # top-up rounds; a kind that injects nothing never asks for more
        total = done + len(todo)
        for c in todo:
            scores.runs.append(runner(c))
            done += 1
            if progress:
                progress(done, total)
        todo = _top_up(scores, min_injections) if min_injections else []
        if not todo:
            break
    return scores


def _top_up(scores: Scores, minimum: int) -> list[Case]:
    injected: Counter[str] = Counter()
    per_variant: dict[tuple, Counter[str]] = defaultdict(Counter)
    seeds_of: dict[tuple, set[int]] = defaultdict(set)
    for r in scores.runs:
        seeds_of[r.case.variant].add(r.case.seed)
        for i, p in enumerate(r.problems):
            if r.owed(i):  # problems worth a warning: the ones recall counts
                injected[p["problem"]] += 1
                per_variant[r.case.variant][p["problem"]] += 1
    short = {k for k, n in injected.items() if n < minimum}
    if not short:
        return []
    next_seed = max(r.case.seed for r in scores.runs) + 1
    out: list[Case] = []
    for kind in sorted(short):
        variants = [v for v, counts in per_variant.items() if counts[kind]]
        per_seed = sum(per_variant[v][kind] / len(seeds_of[v]) for v in variants)
        extra = math.ceil((minimum - injected[kind]) / per_seed)
        for seed in range(next_seed, next_seed + extra):
            for v in variants:
                c = Case(v[0], v[1], v[2], seed)
                if c not in out:
                    out.append(c)
    return out


# ---------------------------------------------------------------------------------------- output
def _ratio(v: Any) -> str:
    return "-" if v is None else sig(v)


def _seeds_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(map(str, seeds))


def render(scores: Scores) -> Group:
    """The strict table, the runs and seeds, why problems and findings failed to match, false alarms."""
    table = scores.table()
    variants = Counter(r.case.variant for r in scores.runs)
    t = Table(title=f"analyzer accuracy, strict rule (location and time agree, one finding per problem), "
                    f"{len(scores.runs)} runs")
    for col in ("problem", "injected", "minor", "matched", "recall", "findings", "true", "precision", "target"):
        t.add_column(col, justify="left" if col == "problem" else "right")
    for r in table:
        t.add_row(r["problem"], str(r["injected"]), str(r["minor"]), str(r["matched"]), _ratio(r["recall"]),
                  str(r["findings"]), str(r["true"]), _ratio(r["precision"]),
                  Text(r["target"], style="green" if r["target"] == "PASS" else "dim" if r["target"] == "-" else "red"))
    parts: list[Any] = [t]
    healthy = sum(1 for r in scores.runs if r.case.healthy)
    parts.append(Text(f"target: precision and recall >= {sig(TARGET)} per kind; findings = claims of the kind's codes "
                      f"(a finding, or each occurrence it lists)"))
    parts.append(Text("minor = injected problems whose measured cost, summed per place, is under the severity rule's "
                      "warning share (analyzers.severity): no warning is owed, so recall leaves them out (a finding on "
                      "one is still true)"))
    parts.append(Text(f"runs: {len(scores.runs)} ({healthy} healthy) of {len(variants)} scenario/switch/parameter "
                      f"variants; seeds {_seeds_text(scores.seeds())}; "
                      f"{ms(sum(r.seconds for r in scores.runs) * NS_PER_MS * 1000)}"))
    runs_by_variant: dict[tuple, list[int]] = defaultdict(list)
    for r in scores.runs:
        runs_by_variant[r.case.variant].append(r.case.seed)
    for (name, sws, params), seeds in sorted(runs_by_variant.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        p = " ".join(f"{k}={v!r}" for k, v in params)
        parts.append(Text(f"  {name:18} {'+'.join(sws) or 'healthy':22} {p:30} seeds {_seeds_text(sorted(seeds))}",
                          style="dim"))
    for what, (_, why) in NOT_HEALTHY.items():
        parts.append(Text(f"not a healthy variant: {what}: {why}", style="dim"))
    reasons = scores.reasons()
    if reasons:
        parts.append(Text("why problems went unmatched (missed) and findings were not true (false):"))
        for kind, info in reasons.items():
            parts.append(Text(f"  {kind}: missed {info['missed'] or '-'}; false {info['false'] or '-'}"))
            for key, example in info["examples"].items():
                parts.append(Text(f"    e.g. {key}: {example}", style="dim"))
    alarms = scores.false_alarms()
    parts.append(Text(f"false alarms on healthy runs: {len(alarms)}", style="green" if not alarms else "red"))
    for a in alarms:
        p = " ".join(f"{k}={v!r}" for k, v in a["params"].items()) or "-"
        parts.append(Text(f"  {a['scenario']} [{p}] seed {a['seed']}: [{a['severity']}] {a['code']}: {a['message']}"))
    return Group(*parts)
