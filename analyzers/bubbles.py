"""Pipeline bubbles: device idle time within steps, by what the device waited for.

A view of the causal attribution (analyzers.causality): every kernel-idle nanosecond has one
cause, found by walking back from the task that ended the idle through what it waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.causality import CAUSE_LABELS, CAUSES, EDGE_CAUSES, HOST_CAUSES, attribution, device_windows
from analyzers.causality.attribution import ATTRIBUTION_COLUMNS
from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames
from analyzers.severity import severity
from msprof_py.trace.units import ms, pct

__all__ = ["ALL_CAUSES", "CODES", "EDGE_CAUSES", "GAP_COLUMNS", "HOST_CAUSES", "BubbleConfig", "analyze",
           "device_gaps", "device_windows", "occurrences", "step_breakdown"]

#: Finding code of each cause the bubble analyzer reports (launch overhead is LAUNCH_BOUND's).
CODES = {
    "host": "BUBBLE_HOST_LAUNCH",
    "sync": "BUBBLE_SYNC",
    "blocking_copy": "BUBBLE_BLOCKING_COPY",
    "compile": "BUBBLE_OP_COMPILE",
    "data": "BUBBLE_DATA",
    "host_idle": "BUBBLE_HOST_IDLE",
    "copy": "BUBBLE_COPY",
    "event": "BUBBLE_EVENT",
    "collective": "BUBBLE_COLLECTIVE",
    "unexplained": "BUBBLE_OTHER",
}
GAP_COLUMNS = ATTRIBUTION_COLUMNS
ALL_CAUSES = CAUSES


@dataclass
class BubbleConfig:
    """Settings of the bubble analyzer (times in ns)."""

    #: A task's release and its start further apart than this are not dispatch latency: the
    #: wait has a cause the trace must show (else it is unexplained).
    dispatch_ns: int = 50_000
    #: A device-side event wait ends this close after the task that released it.
    producer_slack_ns: int = 5_000
    evidence: int = 5


@register("bubbles", BubbleConfig)
def analyze(frames: Frames, cfg: BubbleConfig):
    """Pipeline bubbles.

    Pattern: the AI Cores of a device run no kernel inside a step (copies and collectives may
    be moving data meanwhile), so the step takes longer than its compute.

    Algorithm: steps are measured on the device (a device op belongs to the step of the launch
    that created it; the windows tile the device's timeline). Every kernel-idle nanosecond gets
    one cause from the causal attribution: walking back from the kernel that ended the idle
    through the release that came last (the task before it on its stream, the event that
    released a wait, the launch call), into what the launching thread was doing when the launch
    was late (a synchronize, split by what it waited for on the device; a blocking copy; data
    loading; framework calls; untraced host time). Time the trace gives no release for is
    unexplained. Per device and cause, the idle is the cost; its share of the device's step time
    sets the severity by the one rule (analyzers.severity). Pipeline fill and drain and the
    device's own dispatch between queued tasks are measured, not reported.
    """
    ops = frames.device_ops
    if not (ops["kind"].astype(str) == "kernel").any():
        raise Skipped("no device ops (kernels) in the trace")
    table = device_gaps(frames, cfg)
    windows = device_windows(frames)
    findings = _findings(table, windows, cfg)
    per_step = step_breakdown(frames, cfg)
    causes = table.groupby("cause")["idle_ns"].sum().astype(int).to_dict() if len(table) else {}
    return findings, {"per_step": per_step.to_dict("records"),
                      "gaps": int(len(table[~table["cause"].isin(EDGE_CAUSES)].drop_duplicates(["rank", "device", "ts"]))),
                      "idle_by_cause_ns": causes}


def device_gaps(frames: Frames, cfg: BubbleConfig | None = None) -> pd.DataFrame:
    """The causal attribution of every device's kernel-idle time (GAP_COLUMNS), cached per frames:
    bubbles, launch and reports share it."""
    cfg = cfg or BubbleConfig()
    return attribution(frames, slack_ns=cfg.producer_slack_ns, dispatch_ns=cfg.dispatch_ns)


def _findings(table: pd.DataFrame, windows: dict, cfg: BubbleConfig) -> list[Finding]:
    out = []
    if table.empty:
        return out
    for (rank, device, cause), g in table.groupby(["rank", "device", "cause"]):
        code = CODES.get(cause)
        if code is None:
            continue
        w = windows[(int(rank), int(device))]
        total = int((w["end"] - w["start"]).sum()) or 1
        lost = int(g["idle_ns"].sum())
        ratio = lost / total
        sev = severity(ratio, code)
        label = CAUSE_LABELS[cause]
        detail = ""
        if cause in ("event", "copy", "collective"):
            via = sorted({int(v) for v in g["via"] if v is not None and v >= 0})
            if via:
                detail = f" (on stream{'s' if len(via) > 1 else ''} {', '.join(map(str, via[:6]))})"
        if cause == "collective":
            detail += _peers(g)
        top = g.sort_values("idle_ns", ascending=False).head(cfg.evidence)
        streams = g.loc[g["next_stream"] >= 0, "next_stream"].unique()
        stream = int(streams[0]) if len(streams) == 1 else None  # the stream whose kernels waited
        n = len(g.drop_duplicates(["ts"]))
        out.append(Finding(
            code=code, severity=sev, title=f"Device idle: {label}",
            message=(f"rank {rank} device {device}: {ms(lost)} idle ({pct(ratio)} of device step time), "
                     f"{label}{detail}, in {n} gap{'s' if n != 1 else ''}"),
            rank=int(rank), device=int(device), stream=stream, ts_ns=int(g["ts"].min()),
            dur_ns=int(g["end"].max() - g["ts"].min()), metric="idle_share", value=round(ratio, 6),
            threshold=None, lost_ns=lost,
            evidence=[{"ts": int(r.ts), "dur": int(r.idle_ns), "next": r.next_name if isinstance(r.next_name, str) else None, "corr": _int(r.next_corr),
                       "stream": int(r.next_stream), "step": _int(r.step)} for r in top.itertuples()],
            occurrences=occurrences(g, rank=int(rank), device=int(device), stream=stream)))
    return out


def _peers(g: pd.DataFrame) -> str:
    """The ranks a device's collectives waited for, with the time each, and the transfer left."""
    by = g.groupby("peer")["idle_ns"].sum()
    waited = by[by.index >= 0].sort_values(ascending=False, kind="stable")
    if waited.empty:
        return ""
    ranks = ", ".join(f"rank {int(r)} {ms(int(v))}" for r, v in waited.head(4).items())
    more = f" and {len(waited) - 4} more" if len(waited) > 4 else ""
    return f": waiting for the last rank to arrive ({ranks}{more}), the transfer itself {ms(int(by.get(-1, 0)))}"


def occurrences(g: pd.DataFrame, **where) -> list[dict]:
    """One occurrence per step window (the gaps of one cause in one step), time ordered."""
    out = []
    key = g["step_start"].to_numpy()
    for start in np.unique(key):
        s = g[key == start]
        out.append({**where, "step": _int(s["step"].iloc[0]), "ts_ns": int(s["ts"].min()),
                    "dur_ns": int(s["end"].max() - s["ts"].min()), "lost_ns": int(s["idle_ns"].sum()),
                    "gaps": len(s)})
    return out


def step_breakdown(frames: Frames, cfg: BubbleConfig | None = None) -> pd.DataFrame:
    """Per device step window: compute time (kernels) and idle time by cause, adding up to the
    window (rank, device, step, step_start, step_end, step_ns, compute_ns, idle_ns,
    bubble_ratio, idle_<cause>_ns for each cause)."""
    gaps = device_gaps(frames, cfg)
    cols = ["rank", "device", "step", "step_start", "step_end", "step_ns", "compute_ns", "idle_ns", "bubble_ratio",
            *[f"idle_{c}_ns" for c in ALL_CAUSES]]
    win = [w.assign(rank=rank, device=device) for (rank, device), w in device_windows(frames).items()]
    if not win:
        return pd.DataFrame(columns=cols)
    w = pd.concat(win, ignore_index=True).rename(columns={"start": "step_start", "end": "step_end"})
    if len(gaps):
        by = gaps.pivot_table(index=["rank", "device", "step_start"], columns="cause", values="idle_ns",
                              aggfunc="sum", fill_value=0)
    else:
        by = pd.DataFrame(index=pd.MultiIndex.from_arrays([[], [], []], names=["rank", "device", "step_start"]))
    by = by.reindex(columns=list(ALL_CAUSES), fill_value=0).add_prefix("idle_").add_suffix("_ns").reset_index()
    out = w.merge(by, on=["rank", "device", "step_start"], how="left")
    idle_cols = [f"idle_{c}_ns" for c in ALL_CAUSES]
    out[idle_cols] = out[idle_cols].fillna(0).astype(np.int64)
    out["step_ns"] = (out["step_end"] - out["step_start"]).astype(np.int64)
    out["idle_ns"] = out[idle_cols].sum(axis=1).astype(np.int64)
    out["compute_ns"] = out["step_ns"] - out["idle_ns"]
    out["bubble_ratio"] = np.where(out["step_ns"] > 0, (out["idle_ns"] / out["step_ns"].where(out["step_ns"] > 0, 1)).round(6), 0.0)
    out["step"] = [_int(v) for v in out["step"]]
    out["rank"] = out["rank"].astype(int)
    out["device"] = out["device"].astype(int)
    return out[cols]


def _int(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else int(v)
