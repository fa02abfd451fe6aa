"""Launch overhead: device work cut into tasks too small to cover their launch cost."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames


@dataclass
class LaunchConfig:
    small_ns: int = 50_000  # seed 000: tasks under ~50 us are worth merging
    min_small_share: float = 0.5
    min_saving_ratio: float = 0.1  # of the device span


@register("launch", LaunchConfig)
def analyze(frames: Frames, cfg: LaunchConfig):
    """Launch-bound execution.

    Pattern: most kernels are shorter than ~50 us and the device waits for the host between
    them: launch overhead, not device work, sets the pace.

    Algorithm: share of kernels shorter than `small_ns` per (rank, device); every device-level
    idle gap (no stream busy) that ends with a small kernel whose launch call returned only
    after the device went idle is time the device waited on launches, which fusing would save. Flag when
    small kernels are the majority and the saving is at least `min_saving_ratio` of the span.
    """
    ops = frames.device_ops
    if not (ops["kind"].astype(str) == "kernel").any():
        raise Skipped("no kernels in the trace")
    la = frames.launches.drop_duplicates(["rank", "corr"])
    # When each launch call returned: its task could not start earlier.
    launches = la[["rank", "corr"]].assign(launch_end=la["ts"] + la["dur"].fillna(0))
    findings, metrics = [], []
    for (rank, device), g in ops.groupby(["rank", "device"]):
        k = g[g["kind"].astype(str) == "kernel"]
        if k.empty:
            continue
        share = float((k["dur"] < cfg.small_ns).mean())
        # Device-level idle gaps (no stream busy) that end with a small kernel launched late:
        # the device was waiting for the host to launch it.
        g = g.sort_values("ts", kind="stable")
        run_end = np.maximum.accumulate(g["end"].to_numpy())
        gap = np.concatenate([[0], g["ts"].to_numpy()[1:] - run_end[:-1]]).clip(min=0)
        lts = g[["rank", "corr"]].merge(launches, on=["rank", "corr"], how="left")["launch_end"].to_numpy(np.float64)
        prev_end = np.concatenate([[np.inf], run_end[:-1]]).astype(np.float64)
        waited = (g["kind"].astype(str).to_numpy() == "kernel") & (g["dur"].to_numpy() < cfg.small_ns) & \
            (lts >= prev_end)
        saving = int(gap[waited].sum())
        span = int(g["end"].max() - g["ts"].min()) or 1
        metrics.append({"rank": int(rank), "device": int(device), "kernels": len(k), "small_share": round(share, 4),
                        "saving_ns": saving, "span_ns": span})
        if share >= cfg.min_small_share and saving >= cfg.min_saving_ratio * span:
            small = k["dur"] < cfg.small_ns
            findings.append(Finding(
                code="LAUNCH_BOUND", severity=Severity.WARNING if saving < 0.3 * span else Severity.CRITICAL,
                title="Launch-bound: tasks too small for their launch cost",
                message=(f"rank {rank} device {device}: {share:.0%} of {len(k)} kernels run under "
                         f"{cfg.small_ns / 1e3:.0f} us and the device waited {saving / 1e6:.3f} ms for their launches "
                         f"({saving / span:.0%} of the span); fusing them would save about that"),
                rank=int(rank), device=int(device), ts_ns=int(g["ts"].min()), dur_ns=span, metric="small_task_share",
                value=round(share, 4), threshold=cfg.min_small_share, lost_ns=saving,
                evidence=[{"name": str(n), "count": int(c)} for n, c in
                          k[small]["name"].astype(str).value_counts().head(5).items()]))
    return findings, {"devices": metrics}
