"""Memory leaks and fragmentation, from alloc/free events and memory counters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames
from analyzers.severity import memory_severity
from msprof_py.trace.units import mib, pct, sig

#: Memory counters whose values are device memory held (what `peaks` takes the largest of).
MEMORY_COUNTERS = ("Device memory reserved", "Device memory used", "Device memory allocated")


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
    and failed allocations (kind alloc_fail) with the largest free block smaller than the request.

    Cost and severity (the one rule, analyzers.severity): a leak costs the bytes it held by the
    end of the run (bytes per step x steps), fragmentation the free memory a failed request
    could not use (none when no request failed: a reserve is not harm until a request fails);
    the share is of the device's memory capacity as the trace states it (`capacities`), or,
    when it does not, of the run's peak device memory (`peaks`), and the message says which.
    """
    mem = frames.memory
    counters = frames.counters
    failed = frames.alloc_failures
    if mem.empty and failed.empty:
        raise Skipped("no alloc/free events in the trace (memory recording off?)")
    findings: list[Finding] = []
    metrics: dict = {}
    capacity = capacities(frames)
    live = _live(mem) if not mem.empty else None
    peak = peaks(counters, live)
    if live is not None:
        unfreed = _unfreed(mem)
        metrics["unfreed"] = unfreed.to_dict("records")
        for (rank, device), g in live.groupby(["rank", "device"]):
            f, m = _leak(frames, rank, device, g, unfreed, cfg, _capacity(capacity, device),
                         peak.get((int(rank), int(device))))
            metrics[f"r{rank}.d{device}"] = m
            if f:
                findings.append(f)
    findings.extend(_fragmentation(counters, failed, cfg, capacity, peak))
    return findings, metrics


def capacities(frames: Frames) -> dict[int | None, int]:
    """Device memory capacity in bytes as the trace states it, by device id (None: every device):
    the emulator's preset (`hbm_bytes`), Kineto's top-level `deviceProperties` (`totalGlobalMem`
    of each `id`); empty when the trace does not say (torch_npu and msprof exports)."""
    meta = frames.trace.meta
    preset = (meta.extra or {}).get("preset") or {}
    if preset.get("hbm_bytes"):
        return {None: int(preset["hbm_bytes"])}
    props = (meta.source_meta or {}).get("deviceProperties")
    out: dict[int | None, int] = {}
    for p in props if isinstance(props, list) else ():
        if isinstance(p, dict) and isinstance(p.get("id"), int) and isinstance(p.get("totalGlobalMem"), (int, float)):
            out[p["id"]] = int(p["totalGlobalMem"])
    return out


def _capacity(capacity: dict[int | None, int], device) -> int | None:
    if None in capacity:
        return capacity[None]
    return None if device is None or pd.isna(device) else capacity.get(int(device))


def peaks(counters: pd.DataFrame, live: pd.DataFrame | None) -> dict[tuple[int, int], float]:
    """The run's peak device memory per (rank, device; -1 when the trace names none): the largest
    of the memory counters (reserved, used, allocated) and the live bytes of alloc/free events.
    The device holds at least that much: the share of it is the fallback when the capacity is unknown."""
    out: dict[tuple[int, int], float] = {}
    if not counters.empty:
        c = counters[counters["name"].astype(str).isin(MEMORY_COUNTERS)]
        device = c["device"].fillna(-1).astype(np.int64)
        for key, v in c["value"].groupby([c["rank"].astype(np.int64), device]).max().items():
            out[key] = max(out.get(key, 0.0), float(v))
    if live is not None and not live.empty:
        for key, v in live.groupby(["rank", "device"])["live"].max().items():
            key = (int(key[0]), int(key[1]))
            out[key] = max(out.get(key, 0.0), float(v))
    return out


def _of(share: float | None, capacity: int | None, peak: float | None) -> str:
    """What a memory cost's share is of, for the message."""
    if share is None:
        return "neither the device's capacity nor its peak memory is in the trace"
    if capacity:
        return f"{pct(share)} of the device's {mib(capacity)}"
    return f"{pct(share)} of the run's peak of {mib(peak)}; the device's capacity is not in the trace"


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


def _leak(frames: Frames, rank, device, live: pd.DataFrame, unfreed: pd.DataFrame, cfg: MemoryConfig,
          capacity: int | None = None, peak: float | None = None):
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
    where = f" mostly from {sites[0]['name']!r} ({sites[0]['count']} x {mib(sites[0]['bytes'])})" if sites else ""
    # Every step leaks, the first included: the live bytes at the first step's end already hold one.
    lost = int(round(slope * len(values)))
    sev, share = memory_severity(lost, capacity, peak, "MEMORY_LEAK")
    return Finding(
        code="MEMORY_LEAK", severity=sev, title="Device memory grows every step",
        message=(f"rank {rank} device {device}: live memory grows {mib(slope)} per step over "
                 f"{len(values)} steps (R^2 {sig(r2)}){where}; {mib(lost)} held by the end of the run, "
                 f"{_of(share, capacity, peak)}"),
        rank=int(rank), device=int(device) if device >= 0 else None, ts_ns=int(steps["ts"].min()),
        dur_ns=int(ends.max() - steps["ts"].min()), metric="bytes_per_step", value=float(slope),
        threshold=float(cfg.min_leak_bytes_per_step), lost_bytes=lost, evidence=sites), metrics


def _fragmentation(counters: pd.DataFrame, failed: pd.DataFrame, cfg: MemoryConfig,
                   capacity: dict[int | None, int] | None = None,
                   peak: dict[tuple[int, int], float] | None = None) -> list[Finding]:
    """Failed allocations that free memory would have satisfied (the OOM users see "while free
    memory looks sufficient"), and caches holding much more than they hand out.

    The cost of a failed request is the free memory it could not use (stranded): at the
    failure, the driver's free bytes (the device's capacity minus "Device memory used") plus
    the caching allocator's reserved minus allocated, when the largest free block was smaller
    than the request and that free memory would have held it. Its share of the device's
    capacity (or of the run's peak, `peaks`) sets the severity by the one rule; a failure whose
    free memory the trace does not show is a suspect with no cost (a warning). A cache that
    holds much more than it hands out while no request failed strands nothing the run needed:
    it costs 0 bytes, information."""
    capacity, peak = capacity or {}, peak or {}
    out = []
    names = counters["name"].astype(str) if not counters.empty else pd.Series(dtype=str)

    def series(name):
        rows = counters[names == name]
        return {key: g.sort_values("ts")[["ts", "value"]] for key, g in rows.groupby(["rank", "device"])}

    res, alloc, used = series("Device memory reserved"), series("Device memory allocated"), series("Device memory used")

    def at(table, key, ts) -> float | None:
        g = table.get(key)
        if g is None:
            return None
        i = int(np.searchsorted(g["ts"].to_numpy(), ts, side="right")) - 1
        return float(g["value"].iloc[i]) if i >= 0 else None

    peaks = {}
    for key, r in res.items():
        a = alloc.get(key)
        m = pd.merge_asof(r, a if a is not None else r.iloc[:0], on="ts", suffixes=("_res", "_alloc"))
        m["frag"] = m["value_res"] - m["value_alloc"].fillna(0)
        i = int(m["frag"].to_numpy().argmax())
        peaks[key] = (float(m["frag"].iloc[i]), float(m["value_res"].iloc[i]), int(m["ts"].iloc[i]))
    fails: dict = {}
    for row in failed.itertuples():
        key = (row.rank, row.device)
        largest = None if pd.isna(row.value) else float(row.value)
        if largest is not None and largest >= row.bytes:
            continue  # a block large enough existed: not fragmentation
        # Free to the program: what the driver has left, plus what a caching allocator holds
        # reserved but not handed out (its holes: where fragmentation strands memory).
        u = at(used, key, row.ts)
        cap = _capacity(capacity, row.device)
        driver_free = (cap - u) if cap and u is not None else None
        r_, a_ = at(res, key, row.ts), at(alloc, key, row.ts)
        cache_free = (r_ - (a_ or 0)) if r_ is not None else None
        free = None if driver_free is None and cache_free is None else (driver_free or 0) + (cache_free or 0)
        if free is not None and free < row.bytes:
            continue  # memory was really short: an OOM, not fragmentation
        if free is None and largest is None:
            continue  # nothing in the trace tells fragmentation from a plain OOM
        fails.setdefault(key, []).append((row, None if free is None else int(free), largest))
    for key in sorted(set(peaks) | set(fails), key=str):
        frag, reserved, peak_ts = peaks.get(key, (0.0, 0.0, None))
        fl = fails.get(key, [])
        ratio = frag / reserved if reserved else 0.0
        big = frag >= cfg.min_fragmentation_bytes and ratio >= cfg.fragmentation_ratio
        if not big and not fl:
            continue
        rank, device = key
        device = None if device is None or pd.isna(device) else int(device)
        cap, top = _capacity(capacity, device), peak.get((int(rank), -1 if device is None else device))
        ev = [{"ts": int(f.ts), "requested": int(f.bytes), "free": free,
               "largest_free": None if largest is None else int(largest)} for f, free, largest in fl[:cfg.evidence]]
        if fl:
            f0, free0, largest0 = fl[0]
            known = [free for _, free, _ in fl if free is not None]
            lost = max(known) if known else None
            times = [int(f.ts) for f, _, _ in fl]
            free_text = f"{mib(free0)} free" if free0 is not None else "free memory not in the trace"
            # Confirmed when the trace shows the free memory (its share sets the severity); a
            # suspect with no cost (a warning) when it does not.
            sev, share = memory_severity(lost, cap, top, "MEMORY_FRAGMENTATION")
            msg = (f"rank {rank} device {device}: {len(fl)} allocation(s) failed although "
                   f"{'enough memory was free' if known else 'a smaller block was free'}, e.g. "
                   f"{mib(f0.bytes)} requested with {free_text}"
                   + (f" but no free block over {mib(largest0)}" if largest0 is not None else "")
                   + (f"; {mib(lost)} free memory unusable, {_of(share, cap, top)}" if known else ""))
            ts, dur, metric = min(times), max(times) - min(times), "unusable_free_bytes"
            value = float(lost) if lost is not None else None
            threshold = float(f0.bytes)
        else:
            lost = 0  # no request was refused: nothing the run needed was stranded
            sev, _ = memory_severity(lost, cap, top, "MEMORY_FRAGMENTATION")
            msg = (f"rank {rank} device {device}: {mib(frag)} reserved but not allocated ({pct(ratio)} of "
                   f"reserved); no allocation failed, so none of it was stranded")
            ts, dur, metric, value = peak_ts, 0, "fragmentation_ratio", round(ratio, 6)
            threshold = cfg.fragmentation_ratio
        out.append(Finding(
            code="MEMORY_FRAGMENTATION", severity=sev, title="Memory fragmentation", message=msg, rank=int(rank),
            device=device, ts_ns=ts, dur_ns=dur, metric=metric, value=value, threshold=threshold,
            lost_bytes=None if lost is None else int(lost), evidence=ev))
    return out
