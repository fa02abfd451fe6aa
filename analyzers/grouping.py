"""One finding per problem across the ranks of a job.

A multi-rank job runs the same program on every rank, so a per-rank analyzer finds the same
problem once per rank: sixteen "device idle: waiting on a copy" rows for a 16-rank job. A user
asks once which problem holds the job back; `group_across_ranks` folds the findings of one
analyzer that name the same problem (same code and title; same stream too where the analyzer
reports the problem per stream, i.e. a rank has several of them) on different ranks into one:

- `rank` is the rank where it costs most (its message, evidence and location lead), `ranks`
  the other ranks it was found on, sorted;
- `occurrences` lists every occurrence on every rank (rank, device, stream, when, cost): a
  member's own occurrences with its rank filled in, or the member itself when it has none;
- the cost is the job's, not the sum over ranks. The ranks run side by side and meet at their
  collectives, so a job's step lasts as long as its slowest rank's: occurrences in the same
  step (or, without steps, overlapping in time) form one stretch, which costs the largest
  per-rank sum of lost time in it, and the others' losses hide under it; stretches add up. (The
  what-if replay of the fix on all these ranks, `analyzers.whatif`, then gives the job's saving
  through the job's dependency graph and replaces this estimate as the finding's cost.) A
  memory cost is per device, so the job's is the largest rank's;
- the severity is the worst member's (each graded by the one rule on its own device's step
  time or memory); the what-if re-grades it by the job's saving.

A problem found on one rank only stays that rank's finding, unchanged; cross-rank findings
(`ranks` already set: a straggler, slow links, communication not hidden) and findings that name
no rank are left as they are. Linear in the findings and their occurrences.
"""

from __future__ import annotations

from typing import Any

from analyzers.finding import Finding
from msprof_py.trace.units import ms

#: At most this many evidence items from each rank other than the leading one.
OTHER_RANK_EVIDENCE = 1


def group_across_ranks(findings: list[Finding]) -> list[Finding]:
    """`findings` (one analyzer's, in its order) with the findings of one problem on several ranks
    folded into one, placed where its first member was."""
    groups: dict[tuple, list[Finding]] = {}
    order: list[tuple | Finding] = []
    for f in findings:
        if f.rank is None or f.ranks:
            order.append(f)
            continue
        key = (f.code, f.title)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(f)
    out = []
    for item in order:
        if isinstance(item, Finding):
            out.append(item)
            continue
        members = groups[item]
        ranks = [m.rank for m in members]
        if len(set(ranks)) < len(ranks):
            # The analyzer reports this problem per stream: one finding per stream across ranks
            # (stream numbers of an SPMD program's ranks match; Kineto's often do not, and then
            # its per-rank findings name no stream or one per rank and fold whole).
            by_stream: dict[Any, list[Finding]] = {}
            for m in members:
                by_stream.setdefault(m.stream, []).append(m)
            parts = list(by_stream.values())
        else:
            parts = [members]
        for group in parts:
            if len({m.rank for m in group}) < 2:
                out.extend(group)
            else:
                out.append(_fold(group))
    return out


def rank_text(ranks: list[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 5, 7, 8] -> '0-3, 5, 7-8'."""
    rs = sorted(set(int(r) for r in ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def _fold(members: list[Finding]) -> Finding:
    lead = max(members, key=lambda m: (m.cost, -int(m.rank or 0)))
    ranks = sorted({int(m.rank) for m in members if m.rank is not None})  # type: ignore[arg-type]
    occ = [o for m in members for o in _occurrences(m)]
    occ.sort(key=lambda o: (o.get("ts_ns") if o.get("ts_ns") is not None else -1, o["rank"]))
    starts = [m.ts_ns for m in members if m.ts_ns is not None]
    ends = [m.ts_ns + (m.dur_ns or 0) for m in members if m.ts_ns is not None]
    times = [m for m in members if m.lost_ns is not None]
    lost_ns = job_loss(occ, members) if times else None
    memory = [m.lost_bytes for m in members if m.lost_bytes is not None]
    lost_bytes = max(memory) if memory else None
    evidence = [{**e, "rank": e.get("rank", lead.rank)} for e in lead.evidence]
    for m in sorted(members, key=lambda m: -m.cost):
        if m is not lead:
            evidence += [{**e, "rank": e.get("rank", m.rank)} for e in m.evidence[:OTHER_RANK_EVIDENCE]]
    cost = (f"the job loses {ms(lost_ns)} (occurrences in the same step on different ranks counted once)"
            if lost_ns is not None else f"up to {lost_bytes / 2**20:.1f} MiB on one device"
            if lost_bytes is not None else "")
    message = (f"on {len(ranks)} ranks ({rank_text(ranks)}); the costliest, {lead.message}"
               + (f"; {cost}" if cost else ""))
    return Finding(
        code=lead.code, severity=max(m.severity for m in members), title=lead.title, message=message,
        analyzer=lead.analyzer, rank=lead.rank, device=lead.device, stream=lead.stream,
        ts_ns=min(starts) if starts else None, dur_ns=(max(ends) - min(starts)) if starts else None,
        step=lead.step, metric=lead.metric, value=lead.value, threshold=lead.threshold,
        lost_ns=lost_ns, lost_bytes=lost_bytes, evidence=evidence, lookup=lead.lookup,
        occurrences=occ, ranks=[r for r in ranks if r != lead.rank])


def _occurrences(m: Finding) -> list[dict[str, Any]]:
    """A member's occurrences, each naming its rank (and device / stream where it does not)."""
    where = {"rank": m.rank, "device": m.device, "stream": m.stream}
    if m.occurrences:
        return [{**{k: v for k, v in where.items() if v is not None}, **o, "rank": m.rank} for o in m.occurrences]
    return [{**where, "ts_ns": m.ts_ns, "dur_ns": m.dur_ns, "lost_ns": m.lost_ns,
             **({"lost_bytes": m.lost_bytes} if m.lost_bytes is not None else {})}]


def job_loss(occ: list[dict[str, Any]], members: list[Finding]) -> int:
    """The time the job loses to occurrences on several ranks. Occurrences in the same step
    (same step number) form one stretch: the job's step ends when its slowest rank's does, so
    it loses the largest per-rank sum of lost time in the step. Occurrences without a step form
    stretches where they overlap in time, costed the same way. Stretches add up. A member whose
    occurrences do not carry all of its cost counts as one occurrence over its whole window
    with its whole cost."""
    by_step: dict[int, dict[int, int]] = {}
    spans: list[tuple[int, int, int, int]] = []  # (ts, end, rank, lost) of occurrences without a step
    untimed = 0
    of_rank: dict[Any, list[dict[str, Any]]] = {}
    for o in occ:
        of_rank.setdefault(o["rank"], []).append(o)
    for m in members:
        rank = int(m.rank or 0)
        own = of_rank.get(m.rank, [])
        whole = (bool(m.occurrences) and all(o.get("lost_ns") is not None for o in own)
                 and sum(int(o["lost_ns"]) for o in own) == int(m.lost_ns or 0))
        mine: list[dict[str, Any]] = (own if whole else
                                      [{"step": m.step, "ts_ns": m.ts_ns, "dur_ns": m.dur_ns, "lost_ns": m.lost_ns}])
        for o in mine:
            lost = int(o.get("lost_ns") or 0)
            if o.get("step") is not None:
                per = by_step.setdefault(int(o["step"]), {})
                per[rank] = per.get(rank, 0) + lost
            elif o.get("ts_ns") is not None:
                spans.append((int(o["ts_ns"]), int(o["ts_ns"]) + int(o.get("dur_ns") or 0), rank, lost))
            else:  # no time: it cannot be placed beside the others
                untimed = max(untimed, lost)
    total = sum(max(per.values()) for per in by_step.values())
    spans.sort()
    end: int | None = None
    per_rank: dict[int, int] = {}
    for ts, e, rank, lost in spans:
        if end is not None and ts >= end:
            total += max(per_rank.values())
            per_rank = {}
            end = None
        end = e if end is None else max(end, e)
        per_rank[rank] = per_rank.get(rank, 0) + lost
    if per_rank:
        total += max(per_rank.values())
    return max(total, untimed)
