"""Memory leaks and fragmentation, from alloc/free events and memory counters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames

FAILED = "[memory] allocation failed"


@dataclass
class MemoryConfig:
    min_leak_bytes_per_step: int = 64 * 1024
    min_r2: float = 0.9  # how well live bytes at step ends fit a straight line
    plateau_ratio: float = 0.25  # last-third slope below this share of the fit: a cache warming up
    min_steps: int = 3
    fragmentation_ratio: float = 0.3  # (reserved - allocated) / reserved at the peak
    min_fragmentation_bytes: int = 64 << 20
    evidence: int = 5


@register("memory", MemoryConfig)
def analyze(frames: Frames, cfg: MemoryConfig):
    """Memory leaks and fragmentation.

    Pattern: live device memory grows step after step from the same call site (leak); or
    memory is reserved in blocks too small for a request, so an allocation fails although
    total free memory would suffice (fragmentation).

    Algorithm: pair alloc/free events by (rank, device, address) in time order; live bytes is
    the running sum of allocs minus frees. Sampled at each step's end, a least-squares line
    gives bytes per step and R^2; a leak needs a positive slope above the threshold, a good fit
    and no plateau (the last third of the steps still growing, which tells a leak from a cache
    warming up). Allocations never freed are grouped by name (call site) and size.
    Fragmentation: the peak of reserved minus allocated (memory counters) relative to reserved,
    and failed allocations with the largest free block smaller than the request.
    """
    mem = frames.memory
    counters = frames.counters
    failed = frames._select(("marker",))
    failed = failed[failed["name"].astype(str) == FAILED]
    if mem.empty and failed.empty:
        raise Skipped("no alloc/free events in the trace (memory recording off?)")
    findings: list[Finding] = []
    metrics: dict = {}
    if not mem.empty:
        live = _live(mem)
        unfreed = _unfreed(mem)
        metrics["unfreed"] = unfreed.to_dict("records")
        for (rank, device), g in live.groupby(["rank", "device"]):
            f, m = _leak(frames, rank, device, g, unfreed, cfg)
            metrics[f"r{rank}.d{device}"] = m
            if f:
                findings.append(f)
    findings.extend(_fragmentation(counters, failed, cfg))
    return findings, metrics


def _live(mem: pd.DataFrame) -> pd.DataFrame:
    d = mem[["rank", "device", "ts", "kind", "bytes", "addr", "name", "step"]].copy()
    d["device"] = d["device"].fillna(-1).astype(np.int64)
    d["delta"] = np.where(d["kind"].astype(str) == "alloc", d["bytes"], -d["bytes"]).astype(np.int64)
    d = d.sort_values(["rank", "device", "ts"], kind="stable")
    d["live"] = d.groupby(["rank", "device"])["delta"].cumsum()
    return d


def _unfreed(mem: pd.DataFrame) -> pd.DataFrame:
    """Allocations with no later free of the same address, grouped by call site and size."""
    d = mem[["rank", "device", "ts", "kind", "bytes", "addr", "name"]].copy()
    d["device"] = d["device"].fillna(-1).astype(np.int64)
    d["is_alloc"] = d["kind"].astype(str) == "alloc"
    d = d.sort_values(["rank", "device", "addr", "ts"], kind="stable")
    # An alloc is freed when the next event for its address is a free.
    nxt_free = (~d["is_alloc"]).shift(-1, fill_value=False) & (d["addr"] == d["addr"].shift(-1)) & \
        (d["rank"] == d["rank"].shift(-1)) & (d["device"] == d["device"].shift(-1))
    left = d[d["is_alloc"] & ~nxt_free]
    if left.empty:
        return pd.DataFrame(columns=["rank", "device", "name", "bytes", "count", "total_bytes", "first_ts"])
    g = left.groupby(["rank", "device", "name", "bytes"], observed=True).agg(count=("ts", "size"), first_ts=("ts", "min"))
    g = g.reset_index()
    g["total_bytes"] = g["bytes"] * g["count"]
    g["name"] = g["name"].astype(str)
    return g.sort_values("total_bytes", ascending=False).reset_index(drop=True)


def _leak(frames: Frames, rank, device, live: pd.DataFrame, unfreed: pd.DataFrame, cfg: MemoryConfig):
    steps = frames.steps
    steps = steps[steps["rank"] == rank]
    if len(steps) < cfg.min_steps:
        return None, {"steps": len(steps)}
    ends = steps["end"].to_numpy()
    idx = np.searchsorted(live["ts"].to_numpy(), ends, side="right") - 1
    values = np.where(idx >= 0, live["live"].to_numpy()[np.maximum(idx, 0)], 0).astype(np.float64)
    x = np.arange(len(values), dtype=np.float64)
    slope, intercept = np.polyfit(x, values, 1)
    fitted = slope * x + intercept
    ss_res = float(((values - fitted) ** 2).sum())
    ss_tot = float(((values - values.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    third = max(len(values) // 3, 2)
    tail_slope = np.polyfit(x[-third:], values[-third:], 1)[0] if len(values) >= 4 else slope
    metrics = {"steps": len(values), "bytes_per_step": float(slope), "r2": r2, "tail_bytes_per_step": float(tail_slope),
               "live_at_step_end": values.astype(np.int64).tolist()}
    growing = slope >= cfg.min_leak_bytes_per_step and r2 >= cfg.min_r2
    plateau = tail_slope < cfg.plateau_ratio * slope
    if not growing or plateau:
        return None, metrics
    mine = unfreed[(unfreed["rank"] == rank) & (unfreed["device"] == device)]
    sites = [{"name": r.name, "bytes": int(r.bytes), "count": int(r.count), "first_ts": int(r.first_ts)}
             for r in mine.head(cfg.evidence).itertuples()]
    where = f" mostly from {sites[0]['name']!r} ({sites[0]['count']} x {sites[0]['bytes']} B)" if sites else ""
    lost = int(slope * (len(values) - 1))
    sev = Severity.CRITICAL if slope * 100 > values.max() else Severity.WARNING
    return Finding(
        code="MEMORY_LEAK", severity=sev, title="Device memory grows every step",
        message=(f"rank {rank} device {device}: live memory grows {slope / 1e6:.3f} MB per step over "
                 f"{len(values)} steps (R^2 {r2:.3f}){where}"),
        rank=int(rank), device=int(device) if device >= 0 else None, ts_ns=int(steps["ts"].min()),
        dur_ns=int(ends.max() - steps["ts"].min()), metric="bytes_per_step", value=float(slope),
        threshold=float(cfg.min_leak_bytes_per_step), lost_bytes=lost, evidence=sites), metrics


def _fragmentation(counters: pd.DataFrame, failed: pd.DataFrame, cfg: MemoryConfig) -> list[Finding]:
    out = []
    names = counters["name"].astype(str) if not counters.empty else pd.Series(dtype=str)
    res = counters[names == "Device memory reserved"]
    alloc = counters[names == "Device memory allocated"]
    peaks = {}
    if not res.empty and not alloc.empty:
        for (rank, device), r in res.groupby(["rank", "device"]):
            a = alloc[(alloc["rank"] == rank) & (alloc["device"] == device)].sort_values("ts")
            r = r.sort_values("ts")
            m = pd.merge_asof(r[["ts", "value"]], a[["ts", "value"]], on="ts", suffixes=("_res", "_alloc"))
            m["frag"] = m["value_res"] - m["value_alloc"].fillna(0)
            i = int(m["frag"].to_numpy().argmax())
            peaks[(rank, device)] = (float(m["frag"].iloc[i]), float(m["value_res"].iloc[i]), int(m["ts"].iloc[i]))
    fails = {}
    for row in failed.itertuples():
        fails.setdefault((row.rank, row.device), []).append(row)
    for key in sorted(set(peaks) | set(fails), key=str):
        frag, reserved, ts = peaks.get(key, (0.0, 0.0, None))
        fl = [f for f in fails.get(key, []) if f.value is not None and f.value < f.bytes]
        ratio = frag / reserved if reserved else 0.0
        big = frag >= cfg.min_fragmentation_bytes and ratio >= cfg.fragmentation_ratio
        if not big and not fl:
            continue
        rank, device = key
        ev = [{"ts": int(f.ts), "requested": int(f.bytes), "largest_free": int(f.value)} for f in fl[:cfg.evidence]]
        msg = f"rank {rank} device {device}: {frag / 2**20:.1f} MiB reserved but not allocated ({ratio:.0%} of reserved)"
        if fl:
            msg += (f"; {len(fl)} allocation(s) failed, e.g. {fl[0].bytes / 2**20:.1f} MiB requested with the largest "
                    f"free block {fl[0].value / 2**20:.1f} MiB")
        out.append(Finding(
            code="MEMORY_FRAGMENTATION", severity=Severity.CRITICAL if fl else Severity.WARNING,
            title="Memory fragmentation", message=msg, rank=int(rank),
            device=None if device is None or pd.isna(device) else int(device),
            ts_ns=ts if ts is not None else (int(fl[0].ts) if fl else None), metric="fragmentation_ratio",
            value=round(ratio, 6), threshold=cfg.fragmentation_ratio, lost_bytes=int(frag), evidence=ev))
    return out
