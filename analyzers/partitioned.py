"""Rank-partitioned analysis: map the analyzers over one rank's table at a time, reduce on the driver.

A multi-rank job's trace is partitioned by rank (`rank=R/part-0.parquet`); each partition is the
unit of parallel work. `map_partition(trace)` runs on ONE partition (a Trace holding some ranks,
usually one): every per-rank analyzer runs as it would on the whole trace and returns its findings
and metrics; the cross-rank analyzers (slow rank, slow link, pipeline bubble) only `summarize` the
partition into a small summary (each rank's collective arrival table and busy times; its link
samples; its point-to-point transfers and kernel time per step).
`reduce_partitions(partials)` then, on the driver, merges the per-rank findings and metrics back
into the order and shape a whole-trace `run` gives, and runs the cross-rank `reduce` functions
over the summaries. The result is the `AnalysisResult` of `analyzers.run` on the whole trace.
A collective's wait names the rank it waited for: the driver first gathers every partition's
arrivals (`partition_arrivals`, small) and gives them to each partition (`map_partition(peers=)`).
Two per-rank analyzers have a cross-rank part, handled here too: bandwidth's LOW_OVERLAP is one
finding over every rank's overlap row (recomputed from the merged rows), and without a device
preset its copies are judged against all ranks' reference copies (`bandwidth_reference`: the
driver pools them and runs bandwidth once more per partition with the pool).

Pure functions of tables and summaries: no file is read here, and nothing here knows where the
partitions run (in-process or on a cluster): `msprof_py.report` drives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from analyzers import bandwidth, links, pipeline, ranks
from analyzers.bandwidth import _low_overlap
from analyzers.causality import collectives
from analyzers.finding import REGISTRY, AnalysisResult, Finding, Skipped, _load_all, attributed, group_across_ranks
from analyzers.frames import Frames
from msprof_py.trace.schema import Trace

#: Analyzers whose findings need all ranks: `summarize(frames)` per partition, `reduce(summaries, cfg)` after.
CROSS_RANK: dict[str, tuple[Callable[[Frames], Any], Callable[[list[Any], Any], Any]]] = {
    "ranks": (ranks.summarize, ranks.reduce),
    "links": (links.summarize, links.reduce),
    "pipeline": (pipeline.summarize, pipeline.reduce),
}


@dataclass
class Partial:
    """What one partition's task returns: small next to the partition it read."""

    #: The ranks the partition holds (sorted).
    ranks: list[int]
    platform: str
    #: Per per-rank analyzer: its findings (in its own order), or absent when it skipped.
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: Per cross-rank analyzer: its summary of the partition.
    summaries: dict[str, Any] = field(default_factory=dict)
    #: What the caller's `extra` made of the partition's frames (map_partition).
    extra: Any = None


def selected(names: list[str] | None) -> list[str]:
    """The analyzers a run covers, in `run`'s order; unknown names raise ValueError as `run` does."""
    _load_all()
    unknown = [n for n in (names or []) if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown analyzer(s) {', '.join(unknown)}; choose from {', '.join(sorted(REGISTRY))}")
    return list(names or sorted(REGISTRY))


def map_partition(trace: Trace, names: list[str] | None = None, configs: dict[str, Any] | None = None,
                  window: str = "all", reference: pd.DataFrame | None = None,
                  peers: pd.DataFrame | None = None, extra: Callable[[Frames], Any] | None = None) -> Partial:
    """Run the per-rank analyzers on one partition and summarize it for the cross-rank ones.

    `reference`: the copies of every rank that the bandwidth analyzer judges copies by when the
    trace names no device preset (`bandwidth_reference`); without it, such a partition returns
    its own reference copies in `summaries["bandwidth.reference"]` for the driver to pool.
    `peers`: every rank's arrival at each collective (`collectives.arrivals` of each partition),
    so a collective that waited for a rank of another partition names it. `extra`: called with the
    partition's frames once the analyzers ran (its result in `Partial.extra`), so a caller's own
    figures of the partition come from the same read and the same frames."""
    configs = configs or {}
    frames = Frames(trace, window=window)
    if peers is not None:
        frames._cache[collectives.PEERS_KEY] = peers
    rank_col = frames.table.column("rank")
    out = Partial(ranks=sorted({int(r) for r in rank_col.unique().to_pylist()}), platform=frames.platform)
    for name in selected(names):
        if name in CROSS_RANK:
            out.summaries[name] = CROSS_RANK[name][0](frames)
            continue
        spec = REGISTRY[name]
        cfg = configs.get(name) or spec.config_cls()
        pooled = name == "bandwidth" and not (trace.meta.extra or {}).get("preset")
        if pooled and reference is None:
            out.summaries["bandwidth.reference"] = reference_copies(frames, cfg)
        try:
            if pooled and reference is not None:
                cfg = replace(cfg, reference=reference)  # every rank's reference copies, not the partition's
            res = spec.fn(frames, cfg)
        except Skipped as exc:
            out.skipped[name] = str(exc)
            continue
        if isinstance(res, tuple):
            res, out.metrics[name] = res
        out.findings[name] = list(res)
    if extra is not None:
        out.extra = extra(frames)
    return out


# --------------------------------------------------------------- bandwidth without a preset
# Without a device preset the bandwidth analyzer judges a copy against the copies of the same
# kind and size that had their link to themselves, on ANY rank: a cross-rank reference. Which
# copies those are is decided per (rank, device, link), so each partition gives its own
# (`reference_copies`); the driver pools them and, when there are several partitions, runs the
# analyzer once more on each partition with the pooled reference (`map_partition(reference=)`).

def reference_copies(frames: Frames, cfg: Any) -> pd.DataFrame:
    """The partition's copies the analyzer would take as references (kind, bytes, gbps)."""
    from analyzers.streams import copy_bandwidth

    copies = copy_bandwidth(frames)
    if copies.empty:
        return pd.DataFrame({"kind": pd.Series(dtype=object), "bytes": pd.Series(dtype=np.float64),
                             "gbps": pd.Series(dtype=np.float64)})
    ops = frames.device_ops
    colls = ops[ops["kind"].astype(str) == "collective"]
    copies = copies.reset_index(drop=True)
    copies["link"] = copies["kind"].map(bandwidth.LINK_OF_KIND).fillna("other:" + copies["kind"].astype(str))
    share = bandwidth.collectives_share_copy_links(frames)
    copies["overlaps"] = bandwidth._overlap_counts(copies, colls if share else colls.iloc[0:0])
    ref = bandwidth.reference_pool(copies, cfg)
    return pd.DataFrame({"kind": ref["kind"].astype(str).to_numpy(dtype=object),
                         "bytes": ref["bytes"].to_numpy(dtype=np.float64), "gbps": ref["gbps"].to_numpy(np.float64)})


def bandwidth_reference(partials: list[Partial]) -> pd.DataFrame | None:
    """The pooled reference copies when the bandwidth analyzer must run again with them (a trace
    without a preset, in several partitions, with reference copies somewhere), else None."""
    pools = [p.summaries["bandwidth.reference"] for p in partials if "bandwidth.reference" in p.summaries]
    if len(partials) < 2 or not pools or not any(len(p) for p in pools):
        return None
    return pd.concat(pools, ignore_index=True)


def partition_arrivals(trace: Trace) -> pd.DataFrame:
    """A partition's ranks' arrivals at their collectives, for the other partitions (map_partition's `peers`)."""
    return collectives.arrivals(trace.table)


def reduce_partitions(partials: list[Partial], names: list[str] | None = None,
                      configs: dict[str, Any] | None = None) -> AnalysisResult:
    """The whole-trace `AnalysisResult` from every partition's `Partial` (any order)."""
    configs = configs or {}
    parts = sorted(partials, key=lambda p: p.ranks[:1] or [1 << 62])
    platform = parts[0].platform if parts else "unknown"
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    metrics: dict[str, Any] = {}
    for name in selected(names):
        spec = REGISTRY[name]
        cfg = configs.get(name) or spec.config_cls()
        try:
            if name in CROSS_RANK:
                res = CROSS_RANK[name][1]([p.summaries[name] for p in parts], cfg)
            else:
                res = _merge(name, parts, cfg)
        except Skipped as exc:
            skipped[name] = str(exc)
            continue
        if isinstance(res, tuple):
            res, metrics[name] = res
        findings.extend(attributed(group_across_ranks(res), name, platform))
    return AnalysisResult(findings, skipped, metrics, platform)


# --------------------------------------------------------------- merging per-rank analyzers
# A per-rank analyzer run on the whole trace lists its findings in phases (e.g. sync: the stalls
# of every rank, then the races of every rank), each phase in rank order. Its findings on one
# partition come in the same phases, so the merge orders (phase, key within the phase, partition,
# position): `_PHASES` gives an analyzer's phase and key of a finding (default: one phase, ranks in order).

def _one_phase(f: Finding) -> tuple[int, Any]:
    return 0, 0


def _sync_phase(f: Finding) -> tuple[int, Any]:
    return (0 if f.code == "SYNC_STALL" else 1), 0


def _memory_phase(f: Finding) -> tuple[int, Any]:
    # Fragmentation findings come per (rank, device) sorted as text (memory._fragmentation).
    if f.code == "MEMORY_FRAGMENTATION":
        return 1, str((f.rank, f.device))
    return 0, ""


_COLLECTIVES_SLOWED = "Collectives slowed by copies on their PCIe link"


def _bandwidth_phase(f: Finding) -> tuple[int, Any]:
    return (1 if f.title == _COLLECTIVES_SLOWED else 0), 0


_PHASES: dict[str, Callable[[Finding], tuple[int, Any]]] = {
    "sync": _sync_phase, "memory": _memory_phase, "bandwidth": _bandwidth_phase,
}


def _merge(name: str, parts: list[Partial], cfg: Any):
    ran = [p for p in parts if name in p.findings]
    if not ran:
        reasons = [p.skipped[name] for p in parts if name in p.skipped]
        raise Skipped(reasons[0] if reasons else "no ranks in the trace")
    phase = _PHASES.get(name, _one_phase)
    tagged = [(phase(f), i, j, f) for i, p in enumerate(ran) for j, f in enumerate(p.findings[name])
              if not (name == "bandwidth" and f.code == "LOW_OVERLAP")]
    tagged.sort(key=lambda t: (t[0], t[1], t[2]))
    out = [t[3] for t in tagged]
    merged = _METRICS.get(name, _no_metrics)([p.metrics.get(name) for p in ran])
    if name == "bandwidth":
        # Communication not hidden under compute is one finding across the ranks concerned.
        f = _low_overlap(merged.get("comm_compute_overlap", []), cfg)
        if f is not None:
            out.append(f)
    return (out, merged) if any(name in p.metrics for p in ran) else out


def _no_metrics(ms: list) -> Any:
    return ms[0] if ms else None


def _concat(ms: list[dict], key: str) -> list:
    return [row for m in ms if m and key in m for row in m[key]]


def _sum(ms: list[dict], key: str) -> int:
    return sum(m[key] for m in ms if m and key in m)


def _first(ms: list[dict], key: str) -> Any:
    return next(m[key] for m in ms if m and key in m)


def _bubbles_metrics(ms: list[dict]) -> dict:
    causes: dict[str, int] = {}
    for m in ms:
        for c, v in m["idle_by_cause_ns"].items():
            causes[c] = causes.get(c, 0) + v
    return {"per_step": _concat(ms, "per_step"), "gaps": _sum(ms, "gaps"),
            "idle_by_cause_ns": dict(sorted(causes.items()))}


def _queue_metrics(ms: list[dict]) -> dict:
    return {"streams": _concat(ms, "streams"), "queue_limit": _first(ms, "queue_limit"),
            "full_level": _first(ms, "full_level"), "blocked_ns": _sum(ms, "blocked_ns")}


def _memory_metrics(ms: list[dict]) -> dict:
    out: dict[str, Any] = {}
    if any("unfreed" in m for m in ms):
        out["unfreed"] = sorted(_concat(ms, "unfreed"), key=lambda r: -r["total_bytes"])
    for m in ms:
        out.update({k: v for k, v in m.items() if k != "unfreed"})
    return out


def _bandwidth_metrics(ms: list[dict]) -> dict:
    out: dict[str, Any] = {"copies": _concat(ms, "copies"), "nominal_gbps": _first(ms, "nominal_gbps")}
    if any("judged_copies" in m for m in ms):
        out["judged_copies"] = _sum(ms, "judged_copies")
    out["comm_compute_overlap"] = _concat(ms, "comm_compute_overlap")
    return out


_METRICS: dict[str, Callable[[list], Any]] = {
    "bubbles": _bubbles_metrics,
    "launch": lambda ms: {"devices": _concat(ms, "devices")},
    "queue": _queue_metrics,
    "sync": lambda ms: {"host_threads": _concat(ms, "host_threads"), "races": _sum(ms, "races")},
    "memory": _memory_metrics,
    "bandwidth": _bandwidth_metrics,
    "cores": lambda ms: {"contended_ns": _sum(ms, "contended_ns"),
                         "under_occupancy_saving_ns": _sum(ms, "under_occupancy_saving_ns")},
}
