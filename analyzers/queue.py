"""Queue congestion: how deep stream queues get, how long tasks wait in them, and host blocking."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Cover, Frames
from analyzers.severity import WARNING_SHARE, severity
from analyzers.streams import STREAM_KEY, queue_series, queue_summary
from msprof_py.trace.units import ms, pct

CUDA_QUEUE_LIMIT = 1024  # the launch queue depth Holistic Trace Analysis assumes for CUDA (and ROCm) streams
ASCEND_QUEUE_LIMIT = 2013  # 910B: tasks a stream holds (2048 hardware entries) before a launch blocks


@dataclass
class QueueConfig:
    #: Tasks a stream can hold (queued or running) before a launch blocks. None: the emulator's
    #: preset when the trace has one, else 2013 on Ascend traces and 1024 (HTA's figure) otherwise.
    queue_limit: int | None = None
    #: A queue within this share of its limit counts as full: a trace does not show every entry the
    #: runtime counts (event records and waits hold slots too), and on CUDA the limit is an estimate.
    full_slack: float = 0.01
    #: A stream whose queue reaches this share of the limit is reported (it is one burst from
    #: full); its severity is the one rule's (analyzers.severity) on the time the host blocked.
    near_limit: float = 0.95
    #: A congestion episode ends when the queue falls to this share of the limit or below (the host
    #: stopped feeding it for a while: launches went through without blocking again).
    episode_release: float = 0.9
    evidence: int = 5


@register("queue", QueueConfig)
def analyze(frames: Frames, cfg: QueueConfig):
    """Queue congestion.

    Pattern: a stream's task queue holds a bounded number of tasks (910B: 2013 per stream; CUDA:
    1024 as Holistic Trace Analysis assumes). When the host launches faster than the stream
    retires work, the queue fills and every further launch call blocks inside the runtime until
    a task finishes: the host thread stalls, and whatever it would do next (launches on other
    streams, data loading) waits too. Profilers show no 'blocked' marker: the launch call just
    takes far longer than usual while its stream's queue is at the limit.

    Algorithm: the queue length per stream as HTA defines it (`queue_series`: +1 at each launch,
    -1 when the launched task starts). Before each launch call, the stream's occupancy is that
    queue length plus the task running on the stream, if one is (the runtime counts a task until
    it retires). A launch is made at a full queue when the occupancy is at least
    `(1 - full_slack) * limit`; it blocked for its duration minus the usual duration of a launch
    of the same API on the same thread made while the queue was not full (their median), unless
    that excess is within those launches' own spread (90th percentile minus median), in which
    case it did not block. A stream's cost is the sum of blocked time. Full launches form congestion episodes, split
    where a launch between them found the queue at `episode_release * limit` or below; each
    episode has its window (first blocked launch to the end of the last) and cost, listed as
    occurrences when there are several. Severity: no finding while the queue stays under
    `near_limit * limit` and the host blocked less than 3% of the rank's span (WARNING_SHARE);
    reported otherwise, with the one severity rule (analyzers.severity) on the blocked share.
    Queueing delay (start minus launch) percentiles per stream go to the metrics.
    """
    series = queue_series(frames)
    if series.empty:
        raise Skipped("no launches linked to device tasks (needs launch rows with corr ids)")
    limit = int(cfg.queue_limit or _limit_from_trace(frames))
    full_level = (1.0 - cfg.full_slack) * limit
    summary = queue_summary(series)
    delays = _delays(frames)
    launches = _launch_table(frames, series, limit, cfg.full_slack)
    per_stream = {tuple(int(k) for k in key): g for key, g in launches.groupby(STREAM_KEY)}
    spans = _rank_spans(frames)
    findings = []
    stream_rows = []
    for row in summary.itertuples(index=False):
        key = (int(row.rank), int(row.device), int(row.stream))
        mine = per_stream.get(key, launches.iloc[:0])
        peak = int(min(mine["occupancy"].max() + 1, limit)) if len(mine) else int(row.max)
        full = mine[mine["full"]]
        blocked_ns = int(full["blocked_ns"].sum())
        n_blocked = int((full["blocked_ns"] > 0).sum())
        d = delays.get(key, {})
        held = _idle_held(frames, key[0], full)
        stream_rows.append({"rank": key[0], "device": key[1], "stream": key[2], "count": int(row.count),
                            "idle_held_ns": held,
                            "mean": float(row.mean), "max": int(row.max), "peak_occupancy": peak,
                            "full_launches": len(full), "blocked_launches": n_blocked, "blocked_ns": blocked_ns,
                            **{f"delay_{p}_ns": d.get(p) for p in ("p50", "p90", "p99")}})
        span = spans.get(key[0], 0)
        share = blocked_ns / span if span > 0 else 0.0
        if peak < cfg.near_limit * limit and share < WARNING_SHARE:
            continue
        sev = severity(share, "QUEUE_CONGESTION")
        episodes = _episodes(mine, cfg.episode_release * limit)
        deep = mine[mine["occupancy"] + 1 >= cfg.near_limit * limit]
        if episodes:
            ts_ns, end_ns = episodes[0]["ts_ns"], episodes[-1]["ts_ns"] + episodes[-1]["dur_ns"]
        elif len(deep):  # near the limit, never full: where launches found the queue deepest
            ts_ns, end_ns = int(deep["ts"].min()), int((deep["ts"] + deep["dur"]).max())
        else:
            ts_ns = end_ns = None
        worst = full.sort_values("blocked_ns", ascending=False, kind="stable").head(cfg.evidence)
        evidence = [{"ts": int(r.ts), "dur": int(r.dur), "blocked_ns": int(r.blocked_ns), "corr": int(r.corr),
                     "name": str(r.name), "queued": int(r.occupancy)} for r in worst.itertuples()]
        where = dict(zip(STREAM_KEY, key))
        findings.append(Finding(
            code="QUEUE_CONGESTION", severity=sev, title="Stream queue congested",
            message=(f"rank {key[0]} device {key[1]} stream {key[2]}: queue held up to {peak} of {limit} tasks "
                     f"(queued or running); host blocked {ms(blocked_ns)} ({pct(share)} of the span) in "
                     f"{n_blocked} of {len(full)} launches made at a full queue, in {len(episodes)} episode(s), "
                     f"{ms(held)} of it with the device idle waiting for launches held behind it; "
                     f"queueing delay p50 {ms(d.get('p50', 0))}, p99 {ms(d.get('p99', 0))}"),
            **where, ts_ns=ts_ns, dur_ns=None if ts_ns is None else end_ns - ts_ns,
            metric="queue_occupancy_max", value=float(peak), threshold=cfg.near_limit * limit, lost_ns=blocked_ns,
            evidence=evidence, occurrences=[{**where, **e} for e in episodes] if len(episodes) > 1 else []))
    total = int(launches["blocked_ns"].sum()) if len(launches) else 0
    return findings, {"streams": stream_rows, "queue_limit": limit, "full_level": full_level, "blocked_ns": total}


def _idle_held(frames: Frames, rank: int, full: pd.DataFrame) -> int:
    """Device idle of `rank` the attribution charges to the host blocked at a full queue, inside
    the blocked parts of `full`'s launches (each idle row at most once, at most its overlap)."""
    from analyzers.causality import attribution

    blocked = full[full["blocked_ns"] > 0]
    if blocked.empty:
        return 0
    table = attribution(frames)
    rows = table[(table["rank"] == rank) & (table["cause"] == "queue")]
    if rows.empty:
        return 0
    c = Cover(blocked["ts"].to_numpy(np.int64), (blocked["ts"] + blocked["blocked_ns"]).to_numpy(np.int64))
    overlap = c.between(rows["ts"].to_numpy(np.int64), rows["end"].to_numpy(np.int64))
    return int(np.minimum(overlap, rows["idle_ns"].to_numpy(np.int64)).sum())


def blocked_at_full_queue(frames: Frames) -> pd.DataFrame:
    """The launches that blocked at a full stream queue by the default settings (QueueConfig):
    `blocked_launches` rows with blocked_ns > 0, cached per frames. The dependency graph reads
    them: such a call returned when a task on its stream retired (analyzers.causality)."""
    key = ("queue.blocked",)
    if key not in frames._cache:
        series = queue_series(frames)
        cols = ["rank", "device", "stream", "pid", "tid", "name", "ts", "dur", "corr", "blocked_ns"]
        if series.empty:
            frames._cache[key] = pd.DataFrame(columns=cols)
        else:
            b = _launch_table(frames, series, _limit_from_trace(frames), QueueConfig.full_slack)
            frames._cache[key] = b.loc[b["blocked_ns"] > 0, cols].reset_index(drop=True)
    return frames._cache[key]


def _launch_table(frames: Frames, series: pd.DataFrame, limit: int, full_slack: float) -> pd.DataFrame:
    """`blocked_launches` cached per frames and settings (the analyzer and the dependency graph
    read the same table)."""
    key = ("queue.launches", int(limit), float(full_slack))
    if key not in frames._cache:
        frames._cache[key] = blocked_launches(frames, series, limit, full_slack)
    return frames._cache[key]


def _limit_from_trace(frames: Frames) -> int:
    preset = frames.trace.meta.extra.get("preset") or {}
    if preset.get("queue_tasks"):
        return int(preset["queue_tasks"])
    return ASCEND_QUEUE_LIMIT if frames.platform == "ascend" else CUDA_QUEUE_LIMIT


def blocked_launches(frames: Frames, series: pd.DataFrame, limit: int, full_slack: float = 0.0) -> pd.DataFrame:
    """Every launch linked one-to-one to a device op, with its stream, the stream's occupancy just
    before the call (HTA queue length + the task running), whether that was full, the usual
    duration of such a launch on its thread, and the time it blocked (0 unless full).

    Columns: rank, device, stream, pid, tid, name, ts, dur, corr, occupancy, full, usual_ns, blocked_ns.
    """
    cols = ["rank", "device", "stream", "pid", "tid", "name", "ts", "dur", "corr", "occupancy", "full", "usual_ns",
            "blocked_ns"]
    launches = frames.launches
    launches = launches[launches["dur"].notna()] if len(launches) else launches
    ops = frames.device_ops
    if launches.empty or ops.empty:
        return pd.DataFrame(columns=cols)
    linked = ops[ops["corr"].notna()]
    linked = linked[~linked.duplicated(["rank", "corr"], keep=False)]  # one op per launch, as queue_series
    m = launches[["rank", "pid", "tid", "name", "corr", "ts", "dur"]].merge(
        linked[["rank", "corr", "device", "stream"]], on=["rank", "corr"])
    if m.empty:
        return pd.DataFrame(columns=cols)
    m["name"] = m["name"].astype(str)
    m["dur"] = m["dur"].astype(np.int64)
    m = m.sort_values("ts", kind="stable").reset_index(drop=True)
    for c in STREAM_KEY:
        m[c] = m[c].astype(np.int64)
    # Queue length just before the call (changes at the call's own ts come after it).
    s = series[["ts", *STREAM_KEY, "queue_length"]].astype(np.int64).sort_values("ts", kind="stable")
    m = pd.merge_asof(m, s, on="ts", by=STREAM_KEY, direction="backward", allow_exact_matches=False)
    # The task running on the stream then, if any: the latest op that started before the call.
    running = ops[[*STREAM_KEY, "ts", "end"]].astype(np.int64).sort_values("ts", kind="stable")
    running = running.rename(columns={"ts": "op_ts"})
    m = pd.merge_asof(m, running, left_on="ts", right_on="op_ts", by=STREAM_KEY, direction="backward",
                      allow_exact_matches=False)
    m["occupancy"] = (m["queue_length"].fillna(0).astype(np.int64)
                      + (m["end"].fillna(-1).to_numpy() > m["ts"].to_numpy()).astype(np.int64))
    m["full"] = m["occupancy"] >= (1.0 - full_slack) * limit
    usual, noise = _usual_durations(m)
    m["usual_ns"] = usual
    excess = m["dur"].to_numpy() - usual
    # A full-queue launch no slower than unblocked ones often are did not block.
    m["blocked_ns"] = np.where(m["full"].to_numpy() & (excess > noise), excess, 0).astype(np.int64)
    return m[cols]


def _usual_durations(m: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per launch: the median duration of launches of the same API on the same thread made while
    their queue was not full (falling back to the thread's, then all, unblocked launches, then
    the fastest launch when every one found its queue full), and their spread (90th percentile
    minus median, 0 without a group): how much slower an unblocked launch may be by chance."""
    free = m[~m["full"]]
    usual = pd.Series(np.nan, index=m.index)
    noise = pd.Series(np.nan, index=m.index)
    for keys in (["rank", "pid", "tid", "name"], ["rank", "pid", "tid"]):
        g = free.groupby(keys, observed=True, dropna=False)["dur"]
        stats = pd.DataFrame({"med": g.median(), "spread": g.quantile(0.9) - g.median()})
        got = m[keys].merge(stats, left_on=keys, right_index=True, how="left")
        usual = usual.fillna(pd.Series(got["med"].to_numpy(), index=m.index))
        noise = noise.fillna(pd.Series(got["spread"].to_numpy(), index=m.index))
    fallback = float(free["dur"].median()) if len(free) else float(m["dur"].min())
    return usual.fillna(fallback).to_numpy(dtype=np.float64), noise.fillna(0.0).to_numpy(dtype=np.float64)


def _episodes(mine: pd.DataFrame, release: float) -> list[dict]:
    """The full launches of one stream grouped into episodes: a new one starts when a launch on
    the stream since the previous full one found the queue at `release` tasks or fewer (to fill
    again, the queue passes through such launches)."""
    mine = mine.sort_values("ts", kind="stable")
    full = mine["full"].to_numpy()
    if not full.any():
        return []
    low = np.cumsum(mine["occupancy"].to_numpy() <= release)[full]
    starts = mine["ts"].to_numpy()[full]
    ends = starts + mine["dur"].to_numpy()[full]
    blocked = mine["blocked_ns"].to_numpy()[full]
    new = np.ones(len(starts), dtype=bool)
    new[1:] = low[1:] > low[:-1]
    out = []
    for idx in np.split(np.arange(len(starts)), np.flatnonzero(new)[1:]):
        hit = idx[blocked[idx] > 0]
        span = hit if len(hit) else idx  # the window: the launches that blocked, else all full ones
        t0, t1 = int(starts[span].min()), int(ends[span].max())
        out.append({"ts_ns": t0, "dur_ns": t1 - t0, "lost_ns": int(blocked[idx].sum()), "launches": len(idx),
                    "blocked_launches": int((blocked[idx] > 0).sum())})
    return out


def _rank_spans(frames: Frames) -> dict[int, int]:
    """Per rank: from its first host call or device op to the last one's end."""
    parts = []
    for df, end in ((frames.host_calls, None), (frames.device_ops, "end")):
        if len(df):
            e = df[end] if end else df["ts"] + df["dur"].fillna(0)
            parts.append(pd.DataFrame({"rank": df["rank"].to_numpy(), "ts": df["ts"].to_numpy(),
                                       "end": e.to_numpy()}))
    if not parts:
        return {}
    both = pd.concat(parts)
    g = both.groupby("rank")
    return {int(r): int(e - t) for r, t, e in zip(g["ts"].min().index, g["ts"].min(), g["end"].max())}


def _delays(frames: Frames) -> dict:
    ops = frames.device_ops[["rank", "corr", *STREAM_KEY[1:], "ts"]]
    launches = frames.launches[["rank", "corr", "ts"]]
    m = launches.merge(ops[ops["corr"].notna()], on=["rank", "corr"], suffixes=("_launch", ""))
    m = m[~m.duplicated(["rank", "corr"], keep=False)]
    m["delay"] = m["ts"] - m["ts_launch"]
    out = {}
    for key, g in m.groupby(STREAM_KEY):
        q = np.percentile(g["delay"].to_numpy(), [50, 90, 99])
        out[key] = {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}
    return out
