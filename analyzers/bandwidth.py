"""Bandwidth contention: transfers sharing a link, and communication/computation overlap."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyzers.causality import device_windows, idle_by_rank
from analyzers.causality.critical_path import critical_paths
from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Cover, Frames, cover, intersect_intervals, merge_intervals, union_ns
from analyzers.memcpy import bandwidth_summary, gbps_text
from analyzers.severity import severity
from analyzers.streams import LINK_OF_KIND, copy_bandwidth
from msprof_py.trace.units import ms, pct, sig

MiB = 1 << 20


@dataclass
class BandwidthConfig:
    slow_ratio: float = 0.8  # msprof-analyze: SDMA bandwidth < 0.8x expected while overlapping
    min_lost_ns: int = 20_000
    #: Without a device preset, the reference 'alone' bandwidth comes only from copies of at
    #: least this size (below it, per-copy latency dominates and bytes/duration says nothing
    #: about the link) and within `reference_span` x of the judged copy's size.
    min_reference_bytes: int = MiB
    reference_span: float = 10.0
    #: The reference copies (kind, bytes, gbps) to judge by instead of this trace's own: every
    #: rank's, pooled, when the trace is analyzed a rank partition at a time (analyzers.partitioned).
    reference: "pd.DataFrame | None" = field(default=None, compare=False, repr=False)
    overlap_warning: float = 0.3  # share of communication not hidden under compute
    evidence: int = 5
    max_occurrences: int = 1000
    #: Streams whose delay is within this share of the largest count as tied; among them the one
    #: whose next op started within `gate_ns` of its copy's end (work waiting on it) is chosen.
    near_tie: float = 0.9
    gate_ns: int = 50_000


@register("bandwidth", BandwidthConfig)
def analyze(frames: Frames, cfg: BandwidthConfig):
    """Bandwidth contention.

    Pattern: several transfers crossing the same link (copies of one PCIe direction, device
    copies and memsets on HBM, and collectives where the topology routes them over PCIe) run
    at once, so each gets a share of the link and the work waiting on them starts later.

    Algorithm: a copy's per-copy rate = bytes / duration (the profiler's own figure when it gave
    one); it judges one copy, unlike the bandwidth in use (`analyzers.memcpy`, HTA's figure: the
    rates of the copies running at once summed), which the `copies` metric gives. The time a
    copy would take alone is, when the trace states the device (a preset), copy latency + bytes / the preset's link bandwidth (PCIe per direction, HBM / 2
    for device-to-device); otherwise bytes / the median bandwidth of copies of the same kind
    that ran alone, are >= `min_reference_bytes` and within `reference_span` x of its size
    (no such copies: the copy is not judged; tiny copies never set the reference). A copy is
    slowed when it overlaps another transfer on its link and achieved < `slow_ratio` x the
    alone bandwidth (copies faster than the reference never count); it finished late by
    extra = duration - alone. Overlapping transfers on one link form a contended interval.
    Serialising copies that share a link would not finish the interval sooner, so the sum of
    every copy's extra overstates the loss: each copy is late by roughly the bytes of the
    others. What the job loses is the delay of the work waiting behind the slowed copies: per
    stream, the extras add up along the stream (a late copy delays the next one), and across
    streams they overlap, so an interval costs the victim stream's extras (the stream with
    the largest sum; of near-tied streams, the one whose next op was waiting for the copy),
    capped by the interval's length. What the run gets back of a copy's overhang past its
    alone time is only the part during which the rank's critical path
    (analyzers.causality.critical_path) ran through a transfer of the interval (the copy, another
    copy on the link, or a collective sharing it) or through no recorded activity, and no kernel
    ran on the device (the cores waited): while the path ran through compute or host work, or a
    kernel still ran (the path would move to it), the late copy cost nothing. A finding's cost is
    the sum over its intervals, so never more than the copies' own extra time nor the rank's span.
    One finding per (rank, device, link) costing at least `min_lost_ns`, with one occurrence
    per slowed copy of the victim stream of each interval (ts, dur, stream, lost); its share of
    the device's step time sets the severity by the one rule (analyzers.severity). Where the
    topology puts collectives on the copies' links, collectives overlapping copies are compared
    with the median duration of the same collective without copies around, their extra time
    bounded by the critical path the same way. Also reported (LOW_OVERLAP): communication not
    hidden under compute, one finding for the ranks concerned with the window their exposed
    communication covers.
    """
    copies = copy_bandwidth(frames)
    ops = frames.device_ops
    colls = ops[ops["kind"].astype(str) == "collective"]
    if copies.empty and colls.empty:
        raise Skipped("no copies or collectives in the trace")
    preset = frames.trace.meta.extra.get("preset") or {}
    findings: list[Finding] = []
    metrics: dict = {"copies": bandwidth_summary(copies).to_dict("records"),
                     "nominal_gbps": nominal_gbps(preset) if preset else {}}
    windows = device_windows(frames)
    step_ns = {key: max(int((w["end"] - w["start"]).sum()), 1) for key, w in windows.items()}
    share_pcie = collectives_share_copy_links(frames)
    if not copies.empty:
        copies = copies.reset_index(drop=True)
        copies["link"] = copies["kind"].map(LINK_OF_KIND).fillna("other:" + copies["kind"].astype(str))
        copies["overlaps"] = _overlap_counts(copies, colls if share_pcie else colls.iloc[0:0])
        copies["alone_ns"] = _alone_ns(copies, preset, cfg)
        expected_gbps = copies["bytes"] / copies["alone_ns"]
        copies["extra_ns"] = (copies["end"] - copies["ts"] - copies["alone_ns"]).clip(lower=0).fillna(0)
        copies["slowed"] = ((copies["overlaps"] > 0) & copies["alone_ns"].notna()
                            & (copies["gbps"] < cfg.slow_ratio * expected_gbps) & (copies["extra_ns"] > 0))
        metrics["judged_copies"] = int(copies["alone_ns"].notna().sum())
        for (rank, device, link), g in copies.groupby(["rank", "device", "link"], sort=True):
            if not g["slowed"].any():
                continue
            mine = ops[(ops["rank"] == rank) & (ops["device"] == device)]
            f = _contention_finding(frames, int(rank), int(device), str(link), g, colls if share_pcie else None,
                                    mine, step_ns.get((int(rank), int(device)), 1), cfg)
            if f is not None:
                findings.append(f)
    if share_pcie:
        findings.extend(_collectives_slowed(frames, colls, copies, ops, step_ns, cfg))
    overlap = _overlap(ops)
    idle = idle_by_rank(frames)
    for row in overlap:
        # What overlapping it would recover: the exposed time the attribution says the device
        # waited on the transfer itself (not on a late peer: SLOW_RANK's; not on its host).
        row["transfer_idle_ns"] = min(int(row["exposed_ns"]), idle.get(row["rank"], {}).get("transfer_ns", 0))
    metrics["comm_compute_overlap"] = overlap
    f = _low_overlap(overlap, cfg)
    if f is not None:
        findings.append(f)
    return findings, metrics


def nominal_gbps(preset: dict) -> dict[str, float]:
    pcie, hbm = float(preset["pcie_gbps"]), float(preset["hbm_gbps"])
    return {"Memcpy HtoD": pcie, "Memcpy DtoH": pcie, "Memcpy DtoD": hbm / 2, "Memset": hbm}


def reference_pool(copies: pd.DataFrame, cfg: BandwidthConfig) -> pd.DataFrame:
    """The copies a copy is judged against without a preset: those that had their link to
    themselves (no overlapping collective) and are big enough for bytes/duration to mean a rate."""
    return copies[(copies["overlaps"] == 0) & (copies["bytes"] >= cfg.min_reference_bytes)]


def _alone_ns(copies: pd.DataFrame, preset: dict, cfg: BandwidthConfig) -> pd.Series:
    """How long each copy would take with its link to itself (NaN: no reference to judge it by)."""
    nbytes = copies["bytes"].to_numpy(dtype=np.float64)
    if preset:
        gbps = copies["kind"].map(nominal_gbps(preset)).to_numpy(dtype=np.float64)
        latency = float(preset.get("copy_latency_ns", 0) or 0)
        return pd.Series(latency + nbytes / gbps, index=copies.index)
    out = np.full(len(copies), np.nan)
    ref_pool = reference_pool(copies, cfg) if cfg.reference is None else cfg.reference
    ref_kinds = ref_pool["kind"].astype(str)
    for kind, idx in copies.groupby("kind").groups.items():
        pool = ref_pool[ref_kinds == str(kind)]
        if pool.empty:
            continue
        order = np.argsort(pool["bytes"].to_numpy(dtype=np.float64), kind="stable")
        pb = pool["bytes"].to_numpy(dtype=np.float64)[order]
        pg = pool["gbps"].to_numpy(dtype=np.float64)[order]
        pos = copies.index.get_indexer(idx)
        pos = pos[nbytes[pos] >= cfg.min_reference_bytes]
        lo = np.searchsorted(pb, nbytes[pos] / cfg.reference_span, side="left")
        hi = np.searchsorted(pb, nbytes[pos] * cfg.reference_span, side="right")
        for i, a, b in zip(pos, lo, hi):
            if b > a:  # copies of the same order of magnitude that had the link to themselves
                out[i] = nbytes[i] / float(np.median(pg[a:b]))
    return pd.Series(out, index=copies.index)


def collectives_share_copy_links(frames: Frames) -> bool:
    """Only where collectives cross the links copies use (PCIe-card servers, NICs behind PCIe)
    can copies slow them; the trace's topology says so."""
    topo = frames.trace.meta.extra.get("topology") or {}
    return topo.get("intra") == "pcie" or bool(topo.get("roce_over_pcie"))


def _overlap_counts(copies: pd.DataFrame, colls: pd.DataFrame) -> np.ndarray:
    """How many other transfers on the same link of the same device overlap each copy in time
    (collectives count on both PCIe directions when they cross PCIe: `colls` non-empty)."""
    out = np.zeros(len(copies), dtype=np.int64)
    for (rank, device, link), idx in copies.groupby(["rank", "device", "link"]).groups.items():
        t = copies[(copies["rank"] == rank) & (copies["device"] == device) & (copies["link"] == link)]
        ts, end = t["ts"].to_numpy(), t["end"].to_numpy()
        if link.startswith("pcie") and not colls.empty:
            cc = colls[(colls["rank"] == rank) & (colls["device"] == device)]
            ts, end = np.concatenate([ts, cc["ts"].to_numpy()]), np.concatenate([end, cc["end"].to_numpy()])
        starts, ends = np.sort(ts), np.sort(end)
        c = copies.loc[idx]
        # transfers with start < my end, minus those that ended at or before my start, minus me
        n = np.searchsorted(starts, c["end"].to_numpy(), side="left") - np.searchsorted(ends, c["ts"].to_numpy(),
                                                                                        side="right")
        out[copies.index.get_indexer(idx)] = np.maximum(n - 1, 0)
    return out


def _intervals(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Connected-component id of each interval (overlapping intervals share an id)."""
    order = np.argsort(ts, kind="stable")
    run_end = np.maximum.accumulate(end[order])
    new = np.ones(len(ts), dtype=bool)
    new[1:] = ts[order][1:] >= run_end[:-1]
    ids = np.empty(len(ts), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


_STREAM = re.compile(r"stream (-?\d+)")


def _path_of(frames: Frames, rank: int) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
    """The rank's critical path over the run as what a late transfer can cost: the path's
    transfer edges (copies and collectives: stream, ts, end) and the time it leaves untraced (no
    recorded activity on the path: merged intervals). Cached per frames, as are the whole trace's
    critical paths it reads (shared with reports and other analyzers)."""
    key = ("bandwidth.path", rank)
    if key not in frames._cache:
        cp = critical_paths(frames)[0][rank]
        seg = cp.segments
        seg = seg[seg["weight_ns"] > 0]
        t = seg[seg["cause"].astype(str).isin(("copy", "collective"))]
        stream = pd.to_numeric(t["where"].astype(str).str.extract(_STREAM)[0], errors="coerce")
        transfers = pd.DataFrame({"stream": stream.to_numpy(), "ts": t["ts"].to_numpy(np.int64),
                                  "end": t["end"].to_numpy(np.int64)}).dropna()
        covered = merge_intervals(seg["ts"].to_numpy(np.int64), seg["end"].to_numpy(np.int64))
        frames._cache[key] = (transfers, _complement(covered, cp.start, cp.end))
    return frames._cache[key]


def _complement(iv: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) minus disjoint sorted intervals, as disjoint sorted intervals."""
    starts = np.maximum(np.concatenate([[lo], iv[1]]).astype(np.int64), lo)
    ends = np.minimum(np.concatenate([iv[0], [hi]]).astype(np.int64), hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def _recoverable(path: tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]], members: pd.DataFrame,
                 waiting: tuple[np.ndarray, np.ndarray]) -> Cover:
    """The time a late transfer among `members` (stream, ts, end: the transfers of one contended
    interval) costs the run: while the rank's critical path runs through one of them (or through
    nothing recorded) and the cores wait (`waiting`: no kernel running). While a kernel runs the
    device still works, and the path would move to that work if the transfer were faster: that
    time is not lost."""
    transfers, untraced = path
    a, b = [untraced[0]], [untraced[1]]
    for stream, m in members.groupby("stream"):
        t = transfers[transfers["stream"] == stream]
        if not t.empty:
            x, y = intersect_intervals(merge_intervals(t["ts"].to_numpy(), t["end"].to_numpy()),
                                       merge_intervals(m["ts"].to_numpy(), m["end"].to_numpy()))
            a.append(x)
            b.append(y)
    return Cover(*intersect_intervals(merge_intervals(np.concatenate(a), np.concatenate(b)), waiting))


def _waiting(frames: Frames, rank: int, device: int, ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """When no kernel ran on the device, over the rank's critical path's region."""
    kernels = ops[(ops["rank"] == rank) & (ops["device"] == device) & (ops["kind"].astype(str) == "kernel")]
    busy = cover(kernels)
    _, untraced = _path_of(frames, rank)
    lo = int(min(untraced[0].min(), ops["ts"].min())) if len(untraced[0]) else int(ops["ts"].min())
    hi = int(max(untraced[1].max(), ops["end"].max())) if len(untraced[1]) else int(ops["end"].max())
    return _complement((busy.starts, busy.ends), lo, hi)


def _contention_finding(frames: Frames, rank: int, device: int, link: str, g: pd.DataFrame,
                        colls: pd.DataFrame | None, ops: pd.DataFrame, step_ns: int,
                        cfg: BandwidthConfig) -> Finding | None:
    """One finding for the slowed copies on one link of one device (see `analyze`)."""
    kind = ", ".join(sorted(g.loc[g["slowed"], "kind"].unique()))
    ts, end, streams = g["ts"].to_numpy(), g["end"].to_numpy(), g["stream"].to_numpy()
    if colls is not None and link.startswith("pcie"):
        cc = colls[(colls["rank"] == rank) & (colls["device"] == device)]
        ts, end = np.concatenate([ts, cc["ts"].to_numpy()]), np.concatenate([end, cc["end"].to_numpy()])
        streams = np.concatenate([streams, cc["stream"].to_numpy()])
    link_name = f"r{rank}.d{device}.{link}"  # the link as rank.device.link (e.g. r0.d0.pcie_h2d)
    comp = _intervals(ts, end)  # copies first, then the collectives sharing the link
    g = g.assign(interval=comp[: len(g)])
    occurrences = []
    path = _path_of(frames, rank)
    waiting = _waiting(frames, rank, device, ops)
    for _, iv in g.groupby("interval"):
        slowed = iv[iv["slowed"]]
        if slowed.empty:
            continue
        per_stream = slowed.groupby("stream")["extra_ns"].sum()
        members = comp == iv["interval"].iloc[0]
        budget = int(end[members].max() - ts[members].min())  # never more than the interval lasted
        recoverable = _recoverable(path, pd.DataFrame({"stream": streams[members], "ts": ts[members],
                                                       "end": end[members]}), waiting)
        stream = _delayed_stream(per_stream, slowed, ops, cfg)
        # The occurrences are the slowed copies of the most delayed stream: the work behind them waited.
        for c in slowed[slowed["stream"] == stream].sort_values("ts").itertuples():
            # Only the overhang past the copy's alone time that held the run up counts: while the
            # critical path ran through compute or host work, the slower copy cost nothing.
            a, b = int(c.ts + c.alone_ns), int(c.end)
            stalled = int(recoverable.between(a, b)) if b > a else 0
            lost = int(min(max(stalled, 0), c.extra_ns, budget))
            budget -= lost
            occurrences.append({"rank": rank, "device": device, "stream": stream, "link": link_name,
                                "ts_ns": int(c.ts),
                                "dur_ns": int(c.end - c.ts), "lost_ns": lost, "alone_ns": int(c.alone_ns),
                                "sharing": int(c.overlaps)})
    lost = int(sum(o["lost_ns"] for o in occurrences))
    if lost < cfg.min_lost_ns:
        return None
    share = lost / step_ns
    hit = g[g["slowed"]]
    expected = float((hit["bytes"] / hit["alone_ns"]).median())
    top = hit.sort_values("extra_ns", ascending=False).head(cfg.evidence)
    occ = sorted(occurrences, key=lambda o: -o["lost_ns"])[: cfg.max_occurrences]
    occ.sort(key=lambda o: o["ts_ns"])
    t0 = min(o["ts_ns"] for o in occurrences)
    t1 = max(o["ts_ns"] + o["dur_ns"] for o in occurrences)
    return Finding(
        code="BANDWIDTH_CONTENTION", severity=severity(share, "BANDWIDTH_CONTENTION"),
        title=f"{kind} slowed by transfers sharing {link}",
        message=(f"rank {rank} device {device}: {len(hit)} {kind} copies on {link} ran at a per-copy rate of "
                 f"{gbps_text(hit['gbps'].mean())} GB/s on average against {gbps_text(expected)} GB/s alone, in "
                 f"{g.loc[g['slowed'], 'interval'].nunique()} contended interval(s); {ms(lost)} of their extra "
                 f"time held up the rank's critical path ({pct(share)} of device step time), what the run would "
                 f"get back"),
        rank=rank, device=device, stream=occurrences[0]["stream"] if len(occurrences) == 1 else None,
        ts_ns=t0, dur_ns=t1 - t0, metric="achieved_over_alone",
        value=round(float((hit["gbps"] / (hit["bytes"] / hit["alone_ns"])).mean()), 4),
        threshold=cfg.slow_ratio, lost_ns=lost, occurrences=occ,
        evidence=[{"ts": int(r.ts), "dur": int(r.end - r.ts), "bytes": int(r.bytes), "gbps": round(float(r.gbps), 3),
                   "alone_ns": int(r.alone_ns), "stream": int(r.stream), "link": link_name} for r in top.itertuples()])


def _delayed_stream(per_stream: pd.Series, slowed: pd.DataFrame, ops: pd.DataFrame, cfg: BandwidthConfig) -> int:
    """The stream whose slowed copies held up work: the largest sum of extras, preferring, among
    streams within `near_tie` of it, one whose next op started right after its last slowed copy
    (work queued behind the copy, as a kernel consuming the input) over one with nothing waiting."""
    best = float(per_stream.max())
    near = per_stream[per_stream >= cfg.near_tie * best].sort_values(ascending=False)
    for stream in near.index:
        last_end = int(slowed.loc[slowed["stream"] == stream, "end"].max())
        on = ops[(ops["stream"] == stream) & (ops["ts"] >= last_end)]
        if not on.empty and int(on["ts"].min()) - last_end <= cfg.gate_ns:
            return int(stream)
    return int(near.index[0])


def _collectives_slowed(frames: Frames, colls: pd.DataFrame, copies: pd.DataFrame, ops: pd.DataFrame,
                        step_ns: dict[tuple[int, int], int], cfg: BandwidthConfig) -> list[Finding]:
    """Collectives that ran longer while copies crossed their PCIe link, against the same
    collective (name, bytes) on the same rank without copies around; one finding per rank. A
    collective's extra time counts as far as it held up the rank's critical path (`_recoverable`)."""
    if colls.empty or copies.empty:
        return []
    c = colls.copy()
    c["name"] = c["name"].astype(str)
    pcie = copies[copies["link"].str.startswith("pcie")]
    busy = np.zeros(len(c), dtype=bool)
    for i, row in enumerate(c.itertuples()):
        m = pcie[(pcie["rank"] == row.rank) & (pcie["device"] == row.device)]
        busy[i] = bool(((m["ts"] < row.end) & (m["end"] > row.ts)).any())
    c["with_copies"] = busy
    out = []
    waiting: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for rank, r in c.groupby("rank"):
        occurrences = []
        for (name, _nbytes), g in r.groupby(["name", "bytes"], dropna=False):
            clean, slowed = g[~g["with_copies"]], g[g["with_copies"]]
            if clean.empty or slowed.empty:
                continue
            base = float(clean["dur"].median())
            # Slowed means running at under slow_ratio of the clean speed, i.e. taking 1/slow_ratio longer.
            for s in slowed[slowed["dur"] * cfg.slow_ratio >= base].itertuples():
                key = (int(rank), int(s.device))
                if key not in waiting:
                    waiting[key] = _waiting(frames, *key, ops)
                mine = pd.DataFrame({"stream": [s.stream], "ts": [int(s.ts)], "end": [int(s.end)]})
                held = _recoverable(_path_of(frames, int(rank)), mine, waiting[key])
                lost = int(min(held.between(int(s.ts + base), int(s.end)), s.dur - base))
                occurrences.append({"rank": int(rank), "device": int(s.device), "stream": int(s.stream), "name": name,
                                    "ts_ns": int(s.ts), "dur_ns": int(s.dur), "lost_ns": lost,
                                    "slowdown": round(float(s.dur / base), 4)})
        # A collective is one stream's work: its extra durations do not overlap one another.
        lost = sum(o["lost_ns"] for o in occurrences)
        if lost < cfg.min_lost_ns:
            continue
        share = lost / step_ns.get((int(rank), occurrences[0]["device"]), 1)
        occurrences.sort(key=lambda o: o["ts_ns"])
        t0 = occurrences[0]["ts_ns"]
        t1 = max(o["ts_ns"] + o["dur_ns"] for o in occurrences)
        slow = float(np.median([o["slowdown"] for o in occurrences]))
        out.append(Finding(
            code="BANDWIDTH_CONTENTION", severity=severity(share, "BANDWIDTH_CONTENTION"),
            title="Collectives slowed by copies on their PCIe link",
            message=(f"rank {rank}: {len(occurrences)} collective(s) ran {sig(slow)}x as long (median) while copies "
                     f"crossed the same PCIe link; {ms(lost)} of it held up the rank's critical path "
                     f"({pct(share)} of device step time)"),
            rank=int(rank), device=occurrences[0]["device"], stream=occurrences[0]["stream"], ts_ns=t0, dur_ns=t1 - t0,
            metric="slowdown", value=round(slow, 4), threshold=round(1 / cfg.slow_ratio, 4), lost_ns=int(lost),
            occurrences=occurrences[: cfg.max_occurrences],
            evidence=[{"ts": o["ts_ns"], "dur": o["dur_ns"], "name": o["name"]} for o in occurrences[: cfg.evidence]]))
    return out


def _overlap(ops: pd.DataFrame) -> list[dict]:
    """Per rank: communication time, the part of it with no kernel running (exposed), and the
    window from the first to the last exposed moment."""
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
        first, last = _exposed_window(comm, comp)
        out.append({"rank": int(rank), "comm_ns": comm_ns, "exposed_ns": exposed,
                    "exposed_ratio": round(exposed / comm_ns, 6) if comm_ns else 0.0,
                    "comm_share": round(comm_ns / span, 6), "exposed_first_ns": first, "exposed_last_ns": last})
    return out


def _exposed_window(comm: pd.DataFrame, comp: pd.DataFrame) -> tuple[int | None, int | None]:
    """Start of the first and end of the last collective that ran at some moment with no kernel
    alongside (a collective is hidden only if one stretch of back-to-back kernels covers it)."""
    s, e = comm["ts"].to_numpy(), comm["end"].to_numpy()
    exposed = np.ones(len(s), dtype=bool)
    if len(comp):
        m_ts, m_end = merge_intervals(comp["ts"].to_numpy(), comp["end"].to_numpy())
        k = np.searchsorted(m_ts, s, side="right") - 1
        exposed = (k < 0) | (m_end[np.maximum(k, 0)] < e)
    exposed &= e > s
    if not exposed.any():
        return None, None
    return int(s[exposed].min()), int(e[exposed].max())


def _low_overlap(overlap: list[dict], cfg: BandwidthConfig) -> Finding | None:
    """One finding for every rank whose communication is mostly exposed."""
    hit = [r for r in overlap if r["comm_ns"] and r["exposed_ratio"] >= cfg.overlap_warning and r["comm_share"] >= 0.1]
    if not hit:
        return None
    worst = max(hit, key=lambda r: r["exposed_ns"])
    # exposed_ratio > 0 means some collective ran with no kernel alongside: the window exists.
    t0 = min(r["exposed_first_ns"] for r in hit)
    t1 = max(r["exposed_last_ns"] for r in hit)
    # Its cost is part of BUBBLE_COLLECTIVE's (analyzers.severity.COST_OF): the exposed time the
    # device waited on the transfer itself, per rank, averaged over the ranks (job time).
    recoverable = [r["transfer_idle_ns"] for r in hit]
    ratio = float(np.mean([r["exposed_ratio"] for r in hit]))
    return Finding(
        code="LOW_OVERLAP", severity=Severity.INFO, title="Communication not hidden under compute",
        message=(f"{len(hit)} rank(s): {pct(ratio)} of their collective time on average ran with no compute "
                 f"alongside (rank {worst['rank']}: {ms(worst['exposed_ns'])} of {ms(worst['comm_ns'])}, "
                 f"{ms(worst['transfer_idle_ns'])} of it with the device waiting on the transfer itself)"),
        rank=worst["rank"], ranks=sorted(r["rank"] for r in hit if r["rank"] != worst["rank"]),
        ts_ns=t0, dur_ns=t1 - t0, metric="exposed_comm_ratio", value=round(ratio, 6), threshold=cfg.overlap_warning,
        lost_ns=int(np.mean(recoverable)),
        occurrences=[{"rank": r["rank"], "ts_ns": r["exposed_first_ns"],
                      "dur_ns": r["exposed_last_ns"] - r["exposed_first_ns"], "lost_ns": int(r["transfer_idle_ns"]),
                      "exposed_ns": int(r["exposed_ns"])}
                     for r in hit])
