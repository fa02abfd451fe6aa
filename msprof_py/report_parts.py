"""The report of a trace analyzed partition by partition (`report --engine dask`), without the
whole trace on the driver.

Every figure of the report that belongs to one rank comes from the partition that holds the rank,
computed where the analyzers ran (`piece`, in the same task, on the same frames): its share of
the summary (devices, streams, copies, idle by cause, memory, events, span), its rows of the
step breakdown, its steps and its rows of the cluster step table, and the events the importer
kept only as generic rows. The driver reduces those small pieces (`reduce`) to exactly what
`report.build` computes over the whole trace. The evidence timelines are a second pass: each
partition returns the rows it holds in the top findings' windows (`evidence_rows`), the driver
lays them out.

What needs every rank's events at once, the job's critical path and the fixes' replay, runs on
the driver over at most `DRIVER_ROWS` rows: the whole trace when it has no more (then the report
is the one `report` writes without an engine), else the consecutive job steps around the median
steps in the middle of the run that fit; the fixes' savings are then the window's, scaled by the
run's job-step time over the window's, and each `what_if` names the steps it was replayed on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analyzers import AnalysisResult, Frames
from msprof_py import critical, summaries
from msprof_py.breakdown import evidence_layout, evidence_rows, finding_bounds, host_slices, step_breakdown
from msprof_py.summary import MEMORY_COUNTERS, merge_unmapped, unmapped
from msprof_py.trace import Trace

#: The most rows the driver reads at once for the job's critical path and the fixes' replay.
DRIVER_ROWS = 2_000_000
#: The counters `analyzers.overview` reads device memory from, by preference.
OVERVIEW_COUNTERS = ("Device memory used", "Device memory allocated")


def piece(frames: Frames) -> dict[str, Any]:
    """One partition's share of the report (see the module docstring)."""
    from analyzers.bubbles import step_breakdown as idle_breakdown
    from analyzers.overview import overview
    from msprof_py.report import copy_rows

    ov = overview(frames)
    ops = frames.device_ops
    idle = {}
    step_total = 0
    if len(ops) and (ops["kind"].astype(str) == "kernel").any():
        b = idle_breakdown(frames)
        if len(b):
            step_total = int(b["step_ns"].sum())
            idle = {c: int(b[c].sum()) for c in b.columns if c.startswith("idle_") and c.endswith("_ns")
                    and c != "idle_ns"}
    ranks = summaries.rank_steps(frames.steps)
    real = frames.table.num_rows and (frames.kind_mask(("meta",)).sum() < frames.table.num_rows)
    return {
        "span": frames.span if real else None,
        "events": int(frames.table.num_rows),
        "device_ranks": sorted({int(r) for r in ops["rank"].unique()}) if len(ops) else [],
        "devices": ov["devices"], "streams": ov["streams"], "copies": ov["copies"],
        "idle": idle, "step_ns": step_total,
        "peak": _peak_part(frames),
        "copy_rows": copy_rows(frames),
        "breakdown": step_breakdown(frames),
        "rank_steps": ranks,
        "step_table": summaries.step_table(ranks, ops),
        "unmapped": unmapped(frames.trace.table, frames.trace.meta.source_format),
    }


def _peak_part(frames: Frames) -> dict[str, Any]:
    """What the memory peaks of the report need of one partition: each memory counter's largest
    value, the allocator totals' largest, and the running sum of its allocations (its final value
    and its peak, in rank and time order)."""
    c = frames.counters
    counters = {}
    if len(c):
        names = c["name"].astype(str)
        for name in {*OVERVIEW_COUNTERS, *(n for n, _ in MEMORY_COUNTERS)}:
            values = c.loc[names == name, "value"].dropna()
            if len(values):
                counters[name] = float(values.max())
    mem = frames.memory
    value_max, cum = None, None
    if len(mem):
        if mem["value"].notna().any():
            value_max = float(mem["value"].max())
        delta = np.where(mem["kind"].astype(str) == "alloc", mem["bytes"], -mem["bytes"]).astype(np.int64)
        run = np.cumsum(delta)
        cum = (int(run[-1]), int(run.max()))
    return {"counters": counters, "value_max": value_max, "cum": cum}


def _peak(parts: list[dict[str, Any]], counters: tuple[tuple[str, float], ...]) -> int | None:
    """The peak over partitions in rank order, by the first of `counters` (name, scale) any of them
    has, else the allocator totals, else the running sum of allocations across them."""
    for name, scale in counters:
        got = [p["counters"][name] for p in parts if name in p["counters"]]
        if got:
            return int(max(got) * scale)
    values = [p["value_max"] for p in parts if p["value_max"] is not None]
    if values:
        return int(max(values))
    best, before = None, 0
    for p in parts:
        if p["cum"] is not None:
            final, peak = p["cum"]
            best = before + peak if best is None else max(best, before + peak)
            before += final
    return best


def reduce(pieces: list[dict[str, Any]], result: AnalysisResult) -> dict[str, Any]:
    """The pieces (in rank order) as `analyzers.overview` and `report.build` put the whole trace's:
    the summary (with `devices`, `streams` and `copies`), the breakdown, the rank and job steps, the
    step table, the report's copies and the unmapped rows."""
    spans = [p["span"] for p in pieces if p["span"] is not None]
    t0, t1 = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0, 0)
    devices = [d for p in pieces for d in p["devices"]]
    out: dict[str, Any] = {"span_ns": t1 - t0, "events": sum(p["events"] for p in pieces),
                           "ranks": len({r for p in pieces for r in p["device_ranks"]}), "devices": devices}
    if devices:
        total = sum(u["step_time_ns"] for u in devices) or 1
        compute = sum(u["compute_ns"] for u in devices)
        out["device_utilisation_mean"] = round(compute / total, 6)
        out["bubble_ratio"] = round(1 - compute / total, 6)
    step_total = sum(p["step_ns"] for p in pieces)
    if step_total:
        idle: dict[str, int] = {}
        for p in pieces:
            for c, ns in p["idle"].items():
                idle[c] = idle.get(c, 0) + ns
        out["idle_by_cause"] = {c[5:-3]: round(ns / step_total, 6) for c, ns in idle.items() if ns > 0}
    overlap = result.metrics.get("bandwidth", {}).get("comm_compute_overlap", [])
    if overlap:
        comm = sum(r["comm_ns"] for r in overlap)
        exposed = sum(r["exposed_ns"] for r in overlap)
        out["comm_overlap_ratio"] = round(1 - exposed / comm, 6) if comm else None
    peaks = [p["peak"] for p in pieces]
    out["peak_memory_bytes"] = _peak(peaks, tuple((n, 1) for n in OVERVIEW_COUNTERS))
    if out["peak_memory_bytes"] is None:
        out["peak_memory_bytes"] = _peak(peaks, MEMORY_COUNTERS)
    out["streams"] = [s for p in pieces for s in p["streams"]]
    out["copies"] = [c for p in pieces for c in p["copies"]]
    ranks = pd.concat([p["rank_steps"] for p in pieces], ignore_index=True) if pieces else pd.DataFrame()
    tables = [p["step_table"] for p in pieces if len(p["step_table"])]
    return {"summary": out, "span": (t0, t1), "rank_steps": ranks,
            "step_table": pd.concat(tables, ignore_index=True) if tables else pieces[0]["step_table"],
            "breakdown": [r for p in pieces for r in p["breakdown"]],
            "copy_rows": [c for p in pieces for c in p["copy_rows"]],
            "unmapped": merge_unmapped([p["unmapped"] for p in pieces]),
            "rows": out["events"]}


def evidence_requests(findings: list[dict[str, Any]], span: tuple[int, int]) -> list[tuple | None]:
    """Per finding shown: its timeline's bounds (`breakdown.finding_bounds`), None without time."""
    return [finding_bounds(f, span) for f in findings]


def partition_evidence(frames: Frames, requests: list[tuple | None]) -> list[tuple[pd.DataFrame, pd.DataFrame] | None]:
    """The rows a partition holds in each requested window: (host slices, device ops)."""
    host = host_slices(frames)
    return [None if r is None else evidence_rows(frames, r, host) for r in requests]


def timelines(requests: list[tuple | None], per_part: list[list], cap: int, multi_rank: bool) -> list[dict | None]:
    """The evidence timelines from every partition's rows of each window, in rank order."""
    out: list[dict | None] = []
    for i, r in enumerate(requests):
        if r is None:
            out.append(None)
            continue
        got = [p[i] for p in per_part if p[i] is not None]
        h = pd.concat([g[0] for g in got], ignore_index=True)
        d = pd.concat([g[1] for g in got], ignore_index=True)
        out.append(evidence_layout(h, d, r, cap=cap, multi_rank=multi_rank))
    return out


def driver_window(rank_steps: pd.DataFrame, rows: int, budget: int = DRIVER_ROWS) -> tuple[int, int, list[int], float] | None:
    """The job steps the driver reads for the critical path and the replay: None when the whole
    trace fits `budget` rows (or it has no steps to cut it by); else (start_ns, end_ns, steps,
    scale) of the consecutive job steps in the middle of the run that fit (at least one; the
    first step, often a warm-up, only when every step is read), `scale` the run's job-step time
    over theirs."""
    if rows <= budget or not len(rank_steps):
        return None
    jobs = summaries.job_steps(rank_steps).sort_values("step").reset_index(drop=True)
    k = max(1, min(len(jobs), budget // max(rows // len(jobs), 1)))
    first = (len(jobs) - k + 1) // 2
    sel = jobs.iloc[first:first + k]
    scale = float(jobs["step_ns"].sum()) / max(float(sel["step_ns"].sum()), 1.0)
    return int(sel["start_ns"].min()), int(sel["end_ns"].max()), [int(s) for s in sel["step"]], scale


def critical_and_fixes(trace: Trace, result: AnalysisResult, window: tuple[int, int, list[int], float] | None,
                       run_span_ns: int, top: int, what_if: bool, n_steps: int) -> dict[str, Any]:
    """The critical path of `trace` (the driver's read: the whole trace, or `window`'s steps) and,
    with `what_if`, each time finding's fix replayed on it; on a window, the saving scaled by the
    run's job-step time over the window's (see the module docstring)."""
    from msprof_py.report import predict_fixes

    frames = Frames(trace)
    if what_if:
        predict_fixes(result, frames)
        if window is not None:
            scale = window[3]
            for f in result.findings:
                w = f.what_if
                if w is None or w.get("window"):
                    continue
                saving = int(round(w["saving_ns"] * scale))
                w.update(saving_ns=saving, span_ns=run_span_ns, new_span_ns=run_span_ns - saving,
                         window={"steps": [window[2][0], window[2][-1]], "of_steps": n_steps,
                                 "start_ns": window[0], "end_ns": window[1]})
    cp = critical.paths(frames, top=top)
    if window is not None:
        cp["window"] = {"steps": [window[2][0], window[2][-1]], "of_steps": n_steps,
                        "start_ns": window[0], "end_ns": window[1]}
    return cp


def build(parts: list, names: list[str] | None = None, *, window: str = "all", engine: str = "dask",
          scheduler: str | None = None, workers: int | None = None, progress: bool | None = None,
          input_bytes: int = 0, what_if: bool = True, driver_rows: int = DRIVER_ROWS) -> dict[str, Any]:
    """`report.build` of a trace in rank partitions (`report.rank_partitions`, or a loaded trace
    split by rank), run on `engine` as `report.analyze` runs the analyzers: the same dict, with no
    more than `driver_rows` rows of the trace on the driver (see the module docstring)."""
    from msprof_py import report

    out: dict[str, Any] = {}

    def then(result: AnalysisResult, pieces: list[dict[str, Any]], each: Any) -> None:
        red = reduce(pieces, result)
        summary = red["summary"]
        ranks = red["rank_steps"]
        jobs = summaries.job_steps(ranks)
        win = driver_window(ranks, red["rows"], driver_rows)
        trace = driver_trace(parts, win)
        cp = critical_and_fixes(trace, result, win, summary["span_ns"], report.CRITICAL_PATH_OPS, what_if, len(jobs))
        findings = report._finding_rows(result)
        requests = evidence_requests(findings[:max(report.TIMELINES, 0)], red["span"])
        shown: list[dict | None] = [None] * len(requests)
        if any(r is not None for r in requests):
            shown = timelines(requests, each(partition_evidence, requests), report.TIMELINE_EVENTS,
                              multi_rank=summary["ranks"] > 1)
        summary.update(report.job_step_summary(jobs, ranks))
        out.update(report.layout(trace.meta.source_format, result, summary, red["copy_rows"], findings,
                                 red["unmapped"], red["breakdown"], jobs, red["step_table"], cp, shown))
        if win is not None and what_if:
            result.skipped["what_if"] = (f"the fixes were replayed on job steps {win[2][0]}..{win[2][-1]} of {len(jobs)} "
                                         f"(the trace's {red['rows']:,} rows are more than the driver reads, "
                                         f"{driver_rows:,}); savings scaled by the run's job-step time over theirs")

    report.analyze(parts, names, window=window, engine=engine, scheduler=scheduler, workers=workers,
                   progress=progress, input_bytes=input_bytes, extra=piece, then=then)
    return report._strict(out)


def driver_trace(parts: list, window: tuple | None) -> Trace:
    """What the driver reads: every partition whole (`window` None), else their rows that start in
    the window's [start, end), one partition at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from msprof_py.report import _partition_trace, read_partition

    if window is None:
        return _partition_trace(list(parts))
    t0, t1 = window[0], window[1]
    kept = []
    for part in parts:
        if isinstance(part, Trace):
            ts = part.table.column("ts")
            inside = pc.and_(pc.greater_equal(ts, pa.scalar(t0, ts.type)), pc.less(ts, pa.scalar(t1, ts.type)))
            kept.append(Trace(table=part.table.filter(inside), meta=part.meta))
        else:
            kept.append(read_partition(part[1], part[2], between=(t0, t1)))
    return _partition_trace(kept)
