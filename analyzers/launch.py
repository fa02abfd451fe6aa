"""Launch overhead: device work cut into tasks too small to cover their launch cost."""

from __future__ import annotations

from dataclasses import dataclass

from analyzers.bubbles import BubbleConfig, device_gaps, device_windows, occurrences
from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames
from analyzers.severity import severity
from msprof_py.trace.units import ms, pct


@dataclass
class LaunchConfig:
    small_ns: int = 50_000  # tasks under ~50 us are worth merging (task-level scheduling)
    evidence: int = 5


@register("launch", LaunchConfig)
def analyze(frames: Frames, cfg: LaunchConfig):
    """Launch-bound execution.

    Pattern: the device waits for the host between small kernels: launch overhead, not device
    work, sets the pace.

    Algorithm: the causal attribution's launch time (analyzers.causality): device idle during
    which the kernel that ended it waited for its launch and the launching thread was inside
    launch calls (or the call had just returned: dispatch latency). It never exceeds the launch
    calls' own time plus their dispatch: a long gap of framework or untraced host time is not
    launch overhead. Fusing the small kernels (or capturing a graph) would save that time; its
    share of the device's step time sets the severity by the one rule (analyzers.severity).
    """
    ops = frames.device_ops
    kernels = ops[ops["kind"].astype(str) == "kernel"]
    if kernels.empty:
        raise Skipped("no kernels in the trace")
    gaps = device_gaps(frames, BubbleConfig())
    windows = device_windows(frames)
    findings, metrics = [], []
    for (rank, device), k in kernels.groupby(["rank", "device"]):
        w = windows[(int(rank), int(device))]
        total = int((w["end"] - w["start"]).sum()) or 1
        g = gaps[(gaps["rank"] == rank) & (gaps["device"] == device) & (gaps["cause"] == "launch")]
        saving = int(g["idle_ns"].sum())
        small = k["dur"] < cfg.small_ns
        share = float(small.mean())
        ratio = saving / total
        metrics.append({"rank": int(rank), "device": int(device), "kernels": len(k), "small_share": round(share, 4),
                        "saving_ns": saving, "step_time_ns": total})
        if g.empty:
            continue
        sev = severity(ratio, "LAUNCH_BOUND")
        streams = g["next_stream"].unique()
        stream = int(streams[0]) if len(streams) == 1 else None
        findings.append(Finding(
            code="LAUNCH_BOUND", severity=sev, title="Launch-bound: tasks too small for their launch cost",
            message=(f"rank {rank} device {device}: the device waited {ms(saving)} ({pct(ratio)} of device "
                     f"step time) in launch calls, in {len(g)} gaps ({pct(share)} of {len(k)} kernels are under "
                     f"{ms(cfg.small_ns)}); fusing small kernels or capturing a graph would save about that"),
            rank=int(rank), device=int(device), stream=stream, ts_ns=int(g["ts"].min()),
            dur_ns=int(g["end"].max() - g["ts"].min()), metric="launch_wait_share", value=round(ratio, 6),
            threshold=None, lost_ns=saving,
            evidence=[{"name": str(n), "count": int(c)} for n, c in
                      g["next_name"].astype(str).value_counts().head(cfg.evidence).items()],
            occurrences=occurrences(g, rank=int(rank), device=int(device), stream=stream)))
    return findings, {"devices": metrics}
