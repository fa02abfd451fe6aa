"""Queue congestion: how deep stream queues get, how long tasks wait in them, and host blocking."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames
from analyzers.streams import STREAM_KEY, queue_series, queue_summary

CUDA_QUEUE_LIMIT = 1024  # the launch queue depth HTA assumes for CUDA streams


@dataclass
class QueueConfig:
    #: Tasks a stream can hold; None: from the trace (emulator preset) or 1024 for CUDA traces.
    queue_limit: int | None = None
    near_limit: float = 0.9  # a stream whose queue reaches 90% of the limit is congested
    blocked_factor: float = 10.0  # a launch this many times slower than a usual one was blocked
    min_blocked_ns: int = 100_000
    evidence: int = 5


@register("queue", QueueConfig)
def analyze(frames: Frames, cfg: QueueConfig):
    """Queue congestion.

    Pattern: a stream's task queue fills up (910B: 2013 tasks per stream; CUDA: 1024), so
    launches into it block the host and tasks wait long between launch and start.

    Algorithm: queue length per stream as a step function, +1 at each launch and -1 when the
    launched task starts (Holistic Trace Analysis' definition), with count/mean/max over its
    change points; queueing delay (start minus launch) percentiles per stream; host launches
    that took `blocked_factor` times the median launch while their stream's queue was at
    its maximum are time the host spent blocked on a full queue. A stream is flagged when its
    queue reaches `near_limit` of the limit or the host blocked on it.
    """
    series = queue_series(frames)
    if series.empty:
        raise Skipped("no launches linked to device tasks (needs launch rows with corr ids)")
    limit = cfg.queue_limit or _limit_from_trace(frames)
    summary = queue_summary(series)
    delays = _delays(frames)
    blocked = _blocked_launches(frames, series, cfg)
    findings = []
    for row in summary.itertuples(index=False):
        key = (row.rank, row.device, row.stream)
        blk = blocked[(blocked["rank"] == row.rank) & (blocked["device"] == row.device) & (blocked["stream"] == row.stream)]
        blocked_ns = int(blk["blocked_ns"].sum())
        near = row.max >= cfg.near_limit * limit
        if not near and blocked_ns < cfg.min_blocked_ns:
            continue
        d = delays.get(key, {})
        sev = Severity.CRITICAL if row.max >= limit or blocked_ns >= 10 * cfg.min_blocked_ns else Severity.WARNING
        evidence = [{"ts": int(r.ts), "dur": int(r.dur), "blocked_ns": int(r.blocked_ns), "corr": int(r.corr)}
                    for r in blk.sort_values("blocked_ns", ascending=False).head(cfg.evidence).itertuples()]
        findings.append(Finding(
            code="QUEUE_CONGESTION", severity=sev, title="Stream queue congested",
            message=(f"rank {row.rank} device {row.device} stream {row.stream}: queue reached {int(row.max)} of "
                     f"{limit} tasks (mean {row.mean:.1f}); host blocked {blocked_ns / 1e6:.3f} ms in "
                     f"{len(blk)} launches; queueing delay p50 {d.get('p50', 0) / 1e3:.1f} us, "
                     f"p99 {d.get('p99', 0) / 1e3:.1f} us"),
            rank=int(row.rank), device=int(row.device), stream=int(row.stream),
            ts_ns=int(blk["ts"].min()) if len(blk) else None, metric="queue_length_max", value=float(row.max),
            threshold=cfg.near_limit * limit, lost_ns=blocked_ns or int(d.get("p50", 0) * 0), evidence=evidence))
    metrics = summary.assign(**{f"delay_{p}_ns": [delays.get((r.rank, r.device, r.stream), {}).get(p) for r in
                                                   summary.itertuples()] for p in ("p50", "p90", "p99")})
    return findings, {"streams": metrics.to_dict("records"), "queue_limit": limit,
                      "blocked_ns": int(blocked["blocked_ns"].sum()) if len(blocked) else 0}


def _limit_from_trace(frames: Frames) -> int:
    preset = frames.trace.meta.extra.get("preset") or {}
    return int(preset.get("queue_tasks") or CUDA_QUEUE_LIMIT)


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


def _blocked_launches(frames: Frames, series: pd.DataFrame, cfg: QueueConfig) -> pd.DataFrame:
    """Launch calls much slower than usual, made while their stream's queue was at its peak."""
    launches = frames.launches
    cols = ["rank", "device", "stream", "ts", "dur", "corr", "blocked_ns"]
    if launches.empty or launches["dur"].isna().all():
        return pd.DataFrame(columns=cols)
    ops = frames.device_ops[["rank", "corr", "device", "stream"]]
    m = launches[["rank", "corr", "ts", "dur"]].merge(ops[ops["corr"].notna()], on=["rank", "corr"])
    # The usual cost of a launch: a low percentile, since blocked launches may be the majority.
    median = float(np.percentile(m["dur"].to_numpy(), 10))
    slow = m[m["dur"] > max(cfg.blocked_factor * median, median + 1_000)].copy()
    if slow.empty:
        return pd.DataFrame(columns=cols)
    peaks = series.groupby(STREAM_KEY)["queue_length"].max().rename("peak").reset_index()
    # The queue length just before each slow launch, on the launch's stream.
    before = pd.merge_asof(slow.sort_values("ts"), series.sort_values("ts")[["ts", *STREAM_KEY, "queue_length"]],
                           on="ts", by=STREAM_KEY, direction="backward", allow_exact_matches=False)
    before = before.merge(peaks, on=STREAM_KEY)
    full = before[before["queue_length"] >= before["peak"] - 1].copy()
    full["blocked_ns"] = (full["dur"] - median).clip(lower=0).astype(np.int64)
    return full[cols]
