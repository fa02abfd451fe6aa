"""The device's cores: kernels that waited for cores other streams held (CORE_CONTENTION) and
kernels that left cores idle (UNDER_OCCUPANCY). Views of analyzers.causality.contention."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.causality import device_windows
from analyzers.causality.contention import core_waits, under_occupancy
from analyzers.causality.critical_path import critical_paths, step_paths
from analyzers.causality.graph import stream_tasks
from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames
from analyzers.severity import severity
from msprof_py.trace.units import ms, pct


@dataclass
class CoresConfig:
    #: Evidence rows per finding.
    evidence: int = 5
    #: A device's contention latency or under-occupancy saving below this share of its step time
    #: is not reported: no fix of it could be told from run-to-run noise. DEFAULT.
    report_share: float = 0.01


@register("cores", CoresConfig)
def analyze(frames: Frames, cfg: CoresConfig):
    """Core contention and under-occupancy.

    Pattern: a kernel that was ready (its stream's task before it done, its launch returned, its
    event fired) starts late because kernels of other streams hold every core of its kind
    (priority starvation when the waiting stream is the latency-critical one); or a kernel
    launches fewer blocks than its device has cores, so cores idle while it runs alone.

    Algorithm: kernel rows carry blocks (`value`) and the cores of their kind (`addr`). A ready
    kernel's wait covered by saturating kernels (blocks >= cores) of other streams is contention;
    its cost is the part on the rank's critical paths of its steps (the run's without steps):
    what giving the stream the cores first recovers; its latency the whole wait. A kernel's unused core share times its time alone on
    the device, never below a minimal kernel time, is the under-occupancy saving. Severity: the
    one rule on the cost's share of the device's step time.
    """
    tasks = stream_tasks(frames)
    kernels = tasks[tasks["kind"] == "kernel"]
    if kernels.empty:
        raise Skipped("no device ops (kernels) in the trace")
    if not (kernels["addr"].notna() & kernels["value"].notna()).any():
        raise Skipped("no kernel records its blocks and its device's cores (the trace's kernels carry no "
                      "grid / Block Dim, or the device's core count is not recorded)")
    windows = device_windows(frames)
    findings = _contention(frames, windows, cfg) + _occupancy(frames, windows, cfg)
    waits = core_waits(frames)
    occ = under_occupancy(frames, frames.platform == "ascend")
    return findings, {"contended_ns": int(waits["contended_ns"].sum()) if len(waits) else 0,
                      "under_occupancy_saving_ns": int(occ["saving_ns"].sum()) if len(occ) else 0}


def _step_ns(windows: dict, rank: int, device: int, fallback: int) -> int:
    w = windows.get((rank, device))
    return int((w["end"] - w["start"]).sum()) if w is not None else max(fallback, 1)


def _path_segments(frames: Frames, rank: int) -> pd.DataFrame:
    """The segments of `rank`'s critical paths that set its time: one path per step where the
    trace has steps (a step's time is what a user waits for: a stream starved outside the steps,
    or by work the step does not wait for, costs no step anything), else the whole run's."""
    key = ("cores.path_segments", rank)
    if key not in frames._cache:
        steps = frames.steps
        if len(steps) and (steps["rank"] == rank).any():
            parts = [cp.segments for _, cp in step_paths(frames, rank) if len(cp.segments)]
        else:
            cp = critical_paths(frames)[0].get(rank)
            parts = [cp.segments] if cp is not None and len(cp.segments) else []
        frames._cache[key] = (pd.concat(parts, ignore_index=True) if parts
                              else pd.DataFrame(columns=["cause", "where", "weight_ns"]))
    return frames._cache[key]


def _contention(frames: Frames, windows: dict, cfg: CoresConfig) -> list[Finding]:
    waits = core_waits(frames)
    if waits.empty:
        return []
    out = []
    for (rank, device, stream), g in waits.groupby(["rank", "device", "stream"], sort=True):
        rank, device, stream = int(rank), int(device), int(stream)
        latency = int(g["contended_ns"].sum())
        seg = _path_segments(frames, rank)
        on = seg[(seg["cause"] == "contention") & (seg["where"] == f"stream {stream}")] if len(seg) else seg
        # A contention piece ends at its kernel's start; of it, what is past the wave that was
        # running when the kernel got ready is what priority recovers.
        stuck = pd.Series(g["in_wave_ns"].to_numpy(np.int64), index=g["ts"].to_numpy(np.int64))
        stuck = stuck[~stuck.index.duplicated()]
        piece = on["weight_ns"].to_numpy(np.int64) if len(on) else np.zeros(0, np.int64)
        in_wave = stuck.reindex(on["end"].to_numpy(np.int64) if len(on) else []).fillna(0).to_numpy(np.int64)
        on_path = int(np.maximum(piece - in_wave, 0).sum())
        path_wait = int(piece.sum())
        total = _step_ns(windows, rank, device, int(g["end"].max() - g["ts"].min()))
        if latency < cfg.report_share * total:
            continue
        by_holder = g.groupby("holder")["contended_ns"].sum().sort_values(ascending=False, kind="stable")
        holders = [int(h) for h in by_holder.index if h >= 0]
        held = (f"stream{'s' if len(holders) > 1 else ''} {', '.join(map(str, holders[:4]))}" if holders
                else "other streams")
        top = g.sort_values("contended_ns", ascending=False, kind="stable").head(cfg.evidence)
        out.append(Finding(
            code="CORE_CONTENTION", severity=severity(on_path / total, "CORE_CONTENTION"),
            title="Kernels waiting for cores held by other streams",
            message=(f"rank {rank} device {device} stream {stream}: {len(g)} ready kernel"
                     f"{'s' if len(g) != 1 else ''} waited {ms(latency)} for cores held by {held}'s kernels; "
                     f"{ms(path_wait)} of it on the critical path, of which {ms(on_path)} "
                     f"({pct(on_path / total)} of device step time) past the blocks already running, "
                     f"which the stream's priority would give back"),
            rank=rank, device=device, stream=stream, ts_ns=int(g["ready"].min()),
            dur_ns=int(g["ts"].max() - g["ready"].min()), metric="contended_ns", value=float(latency),
            threshold=None, lost_ns=on_path,
            evidence=[{"ts": int(r.ready), "dur": int(r.contended_ns), "in_wave": int(r.in_wave_ns), "name": r.name,
                       "corr": None if np.isnan(r.corr) else int(r.corr), "stream": int(r.stream),
                       "held_by_stream": int(r.holder)} for r in top.itertuples()]))
    return out


def _occupancy(frames: Frames, windows: dict, cfg: CoresConfig) -> list[Finding]:
    occ = under_occupancy(frames, frames.platform == "ascend")
    if occ.empty:
        return []
    out = []
    for (rank, device), g in occ.groupby(["rank", "device"], sort=True):
        rank, device = int(rank), int(device)
        saving = int(g["saving_ns"].sum())
        total = _step_ns(windows, rank, device, int(g["end"].max() - g["ts"].min()))
        if saving < cfg.report_share * total:
            continue
        by = (g.groupby("name").agg(saving=("saving_ns", "sum"), n=("saving_ns", "size"), blocks=("blocks", "median"),
                                     cores=("cores", "max"), used=("used_share", "mean"))
              .sort_values("saving", ascending=False, kind="stable"))
        names = ", ".join(f"{n} ({int(r.blocks)} blocks on {int(r.cores)} cores, {pct(r.used)} used)"
                          for n, r in by.head(3).iterrows())
        out.append(Finding(
            code="UNDER_OCCUPANCY", severity=severity(saving / total, "UNDER_OCCUPANCY"),
            title="Kernels leaving cores idle",
            message=(f"rank {rank} device {device}: {len(g)} kernel run{'s' if len(g) != 1 else ''} left cores idle "
                     f"while alone on the device; filling them would save up to {ms(saving)} "
                     f"({pct(saving / total)} of device step time): {names}"),
            rank=rank, device=device, ts_ns=int(g["ts"].min()), dur_ns=int(g["end"].max() - g["ts"].min()),
            metric="used_core_share", value=round(float((g["used_share"] * g["alone_ns"]).sum()
                                                        / max(int(g["alone_ns"].sum()), 1)), 6),
            threshold=None, lost_ns=saving,
            evidence=[{"name": str(n), "kernels": int(r.n), "blocks": int(r.blocks), "cores": int(r.cores),
                       "dur": int(r.saving)} for n, r in by.head(cfg.evidence).iterrows()]))
    return out
