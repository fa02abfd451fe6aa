"""Launch overhead: device work cut into tasks too small to cover their launch cost."""

from __future__ import annotations

from dataclasses import dataclass

from analyzers.bubbles import BubbleConfig, device_gaps, device_windows, occurrences
from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames
from msprof_py.trace.units import ms, pct


@dataclass
class LaunchConfig:
    small_ns: int = 50_000  # seed 000: tasks under ~50 us are worth merging
    warning_ratio: float = 0.10  # of the device's step time, as for the other idle causes
    critical_ratio: float = 0.30
    evidence: int = 5


@register("launch", LaunchConfig)
def analyze(frames: Frames, cfg: LaunchConfig):
    """Launch-bound execution.

    Pattern: the device waits for the host between small kernels: launch overhead, not device
    work, sets the pace.

    Algorithm: the bubble analyzer's kernel-idle gaps (device-side step windows, pipeline fill
    and drain left out), those that end with a kernel shorter than `small_ns` whose launch call
    returned only after the device went idle, while the launching thread was neither in a
    synchronize nor doing host work for most of the wait: the device waited for launches, and
    fusing the small kernels would save that time. Their share of the device's step time sets
    the severity (10% warning, 30% critical, as for every idle cause).
    """
    ops = frames.device_ops
    kernels = ops[ops["kind"].astype(str) == "kernel"]
    if kernels.empty:
        raise Skipped("no kernels in the trace")
    gaps = device_gaps(frames, BubbleConfig(small_kernel_ns=cfg.small_ns))
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
        sev = (Severity.CRITICAL if ratio >= cfg.critical_ratio else
               Severity.WARNING if ratio >= cfg.warning_ratio else Severity.INFO)
        streams = g["next_stream"].unique()
        stream = int(streams[0]) if len(streams) == 1 else None
        findings.append(Finding(
            code="LAUNCH_BOUND", severity=sev, title="Launch-bound: tasks too small for their launch cost",
            message=(f"rank {rank} device {device}: the device waited {ms(saving)} ({pct(ratio)} of device "
                     f"step time) in {len(g)} gaps for launches of kernels under {ms(cfg.small_ns)} "
                     f"({pct(share)} of {len(k)} kernels are that small); fusing them would save about that"),
            rank=int(rank), device=int(device), stream=stream, ts_ns=int(g["ts"].min()),
            dur_ns=int(g["end"].max() - g["ts"].min()), metric="launch_wait_share", value=round(ratio, 6),
            threshold=cfg.warning_ratio, lost_ns=saving,
            evidence=[{"name": str(n), "count": int(c)} for n, c in
                      g["next_name"].astype(str).value_counts().head(cfg.evidence).items()],
            occurrences=occurrences(g, rank=int(rank), device=int(device), stream=stream)))
    return findings, {"devices": metrics}
