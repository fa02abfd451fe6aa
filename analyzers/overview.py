"""Headline numbers of a trace (step time, utilisation, bubbles, overlap, memory) and the
per-stream / per-copy tables reports publish."""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzers.finding import AnalysisResult
from analyzers.frames import Frames, union_ns
from analyzers.memcpy import bandwidth_summary
from analyzers.streams import copy_bandwidth, queue_series, queue_summary, stream_time


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
    # Per device, over its device-side step windows (the whole device span without steps):
    # compute (some kernel running) and idle (none) add up to the step time, and the idle is
    # split by cause, so utilisation + bubble ratio = 1 by construction.
    from analyzers.bubbles import step_breakdown

    breakdown = step_breakdown(frames) if len(ops) and (ops["kind"].astype(str) == "kernel").any() else None
    util = []
    for (rank, device), g in ops.groupby(["rank", "device"]):
        busy = union_ns(g["ts"].to_numpy(), g["end"].to_numpy())
        span = int(g["end"].max() - g["ts"].min()) or 1
        row = {"rank": int(rank), "device": int(device), "busy_ns": busy, "span_ns": span,
               "busy_ratio": round(busy / span, 6)}
        b = breakdown[(breakdown["rank"] == rank) & (breakdown["device"] == device)] if breakdown is not None else None
        if b is not None and len(b):
            step_ns, compute_ns = int(b["step_ns"].sum()), int(b["compute_ns"].sum())
            row.update({"step_time_ns": step_ns, "compute_ns": compute_ns, "idle_ns": step_ns - compute_ns,
                        "utilisation": round(compute_ns / step_ns, 6) if step_ns else 0.0,
                        "bubble_ratio": round((step_ns - compute_ns) / step_ns, 6) if step_ns else 0.0})
        else:
            row.update({"step_time_ns": span, "compute_ns": 0, "idle_ns": span, "utilisation": 0.0,
                        "bubble_ratio": 1.0})
        util.append(row)
    out["devices"] = util
    if util:
        total = sum(u["step_time_ns"] for u in util) or 1
        compute = sum(u["compute_ns"] for u in util)
        # Time-weighted over devices, so the two shares add up to 1 exactly.
        out["device_utilisation_mean"] = round(compute / total, 6)
        out["bubble_ratio"] = round(1 - compute / total, 6)
    if breakdown is not None and len(breakdown):
        idle_cols = [c for c in breakdown.columns if c.startswith("idle_") and c.endswith("_ns") and c != "idle_ns"]
        total = int(breakdown["step_ns"].sum()) or 1
        out["idle_by_cause"] = {c[5:-3]: round(int(breakdown[c].sum()) / total, 6) for c in idle_cols
                                if breakdown[c].sum() > 0}
    if result is not None:
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
