"""Pipeline bubbles: device idle time within steps, each gap classified by what it waited for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames

#: Host slices that are data loading / pre- or postprocessing (besides the emulator's host_work).
DATA_NAMES = r"dataloader|data_load|preprocess|postprocess|decode|resize|letterbox|\bnms\b"
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

    min_gap_ns: int = 1_000  # gaps shorter than this are dispatch jitter, not bubbles
    warning_ratio: float = 0.10  # msprof-analyze advisor: free time > 10% of the step
    critical_ratio: float = 0.30
    #: Cores starving while copies run is cheap to fix (overlap them), so it warns earlier.
    copy_warning_ratio: float = 0.05
    producer_slack_ns: int = 5_000  # a producer "ends the gap" if it ends this close before it
    evidence: int = 5


@register("bubbles", BubbleConfig)
def analyze(frames: Frames, cfg: BubbleConfig):
    """Pipeline bubbles.

    Pattern: the AI Cores of a device run no kernel inside a step (copies and collectives may
    be moving data meanwhile), so the step takes longer than its compute.

    Algorithm: per (rank, device), merge the kernels' intervals and take the gaps between
    them, clipped to each step (`ProfilerStep#N` on the host; the whole trace when there are
    none). The kernel that ends a gap says why: if its launch call returned only after the
    gap began, the host was late -- then what the launching thread did during the gap decides
    between a host synchronize, host work (data loading / preprocessing) and launch overhead;
    if it had been launched in time, it waited on the device -- for what ended just before on
    the device (a copy, a collective, or an event's producer). Per cause, the idle time summed
    over steps is the time lost; its share of step time sets the severity. In gaps the host
    caused, time during which the device was copying counts as waiting on a copy.
    With three or more steps the first (pipeline fill, warm-up) is left out of the verdict.
    """
    ops = frames.device_ops
    compute = ops[ops["kind"].astype(str) == "kernel"]
    if compute.empty:
        raise Skipped("no device ops (kernels) in the trace")
    windows = _step_windows(frames)
    parts = []
    for (rank, device), dev_ops in compute.groupby(["rank", "device"], sort=True):
        dev_ops = dev_ops.sort_values("ts", kind="stable").reset_index(drop=True)
        ts = dev_ops["ts"].to_numpy()
        run_end = np.maximum.accumulate(dev_ops["end"].to_numpy())
        for step, (w0, w1) in windows.get(rank, {None: frames.span}).items():
            # Only the kernels that can touch this window (ends are cumulative maxima, sorted).
            lo, hi = np.searchsorted(run_end, w0, side="right"), np.searchsorted(ts, w1, side="left")
            g = _gaps(dev_ops.iloc[lo:hi], w0, w1, cfg.min_gap_ns)
            if len(g):
                parts.append(g.assign(rank=rank, device=device, step=step, step_start=w0, step_end=w1))
    cols = ["rank", "device", "step", "step_start", "step_end", "ts", "idle_ns", "cause", "next_name", "next_corr",
            "next_stream"]
    if not parts:
        table = pd.DataFrame(columns=cols)
    else:
        table = pd.concat(parts, ignore_index=True)
        table["cause"] = _classify(table, ops, frames, cfg)
        table = _split_copy_time(table, ops)[cols]
    steady = _drop_warmup(table, windows)
    findings = _findings(steady, windows, frames, cfg)
    per_step = _per_step(table, windows, ops)
    return findings, {"per_step": per_step.to_dict("records"), "gaps": len(table)}


def _drop_warmup(table: pd.DataFrame, windows: dict) -> pd.DataFrame:
    """Leave the first step out of the verdict when there are three or more: it fills the
    pipeline (first copies, caches, compilation) and is not what the job does in steady state."""
    keep = np.ones(len(table), dtype=bool)
    for rank, steps in windows.items():
        numbered = sorted(k for k in steps if k is not None)
        if len(numbered) >= 3:
            keep &= ~((table["rank"] == rank) & (table["step"] == numbered[0])).to_numpy()
    return table[keep]


def _split_copy_time(table: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """The part of a host-caused gap during which the device was copying is 'waiting on a
    copy' time: the cores starved while data moved."""
    copies = ops[ops["kind"].astype(str).isin(["memcpy", "memset"])]
    if copies.empty:
        return table
    table = table.copy()
    table["copy_ns"] = 0
    for (rank, device), idx in table.groupby(["rank", "device"]).groups.items():
        c = copies[(copies["rank"] == rank) & (copies["device"] == device)]
        if c.empty:
            continue
        cover = _cover(c)
        g = table.loc[idx]
        table.loc[idx, "copy_ns"] = (cover(g["end"].to_numpy()) - cover(g["ts"].to_numpy())).astype(np.int64)
    # Gaps the host caused (late launches, syncs, host work) lose their copy time to "copy":
    # the cores waited for the data. Where they waited on a collective or an event, a copy
    # running meanwhile (a prefetch) was not what they waited for.
    splittable = (table["copy_ns"] > 0) & table["cause"].isin(["host_launch", "sync", "data", "other"])
    copy_part = table[splittable].copy()
    copy_part["idle_ns"] = copy_part["copy_ns"]
    copy_part["cause"] = "copy"
    rest = table.copy()
    moved = splittable
    rest.loc[moved, "idle_ns"] = rest.loc[moved, "idle_ns"] - rest.loc[moved, "copy_ns"]
    out = pd.concat([rest[rest["idle_ns"] > 0], copy_part], ignore_index=True)
    return out.sort_values(["rank", "device", "ts"], kind="stable").reset_index(drop=True)


def _step_windows(frames: Frames) -> dict[int, dict]:
    steps = frames.steps
    out: dict[int, dict] = {}
    for row in steps.itertuples(index=False):
        out.setdefault(int(row.rank), {})[int(row.step) if pd.notna(row.step) else None] = (int(row.ts), int(row.end))
    return out


def _gaps(dev_ops: pd.DataFrame, w0: int, w1: int, min_gap: int) -> pd.DataFrame:
    """Idle spans of one device inside [w0, w1): before the first op, between ops, after the last."""
    ts, end = dev_ops["ts"].to_numpy(), dev_ops["end"].to_numpy()
    run_end = np.maximum.accumulate(end) if len(end) else end
    starts = np.concatenate([[w0], run_end])
    stops = np.concatenate([ts, [w1]])
    nxt = np.concatenate([np.arange(len(ts)), [-1]])
    lo, hi = np.maximum(starts, w0), np.minimum(stops, w1)
    keep = (hi - lo) >= min_gap
    lo, hi, nxt = lo[keep], hi[keep], nxt[keep]
    has = nxt >= 0
    if not len(dev_ops):  # no kernel touches the window: one gap, ended by nothing
        pick = pd.DataFrame({"name": [None] * len(lo), "corr": np.nan, "stream": -1, "kind": ""})
        has = np.zeros(len(lo), dtype=bool)
    else:
        pick = dev_ops.iloc[np.where(has, nxt, 0)]
    return pd.DataFrame({
        "ts": lo.astype(np.int64), "end": hi.astype(np.int64), "idle_ns": (hi - lo).astype(np.int64),
        "next_name": np.where(has, pick["name"].astype(str).to_numpy(), None),
        "next_corr": np.where(has, pick["corr"].to_numpy(dtype=np.float64), np.nan),
        "next_stream": np.where(has, pick["stream"].to_numpy(), -1),
        "next_kind": np.where(has, pick["kind"].astype(str).to_numpy(), ""),
    })


def _classify(gaps: pd.DataFrame, ops: pd.DataFrame, frames: Frames, cfg: BubbleConfig) -> np.ndarray:
    """Why each gap ended when it did (vectorised over all gaps)."""
    cause = np.full(len(gaps), "other", dtype=object)
    launches = frames.launches.drop_duplicates(["rank", "corr"])[["rank", "corr", "ts", "dur", "pid", "tid"]].copy()
    # The op could not start before its launch call returned: compare the gap with that end.
    launches["launch_ts"] = launches["ts"] + launches["dur"].fillna(0)
    m = gaps[["rank", "next_corr"]].merge(launches.drop(columns=["ts", "dur"]).rename(columns={"corr": "next_corr"}),
                                           on=["rank", "next_corr"], how="left")
    launch_ts = m["launch_ts"].to_numpy(dtype=np.float64)
    has_launch = ~np.isnan(launch_ts)
    late = has_launch & (launch_ts >= gaps["ts"].to_numpy())
    # Host late: what the launching thread did between the device going idle and the launch.
    host = _host_cover(frames)
    sync = np.zeros(len(gaps))
    work = np.zeros(len(gaps))
    for key, (cover_sync, cover_work) in host.items():
        rank, pid, tid = key
        sel = late & (gaps["rank"].to_numpy() == rank) & (m["pid"].to_numpy() == pid) & (m["tid"].to_numpy() == tid)
        if sel.any():
            a, b = gaps["ts"].to_numpy()[sel], launch_ts[sel]
            sync[sel] = cover_sync(b) - cover_sync(a)
            work[sel] = cover_work(b) - cover_work(a)
    span = np.maximum(launch_ts - gaps["ts"].to_numpy(), 1)
    cause[late] = "host_launch"
    cause[late & (work >= 0.3 * span) & (work > sync)] = "data"
    cause[late & (sync >= 0.3 * span) & (sync >= work)] = "sync"
    # Launched in time: the device held it. A collective waits for its peers; otherwise the
    # producer is whatever ended on another stream just before the gap ended.
    kinds = gaps["next_kind"].to_numpy()
    cause[~late & (kinds == "collective")] = "collective"
    rest = ~late & (kinds != "collective") & (gaps["next_corr"].notna().to_numpy())
    if rest.any():
        cause[rest] = _producer_kind(gaps[rest], ops, cfg)
    # A gap no kernel ends (the tail of a step): judge it by what the rank's host threads did.
    tail = gaps["next_corr"].isna().to_numpy() & ~late
    if tail.any():
        a, b = gaps["ts"].to_numpy()[tail], gaps["end"].to_numpy()[tail]
        ranks = gaps["rank"].to_numpy()[tail]
        t_sync, t_work = np.zeros(tail.sum()), np.zeros(tail.sum())
        for (rank, _pid, _tid), (cover_sync, cover_work) in host.items():
            mine = ranks == rank
            if mine.any():
                t_sync[mine] = np.maximum(t_sync[mine], cover_sync(b[mine]) - cover_sync(a[mine]))
                t_work[mine] = np.maximum(t_work[mine], cover_work(b[mine]) - cover_work(a[mine]))
        span_t = np.maximum(b - a, 1)
        tail_cause = np.full(tail.sum(), "other", dtype=object)
        tail_cause[(t_work >= 0.3 * span_t) & (t_work > t_sync)] = "data"
        tail_cause[(t_sync >= 0.3 * span_t) & (t_sync >= t_work)] = "sync"
        cause[tail] = tail_cause
    return cause


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


def _host_cover(frames: Frames) -> dict:
    """Per host thread: functions t -> time covered by sync calls / by host work up to t."""
    host = frames.host_calls
    out = {}
    if host.empty:
        return out
    kind = host["kind"].astype(str)
    names = host["name"].astype(str)
    is_sync = kind == "sync"
    is_work = (host["cat"].astype(str) == "host_work") | names.str.contains(DATA_NAMES, case=False, regex=True)
    for key, g in host.groupby(["rank", "pid", "tid"]):
        out[key] = (_cover(g[is_sync.loc[g.index]]), _cover(g[is_work.loc[g.index]]))
    return out


def _cover(rows: pd.DataFrame):
    """t -> length of the union of the rows' intervals that lies before t."""
    if rows.empty:
        return lambda t: np.zeros(len(t))
    ts = rows["ts"].to_numpy(dtype=np.int64)
    end = ts + rows["dur"].fillna(0).to_numpy(dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    run_end = np.maximum.accumulate(end)
    new = np.concatenate([[True], ts[1:] > run_end[:-1]])
    starts = ts[new]
    stops = np.maximum.reduceat(end, np.flatnonzero(new))
    before = np.concatenate([[0], np.cumsum(stops - starts)])

    def covered(t):
        t = np.asarray(t, dtype=np.float64)
        i = np.searchsorted(starts, t, side="right") - 1
        inside = np.where(i >= 0, np.minimum(t, stops[np.maximum(i, 0)]) - starts[np.maximum(i, 0)], 0)
        return np.where(i >= 0, before[np.maximum(i, 0)] + np.maximum(inside, 0), 0)

    return covered


def _findings(table: pd.DataFrame, windows: dict, frames: Frames, cfg: BubbleConfig) -> list[Finding]:
    out = []
    if table.empty:
        return out
    step_time = {}
    for (rank, device), g in table.groupby(["rank", "device"]):
        steps = g[["step", "step_start", "step_end"]].drop_duplicates()
        step_time[(rank, device)] = int((steps["step_end"] - steps["step_start"]).sum())
    for (rank, device, cause), g in table.groupby(["rank", "device", "cause"]):
        total = step_time[(rank, device)] or 1
        lost = int(g["idle_ns"].sum())
        ratio = lost / total
        warn = cfg.copy_warning_ratio if cause == "copy" else cfg.warning_ratio
        sev = (Severity.CRITICAL if ratio >= cfg.critical_ratio else
               Severity.WARNING if ratio >= warn else Severity.INFO)
        code, label = CAUSES[cause]
        top = g.sort_values("idle_ns", ascending=False).head(cfg.evidence)
        out.append(Finding(
            code=code, severity=sev, title=f"Device idle: {label}",
            message=(f"rank {rank} device {device}: {lost / 1e6:.3f} ms idle ({ratio:.1%} of step time) "
                     f"in {len(g)} gaps {label}"),
            rank=int(rank), device=int(device), ts_ns=int(g["ts"].min()), dur_ns=int((g["ts"] + g["idle_ns"]).max() - g["ts"].min()),
            metric="bubble_ratio", value=round(ratio, 6), threshold=cfg.warning_ratio, lost_ns=lost,
            evidence=[{"ts": int(r.ts), "dur": int(r.idle_ns), "next": r.next_name, "corr": _int(r.next_corr),
                       "stream": r.next_stream, "step": _int(r.step)} for r in top.itertuples()]))
    return out


def _per_step(table: pd.DataFrame, windows: dict, ops: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return pd.DataFrame(columns=["rank", "device", "step", "step_ns", "idle_ns", "bubble_ratio"])
    g = table.groupby(["rank", "device", "step", "step_start", "step_end"], dropna=False)["idle_ns"].sum().reset_index()
    g["step_ns"] = g["step_end"] - g["step_start"]
    g["bubble_ratio"] = g["idle_ns"] / g["step_ns"].clip(lower=1)
    return g[["rank", "device", "step", "step_ns", "idle_ns", "bubble_ratio"]]


def _int(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else int(v)
