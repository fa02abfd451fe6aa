"""Bandwidth contention: transfers sharing a link, and communication/computation overlap."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames, union_ns
from analyzers.streams import bandwidth_summary, copy_bandwidth


@dataclass
class BandwidthConfig:
    slow_ratio: float = 0.8  # msprof-analyze: SDMA bandwidth < 0.8x expected while overlapping
    min_lost_ns: int = 20_000
    overlap_warning: float = 0.3  # share of communication not hidden under compute
    evidence: int = 5


@register("bandwidth", BandwidthConfig)
def analyze(frames: Frames, cfg: BandwidthConfig):
    """Bandwidth contention.

    Pattern: several transfers (copies of one direction, or copies and collectives crossing the
    same link) run at once, so each gets a share of the link and takes longer than alone.

    Algorithm: achieved bandwidth per copy = bytes / duration (the profiler's own figure when it
    gave one). The bandwidth a copy would get alone is the device preset's (PCIe per direction,
    HBM for device copies) when the trace states the device, else the median of same-kind,
    same-size-class copies that ran alone in the trace. A copy is contended when it overlaps
    another transfer on the same device and achieved < `slow_ratio` x alone; it lost
    duration - bytes / alone. Where the topology puts collectives on the copies' links,
    collectives overlapping copies are compared with the median duration of the same
    collective without copies around. Also reported: communication hidden under compute.
    """
    copies = copy_bandwidth(frames)
    ops = frames.device_ops
    colls = ops[ops["kind"].astype(str) == "collective"]
    if copies.empty and colls.empty:
        raise Skipped("no copies or collectives in the trace")
    nominal = _nominal(frames, copies)
    findings: list[Finding] = []
    metrics: dict = {"copies": bandwidth_summary(copies).to_dict("records"), "nominal_gbps": nominal}
    transfers = pd.concat([copies[["rank", "device", "ts", "end"]].assign(what="copy"),
                           colls[["rank", "device", "ts", "end"]].assign(what="collective")], ignore_index=True)
    if not copies.empty:
        copies["overlaps"] = _overlap_counts(copies, transfers)
        copies["expected"] = _expected(copies, nominal, has_preset=bool(frames.trace.meta.extra.get("preset")))
        copies["alone_ns"] = copies["bytes"] / copies["expected"]
        copies["lost_ns"] = (copies["end"] - copies["ts"] - copies["alone_ns"]).clip(lower=0).fillna(0)
        hit = copies[(copies["overlaps"] > 0) & (copies["gbps"] < cfg.slow_ratio * copies["expected"])]
        for (rank, device, kind), g in hit.groupby(["rank", "device", "kind"]):
            lost = int(g["lost_ns"].sum())
            if lost < cfg.min_lost_ns:
                continue
            top = g.sort_values("lost_ns", ascending=False).head(cfg.evidence)
            expected = float(g["expected"].median())
            findings.append(Finding(
                code="BANDWIDTH_CONTENTION", severity=Severity.WARNING, title=f"{kind} slowed by concurrent transfers",
                message=(f"rank {rank} device {device}: {len(g)} {kind} copies ran at {g['gbps'].mean():.2f} GB/s on "
                         f"average against {expected:.2f} GB/s alone while sharing the link; "
                         f"{lost / 1e6:.3f} ms lost"),
                rank=int(rank), device=int(device), ts_ns=int(g["ts"].min()), dur_ns=int(g["end"].max() - g["ts"].min()),
                metric="achieved_over_expected", value=round(float((g["gbps"] / g["expected"]).mean()), 4),
                threshold=cfg.slow_ratio, lost_ns=lost,
                evidence=[{"ts": int(r.ts), "dur": int(r.end - r.ts), "bytes": int(r.bytes), "gbps": round(r.gbps, 3),
                           "stream": int(r.stream)} for r in top.itertuples()]))
    if _collectives_share_copy_links(frames):
        findings.extend(_collectives_slowed(colls, copies, cfg))
    overlap = _overlap(ops)
    metrics["comm_compute_overlap"] = overlap
    for row in overlap:
        if row["comm_ns"] and row["exposed_ratio"] >= cfg.overlap_warning and row["comm_share"] >= 0.1:
            findings.append(Finding(
                code="LOW_OVERLAP", severity=Severity.INFO, title="Communication not hidden under compute",
                message=(f"rank {row['rank']}: {row['exposed_ratio']:.0%} of {row['comm_ns'] / 1e6:.3f} ms of "
                         f"collectives ran with no compute alongside"),
                rank=row["rank"], metric="exposed_comm_ratio", value=row["exposed_ratio"],
                threshold=cfg.overlap_warning, lost_ns=int(row["comm_ns"] * row["exposed_ratio"])))
    return findings, metrics


def _nominal(frames: Frames, copies: pd.DataFrame) -> dict[str, float]:
    preset = frames.trace.meta.extra.get("preset") or {}
    best = copies.groupby("kind")["gbps"].max().to_dict() if not copies.empty else {}
    if preset:
        pcie, hbm = float(preset["pcie_gbps"]), float(preset["hbm_gbps"])
        known = {"Memcpy HtoD": pcie, "Memcpy DtoH": pcie, "Memcpy DtoD": hbm / 2, "Memset": hbm}
        return {k: known.get(k, best.get(k, 0.0)) for k in set(known) | set(best)}
    return {k: float(v) for k, v in best.items()}


def _expected(copies: pd.DataFrame, nominal: dict[str, float], *, has_preset: bool) -> pd.Series:
    """Bandwidth a copy would get alone: the device's nominal figure when the trace states the
    device, else the median of same-kind, similar-size (same power of two) copies that ran alone."""
    if has_preset:
        return copies["kind"].map(nominal).astype(np.float64)
    bucket = np.floor(np.log2(copies["bytes"].clip(lower=1).astype(np.float64)))
    alone = copies[copies["overlaps"] == 0].assign(bucket=bucket)
    ref = alone.groupby(["kind", "bucket"])["gbps"].median()
    keys = list(zip(copies["kind"], bucket))
    return pd.Series([ref.get(k, np.nan) for k in keys], index=copies.index, dtype=np.float64)


def _collectives_share_copy_links(frames: Frames) -> bool:
    """Only where collectives cross the links copies use (PCIe-card servers, NICs behind PCIe)
    can copies slow them; the trace's topology says so."""
    topo = frames.trace.meta.extra.get("topology") or {}
    return topo.get("intra") == "pcie" or bool(topo.get("roce_over_pcie"))


def _overlap_counts(copies: pd.DataFrame, transfers: pd.DataFrame) -> np.ndarray:
    """How many other transfers on the same device overlap each copy in time."""
    out = np.zeros(len(copies), dtype=np.int64)
    for (rank, device), idx in copies.groupby(["rank", "device"]).groups.items():
        t = transfers[(transfers["rank"] == rank) & (transfers["device"] == device)]
        starts, ends = np.sort(t["ts"].to_numpy()), np.sort(t["end"].to_numpy())
        c = copies.loc[idx]
        # transfers with start < my end, minus those that ended at or before my start, minus me
        n = np.searchsorted(starts, c["end"].to_numpy(), side="left") - np.searchsorted(ends, c["ts"].to_numpy(), side="right")
        out[copies.index.get_indexer(idx)] = np.maximum(n - 1, 0)
    return out


def _collectives_slowed(colls: pd.DataFrame, copies: pd.DataFrame, cfg: BandwidthConfig) -> list[Finding]:
    if colls.empty or copies.empty:
        return []
    c = colls.copy()
    c["name"] = c["name"].astype(str)
    busy = np.zeros(len(c), dtype=bool)
    for i, row in enumerate(c.itertuples()):
        m = copies[(copies["rank"] == row.rank) & (copies["device"] == row.device)]
        busy[i] = bool(((m["ts"] < row.end) & (m["end"] > row.ts)).any())
    c["with_copies"] = busy
    out = []
    for (rank, name, _nbytes), g in c.groupby(["rank", "name", "bytes"], dropna=False):
        clean = g[~g["with_copies"]]
        slowed = g[g["with_copies"]]
        if clean.empty or slowed.empty:
            continue
        base = float(clean["dur"].median())
        lost = int((slowed["dur"] - base).clip(lower=0).sum())
        # Slowed means running at under slow_ratio of the clean speed, i.e. taking 1/slow_ratio longer.
        if lost < cfg.min_lost_ns or slowed["dur"].median() * cfg.slow_ratio < base:
            continue
        out.append(Finding(
            code="BANDWIDTH_CONTENTION", severity=Severity.WARNING, title=f"{name} slowed by concurrent copies",
            message=(f"rank {rank}: {len(slowed)} x {name} took {slowed['dur'].median() / 1e3:.1f} us (median) while "
                     f"copies ran on the same device, {base / 1e3:.1f} us without; {lost / 1e6:.3f} ms lost"),
            rank=int(rank), device=int(slowed["device"].iloc[0]), ts_ns=int(slowed["ts"].min()),
            metric="slowdown", value=round(float(slowed["dur"].median() / base), 4), threshold=1 / cfg.slow_ratio,
            lost_ns=lost, evidence=[{"ts": int(r.ts), "dur": int(r.dur), "corr": int(r.corr) if pd.notna(r.corr) else None}
                                    for r in slowed.head(cfg.evidence).itertuples()]))
    return out


def _overlap(ops: pd.DataFrame) -> list[dict]:
    out = []
    for rank, g in ops.groupby("rank"):
        kind = g["kind"].astype(str)
        comm = g[kind == "collective"]
        if comm.empty:
            continue
        comp = g[kind == "kernel"]
        comm_ns = union_ns(comm["ts"].to_numpy(), comm["end"].to_numpy())
        both = union_ns(np.concatenate([comm["ts"], comp["ts"]]), np.concatenate([comm["end"], comp["end"]]))
        comp_ns = union_ns(comp["ts"].to_numpy(), comp["end"].to_numpy())
        exposed = both - comp_ns  # communication time with no kernel running
        span = int(g["end"].max() - g["ts"].min()) or 1
        out.append({"rank": int(rank), "comm_ns": comm_ns, "exposed_ns": exposed,
                    "exposed_ratio": round(exposed / comm_ns, 6) if comm_ns else 0.0,
                    "comm_share": round(comm_ns / span, 6)})
    return out
