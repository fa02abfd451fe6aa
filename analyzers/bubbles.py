"""Pipeline bubbles: device idle time within steps, each gap classified by what it waited for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Cover, Frames, cover, intersect_intervals, merge_intervals, union_ns
from msprof_py.trace.units import ms, pct

CAUSES = {
    "host_launch": ("BUBBLE_HOST_LAUNCH", "host-bound launch"),
    "sync": ("BUBBLE_SYNC", "host synchronize"),
    "data": ("BUBBLE_DATA", "data loading / preprocessing"),
    "copy": ("BUBBLE_COPY", "waiting on a copy"),
    "event": ("BUBBLE_EVENT", "waiting on an event"),
    "collective": ("BUBBLE_COLLECTIVE", "waiting on a collective"),
    "other": ("BUBBLE_OTHER", "unexplained"),
}


@dataclass
class BubbleConfig:
    """Thresholds of the bubble analyzer (times in ns)."""

    #: Device-side gaps shorter than this are dispatch jitter, not bubbles (gaps waiting for
    #: the host count at any length).
    min_gap_ns: int = 1_000
    warning_ratio: float = 0.10  # msprof-analyze advisor: free time > 10% of the step
    critical_ratio: float = 0.30
    #: Cores starving while copies run is cheap to fix (overlap them), so it warns earlier.
    copy_warning_ratio: float = 0.05
    #: ... and at this share already when the cores waited through most of the copy time
    #: (copies serialised with compute, not a copy that overran once).
    copy_pattern_ratio: float = 0.01
    copy_exposed_share: float = 0.5
    producer_slack_ns: int = 5_000  # a producer "ends the gap" if it ends this close before it
    #: A sync call that returned this close to the moment the device went idle (or later) was
    #: waiting for the device to drain: the host could queue nothing behind it.
    sync_slack_ns: int = 1_000
    #: Host work covering this share of a late launch's wait makes the gap data loading.
    work_share: float = 0.5
    small_kernel_ns: int = 50_000  # seed 000: tasks under ~50 us are worth merging (LAUNCH_BOUND)
    evidence: int = 5


#: Causes that are not a problem of the steady state: the pipeline filling before the first
#: kernel and draining after the last one.
EDGE_CAUSES = ("fill", "drain")
#: Causes where the device waited for the host (a late launch).
HOST_CAUSES = ("host_launch", "launch", "sync", "data")
GAP_COLUMNS = ["rank", "device", "step", "step_start", "step_end", "ts", "end", "idle_ns", "cause", "next_name",
               "next_corr", "next_stream", "next_dur"]


@register("bubbles", BubbleConfig)
def analyze(frames: Frames, cfg: BubbleConfig):
    """Pipeline bubbles.

    Pattern: the AI Cores of a device run no kernel inside a step (copies and collectives may
    be moving data meanwhile), so the step takes longer than its compute.

    Algorithm: steps are measured on the device: a device op belongs to the step of the launch
    that created it (the `step` column), and step N's window on a device runs from where step
    N-1's device work ended to where step N's ends, so the windows tile the device's timeline
    however far the host ran ahead. Per (rank, device), the gaps of the kernels' union are
    classified by the kernel that ends each gap. If its launch call returned only after the
    gap began, the host was late: host work (data loading / preprocessing) covering most of
    the wait makes it data; a synchronize on the launching thread that returned as the device
    went idle (it waited for the device to drain, so nothing was queued behind it) makes it
    sync; otherwise it is launch overhead (small kernels: LAUNCH_BOUND, reported by the launch
    analyzer). If it had been launched in time, it waited on the device: for what ended just
    before on the device (a copy, a collective, or an event's producer). In gaps a sync
    caused (or a late launch with no host work), the time the device spent copying counts as
    waiting on a copy. Waiting on a
    collective is reported as information only (exposed communication; the slow rank, slow
    link and contention analyzers name what makes a collective slow). Idle before the
    first kernel and after the last one is pipeline fill and drain: measured, not a problem.
    Per cause, the idle time is the time lost; its share of the device's step time (all
    steps) sets the severity: warning from 10% (5% for copies, or 1% when the cores waited
    through at least half of the copy time: copies serialised with compute), critical from
    30%.
    """
    ops = frames.device_ops
    if not (ops["kind"].astype(str) == "kernel").any():
        raise Skipped("no device ops (kernels) in the trace")
    table = device_gaps(frames, cfg)
    windows = device_windows(frames)
    findings = _findings(table, windows, cfg, ops)
    per_step = step_breakdown(frames, cfg)
    causes = table.groupby("cause")["idle_ns"].sum().astype(int).to_dict() if len(table) else {}
    return findings, {"per_step": per_step.to_dict("records"), "gaps": int((~table["cause"].isin(EDGE_CAUSES)).sum()),
                      "idle_by_cause_ns": causes}


def device_windows(frames: Frames) -> dict[tuple[int, int], pd.DataFrame]:
    """Per (rank, device): the device-side step windows (step, start, end), tiling the device's
    timeline. Without steps, one window (step None) over the device's ops."""
    key = ("bubbles.windows",)
    if key in frames._cache:
        return frames._cache[key]
    ops = frames.device_ops
    out: dict[tuple[int, int], pd.DataFrame] = {}
    for (rank, device), g in ops.groupby(["rank", "device"], sort=True):
        stepped = g[g["step"].notna()] if "step" in g else g.iloc[:0]
        if stepped.empty:
            out[(int(rank), int(device))] = pd.DataFrame({"step": [None], "start": [int(g["ts"].min())],
                                                          "end": [int(g["end"].max())]})
            continue
        per = stepped.groupby("step").agg(first=("ts", "min"), last=("end", "max")).sort_index()
        bounds = np.maximum.accumulate(per["last"].to_numpy(np.int64))
        starts = np.concatenate([[int(per["first"].iloc[0])], bounds[:-1]])
        out[(int(rank), int(device))] = pd.DataFrame({"step": per.index.astype(np.int64), "start": starts,
                                                      "end": bounds})
    frames._cache[key] = out
    return out


def device_gaps(frames: Frames, cfg: BubbleConfig | None = None) -> pd.DataFrame:
    """Every kernel-idle gap on every device inside its step windows, split at window edges,
    with its cause (GAP_COLUMNS). Cached per frames: bubbles, launch and reports share it."""
    cfg = cfg or BubbleConfig()
    key = ("bubbles.gaps", cfg.min_gap_ns, cfg.producer_slack_ns, cfg.sync_slack_ns, cfg.work_share,
           cfg.small_kernel_ns)
    if key in frames._cache:
        return frames._cache[key]
    ops = frames.device_ops
    kernels = ops[ops["kind"].astype(str) == "kernel"]
    windows = device_windows(frames)
    parts = []
    for (rank, device), k in kernels.groupby(["rank", "device"], sort=True):
        w = windows[(int(rank), int(device))]
        g = _kernel_gaps(k.sort_values("ts", kind="stable"), int(w["start"].min()), int(w["end"].max()), 1)
        if len(g):
            parts.append(g.assign(rank=int(rank), device=int(device)))
    if not parts:
        table = pd.DataFrame(columns=GAP_COLUMNS)
    else:
        table = pd.concat(parts, ignore_index=True)
        inner = ~table["cause"].isin(EDGE_CAUSES)
        table["launched"] = np.nan
        if inner.any():
            cause, launched = _classify(table[inner].reset_index(drop=True), ops, frames, cfg)
            table.loc[inner, "cause"] = cause
            table.loc[inner, "launched"] = launched
        table = _device_side_tails(table, ops, cfg)
        # Short gaps the device itself leaves (dispatch latency between dependent tasks) are
        # jitter; short gaps waiting for the host are not: a launch-bound loop is made of them.
        host_caused = table["cause"].isin(HOST_CAUSES)
        table = table[host_caused | (table["idle_ns"] >= cfg.min_gap_ns)].reset_index(drop=True)
        table = _in_windows(table, windows)
        table = _split_copy_time(table, ops, frames)[GAP_COLUMNS]
    frames._cache[key] = table
    return table


def _kernel_gaps(k: pd.DataFrame, w0: int, w1: int, min_gap: int) -> pd.DataFrame:
    """Idle spans of one device's cores in [w0, w1): the fill before the first kernel, the gaps
    between kernels (each with the kernel that ends it), and the drain after the last."""
    ts, end = k["ts"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    run_end = np.maximum.accumulate(end)
    starts = np.concatenate([[w0], run_end])
    stops = np.concatenate([ts, [w1]])
    nxt = np.concatenate([np.arange(len(ts)), [-1]])
    lo, hi = np.maximum(starts, w0), np.minimum(stops, w1)
    cause = np.full(len(lo), "", dtype=object)
    cause[0] = "fill"
    cause[-1] = "drain"
    keep = (hi - lo) >= min_gap
    lo, hi, nxt, cause = lo[keep], hi[keep], nxt[keep], cause[keep]
    has = nxt >= 0
    pick = k.iloc[np.where(has, nxt, 0)]
    return pd.DataFrame({
        "ts": lo, "end": hi, "idle_ns": hi - lo, "cause": cause,
        "next_name": np.where(has, pick["name"].astype(str).to_numpy(), None),
        "next_corr": np.where(has, pick["corr"].to_numpy(dtype=np.float64), np.nan),
        "next_stream": np.where(has, pick["stream"].to_numpy(), -1),
        "next_dur": np.where(has, pick["dur"].to_numpy(np.int64), 0),
    })


def _in_windows(table: pd.DataFrame, windows: dict) -> pd.DataFrame:
    """Split each gap at the step-window edges of its device; each piece gets its step."""
    parts = []
    for (rank, device), g in table.groupby(["rank", "device"], sort=True):
        w = windows[(int(rank), int(device))]
        edges = w["end"].to_numpy(np.int64)
        first = np.searchsorted(edges, g["ts"].to_numpy(), side="right")
        last = np.searchsorted(edges, g["end"].to_numpy() - 1, side="right")
        first = np.minimum(first, len(w) - 1)
        last = np.minimum(last, len(w) - 1)
        reps = last - first + 1
        pieces = g.loc[g.index.repeat(reps)].copy()
        widx = np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]) if len(g) else np.zeros(0, int)
        pieces["step"] = w["step"].to_numpy()[widx]
        pieces["step_start"] = w["start"].to_numpy()[widx]
        pieces["step_end"] = w["end"].to_numpy()[widx]
        pieces["ts"] = np.maximum(pieces["ts"].to_numpy(), pieces["step_start"].to_numpy())
        pieces["end"] = np.minimum(pieces["end"].to_numpy(), pieces["step_end"].to_numpy())
        pieces["idle_ns"] = pieces["end"] - pieces["ts"]
        parts.append(pieces[pieces["idle_ns"] > 0])
    out = pd.concat(parts, ignore_index=True) if parts else table.iloc[:0]
    out["step"] = out["step"].astype(object)
    return out


def _split_copy_time(table: pd.DataFrame, ops: pd.DataFrame, frames: Frames) -> pd.DataFrame:
    """The part of a host-caused gap during which the cores waited for data is 'waiting on a
    copy' time (the serial copy-in / copy-out pattern)."""
    copies = ops[ops["kind"].astype(str).isin(["memcpy", "memset"])]
    if copies.empty or table.empty:
        return table
    host = frames.host_calls
    syncs = host[host["kind"].astype(str) == "sync"] if not host.empty else host
    table = table.copy()
    table["copy_ns"] = 0
    table["synced_copy_ns"] = 0
    for (rank, device), idx in table.groupby(["rank", "device"]).groups.items():
        c = copies[(copies["rank"] == rank) & (copies["device"] == device)]
        if c.empty:
            continue
        g = table.loc[idx]
        a, b = g["ts"].to_numpy(), g["end"].to_numpy()
        table.loc[idx, "copy_ns"] = cover(c).between(a, b).astype(np.int64)
        s = syncs[syncs["rank"] == rank] if len(syncs) else syncs
        if len(s):
            both = intersect_intervals(merge_intervals(c["ts"].to_numpy(), c["end"].to_numpy()),
                                       merge_intervals(s["ts"].to_numpy(), (s["ts"] + s["dur"].fillna(0)).to_numpy()))
            cover_both = Cover(*both)
            table.loc[idx, "synced_copy_ns"] = cover_both.between(a, b).astype(np.int64)
    # A sync that returned as the device went idle was draining copies: all the copy time in
    # its gap is the cores waiting for data. Where the host was busy (host work, per-op launch
    # overhead) only the copy time it spent blocked in a sync waiting for a copy is: a copy
    # running while the host computed was not what the cores waited for. Where they waited on
    # a collective or an event, a copy running meanwhile (a prefetch) is not either.
    moved = np.where(table["cause"].isin(["host_launch", "sync", "other"]), table["copy_ns"],
                     np.where(table["cause"].isin(["data", "launch"]), table["synced_copy_ns"], 0))
    moved = np.minimum(moved, table["idle_ns"].to_numpy())
    copy_part = table[moved > 0].copy()
    copy_part["idle_ns"] = moved[moved > 0]
    copy_part["cause"] = "copy"
    rest = table.copy()
    rest["idle_ns"] = rest["idle_ns"] - moved
    out = pd.concat([rest[rest["idle_ns"] > 0], copy_part], ignore_index=True)
    return out.sort_values(["rank", "device", "ts"], kind="stable").reset_index(drop=True)


def _classify(gaps: pd.DataFrame, ops: pd.DataFrame, frames: Frames, cfg: BubbleConfig) -> np.ndarray:
    """Why each gap ended when it did (vectorised over all gaps)."""
    cause = np.full(len(gaps), "other", dtype=object)
    launches = frames.launches.drop_duplicates(["rank", "corr"])[["rank", "corr", "ts", "dur", "pid", "tid"]].copy()
    # The op could not start before its launch call returned: compare the gap with that end.
    launches["launch_ts"] = launches["ts"] + launches["dur"].fillna(0)
    launches = launches.rename(columns={"ts": "call_ts"}).drop(columns=["dur"])
    m = gaps[["rank", "next_corr"]].merge(launches.rename(columns={"corr": "next_corr"}),
                                          on=["rank", "next_corr"], how="left")
    launch_ts = m["launch_ts"].to_numpy(dtype=np.float64)
    call_ts = m["call_ts"].to_numpy(dtype=np.float64)
    g_ts = gaps["ts"].to_numpy(dtype=np.float64)
    late = ~np.isnan(launch_ts) & (launch_ts >= g_ts)
    # Host late: what the launching thread did between the device going idle and the launch.
    host = _host_cover(frames)
    syncs = _sync_ends(frames)
    work = np.zeros(len(gaps))
    synced = np.zeros(len(gaps), dtype=bool)
    for key, (_cover_sync, cover_work) in host.items():
        rank, pid, tid = key
        sel = late & (gaps["rank"].to_numpy() == rank) & (m["pid"].to_numpy() == pid) & (m["tid"].to_numpy() == tid)
        if not sel.any():
            continue
        a, b = g_ts[sel], launch_ts[sel]
        work[sel] = cover_work(b) - cover_work(a)
        ends = syncs.get(key)
        if ends is not None and len(ends):
            # The thread's last sync that returned before this launch call began.
            i = np.searchsorted(ends, call_ts[sel], side="right") - 1
            last_end = np.where(i >= 0, ends[np.maximum(i, 0)], -np.inf)
            synced[sel] = last_end >= a - cfg.sync_slack_ns
    span = np.maximum(launch_ts - g_ts, 1)
    small = gaps["next_dur"].to_numpy() < cfg.small_kernel_ns
    cause[late] = np.where(small[late], "launch", "host_launch")
    cause[late & synced] = "sync"
    # Host work decides only when it is more than per-op framework dispatch: a small kernel
    # whose launch followed a few us of op dispatch (aten::select, ...) is launch overhead.
    dispatch = small & (work < cfg.small_kernel_ns)
    cause[late & (work >= cfg.work_share * span) & ~dispatch] = "data"
    # Launched in time: the device held it, for whatever ended on the device just before.
    rest = ~late & gaps["next_corr"].notna().to_numpy()
    if rest.any():
        cause[rest] = _producer_kind(gaps[rest], ops, cfg)
    return cause, np.where(late, launch_ts, np.nan)


def _device_side_tails(table: pd.DataFrame, ops: pd.DataFrame, cfg: BubbleConfig) -> pd.DataFrame:
    """Split a host-caused gap where the late kernel's launch returned: before, the device waited
    for the host (the gap's cause); after, the kernel was queued and waited on the device, for
    whatever ended just before it started (a copy on its stream, an event's producer...)."""
    late = table["launched"].notna() & (table["launched"] < table["end"]) & (table["launched"] > table["ts"])
    if not late.any():
        return table.drop(columns="launched")
    tail = table[late].copy()
    tail["ts"] = tail["launched"].astype(np.int64)
    tail["idle_ns"] = tail["end"] - tail["ts"]
    tail["cause"] = _producer_kind(tail.reset_index(drop=True), ops, cfg)
    # Waiting on nothing in particular after the launch is dispatch latency: it stays with the
    # host-side cause that made the launch late.
    keep = tail["cause"].isin(["copy", "collective"]).to_numpy()
    head = table.copy()
    cut = late.copy()
    cut[late] = keep
    head.loc[cut, "end"] = head.loc[cut, "launched"].astype(np.int64)
    head["idle_ns"] = head["end"] - head["ts"]
    out = pd.concat([head, tail[keep]], ignore_index=True).drop(columns="launched")
    return out.sort_values(["rank", "device", "ts"], kind="stable").reset_index(drop=True)


def _sync_ends(frames: Frames) -> dict:
    """Per host thread (rank, pid, tid): the sorted end times of its sync calls."""
    host = frames.host_calls
    out = {}
    if host.empty:
        return out
    sync = host[host["kind"].astype(str) == "sync"]
    for key, g in sync.groupby(["rank", "pid", "tid"]):
        out[key] = np.sort((g["ts"] + g["dur"].fillna(0)).to_numpy(np.float64))
    return out


def _producer_kind(gaps: pd.DataFrame, ops: pd.DataFrame, cfg: BubbleConfig) -> np.ndarray:
    out = np.full(len(gaps), "event", dtype=object)
    for (rank, device), idx in gaps.groupby(["rank", "device"]).groups.items():
        d = ops[(ops["rank"] == rank) & (ops["device"] == device)].sort_values("end", kind="stable")
        ends = d["end"].to_numpy()
        kinds = d["kind"].astype(str).to_numpy()
        g_end = gaps.loc[idx, "end"].to_numpy()
        k = np.searchsorted(ends, g_end, side="right") - 1
        ok = (k >= 0) & (g_end - ends[np.maximum(k, 0)] <= cfg.producer_slack_ns)
        kind = np.where(ok, kinds[np.maximum(k, 0)], "")
        pos = gaps.index.get_indexer(idx)
        out[pos] = np.select([np.isin(kind, ("memcpy", "memset")), kind == "collective"], ["copy", "collective"],
                             default="event")
    return out


#: Causes the bubble analyzer reports (launch overhead before small kernels is LAUNCH_BOUND's).
REPORTED = tuple(CAUSES)


def _copy_exposure(ops: pd.DataFrame, rank: int, device: int, lost: int) -> float:
    """Share of the device's copy time, between its first kernel's start and its last kernel's
    end, during which no kernel ran (`lost`, the copy-caused idle, over that copy time)."""
    d = ops[(ops["rank"] == rank) & (ops["device"] == device)]
    kinds = d["kind"].astype(str)
    k = d[kinds == "kernel"]
    if k.empty:
        return 0.0
    lo, hi = int(k["ts"].min()), int(k["end"].max())
    c = d[kinds.isin(["memcpy", "memset"]) & (d["end"] > lo) & (d["ts"] < hi)]
    total = union_ns(c["ts"].clip(lower=lo).to_numpy(), c["end"].clip(upper=hi).to_numpy())
    return min(lost / total, 1.0) if total else 0.0


def _findings(table: pd.DataFrame, windows: dict, cfg: BubbleConfig, ops: pd.DataFrame) -> list[Finding]:
    out = []
    if table.empty:
        return out
    for (rank, device, cause), g in table.groupby(["rank", "device", "cause"]):
        if cause not in REPORTED:
            continue
        w = windows[(int(rank), int(device))]
        total = int((w["end"] - w["start"]).sum()) or 1
        lost = int(g["idle_ns"].sum())
        ratio = lost / total
        warn = cfg.copy_warning_ratio if cause == "copy" else cfg.warning_ratio
        sev = (Severity.CRITICAL if ratio >= cfg.critical_ratio else
               Severity.WARNING if ratio >= warn else Severity.INFO)
        note = ""
        if cause == "copy" and sev == Severity.INFO and ratio >= cfg.copy_pattern_ratio:
            # Copies serialised with compute (the cores wait through most of the copy time) is
            # the pattern itself, whatever the copies weigh: a warning once it costs 1%.
            exposed = _copy_exposure(ops, int(rank), int(device), lost)
            if exposed >= cfg.copy_exposed_share:
                sev, warn = Severity.WARNING, cfg.copy_pattern_ratio
                note = f"; the cores waited through {pct(exposed)} of the copy time: copies serialised with compute"
        if cause == "collective":
            # Cores idle while a collective runs is exposed communication: a measurement (the
            # step breakdown's communication share), not a diagnosis. What makes collectives
            # slow is reported with its cause by the ranks, links and bandwidth analyzers.
            sev = Severity.INFO
        code, label = CAUSES[cause]
        top = g.sort_values("idle_ns", ascending=False).head(cfg.evidence)
        streams = g.loc[g["next_stream"] >= 0, "next_stream"].unique()
        stream = int(streams[0]) if len(streams) == 1 else None  # the stream whose kernels waited
        out.append(Finding(
            code=code, severity=sev, title=f"Device idle: {label}",
            message=(f"rank {rank} device {device}: {ms(lost)} idle ({pct(ratio)} of device step time) "
                     f"in {len(g)} gaps {label}{note}"),
            rank=int(rank), device=int(device), stream=stream, ts_ns=int(g["ts"].min()),
            dur_ns=int(g["end"].max() - g["ts"].min()), metric="idle_share", value=round(ratio, 6), threshold=warn, lost_ns=lost,
            evidence=[{"ts": int(r.ts), "dur": int(r.idle_ns), "next": r.next_name, "corr": _int(r.next_corr),
                       "stream": int(r.next_stream), "step": _int(r.step)} for r in top.itertuples()],
            occurrences=occurrences(g, rank=int(rank), device=int(device), stream=stream)))
    return out


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


ALL_CAUSES = (*CAUSES, "launch", *EDGE_CAUSES)


def step_breakdown(frames: Frames, cfg: BubbleConfig | None = None) -> pd.DataFrame:
    """Per device step window: compute time (kernels) and idle time by cause, adding up to the
    window (rank, device, step, step_start, step_end, step_ns, compute_ns, idle_ns,
    bubble_ratio, idle_<cause>_ns for each cause)."""
    gaps = device_gaps(frames, cfg)
    rows = []
    for (rank, device), w in device_windows(frames).items():
        mine = gaps[(gaps["rank"] == rank) & (gaps["device"] == device)] if len(gaps) else gaps
        for step, start, end in zip(w["step"], w["start"], w["end"]):
            g = mine[mine["step_start"] == start] if len(mine) else mine
            by = g.groupby("cause")["idle_ns"].sum() if len(g) else pd.Series(dtype=np.int64)
            idle = int(by.sum())
            step_ns = int(end - start)
            row = {"rank": rank, "device": device, "step": _int(step), "step_start": int(start), "step_end": int(end),
                   "step_ns": step_ns, "compute_ns": step_ns - idle, "idle_ns": idle,
                   "bubble_ratio": round(idle / step_ns, 6) if step_ns else 0.0}
            row.update({f"idle_{c}_ns": int(by.get(c, 0)) for c in ALL_CAUSES})
            rows.append(row)
    cols = ["rank", "device", "step", "step_start", "step_end", "step_ns", "compute_ns", "idle_ns", "bubble_ratio",
            *[f"idle_{c}_ns" for c in ALL_CAUSES]]
    return pd.DataFrame(rows, columns=cols)


def _host_cover(frames: Frames) -> dict:
    """Per host thread (rank, pid, tid): functions t -> time covered up to t by its sync calls,
    and by its host work (kinds host_work and data_load: preprocessing, data loading...)."""
    calls, work = frames.host_calls, frames.host_work
    keys = ["rank", "pid", "tid"]
    syncs = dict(iter(calls[calls["kind"].astype(str) == "sync"].groupby(keys))) if not calls.empty else {}
    works = dict(iter(work.groupby(keys))) if not work.empty else {}
    none = pd.DataFrame()
    return {key: (cover(syncs.get(key, none)), cover(works.get(key, none)))
            for key in sorted(set(syncs) | set(works))}


def _int(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else int(v)
