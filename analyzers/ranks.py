"""Slow ranks: one rank computing, communicating or idling more than the others."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames, union_ns


@dataclass
class RankConfig:
    spread: float = 0.05  # msprof-analyze advisor: (max - min) / mean > 5%
    critical_spread: float = 0.2
    min_spread_ns: int = 50_000  # ignore spreads too small to matter


@register("ranks", RankConfig)
def analyze(frames: Frames, cfg: RankConfig):
    """Slow rank.

    Pattern: in a multi-rank job one rank's compute (or communication, or idle) time differs
    from the others', so every collective waits for it.

    Algorithm: per rank, compute = union of kernel time, communication = union of collective
    time, free = the job's span minus the union of all device work. For each of the three,
    spread = (max - min) / mean across ranks (msprof-analyze's rule: > 5% flags a slow
    rank). The straggler is the rank with the most compute (it makes the others wait in
    communication); with compute even, the rank with the least communication time arrived
    last to every collective.
    """
    ops = frames.device_ops
    ranks = sorted(ops["rank"].unique())
    if len(ranks) < 2:
        raise Skipped("fewer than two ranks in the trace")
    t0, t1 = int(ops["ts"].min()), int(ops["end"].max())
    rows = []
    for rank in ranks:
        g = ops[ops["rank"] == rank]
        kind = g["kind"].astype(str)
        comp = g[kind != "collective"]
        comm = g[kind == "collective"]
        rows.append({"rank": int(rank),
                     "compute_ns": union_ns(comp["ts"].to_numpy(), comp["end"].to_numpy()),
                     "communication_ns": union_ns(comm["ts"].to_numpy(), comm["end"].to_numpy()),
                     "free_ns": (t1 - t0) - union_ns(g["ts"].to_numpy(), g["end"].to_numpy())})
    findings = []
    for metric in ("compute_ns", "communication_ns", "free_ns"):
        vals = np.array([r[metric] for r in rows], dtype=np.float64)
        mean = vals.mean()
        spread = (vals.max() - vals.min()) / mean if mean else 0.0
        for r in rows:
            r[f"{metric[:-3]}_spread"] = round(spread, 4)
        if spread <= cfg.spread or vals.max() - vals.min() < cfg.min_spread_ns:
            continue
        if metric == "communication_ns":
            culprit = rows[int(vals.argmin())]  # waited least: arrived last
        else:
            culprit = rows[int(vals.argmax())] if metric == "compute_ns" else rows[int(vals.argmin())]
        lost = int(vals.max() - vals.min())
        findings.append(Finding(
            code="SLOW_RANK", severity=Severity.CRITICAL if spread >= cfg.critical_spread else Severity.WARNING,
            title="Slow rank", rank=culprit["rank"],
            message=(f"{metric[:-3]} time differs across {len(rows)} ranks by {spread:.1%} of the mean "
                     f"({vals.min() / 1e6:.3f} - {vals.max() / 1e6:.3f} ms); rank {culprit['rank']} is the straggler"),
            metric=f"{metric[:-3]}_spread", value=round(spread, 4), threshold=cfg.spread, lost_ns=lost,
            evidence=[{"rank": r["rank"], metric: r[metric]} for r in sorted(rows, key=lambda r: -r[metric])[:5]]))
    # One finding per straggler: keep the most telling metric.
    best: dict[int, Finding] = {}
    for f in findings:
        if f.rank not in best or (f.value or 0) > (best[f.rank].value or 0):
            best[f.rank] = f
    return list(best.values()), {"ranks": rows}
