"""Headline numbers of a trace (step time, utilisation, bubbles, overlap, memory) and the
per-stream / per-copy tables reports publish."""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzers.finding import AnalysisResult
from analyzers.frames import Frames, union_ns
from analyzers.streams import bandwidth_summary, copy_bandwidth, queue_series, queue_summary, stream_time


def overview(frames: Frames, result: AnalysisResult | None = None) -> dict[str, Any]:
    """Summary metrics, plus `streams` and `copies` lists other tools can consume."""
    ops = frames.device_ops
    steps = frames.steps
    t0, t1 = frames.span
    out: dict[str, Any] = {"span_ns": t1 - t0, "events": len(frames.table), "ranks": int(ops["rank"].nunique()) if len(ops) else 0}
    if len(steps):
        durations = (steps["end"] - steps["ts"]).to_numpy()
        out["steps"] = int(len(steps))
        out["step_time_ns_mean"] = float(durations.mean())
        out["step_time_ns_max"] = int(durations.max())
        per_rank = steps.groupby("rank").size()
        span_steps = int(steps["end"].max() - steps["ts"].min()) or 1
        out["throughput_steps_per_s"] = float(per_rank.max() / (span_steps / 1e9))
    util = []
    for (rank, device), g in ops.groupby(["rank", "device"]):
        busy = union_ns(g["ts"].to_numpy(), g["end"].to_numpy())
        span = int(g["end"].max() - g["ts"].min()) or 1
        util.append({"rank": int(rank), "device": int(device), "busy_ns": busy, "span_ns": span,
                     "utilisation": round(busy / span, 6)})
    out["devices"] = util
    if util:
        out["device_utilisation_mean"] = round(float(np.mean([u["utilisation"] for u in util])), 6)
    if result is not None:
        per_step = result.metrics.get("bubbles", {}).get("per_step", [])
        if per_step:
            idle = sum(r["idle_ns"] for r in per_step)
            total = sum(r["step_ns"] for r in per_step) or 1
            out["bubble_ratio"] = round(idle / total, 6)
        overlap = result.metrics.get("bandwidth", {}).get("comm_compute_overlap", [])
        if overlap:
            comm = sum(r["comm_ns"] for r in overlap)
            exposed = sum(r["exposed_ns"] for r in overlap)
            out["comm_overlap_ratio"] = round(1 - exposed / comm, 6) if comm else None
    out["peak_memory_bytes"] = _peak_memory(frames)
    out["streams"] = _streams(frames)
    out["copies"] = [{"rank": int(r["rank"]), "kind": r["kind"], "count": int(r["count"]),
                      "gbps_mean": round(float(r["gbps_mean"]), 6), "gbps_max": round(float(r["gbps_max"]), 6)}
                     for r in bandwidth_summary(copy_bandwidth(frames)).to_dict("records")]
    return out


def _streams(frames: Frames) -> list[dict]:
    st = stream_time(frames)
    q = queue_summary(queue_series(frames))
    rows = []
    qi = {(r["rank"], r["device"], r["stream"]): r for r in q.to_dict("records")}
    for r in st.to_dict("records"):
        k = (r["rank"], r["device"], r["stream"])
        qq = qi.get(k, {})
        rows.append({"rank": int(r["rank"]), "device": int(r["device"]), "stream": int(r["stream"]),
                     "busy_ns": int(r["busy_ns"]), "idle_ns": int(r["idle_ns"]),
                     "queue_len_max": int(qq["max"]) if qq else None,
                     "queue_len_mean": round(float(qq["mean"]), 6) if qq else None})
    return rows


def _peak_memory(frames: Frames) -> int | None:
    c = frames.counters
    if not c.empty:
        names = c["name"].astype(str)
        for name in ("Device memory used", "Device memory allocated"):
            rows = c[names == name]
            if len(rows):
                return int(rows["value"].max())
    mem = frames.memory
    if mem.empty:
        return None
    if mem["value"].notna().any():  # Kineto: Total Allocated after each event
        return int(mem["value"].max())
    delta = np.where(mem["kind"].astype(str) == "alloc", mem["bytes"], -mem["bytes"])
    return int(np.cumsum(delta).max())
