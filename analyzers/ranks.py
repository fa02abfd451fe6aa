"""Slow ranks: the rank the others wait for in their collectives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzers.causality import idle_by_rank
from analyzers.causality.collectives import match as match_collectives
from analyzers.causality.pipeline import RECV, SEND
from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames, union_ns
from analyzers.severity import WARNING_SHARE, severity
from msprof_py.trace.units import ms, pct


@dataclass
class RankConfig:
    #: A rank counts as the one a collective waited for only when it arrived at least this much
    #: after the next-latest rank (below it, arrival order is noise).
    min_late_ns: int = 10_000
    #: The straggler must explain at least this share of all the waiting in matched collectives.
    min_share_of_waiting: float = 0.5
    #: A straggler is reported when the others waited at least this long for it (their mean wait,
    #: summed over the collectives it held up), whatever that cost their devices.
    min_lost_ns: int = 50_000
    spread: float = 0.05  # msprof-analyze advisor: (max - min) / mean > 5% (supporting metric)
    evidence: int = 5


@register("ranks", RankConfig)
def analyze(frames: Frames, cfg: RankConfig):
    """Slow rank (straggler).

    Pattern: in a multi-rank job one rank reaches the collectives later than the others (its
    device computes slower, or its host is late launching: data loading, preprocessing), so
    every other rank sits waiting in each collective until it arrives.

    Algorithm: a rank's part of a collective is the collective op plus the wait tasks (kind
    `wait`, e.g. HCCL's Notify_Wait) that share its correlation id on its stream; the rank
    arrives at the start of that part. (On NCCL traces the collective kernel itself spins until
    the peers arrive, so its start is the arrival.) The same collective is matched across ranks
    by (stream, name, bytes, n-th such collective on the rank's stream), falling back to
    (name, bytes, n-th) when streams are numbered differently per rank; a match counts only if
    no part ended before the last arrival (a collective cannot complete before every member
    arrives: this rejects point-to-point ops matched with the wrong peer). Per matched
    collective, the rank arriving last (by at least `min_late_ns` over the next) is the one
    the others waited for, and each other rank waited (last arrival - its arrival).
    The straggler is the rank the others waited for most. Its cost, summed over the
    collectives where it came last, is the *mean* wait of the other members: the time an
    average rank of the job sat idle in that collective because of it, which is what an
    independent measurement of "time the other ranks spend waiting in collectives" gives
    (the max would overstate it whenever one rank was itself a bit late; the sum over ranks
    counts device-time, not job time), capped by its evidence in the causal attribution: the
    mean over those members of their device idle the attribution charges to the straggler
    (their waits while a kernel still ran on their device cost nothing). The cost is part of the
    waiting ranks' BUBBLE_COLLECTIVE, never added to it (analyzers.severity.COST_OF). One finding names the straggler (`rank`), the ranks
    that waited (`ranks`) and the window from the first to the last affected collective (one
    straggler is one problem: the collectives it held up are evidence and metrics, not separate
    occurrences); per-rank compute / communication / wait / free time are in the metrics. Severity: warning when the cost is >= `warning`
    of the job's span, critical when >= `critical`; info below. msprof-analyze's rule,
    spread = (max - min) / mean of per-rank compute, communication (collectives with their
    waits) and free time, is kept as a supporting metric.
    """
    return reduce([summarize(frames)], cfg)


def summarize(frames: Frames) -> dict:
    """What the slow-rank analysis needs of some ranks (one partition or the whole trace): their
    collective arrival table (`collective_parts`: one row per collective op), and per rank its
    device, compute / communication / wait / busy time and first and last device moment. Small
    next to the trace: `reduce` over the summaries of all partitions gives the findings."""
    ops = frames.device_ops
    parts = collective_parts(frames)
    idle = idle_by_rank(frames)
    rows = []
    for rank in sorted(int(r) for r in ops["rank"].unique()):
        g = ops[ops["rank"] == rank]
        comp = g[g["kind"].astype(str) != "collective"]
        p = parts[parts["rank"] == rank]
        busy_ts = np.concatenate([g["ts"].to_numpy(), p["arrival_ns"].to_numpy()])
        busy_end = np.concatenate([g["end"].to_numpy(), p["end"].to_numpy()])
        rows.append({"rank": int(rank), "device": int(g["device"].iloc[0]) if len(g) else None,
                     "compute_ns": union_ns(comp["ts"].to_numpy(), comp["end"].to_numpy()),
                     "communication_ns": union_ns(p["arrival_ns"].to_numpy(), p["end"].to_numpy()),
                     "wait_ns": int(p["wait_ns"].sum()), "busy_ns": union_ns(busy_ts, busy_end),
                     "t0": int(g["ts"].min()), "t1": int(g["end"].max()),
                     # Its device idle the attribution charges to each peer it waited for.
                     "peer_idle_ns": dict(idle.get(rank, {}).get("peer_ns", {}))})
    return {"parts": parts, "ranks": rows}


def reduce(summaries: list[dict], cfg: RankConfig):
    """The slow-rank findings and metrics from the `summarize` outputs of all partitions (in rank
    order): the collectives are matched across the partitions' arrival tables."""
    per_rank = sorted((r for s in summaries for r in s["ranks"]), key=lambda r: r["rank"])
    ranks = [r["rank"] for r in per_rank]
    if len(ranks) < 2:
        raise Skipped("fewer than two ranks in the trace")
    t0, t1 = min(r["t0"] for r in per_rank), max(r["t1"] for r in per_rank)
    span = max(t1 - t0, 1)
    tables = [s["parts"] for s in summaries if len(s["parts"])]
    parts = (pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0] if tables
             else summaries[0]["parts"])
    parts = parts.sort_values(["rank", "stream", "ts"], kind="stable").reset_index(drop=True)
    rows = _spreads(per_rank, span)
    metrics: dict = {"ranks": rows}
    inst = match_collectives(parts)
    metrics["collectives_matched"] = int(inst["instance"].nunique()) if not inst.empty else 0
    if inst.empty:
        return [], metrics
    per = _per_collective(inst, cfg)
    waited = per[per["late_rank"] >= 0]
    caused = waited.groupby("late_rank")["mean_wait_ns"].sum()
    total_wait = float(per["mean_wait_ns"].sum())
    metrics["caused_wait_ns"] = {int(r): int(v) for r, v in caused.items()}
    if caused.empty:
        return [], metrics
    straggler = int(caused.idxmax())
    mine = waited[waited["late_rank"] == straggler].sort_values("first_arrival_ns")
    # The straggler is named by arrivals (as HTA names it); its cost is a view of the attribution:
    # what the others' devices sat idle waiting for it (part of their BUBBLE_COLLECTIVE,
    # analyzers.severity.COST_OF), averaged over them. A rank that waited while its device still
    # computed, or whose next kernels waited for something else, lost nothing to it then.
    members = sorted({r for ws in mine["waits"] for r in ws})
    peer_idle = {r["rank"]: r.get("peer_idle_ns", {}) for r in per_rank}
    evidence = sum(peer_idle.get(r, {}).get(straggler, 0) for r in members) / max(len(members), 1)
    metrics["caused_idle_ns"] = int(evidence)
    lost = int(min(caused.max(), evidence))
    if caused.max() < cfg.min_lost_ns or (total_wait and caused.max() / total_wait < cfg.min_share_of_waiting):
        return [], metrics
    share = lost / span
    sev = severity(share, "SLOW_RANK")
    waiting = sorted({r for ws in mine["waits"] for r, w in ws.items() if w > 0})
    ts = int(mine["first_arrival_ns"].min())
    end = int(mine["end_ns"].max())
    # The collectives it held up (all in the metrics, the costliest as evidence). They are not
    # separate occurrences: one straggler is one problem, over the window they span. The
    # collective's stream is where the others waited, not where the straggler was slow (its
    # compute stream or its host), so they name the collective's stream as such.
    held = [{"rank": straggler, "collective_stream": int(o.stream), "name": o.name, "ts": int(o.first_arrival_ns),
             "dur": int(o.last_arrival_ns - o.first_arrival_ns), "lost_ns": int(o.mean_wait_ns)}
            for o in mine.itertuples()]
    metrics["held_up"] = held
    by_rank = {r["rank"]: r for r in rows}
    finding = Finding(
        code="SLOW_RANK", severity=sev, title="Slow rank: the others wait for it in collectives",
        message=(f"rank {straggler} arrived last at {len(mine)} of {len(per)} matched collectives; "
                 f"{len(waiting)} other rank(s) waited {ms(mine['mean_wait_ns'].mean())} on average "
                 f"each time, {ms(caused.max())} in all, {ms(lost)} of it with their devices idle "
                 f"({pct(share)} of the job's span)"),
        rank=straggler, device=by_rank[straggler].get("device"), ts_ns=ts, dur_ns=end - ts,
        metric="collective_wait_caused_ns", value=float(lost), threshold=float(WARNING_SHARE * span),
        lost_ns=lost, ranks=waiting,
        evidence=sorted(held, key=lambda h: -h["lost_ns"])[: cfg.evidence])
    return [finding], metrics


def collective_parts(frames: Frames) -> pd.DataFrame:
    """One row per collective op: rank, device, stream, name, bytes, corr, arrival_ns (start of
    its wait tasks, else of the op), ts, end, wait_ns (time in its wait tasks), group and seq (the
    communicator and call number the trace records, NaN where it records none)."""
    ops = frames.device_ops
    colls = ops[ops["kind"].astype(str) == "collective"]
    # A point-to-point transfer (a send or a receive, not both: analyzers.causality.pipeline) is a
    # hand-off whose wait is its data dependency (a pipeline stage waiting for the one before), not
    # a straggler's.
    names = colls["name"].astype(str)
    colls = colls[~(names.str.contains(SEND) ^ names.str.contains(RECV))]
    cols = ["rank", "device", "stream", "name", "bytes", "corr", "arrival_ns", "ts", "end", "wait_ns", "group", "seq"]
    if colls.empty:
        return pd.DataFrame(columns=cols)
    c = pd.DataFrame({"rank": colls["rank"].to_numpy().astype(np.int64), "device": colls["device"].to_numpy(),
                      "stream": colls["stream"].to_numpy(), "name": colls["name"].astype(str).to_numpy(),
                      "bytes": colls["bytes"].fillna(-1).to_numpy().astype(np.int64),
                      "corr": colls["corr"].to_numpy(dtype=np.float64),
                      "ts": colls["ts"].to_numpy(), "end": colls["end"].to_numpy(),
                      # The communicator and call number the producer recorded (collectives.match).
                      "group": colls["addr"].to_numpy(dtype=np.float64),
                      "seq": colls["value"].to_numpy(dtype=np.float64)})
    waits = _device_waits(frames)
    c["arrival_ns"] = c["ts"]
    c["wait_ns"] = 0
    if not waits.empty and c["corr"].notna().any():
        w = waits.groupby(["rank", "stream", "corr"]).agg(wts=("ts", "min"), wdur=("dur", "sum")).reset_index()
        m = c.reset_index().merge(w, on=["rank", "stream", "corr"], how="left").set_index("index")
        has = m["wts"].notna() & (m["wts"] <= m["ts"])
        c.loc[has[has].index, "arrival_ns"] = m.loc[has, "wts"].astype(np.int64)
        c.loc[has[has].index, "wait_ns"] = m.loc[has, "wdur"].astype(np.int64)
    return c[cols].sort_values(["rank", "stream", "ts"], kind="stable").reset_index(drop=True)


def _device_waits(frames: Frames) -> pd.DataFrame:
    """Wait tasks that ran on a device stream (X events of kind wait with a stream and corr)."""
    t = frames.table
    mask = (frames.kind_mask(("wait",)) & t.column("stream").is_valid().to_numpy(zero_copy_only=False)
            & t.column("corr").is_valid().to_numpy(zero_copy_only=False))
    if not mask.any():
        return pd.DataFrame(columns=["rank", "stream", "corr", "ts", "dur"])
    sub = t.select(["rank", "ph", "stream", "corr", "ts", "dur"]).filter(pa.array(mask))
    sub = sub.filter(pc.equal(sub.column("ph").cast(pa.string()), "X"))
    return pd.DataFrame({"rank": sub.column("rank").to_numpy().astype(np.int64),
                         "stream": sub.column("stream").to_numpy().astype(np.int64),
                         "corr": sub.column("corr").to_numpy().astype(np.float64),
                         "ts": sub.column("ts").to_numpy(),
                         "dur": sub.column("dur").fill_null(0).to_numpy()})


def _per_collective(inst: pd.DataFrame, cfg: RankConfig) -> pd.DataFrame:
    """Per matched collective: who came last, each other rank's wait, their mean, the window."""
    out = []
    for i, g in inst.groupby("instance", sort=False):
        arr = g["arrival_ns"].to_numpy()
        rk = g["rank"].to_numpy()
        order = np.argsort(arr, kind="stable")
        last, second = int(arr[order[-1]]), int(arr[order[-2]])
        late = int(rk[order[-1]]) if last - second >= cfg.min_late_ns else -1
        waits = {int(r): int(last - a) for r, a in zip(rk, arr) if r != rk[order[-1]]}
        out.append({"instance": int(i), "name": str(g["name"].iloc[0]), "stream": int(g["stream"].iloc[0]),
                    "late_rank": late, "first_arrival_ns": int(arr.min()), "last_arrival_ns": last,
                    "end_ns": int(g["end"].max()), "waits": waits,
                    "mean_wait_ns": float(np.mean(list(waits.values())))})
    return pd.DataFrame(out)


def _spreads(per_rank: list[dict], span: int) -> list[dict]:
    """Per rank: compute, communication (collectives with their waits), wait and free time, and
    msprof-analyze's spread of each across ranks."""
    rows = [{"rank": r["rank"], "device": r["device"], "compute_ns": r["compute_ns"],
             "communication_ns": r["communication_ns"], "wait_ns": r["wait_ns"], "free_ns": span - r["busy_ns"]}
            for r in per_rank]
    for metric in ("compute_ns", "communication_ns", "free_ns"):
        vals = np.array([r[metric] for r in rows], dtype=np.float64)
        mean = vals.mean()
        spread = (vals.max() - vals.min()) / mean if mean else 0.0
        for r in rows:
            r[f"{metric[:-3]}_spread"] = round(float(spread), 4)
    return rows
