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

from analyzers.frames import Frames

PARTS = ("compute", "communication", "copy")
#: Device op kind -> part (index into PARTS).
_PART_OF_KIND = {"kernel": 0, "collective": 1, "memcpy": 2, "memset": 2}
#: Idle time no gap of the bubble analyzer accounts for (short gaps, time outside its steps).
UNCLASSIFIED = "unclassified"
#: Host slices shown in evidence windows.
HOST_KINDS = ("api", "launch", "sync", "wait", "host_work", "data_load")


class _Cover:
    """Cumulative union length of a set of intervals: cover(t) = covered time in (-inf, t]."""

    def __init__(self, ts: np.ndarray, end: np.ndarray) -> None:
        if len(ts) == 0:
            self.starts = self.ends = self.before = np.zeros(0, dtype=np.int64)
            return
        order = np.argsort(ts, kind="stable")
        ts, end = ts[order].astype(np.int64), end[order].astype(np.int64)
        run_end = np.maximum.accumulate(end)
        new = np.ones(len(ts), dtype=bool)
        new[1:] = ts[1:] > run_end[:-1]
        self.starts = ts[new]
        self.ends = np.maximum.reduceat(run_end, np.flatnonzero(new))
        lengths = self.ends - self.starts
        self.before = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths

    def __call__(self, t: np.ndarray | int) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        if len(self.starts) == 0:
            return np.zeros(t.shape, dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        ok = i >= 0
        j = np.clip(i, 0, None)
        inside = np.clip(t - self.starts[j], 0, self.ends[j] - self.starts[j])
        return np.where(ok, self.before[j] + inside, 0)

    def between(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        return self(b) - self(a)


def step_breakdown(frames: Frames, bubbles: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per (rank, device, step): start_ns / end_ns / step_ns on the device, compute_ns,
    communication_ns, copy_ns, idle_ns (adding up to step_ns) and idle_by_cause {cause: ns}.

    Step windows: the bubble analyzer's (`bubbles["per_step"]` rows with step_start /
    step_end) when it publishes them; otherwise measured on the device: a device op belongs
    to the step in which it was launched, and a step runs from the end of the previous
    step's last op (its first op, for the first step) to the end of its own last op. Without
    steps, the device's whole span is one row with step None.

    Idle by cause, as far as `bubbles` allows: with a `gaps` table (rows with rank, device,
    ts, idle_ns, cause), each gap's device-idle time goes to its cause; with only a
    `per_cause` table (rank, device, step, cause, idle_ns) or per_step columns
    idle_<cause>_ns, a step's idle is split in the proportions they give (less, for copy and
    collective waits, the time copies and collectives ran);
    otherwise idle stays whole. Idle no gap explains is
    'unclassified'. Time a gap spent with copies or collectives running is copy or
    communication time here, not idle.
    """
    ops = frames.device_ops
    if ops.empty:
        return []
    bubbles = bubbles or {}
    kinds = ops["kind"].astype(str).to_numpy()
    part = np.array([_PART_OF_KIND.get(k, 0) for k in kinds], dtype=np.int8)
    step_of = _op_steps(frames, ops)
    published = _published_windows(bubbles.get("per_step"))
    gaps = _gap_table(bubbles.get("gaps"))
    per_cause = _per_cause_table(bubbles.get("per_cause")) or _per_cause_table(_wide_causes(bubbles.get("per_step")))
    rows: list[dict[str, Any]] = []
    ts_all, end_all = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    for (rank, device), idx in sorted(ops.groupby(["rank", "device"], sort=True).indices.items()):
        ts, end, p, st = ts_all[idx], end_all[idx], part[idx], step_of[idx]
        # covers[c]: union of the ops of part <= c (compute; + communication; + copy).
        covers = [_Cover(ts[p <= c], end[p <= c]) for c in range(len(PARTS))]
        windows = published.get((int(rank), int(device))) or _device_windows(ts, end, st)
        if not windows:
            continue
        steps = list(windows)
        w0 = np.array([windows[s][0] for s in steps], dtype=np.int64)
        w1 = np.array([windows[s][1] for s in steps], dtype=np.int64)
        upto = [c.between(w0, w1) for c in covers]
        busy = upto[-1]
        dev_gaps = gaps.get((int(rank), int(device))) if gaps is not None else None
        for k, step in enumerate(steps):
            step_ns = int(w1[k] - w0[k])
            row = {"rank": int(rank), "device": int(device), "step": step, "start_ns": int(w0[k]),
                   "end_ns": int(w1[k]), "step_ns": step_ns, "compute_ns": int(upto[0][k]),
                   "communication_ns": int(upto[1][k] - upto[0][k]), "copy_ns": int(upto[2][k] - upto[1][k]),
                   "idle_ns": int(step_ns - busy[k])}
            row["idle_by_cause"] = _idle_causes(row, dev_gaps, covers[-1], per_cause)
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


def _op_steps(frames: Frames, ops: pd.DataFrame) -> np.ndarray:
    """The host step each device op was launched in (by correlation id; by the op's own
    start when it has no launch); NaN outside every step."""
    out = np.full(len(ops), np.nan)
    steps = frames.steps
    if steps.empty:
        return out
    when = ops["ts"].to_numpy(np.float64).copy()
    launches = frames.launches
    if not launches.empty and ops["corr"].notna().any():
        la = launches[["rank", "corr", "ts"]].dropna().drop_duplicates(["rank", "corr"])
        key = ops[["rank", "corr"]].reset_index(drop=True)
        m = key.merge(la.rename(columns={"ts": "launch_ts"}), on=["rank", "corr"], how="left")
        launched = m["launch_ts"].to_numpy(np.float64)
        when = np.where(np.isnan(launched), when, launched)
    ranks = ops["rank"].to_numpy()
    for rank, s in steps.groupby("rank"):
        s = s.sort_values("ts")
        numbers = np.where(s["step"].notna(), s["step"].to_numpy(np.float64), np.arange(len(s), dtype=np.float64))
        s0, s1 = s["ts"].to_numpy(np.float64), s["end"].to_numpy(np.float64)
        mine = ranks == rank
        t = when[mine]
        i = np.searchsorted(s0, t, side="right") - 1
        j = np.clip(i, 0, None)
        inside = (i >= 0) & (t < s1[j])
        out[mine] = np.where(inside, numbers[j], np.nan)
    return out


def _device_windows(ts: np.ndarray, end: np.ndarray, step_of: np.ndarray) -> dict[Any, tuple[int, int]]:
    has = ~np.isnan(step_of)
    if not has.any():
        return {None: (int(ts.min()), int(end.max()))}
    out: dict[Any, tuple[int, int]] = {}
    prev_end = None
    for step in np.unique(step_of[has]):
        sel = step_of == step
        first, last = int(ts[sel].min()), int(end[sel].max())
        start = first if prev_end is None else prev_end
        stop = max(last, start)
        out[int(step)] = (start, stop)
        prev_end = stop
    return out


def _published_windows(per_step: Any) -> dict[tuple[int, int], dict[Any, tuple[int, int]]]:
    out: dict[tuple[int, int], dict[Any, tuple[int, int]]] = {}
    for r in per_step or []:
        if not isinstance(r, dict) or r.get("step_start") is None or r.get("step_end") is None:
            return {}
        step = r.get("step")
        step = None if step is None or (isinstance(step, float) and np.isnan(step)) else int(step)
        out.setdefault((int(r["rank"]), int(r["device"])), {})[step] = (int(r["step_start"]), int(r["step_end"]))
    return out


def _gap_table(gaps: Any) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The bubble analyzer's gaps as intervals with one cause each, per (rank, device); None
    when it publishes no gap rows. A gap split into a copy part and another cause keeps the
    other cause (its copy part is copy time here)."""
    if not isinstance(gaps, list) or not gaps or not isinstance(gaps[0], dict):
        return None
    df = pd.DataFrame(gaps)
    if not {"rank", "device", "ts", "idle_ns", "cause"} <= set(df.columns):
        return None
    df = df.dropna(subset=["ts", "idle_ns"])
    df["cause"] = df["cause"].astype(str)
    out = {}
    for (rank, device), g in df.groupby(["rank", "device"]):
        agg = g.groupby("ts").agg(idle=("idle_ns", "sum")).reset_index()
        if "end" in g.columns:
            agg = agg.merge(g.groupby("ts")["end"].max().reset_index(), on="ts")
            stop = agg["end"].fillna(agg["ts"] + agg["idle"]).to_numpy(np.int64)
        else:
            stop = (agg["ts"] + agg["idle"]).to_numpy(np.int64)
        g = g.assign(weight=np.where(g["cause"] == "copy", 0, 1) * 1e18 + g["idle_ns"])
        cause = g.sort_values("weight").groupby("ts")["cause"].last()
        out[(int(rank), int(device))] = (agg["ts"].to_numpy(np.int64), stop, cause.reindex(agg["ts"]).to_numpy())
    return out


def _per_cause_table(per_cause: Any) -> dict[tuple, dict[str, float]] | None:
    if not isinstance(per_cause, list) or not per_cause:
        return None
    out: dict[tuple, dict[str, float]] = {}
    for r in per_cause:
        if not isinstance(r, dict) or not {"rank", "device", "cause", "idle_ns"} <= set(r):
            return None
        step = r.get("step")
        step = None if step is None or (isinstance(step, float) and np.isnan(step)) else int(step)
        d = out.setdefault((int(r["rank"]), int(r["device"]), step), {})
        d[str(r["cause"])] = d.get(str(r["cause"]), 0.0) + float(r["idle_ns"] or 0)
    return out


def _wide_causes(per_step: Any) -> list[dict[str, Any]] | None:
    """per_step rows with one idle_<cause>_ns column per cause, as per_cause rows."""
    out = []
    for r in per_step or []:
        if not isinstance(r, dict):
            return None
        for key, ns in r.items():
            if key.startswith("idle_") and key.endswith("_ns") and key != "idle_ns" and ns:
                out.append({"rank": r.get("rank"), "device": r.get("device"), "step": r.get("step"),
                            "cause": key[len("idle_"):-len("_ns")], "idle_ns": ns})
    return out or None


def _idle_causes(row: dict[str, Any], gaps, cover: _Cover, per_cause) -> dict[str, int]:
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
    elif per_cause is not None:
        # The analyzer's idle is time without a compute kernel: its copy and collective waits
        # include the time copies and collectives ran, which is copy / communication time here.
        running = {"copy": row["copy_ns"], "collective": row["communication_ns"]}
        shares = {c: ns - running.get(c, 0)
                  for c, ns in per_cause.get((row["rank"], row["device"], row["step"]), {}).items()}
        shares = {c: ns for c, ns in shares.items() if ns > 0}
        total = sum(shares.values())
        if total:
            out = {c: int(idle * ns / total) for c, ns in shares.items()}
    else:
        return {}
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
    overlapping the highlighted window first, then the longest. None without any time."""
    window = _finding_window(finding, frames.span)
    if window is None:
        return None
    h0, h1, rank, source = window
    margin = max((h1 - h0) // 4, 50_000)
    s0, s1 = frames.span
    t0, t1 = max(h0 - margin, min(s0, h0)), min(h1 + margin, max(s1, h1))
    ops = frames.device_ops
    d = ops[(ops["ts"].to_numpy() < t1) & (ops["end"].to_numpy() > t0)
            & ((ops["rank"].to_numpy() == rank) if rank is not None else True)]
    host = host_slices(frames) if host is None else host
    h = host[(host["ts"].to_numpy() < t1) & (host["end"].to_numpy() > t0)
             & ((host["rank"].to_numpy() == rank) if rank is not None else True)]
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
    multi = (pd.concat([hh["rank"], dd["rank"]]).nunique() > 1) or dd["device"].nunique() > 1
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
            "source": source, "rank": rank, "lanes": host_lanes + dev_lanes, "events": events,
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


def _finding_window(f: dict[str, Any], span: tuple[int, int]) -> tuple[int, int, Any, str] | None:
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
