"""Where device time goes, as data for charts (no plotting here: reports and dashboards share it).

`step_breakdown`: per step and device, the step's time on the device split into compute,
communication, copy and idle, with idle split by what the device waited for -- a per-step
version of Holistic Trace Analysis' temporal breakdown. The four parts never overlap and add
up to the step time: where kinds overlap, compute wins over communication, which wins over
copy (communication hidden under compute counts as compute, as in HTA).

`evidence_windows`: for a finding, the device ops (one lane per stream) and host calls (one
lane per thread) around its time window, capped so that a report stays small on big traces.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd

from analyzers.bubbles import device_gaps, device_windows
from analyzers.frames import Cover, Frames

PARTS = ("compute", "communication", "copy")
#: Device op kind -> part (index into PARTS).
_PART_OF_KIND = {"kernel": 0, "collective": 1, "memcpy": 2, "memset": 2}
#: Idle time no gap of the bubble analyzer accounts for (short gaps, time outside its steps).
UNCLASSIFIED = "unclassified"
#: Host slices shown in evidence windows.
HOST_KINDS = ("api", "launch", "sync", "wait", "host_work", "data_load", "host_idle", "op_compile")


def step_breakdown(frames: Frames) -> list[dict[str, Any]]:
    """Per (rank, device, step): start_ns / end_ns / step_ns on the device, compute_ns,
    communication_ns, copy_ns, idle_ns (adding up to step_ns) and idle_by_cause {cause: ns}.

    The step windows and the idle causes are the bubble analyzer's (`device_windows`,
    `device_gaps`): steps measured on the device, each kernel-idle gap with what the device
    waited for. Time a gap spent with copies or collectives running is copy or communication
    time here, not idle; idle no gap explains is 'unclassified'.
    """
    ops = frames.device_ops
    if ops.empty:
        return []
    kinds = ops["kind"].astype(str).to_numpy()
    part = np.array([_PART_OF_KIND.get(k, 0) for k in kinds], dtype=np.int8)
    windows = device_windows(frames)
    gaps = _gap_table(device_gaps(frames))
    rows: list[dict[str, Any]] = []
    ts_all, end_all = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    for (rank, device), idx in sorted(ops.groupby(["rank", "device"], sort=True).indices.items()):
        ts, end, p = ts_all[idx], end_all[idx], part[idx]
        # covers[c]: union of the ops of part <= c (compute; + communication; + copy).
        covers = [Cover(ts[p <= c], end[p <= c]) for c in range(len(PARTS))]
        w = windows[(int(rank), int(device))]
        w0, w1 = w["start"].to_numpy(np.int64), w["end"].to_numpy(np.int64)
        upto = [c.between(w0, w1) for c in covers]
        busy = upto[-1]
        for k, step in enumerate(w["step"]):
            step_ns = int(w1[k] - w0[k])
            row = {"rank": int(rank), "device": int(device), "step": None if pd.isna(step) else int(step),
                   "start_ns": int(w0[k]), "end_ns": int(w1[k]), "step_ns": step_ns, "compute_ns": int(upto[0][k]),
                   "communication_ns": int(upto[1][k] - upto[0][k]), "copy_ns": int(upto[2][k] - upto[1][k]),
                   "idle_ns": int(step_ns - busy[k])}
            row["idle_by_cause"] = _idle_causes(row, gaps.get((int(rank), int(device))), covers[-1])
            rows.append(row)
    return rows


def idle_explained(rows: Iterable[dict[str, Any]]) -> float | None:
    """The share of the steps' idle time that has a cause (None when no cause is known)."""
    rows = list(rows)
    idle = sum(r["idle_ns"] for r in rows)
    causes = [r["idle_by_cause"] for r in rows if r["idle_by_cause"]]
    if not idle or not causes:
        return None
    explained = sum(ns for c in causes for cause, ns in c.items() if cause != UNCLASSIFIED)
    return explained / idle


def _gap_table(gaps: pd.DataFrame) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The bubble analyzer's gaps as intervals with one cause each, per (rank, device). A gap
    split into a copy part and another cause keeps the other cause (its copy part is copy
    time here)."""
    out: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if gaps.empty:
        return out
    gaps = gaps.assign(cause=gaps["cause"].astype(str))
    for (rank, device), g in gaps.groupby(["rank", "device"]):
        spans = g.groupby("ts")["end"].max()
        g = g.assign(weight=np.where(g["cause"] == "copy", 0, 1) * 1e18 + g["idle_ns"])
        cause = g.sort_values("weight").groupby("ts")["cause"].last()
        out[(int(rank), int(device))] = (spans.index.to_numpy(np.int64), spans.to_numpy(np.int64),
                                         cause.reindex(spans.index).to_numpy())
    return out


def _idle_causes(row: dict[str, Any], gaps, cover: Cover) -> dict[str, int]:
    idle = row["idle_ns"]
    if idle <= 0:
        return {}
    out: dict[str, int] = {}
    if gaps is not None:
        g0, g1, cause = gaps
        a, b = np.maximum(g0, row["start_ns"]), np.minimum(g1, row["end_ns"])
        sel = b > a
        if sel.any():
            free = (b[sel] - a[sel]) - cover.between(a[sel], b[sel])
            for c, ns in zip(cause[sel], free):
                if ns > 0:
                    out[str(c)] = out.get(str(c), 0) + int(ns)
        explained = sum(out.values())
        if explained > idle:  # overlapping gap rows: never more than the idle there is
            scale = idle / explained
            out = {c: int(ns * scale) for c, ns in out.items()}
    rest = idle - sum(out.values())
    if out and 0 < rest <= len(out):  # integer rounding of the shares
        top = max(out, key=out.get)
        out[top] += rest
        rest = 0
    if rest > 0:
        out[UNCLASSIFIED] = out.get(UNCLASSIFIED, 0) + rest
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def evidence_window(frames: Frames, finding: dict[str, Any], *, cap: int = 300,
                    host: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The events around a finding, for a small timeline: device ops per stream lane and host
    calls per thread lane in [start - margin, end + margin] of the highlighted window, which
    is the finding's own (ts_ns, dur_ns) when that is a short stretch of the trace, else its
    most telling evidence event, else its costliest occurrence. At most `cap` events: those
    overlapping the highlighted window first, then the longest. None without any time.

    In three parts, so a partitioned trace can gather the rows where they are
    (msprof_py.report_parts): `finding_bounds`, `evidence_rows` and `evidence_layout`."""
    bounds = finding_bounds(finding, frames.span)
    if bounds is None:
        return None
    h, d = evidence_rows(frames, bounds, host)
    return evidence_layout(h, d, bounds, cap=cap, multi_rank=frames.device_ops["rank"].nunique() > 1)


def finding_bounds(finding: dict[str, Any], span: tuple[int, int]) -> tuple | None:
    """A finding's timeline in a trace of `span`: (t0, t1, h0, h1, rank, source, ranks): the window
    shown, the highlighted one, the rank it came from, what it came from (`finding_window`) and
    the ranks shown (`finding_ranks`, all when empty). None without any time."""
    window = finding_window(finding, span)
    if window is None:
        return None
    h0, h1, rank, source = window
    margin = max((h1 - h0) // 4, 50_000)
    s0, s1 = span
    t0, t1 = max(h0 - margin, min(s0, h0)), min(h1 + margin, max(s1, h1))
    return t0, t1, h0, h1, rank, source, finding_ranks(finding, rank)


def evidence_rows(frames: Frames, bounds: tuple, host: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The host slices and device ops of `frames` in a timeline's window (`finding_bounds`)."""
    t0, t1, ranks = bounds[0], bounds[1], bounds[6]
    ops = frames.device_ops
    d = ops[(ops["ts"].to_numpy() < t1) & (ops["end"].to_numpy() > t0)
            & (np.isin(ops["rank"].to_numpy(), ranks) if ranks else True)]
    host = host_slices(frames) if host is None else host
    h = host[(host["ts"].to_numpy() < t1) & (host["end"].to_numpy() > t0)
             & (np.isin(host["rank"].to_numpy(), ranks) if ranks else True)]
    return h, d


def evidence_layout(h: pd.DataFrame, d: pd.DataFrame, bounds: tuple, *, cap: int = 300,
                    multi_rank: bool = False) -> dict[str, Any]:
    """A timeline from its window's rows (`evidence_rows`): at most `cap` events, in lanes that
    name their rank when the trace has several (`multi_rank`) or the events shown do."""
    t0, t1, h0, h1, rank, source, ranks = bounds
    is_dev = np.concatenate([np.zeros(len(h), bool), np.ones(len(d), bool)])
    ts = np.concatenate([h["ts"].to_numpy(np.int64), d["ts"].to_numpy(np.int64)])
    dur = np.concatenate([h["dur"].to_numpy(np.int64), d["dur"].to_numpy(np.int64)])
    total = len(ts)
    keep = np.arange(total)
    if total > cap:
        overlap = (ts < max(h1, h0 + 1)) & (ts + dur > h0)
        keep = np.lexsort((-dur, ~overlap))[:cap]
        keep = keep[np.argsort(ts[keep], kind="stable")]
    hk, dk = keep[~is_dev[keep]], keep[is_dev[keep]] - len(h)
    hh, dd = h.iloc[hk], d.iloc[dk]
    # Lanes name their rank whenever the trace has more than one (and their device when the
    # events shown span devices): a lane of a job's trace says where it is.
    multi = multi_rank or pd.concat([hh["rank"], dd["rank"]]).nunique() > 1 or dd["device"].nunique() > 1
    events = []
    for r in hh.itertuples(index=False):
        events.append({"lane": (f"r{r.rank} " if multi else "") + f"host {r.tid}", "name": str(r.name),
                       "ts": int(r.ts), "dur": int(r.dur), "cat": str(r.kind)})
    for r in dd.itertuples(index=False):
        events.append({"lane": (f"r{r.rank} d{r.device} " if multi else "") + f"stream {r.stream}",
                       "name": str(r.name), "ts": int(r.ts), "dur": int(r.dur),
                       "cat": PARTS[_PART_OF_KIND.get(str(r.kind), 0)]})
    host_lanes = sorted({e["lane"] for e in events if e["cat"] not in PARTS})
    dev_lanes = sorted({e["lane"] for e in events if e["cat"] in PARTS},
                       key=lambda x: [int(t) if t.isdigit() else t for t in x.replace("r", " ").replace("d", " ").split()])
    events.sort(key=lambda e: e["ts"])
    return {"start_ns": int(t0), "end_ns": int(t1), "highlight_start_ns": int(h0), "highlight_end_ns": int(h1),
            "source": source, "rank": rank, "ranks": ranks, "lanes": host_lanes + dev_lanes, "events": events,
            "dropped": int(total - len(keep))}


def host_slices(frames: Frames) -> pd.DataFrame:
    """Host slices (runtime calls, launches, syncs, waits, host work, data loading) with an end."""
    import pyarrow as pa

    t = frames.table
    mask = frames.kind_mask(HOST_KINDS)
    sub = t.select(["rank", "ph", "name", "ts", "dur", "tid", "kind"]).filter(pa.array(mask))
    df = sub.to_pandas()
    df = df[df["ph"].astype(str) == "X"].copy()
    df["dur"] = df["dur"].fillna(0).astype(np.int64)
    df["end"] = df["ts"] + df["dur"]
    return df.reset_index(drop=True)


#: At most this many ranks in a cross-rank finding's evidence timeline.
EVIDENCE_RANKS = 8


def finding_ranks(f: dict[str, Any], lead: Any = None, cap: int | None = EVIDENCE_RANKS) -> list[int]:
    """The ranks a finding involves, to show together: its (or its window's, `lead`) rank first,
    then the ranks its evidence and occurrences name, then the other ranks it lists (a
    straggler's waiting ranks, the other ranks of a problem found on several); at most `cap`.
    Empty when it names no rank (every rank is shown)."""
    out: list[int] = []
    for r in [lead, f.get("rank"), *[e.get("rank") for e in f.get("evidence") or [] if isinstance(e, dict)],
              *[o.get("rank") for o in f.get("occurrences") or [] if isinstance(o, dict)], *(f.get("ranks") or [])]:
        if r is not None and int(r) not in out:
            out.append(int(r))
    return out[:cap] if cap else out


def finding_window(f: dict[str, Any], span: tuple[int, int]) -> tuple[int, int, Any, str] | None:
    """Where on the timeline a finding (as a report dict) is best seen: (start_ns, end_ns, rank,
    what the window came from: 'finding', 'evidence' or 'occurrence'), or None if it has no time."""
    rank = f.get("rank")
    short = max((span[1] - span[0]) // 10, 1_000_000)
    if f.get("ts_ns") is not None and (f.get("dur_ns") or 0) <= short:
        return int(f["ts_ns"]), int(f["ts_ns"]) + int(f.get("dur_ns") or 0), rank, "finding"
    ev = [e for e in f.get("evidence") or [] if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]
    if ev:
        e = ev[0]
        return int(e["ts"]), int(e["ts"]) + int(e.get("dur") or 0), e.get("rank", rank), "evidence"
    occ = [o for o in f.get("occurrences") or [] if isinstance(o, dict) and o.get("ts_ns") is not None]
    if occ:
        o = max(occ, key=lambda o: (o.get("lost_ns") or 0, o.get("dur_ns") or 0))
        return int(o["ts_ns"]), int(o["ts_ns"]) + int(o.get("dur_ns") or 0), o.get("rank", rank), "occurrence"
    if f.get("ts_ns") is not None:
        return int(f["ts_ns"]), int(f["ts_ns"]) + int(f.get("dur_ns") or 0), rank, "finding"
    return None
