"""Bottleneck reports: findings ranked by what they cost, with lookup entries and the numbers
behind them, as Markdown, self-contained HTML (works offline) or JSON."""

from __future__ import annotations

import contextlib
import json
import math
import re
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analyzers import AnalysisResult, Frames, Severity, run
from analyzers.grouping import rank_text
from analyzers.memcpy import bandwidth_summary, gbps_text
from analyzers.overview import overview
from analyzers.streams import copy_bandwidth
from msprof_py import critical, summaries
from msprof_py.breakdown import PARTS, UNCLASSIFIED, evidence_window, host_slices, step_breakdown
from msprof_py.choices import ReportFormat
from msprof_py.compare import cost_text, fix_text
from msprof_py.errors import MsprofError
from msprof_py.summary import peak_memory_bytes, unmapped
from msprof_py.trace import Trace
from msprof_py.trace.atomic import atomic_file
from msprof_py.trace.units import mib, ms, ms_at, pct, sig

FORMATS = tuple(f.value for f in ReportFormat)
#: Report file extensions and the format each one means.
EXTENSIONS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json"}
#: Findings that get an evidence timeline in the HTML report, and at most how many events each.
TIMELINES = 10
#: Ops listed per rank in the report's critical path section.
CRITICAL_PATH_OPS = 5
TIMELINE_EVENTS = 300


def format_for(path: str | Path, fmt: str | None = None) -> str:
    """The report format for `path`: `fmt` when given (it must agree with a known extension),
    else the one its extension names (.md / .markdown, .html / .htm, .json)."""
    path = Path(path)
    ext = path.suffix.lower()
    if fmt is not None:
        fmt = _format(fmt)
        if ext in EXTENSIONS and EXTENSIONS[ext] != fmt:
            raise MsprofError(f"--format {fmt} contradicts the file name {path.name} ({ext} is {EXTENSIONS[ext]}); "
                              f"drop --format or change the extension")
        return fmt
    if ext not in EXTENSIONS:
        raise MsprofError(f"cannot tell the report format from the file name {path.name}; "
                          f"use .md, .html or .json, or give --format")
    return EXTENSIONS[ext]


def build(trace: Trace, names: list[str] | None = None, *, window: str = "all",
          timelines: int = TIMELINES, frames: Frames | None = None,
          result: AnalysisResult | None = None, what_if: bool = True) -> dict[str, Any]:
    """Run the analyzers and collect everything a report shows: a plain dict that is strict
    JSON (no NaN or infinity: missing numbers are None). Findings are most costly first, each
    with `cost` in its `cost_unit` ("ns", "bytes" or "" for none); `breakdown` is the per-step
    time breakdown on the devices; `timelines` the evidence windows of the first `timelines`
    findings (for the HTML report). `frames` reuses frames the caller already built over
    `trace` (the dashboard keeps them for its own views); `result` the analyzers' result when an
    engine already ran them (`analyze`). `what_if`: replay each time finding's fix
    (analyzers.whatif) and rank the findings by its saving."""
    frames = frames if frames is not None else Frames(trace, window=window)
    result = result if result is not None else run(trace, names, frames=frames)
    if what_if:
        predict_fixes(result, frames if frames.window == "all" else Frames(trace))
    summary = overview(frames, result)
    if summary.get("peak_memory_bytes") is None:
        # Memory counters the overview does not name (torch_npu's NPU MEM "APP/Memory", in KB).
        summary["peak_memory_bytes"] = peak_memory_bytes(frames.table)
    findings = _finding_rows(result)
    shown = findings[:max(timelines, 0)]
    host = host_slices(frames) if shown else None
    rows = step_breakdown(frames)
    ranks = summaries.rank_steps(frames.steps)
    jobs = summaries.job_steps(ranks)
    summary.update(job_step_summary(jobs, ranks))
    return _strict(layout(trace.meta.source_format, result, summary, copy_rows(frames), findings,
                          unmapped(trace.table, trace.meta.source_format), rows, jobs,
                          summaries.step_table(ranks, frames.device_ops),
                          critical.paths(frames, top=CRITICAL_PATH_OPS),
                          [evidence_window(frames, f, cap=TIMELINE_EVENTS, host=host) for f in shown]))


def layout(source_format: str, result: AnalysisResult, summary: dict[str, Any], copies: list, findings: list,
           unmapped_rows: tuple, breakdown: list, jobs: pd.DataFrame, step_table: pd.DataFrame,
           critical_path: dict[str, Any], timelines: list) -> dict[str, Any]:
    """The report's dict from its parts, as `build` (the whole trace) and msprof_py.report_parts (a
    partitioned one) compute them; `summary` still holds its devices, streams and copies."""
    return {
        "schema": 1,
        "source_format": source_format,
        "platform": result.platform,
        "summary": {k: v for k, v in summary.items() if k not in ("streams", "copies", "devices")},
        "devices": summary.get("devices", []),
        "streams": summary.get("streams", []),
        "copies": copies,
        "findings": findings,
        "skipped": result.skipped,
        # What the importer kept only as generic rows: no figure of the report counts them.
        "unmapped": [{"count": u.count, "category": u.category, "phases": list(u.phases), "reason": u.reason,
                      "message": u.message} for u in unmapped_rows],
        "breakdown": breakdown,
        "job_steps": jobs.to_dict("records"),
        "step_table": step_table.to_dict("records"),
        "critical_path": critical_path,
        "timelines": timelines,
        "metrics": result.metrics,
    }


def job_step_summary(jobs: pd.DataFrame, ranks: pd.DataFrame) -> dict[str, Any]:
    """The summary's step figures from the job's steps (`summaries.job_steps`): `steps` counts job
    steps (one step number across ranks), their time (mean, max) runs from the first rank's start
    to the last rank's end, the throughput is job steps per second of the steps' span;
    `rank_steps` counts the (rank, step) pairs. Empty without steps. On one rank these are the
    rank's own steps."""
    if not len(jobs):
        return {}
    durations = jobs["step_ns"].to_numpy(np.int64)
    span = int(jobs["end_ns"].max() - jobs["start_ns"].min()) or 1
    return {"steps": int(len(jobs)), "rank_steps": int(len(ranks)), "step_time_ns_mean": float(durations.mean()),
            "step_time_ns_max": int(durations.max()), "throughput_steps_per_s": float(len(jobs) / (span / 1e9))}


def predict_fixes(result: AnalysisResult, frames: Frames) -> None:
    """Each time finding's fix replayed on the whole trace (`frames`, window "all"): its
    `what_if`, cost and severity (analyzers.whatif). A trace whose dependency graph the replay
    cannot re-time keeps the measured costs, and says why under `skipped["what_if"]`."""
    from analyzers.whatif import predict

    try:
        predict(frames, result.findings)
    except ValueError as exc:
        for f in result.findings:
            f.what_if = None
        result.skipped["what_if"] = f"the fixes were not replayed: {exc}"


def findings_report(result: AnalysisResult) -> dict[str, Any]:
    """The findings part of a report (what `analyze` prints): findings most costly first, each with
    `cost` in its `cost_unit`, the skipped analyzers and the metrics, as strict JSON."""
    return _strict({"platform": result.platform, "findings": _finding_rows(result), "skipped": result.skipped,
                    "metrics": result.metrics})


def _finding_rows(result: AnalysisResult) -> list[dict[str, Any]]:
    return [{**f.to_dict(), "cost_unit": f.cost_unit, "cost": f.cost} for f in result.ranked()]


#: `analyze --format csv`: a finding's fields as JSON has them, one column each; `end_ns` is
#: ts_ns + dur_ns; `lookup_*` the problem-lookup entry (`lookup_code` names it); lists and dicts
#: (lookup_references, ranks, occurrences, evidence, what_if) as compact JSON text.
FINDING_CSV_COLUMNS = (
    "code", "severity", "title", "rank", "device", "stream", "step", "ts_ns", "dur_ns", "end_ns", "cost", "cost_unit",
    "lost_ns", "lost_bytes", "metric", "value", "threshold", "analyzer", "message", "lookup_code", "lookup_symptom",
    "lookup_cause", "lookup_remedy", "lookup_references", "ranks", "occurrences", "evidence", "what_if")


def write_findings_csv(findings: list[dict[str, Any]], out: Any) -> None:
    """`findings` (as `findings_report` gives them) to `out` as CSV, one row per finding, most
    costly first, numbers at full precision (a float as its repr, which reads back as the same
    double); a missing value is an empty cell."""
    import csv

    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FINDING_CSV_COLUMNS)
    for f in findings:
        row = {k: v for k, v in f.items() if k != "lookup"}
        row.update({f"lookup_{k}": v for k, v in (f.get("lookup") or {}).items()})
        ts, dur = f.get("ts_ns"), f.get("dur_ns")
        row["end_ns"] = ts + dur if ts is not None and dur is not None else None
        writer.writerow([_csv_cell(row.get(k)) for k in FINDING_CSV_COLUMNS])


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return v


def worst(report: dict[str, Any]) -> Severity | None:
    sev = [Severity[f["severity"].upper()] for f in report["findings"]]
    return max(sev) if sev else None


def _format(fmt: str | ReportFormat) -> str:
    """`fmt` as a known format's name (the CLI's --format is already one; library callers pass text)."""
    try:
        return ReportFormat(fmt).value
    except ValueError:
        raise MsprofError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}") from None


def write(report: dict[str, Any], path: str | Path, fmt: str | ReportFormat) -> Path:
    text = {"md": to_markdown, "html": to_html, "json": to_json}[_format(fmt)](report)
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def to_json(report: dict[str, Any]) -> str:
    """Strict JSON (RFC 8259): NaN and infinities are null. The evidence timelines stay out:
    they are copies of trace events, for the HTML report's pictures."""
    doc = _strict({k: v for k, v in report.items() if k != "timelines"})
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def to_markdown(report: dict[str, Any]) -> str:
    lines = ["# msprof-py bottleneck report", "", "## Summary", "", "| metric | value | definition |", "|---|---|---|"]
    for label, value, note in _summary_rows(report["summary"]):
        lines.append(f"| {label} | {value} | {_md(note)} |")
    if report.get("unmapped"):
        lines += ["", "## Events not understood", "", f"{UNMAPPED_NOTE}:", ""]
        lines += [f"- {_md(u['message'])}" for u in report["unmapped"]]
    lines += ["", "## Findings (most costly first)", ""]
    if not report["findings"]:
        lines.append("No findings.")
    for i, f in enumerate(report["findings"], 1):
        lines += [f"### {i}. [{f['severity']}] {_md(f['title'])} ({f['code']})", "",
                  f"{_md(f['message'])}", "",
                  f"- where: {_where(f)}; lost: {_lost(f)}",
                  *([f"- {fix_text(f)}"] if fix_text(f) else []),
                  f"- metric: {f['metric']} = {_metric(f['metric'], f['value'])} "
                  f"(threshold {_metric(f['metric'], f['threshold'])})"]
        lk = f.get("lookup")
        if lk:
            lines += [f"- symptom: {_md(lk['symptom'])}", f"- cause: {_md(lk['cause'])}",
                      f"- remedy: {_md(lk['remedy'])}"]
        lines.append("")
    if report["skipped"]:
        lines += ["## Analyzers skipped", ""] + [f"- {k}: {v}" for k, v in report["skipped"].items()] + [""]
    steps = report.get("breakdown") or []
    if steps:
        lines += ["## Time per step on the device", "",
                  "Compute, communication, copy and idle never overlap (compute wins over communication, "
                  "which wins over copy) and add up to the step time.", "",
                  "| " + " | ".join(_BREAKDOWN_HEAD) + " |", "|" + "---|" * len(_BREAKDOWN_HEAD)]
        for r in steps[:_TABLE_ROWS]:
            lines.append("| " + " | ".join(_md(c) for c in _breakdown_cells(r)) + " |")
        if len(steps) > _TABLE_ROWS:
            lines.append(f"\n({len(steps) - _TABLE_ROWS} more steps in the JSON report)")
        lines.append("")
    for title, caption, head, cells, more in _step_sections(report):
        lines += [f"## {title}", "", caption, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in cells]
        lines += ([f"\n({more} more rows in the JSON report)"] if more else []) + [""]
    lines += _critical_path_md(report.get("critical_path"))
    head, rows = _device_table(report.get("devices") or [])
    if rows:
        lines += ["## Devices", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    lines += ["## Streams", "", "| rank | device | stream | busy ms | idle ms | queue max | queue mean |",
              "|---|---|---|---|---|---|---|"]
    for r in report["streams"]:
        lines.append(f"| {r['rank']} | {r['device']} | {r['stream']} | {_ms(r['busy_ns'])} | "
                     f"{_ms(r['idle_ns'])} | {_val(r['queue_len_max'])} | {_val(r['queue_len_mean'])} |")
    if report["copies"]:
        lines += ["", "## Copies", "", COPIES_NOTE, "", "| " + " | ".join(COPIES_HEAD) + " |", "|---|---|---|---|---|"]
        for r in report["copies"]:
            lines.append(f"| {r['rank']} | {r['kind']} | {r['count']} | {_gbps(r['gbps_mean'])} | "
                         f"{_gbps(r['gbps_max'])} |")
    return "\n".join(lines) + "\n"


#: Up to this many ranks, the step table has a row per rank and step; above it, one per step.
STEP_TABLE_RANKS = 16
JOB_STEPS_NOTE = ("A job step is one step number across ranks: from the first rank's start of it to the last "
                  "rank's end of it. Each rank's own time for the step beside it: the fastest, the median and the "
                  "slowest rank; the last rank is the one that ended the step.")
STEP_TABLE_NOTE = ("Each rank's step as msprof-analyze's cluster_step_trace_time.csv splits it: computing (a compute "
                   "kernel runs), communication not overlapped (a collective runs, no kernel), free (neither) add up "
                   "to the step time; overlapped is collective time with a kernel running.")
STEP_TABLE_SUMMARY_NOTE = (STEP_TABLE_NOTE + " More than {n} ranks: per step, the min / median / max over ranks, "
                           "and the rank with the longest step.")
_JOB_STEP_HEAD = ("step", "ranks", "job step ms", "rank step ms, min", "median", "max", "slowest rank", "last rank")
_STEP_TABLE_HEAD = ("rank", "step", "step ms", "computing ms", "communication not overlapped ms", "overlapped ms",
                    "communication ms", "free ms")
_STEP_TABLE_PARTS = ("step_ns", "computing_ns", "communication_not_overlapped_ns", "overlapped_ns",
                     "communication_ns", "free_ns")


def _step_sections(report: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...], list[list[str]], int]]:
    """The job steps and the per-rank step table as (title, caption, head, rows, rows left out),
    for Markdown and HTML alike; none on a trace without steps. Up to STEP_TABLE_RANKS ranks the
    step table has a row per rank and step, above it one per step (min / median / max over ranks,
    'min / median / max' in each cell, and the slowest rank)."""
    jobs, table = report.get("job_steps") or [], report.get("step_table") or []
    out = []
    if jobs:
        rows = [[str(j["step"]), str(j["ranks"]), _ms(j["step_ns"]), _ms(j["rank_step_ns_min"]),
                 _ms(j["rank_step_ns_median"]), _ms(j["rank_step_ns_max"]), str(j["slowest_rank"]), str(j["last_rank"])]
                for j in jobs]
        out.append(("Job steps", JOB_STEPS_NOTE, _JOB_STEP_HEAD, rows[:_TABLE_ROWS], max(len(rows) - _TABLE_ROWS, 0)))
    if table:
        n_ranks = len({r["rank"] for r in table})
        if n_ranks <= STEP_TABLE_RANKS:
            rows = [[str(r["rank"]), str(r["step"]), *(_ms(r[c]) for c in _STEP_TABLE_PARTS)] for r in table]
            out.append(("Step time per rank", STEP_TABLE_NOTE, _STEP_TABLE_HEAD, rows[:_TABLE_ROWS],
                        max(len(rows) - _TABLE_ROWS, 0)))
        else:
            df = pd.DataFrame(table)
            rows = []
            for step, g in df.groupby("step", sort=True):
                slowest = g.sort_values(["step_ns", "rank"], ascending=[False, True], kind="stable").iloc[0]
                cells = [" / ".join(_ms(v) for v in (g[c].min(), g[c].median(), g[c].max())) for c in _STEP_TABLE_PARTS]
                rows.append([str(step), str(len(g)), *cells, f"{int(slowest['rank'])} ({_ms(slowest['step_ns'])} ms)"])
            head = ("step", "ranks", *(f"{h} (min / median / max)" for h in _STEP_TABLE_HEAD[2:]), "slowest rank")
            out.append(("Step time per rank", STEP_TABLE_SUMMARY_NOTE.format(n=STEP_TABLE_RANKS), head,
                        rows[:_TABLE_ROWS], max(len(rows) - _TABLE_ROWS, 0)))
    return out


CRITICAL_PATH_NOTE = ("The longest chain of recorded activity through what each task waited for (host calls, "
                      "launches, device tasks, event and sync waits), as Holistic Trace Analysis' critical path: its "
                      "time per cause, the region's time off the chain being untraced, and the ops on it.")


def _critical_path_md(cp: dict[str, Any] | None) -> list[str]:
    rows = critical.rows(cp)
    if not rows:
        return []
    lines = ["## Critical path", "", CRITICAL_PATH_NOTE, ""]
    for r in rows:
        lines += [f"### {r['title']}", "", "| cause | ms | share |", "|---|---|---|"]
        lines += [f"| {_md(a)} | {b} | {c} |" for a, b, c in r["causes"]]
        lines += ["", "| op | where | cause | ms | count |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md(x) for x in o) + " |" for o in r["ops"]] + [""]
    if len(rows) > 1:
        lines += [f"Longest path: rank {cp['longest_rank']}.", ""]
    return lines


def to_html(report: dict[str, Any]) -> str:
    """One self-contained page (plotly.js inline, works offline). Chart specs are JSON data
    blocks that plotly's encoder escapes (no '<' in them), so no trace text can end a script."""
    import jinja2
    import plotly.offline
    from markupsafe import Markup

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(_HTML)
    charts = _charts(report)
    head, rows = _device_table(report.get("devices") or [])
    return template.render(
        report=report, summary=_summary_rows(report["summary"]), charts=charts, where=_where, lost=_lost, fix=fix_text, val=_val,
        metric=_metric, ms=_ms,
        plotlyjs=Markup(_script_text(plotly.offline.get_plotlyjs())), breakdown_head=_BREAKDOWN_HEAD,
        breakdown_rows=[_breakdown_cells(r) for r in (report.get("breakdown") or [])[:_TABLE_ROWS]],
        breakdown_more=max(len(report.get("breakdown") or []) - _TABLE_ROWS, 0), device_head=head, device_rows=rows,
        copies_note=COPIES_NOTE, copies_head=COPIES_HEAD, gbps=_gbps, unmapped_note=UNMAPPED_NOTE,
        critical_rows=critical.rows(report.get("critical_path")), critical_note=CRITICAL_PATH_NOTE,
        step_sections=_step_sections(report))


def _script_text(js: str) -> str:
    r"""JavaScript made safe to inline in <script>: only '</script' and '<!--' can break out
    of (or confuse) the element, so only they are escaped ('<\/script', '<\x21--' mean the same
    in JavaScript strings and regular expressions)."""
    return re.sub(r"<(/script|!--)", lambda m: "<\\/script" if m.group(1).lower().startswith("/")
                  else "<\\x21--", js, flags=re.IGNORECASE)


class _Chart:
    """A plotly figure as a JSON spec (data, layout, config) for the page's loader script."""

    def __init__(self, fig, key: str) -> None:
        from markupsafe import Markup
        from plotly.io.json import to_json_plotly

        self.key = key
        self.height = int(fig.layout.height)
        spec = fig.to_plotly_json()
        spec["config"] = {"displaylogo": False, "responsive": True}
        # plotly's encoder writes '<', '>' and '/' as \u escapes and NaN as null.
        self.spec = Markup(to_json_plotly({k: spec[k] for k in ("data", "layout", "config")}))


def _charts(report: dict[str, Any]) -> dict[str, Any]:
    """The page's charts: the per-step breakdown, the time lost per finding and one evidence
    timeline per finding (None where a finding has no time window)."""
    import plotly.graph_objects as go

    out: dict[str, Any] = {"breakdown": None, "lost": None, "timelines": []}
    rows = report.get("breakdown") or []
    if rows:
        out["breakdown"] = _Chart(breakdown_figure(rows), "breakdown")
    lost = [(i, f) for i, f in enumerate(report["findings"], 1) if f.get("cost_unit") == "ns" and f.get("cost")]
    if lost:
        fig = go.Figure(go.Bar(x=[f["cost"] / 1e6 for _, f in lost], y=[f"{i}. {f['code']}" for i, f in lost],
                               orientation="h", marker_color="#b00020",
                               hovertemplate="%{y}: %{x:.3~r} ms<extra></extra>"))
        fig.update_layout(title="Time per finding (ms): what its fix saves, else what it lost", yaxis_autorange="reversed", template="plotly_white",
                          height=max(180, 90 + 28 * len(lost)), margin=dict(l=10, r=20, t=40, b=40),
                          yaxis_automargin=True, xaxis_title="ms")
        out["lost"] = _Chart(fig, "lost")
    for i, w in enumerate(report.get("timelines") or []):
        out["timelines"].append(_Chart(_timeline_figure(go, w), f"timeline-{i + 1}") if w else None)
    return out


_PART_COLOURS = {"compute": "#4c78a8", "communication": "#b279a2", "copy": "#f58518"}
_HOST_COLOURS = {"api": "#9d9d9d", "launch": "#54a24b", "sync": "#e45756", "wait": "#ff9da6",
                 "host_work": "#72b7b2", "data_load": "#eeca3b"}
_CAUSE_LABELS = {"host_launch": "host-bound launch", "launch": "launch overhead", "sync": "host synchronize",
                 "queue": "host blocked at a full queue", "data": "data loading", "copy": "waiting on a copy", "event": "waiting on an event",
                 "collective": "waiting on a collective", "fill": "pipeline fill", "drain": "pipeline drain",
                 "other": "unexplained", UNCLASSIFIED: "unclassified"}
_IDLE_COLOURS = ["#d62728", "#8c564b", "#bcbd22", "#17becf", "#e377c2", "#7f7f7f", "#9467bd", "#ff9896",
                 "#c49c94", "#dbdb8d"]


def cause_label(c: str) -> str:
    """How an idle cause reads for people ('host_launch' -> 'host-bound launch')."""
    return _CAUSE_LABELS.get(c, c.replace("_", " "))


def _step_label(r: dict[str, Any], many: bool) -> str:
    step = "all" if r["step"] is None else str(r["step"])
    return f"r{r['rank']} d{r['device']} · {step}" if many else step


def breakdown_figure(rows: list[dict[str, Any]]):
    """Stacked bars per step (and rank / device): compute, communication, copy, idle by cause (ms).
    The HTML report and the dashboard's overview draw the same figure."""
    import plotly.graph_objects as go

    many = len({(r["rank"], r["device"]) for r in rows}) > 1
    x = [_step_label(r, many) for r in rows]
    fig = go.Figure()
    for part in PARTS:
        fig.add_bar(name=part, x=x, y=[r[f"{part}_ns"] / 1e6 for r in rows], marker_color=_PART_COLOURS[part],
                    hovertemplate=f"{part}: %{{y:.3~r}} ms<extra>step %{{x}}</extra>")
    causes: dict[str, int] = {}
    for r in rows:
        for c, ns in (r.get("idle_by_cause") or {}).items():
            causes[c] = causes.get(c, 0) + ns
    order = sorted(causes, key=lambda c: (c == UNCLASSIFIED, -causes[c]))
    for k, c in enumerate(order):
        fig.add_bar(name=f"idle: {cause_label(c)}", x=x, y=[(r.get("idle_by_cause") or {}).get(c, 0) / 1e6 for r in rows],
                    marker_color="#cccccc" if c == UNCLASSIFIED else _IDLE_COLOURS[k % len(_IDLE_COLOURS)],
                    hovertemplate=f"idle, {cause_label(c)}: %{{y:.3~r}} ms<extra>step %{{x}}</extra>")
    rest = [r["idle_ns"] - sum((r.get("idle_by_cause") or {}).values()) for r in rows]
    if any(v > 0 for v in rest):
        fig.add_bar(name="idle", x=x, y=[v / 1e6 for v in rest], marker_color="#cccccc",
                    hovertemplate="idle: %{y:.3~r} ms<extra>step %{x}</extra>")
    fig.update_layout(barmode="stack", template="plotly_white", height=400, margin=dict(l=10, r=10, t=40, b=40),
                      title="Time per step on the device: compute, communication, copy, idle by cause (ms)",
                      xaxis_title="step", yaxis_title="ms", xaxis_type="category", legend_traceorder="normal")
    return fig


def _timeline_figure(go, w: dict[str, Any]):
    lanes = w["lanes"]
    fig = go.Figure()
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for e in w["events"]:
        by_cat.setdefault(e["cat"], []).append(e)
    for cat, evs in by_cat.items():
        colour = _PART_COLOURS.get(cat) or _HOST_COLOURS.get(cat, "#888888")
        fig.add_bar(name=cat, orientation="h", y=[e["lane"] for e in evs], base=[e["ts"] / 1e6 for e in evs],
                    x=[max(e["dur"], 1) / 1e6 for e in evs], marker_color=colour, marker_line_width=0,
                    customdata=[[e["name"][:120], e["dur"] / 1e6] for e in evs],
                    hovertemplate="%{customdata[0]}<br>%{customdata[1]:.3~r} ms<extra>" + cat + "</extra>")
    h0, h1 = w["highlight_start_ns"] / 1e6, w["highlight_end_ns"] / 1e6
    if h1 > h0:
        fig.add_shape(type="rect", xref="x", yref="paper", x0=h0, x1=h1, y0=0, y1=1, layer="below",
                      fillcolor="rgba(214,39,40,0.13)", line=dict(color="rgba(214,39,40,0.8)", width=1, dash="dot"))
    else:
        fig.add_shape(type="line", xref="x", yref="paper", x0=h0, x1=h0, y0=0, y1=1,
                      line=dict(color="rgba(214,39,40,0.9)", width=2, dash="dot"))
    fig.update_layout(barmode="overlay", template="plotly_white", height=max(170, 80 + 26 * len(lanes)),
                      margin=dict(l=10, r=10, t=10, b=40), showlegend=True, bargap=0.25,
                      legend=dict(orientation="h", y=-0.25 if len(lanes) > 3 else -0.45),
                      xaxis=dict(title="ms", range=[w["start_ns"] / 1e6, w["end_ns"] / 1e6]),
                      yaxis=dict(categoryorder="array", categoryarray=lanes[::-1], automargin=True, type="category"))
    return fig


_TABLE_ROWS = 64
_BREAKDOWN_HEAD = ("rank", "device", "step", "step ms", "compute ms", "communication ms", "copy ms", "idle ms",
                   "idle by cause")


def _breakdown_cells(r: dict[str, Any]) -> list[str]:
    causes = ", ".join(f"{cause_label(c)} {_ms(ns)}" for c, ns in (r.get("idle_by_cause") or {}).items()) or "-"
    return [str(r["rank"]), str(r["device"]), "all" if r["step"] is None else str(r["step"]), _ms(r["step_ns"]),
            _ms(r["compute_ns"]), _ms(r["communication_ns"]), _ms(r["copy_ns"]), _ms(r["idle_ns"]), causes]


_DEVICE_COLUMNS = (("busy_ns", "busy ms", "ms"), ("span_ns", "span ms", "ms"), ("busy_ratio", "busy / span", "%"),
                   ("step_time_ns", "step time ms", "ms"), ("compute_ns", "compute ms", "ms"),
                   ("utilisation", "utilisation", "%"), ("idle_ratio", "idle", "%"),
                   ("bubble_ratio", "bubble ratio", "%"))


def _device_table(devices: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    cols = [c for c in _DEVICE_COLUMNS if any(c[0] in d for d in devices)]
    head = ["rank", "device"] + [label for _, label, _ in cols]
    rows = []
    for d in devices:
        cells = [str(d.get("rank")), str(d.get("device"))]
        for key, _, unit in cols:
            v = d.get(key)
            cells.append("-" if v is None else _ms(v) if unit == "ms" else pct(v))
        rows.append(cells)
    return head, rows


def _summary_rows(s: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, definition) rows. Utilisation, idle and the bubble ratio's causes are
    shares of the same time, so they add up."""
    rows = [("span", f"{_ms(s.get('span_ns') or 0)} ms", "first event to last"),
            ("events", f"{s.get('events', 0):,}", ""), ("ranks", str(s.get("ranks", 0)), "")]
    if s.get("steps") is not None:
        many = (s.get("rank_steps") or 0) > s["steps"]
        rows += [("steps", str(s["steps"]), f"job steps: one step number across ranks ({s['rank_steps']} rank steps)"
                  if many else "profiler steps"),
                 ("step time (mean)", _opt(s.get("step_time_ns_mean"), ms),
                  "from the first rank's start of a step to the last rank's end of it" if many else ""),
                 ("throughput", _opt(s.get("throughput_steps_per_s"), lambda v: f"{sig(v)} steps/s"), "")]
    util = s.get("device_utilisation_mean")
    if util is not None:
        rows.append(("device utilisation", pct(util),
                     "time a compute kernel runs / step time on the device (its span when there are no steps), "
                     "all devices together"))
        idle = s.get("idle_ratio", 1 - util)
        if idle is not None:
            rows.append(("device idle", pct(idle), "1 - device utilisation: no compute kernel running"))
    bubble = s.get("bubble_ratio")
    if bubble is not None:
        rows.append(("bubble ratio", pct(bubble), "step time with no compute kernel on the device / step time"))
    causes = s.get("idle_by_cause") or {}
    if causes:
        for c, share in sorted(causes.items(), key=lambda kv: -(kv[1] or 0)):
            rows.append((f"  idle: {cause_label(c)}", _opt(share, lambda v: pct(v)), "share of step time"))
        rest = bubble if bubble is not None else s.get("idle_ratio")
        if rest is not None:
            left = rest - sum(v or 0 for v in causes.values())
            if left > 0.0005:
                rows.append(("  idle: no cause found", pct(left), "share of step time"))
    if s.get("comm_overlap_ratio") is not None:
        rows.append(("communication hidden under compute", pct(s['comm_overlap_ratio']),
                     "collective time overlapped by compute kernels / collective time"))
    if s.get("peak_memory_bytes") is not None:
        rows.append(("peak device memory", mib(s["peak_memory_bytes"]), ""))
    return rows


def _opt(v: Any, fmt) -> str:
    return "-" if v is None else fmt(v)


def _ms(ns: Any) -> str:
    """ns as a number of ms for a column headed in ms, 3 significant digits."""
    return "-" if ns is None else sig(ns / 1e6)


#: The caption of the report's listing of the events the importer did not understand.
UNMAPPED_NOTE = ("The importer did not understand these events and kept them only as generic markers: no figure "
                 "in this report counts them")
#: The copies table: HTA's memory bandwidth summary (not per-copy rates; see analyzers.memcpy).
COPIES_NOTE = ("Bandwidth in use: the rates of the copies of one kind running at the same time, summed; "
               "statistics over its samples (one each time it changes), as Holistic Trace Analysis computes them.")
COPIES_HEAD = ("rank", "kind", "samples", "GB/s in use, mean", "GB/s in use, max")


def copy_rows(frames: Frames) -> list[dict[str, Any]]:
    """The report's `copies`: per rank and copy kind, the samples of the bandwidth in use and
    their mean and max in GB/s (full precision)."""
    return [{"rank": int(r["rank"]), "kind": str(r["kind"]), "count": int(r["count"]),
             "gbps_mean": float(r["gbps_mean"]), "gbps_max": float(r["gbps_max"])}
            for r in bandwidth_summary(copy_bandwidth(frames)).to_dict("records")]


def _gbps(v: Any) -> str:
    return "-" if v is None else gbps_text(float(v))


def _val(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return sig(v)
    return str(v)


def _metric(name: str, v: Any) -> str:
    """A finding's metric or threshold in the report's units: bytes in MiB, ns in ms, others to 3
    significant digits (the JSON report keeps the exact value)."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return _val(v)
    if "bytes" in name:
        return mib(v)
    if name.endswith("_ns"):
        return ms(v)
    return sig(v)


def _where(f: dict[str, Any]) -> str:
    parts = [f"{k} {f[k]}" for k in ("rank", "device", "stream") if f.get(k) is not None]
    if f.get("ranks"):
        parts.append(f"also rank{'s' if len(f['ranks']) > 1 else ''} {rank_text(f['ranks'])}")
    if f.get("ts_ns") is not None:
        parts.append(f"at {ms_at(f['ts_ns'])}")
    return ", ".join(parts) or "whole trace"


def _lost(f: dict[str, Any]) -> str:
    """What the trace measured the finding to cost (its fix's predicted saving is `fix_text`)."""
    if f.get("lost_ns") is not None:
        return cost_text(f["lost_ns"], "ns")
    if f.get("lost_bytes") is not None:
        return cost_text(f["lost_bytes"], "bytes")
    return "-"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _strict(o: Any) -> Any:
    """`o` as plain JSON values: NaN and infinities become None, numpy / pandas scalars
    Python numbers, arrays lists, anything else unknown its str()."""
    if isinstance(o, dict):
        return {str(k): _strict(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, set)):
        return [_strict(v) for v in o]
    if isinstance(o, bool) or o is None or isinstance(o, str):
        return o
    if isinstance(o, int):
        return int(o)
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, np.ndarray):
        return [_strict(v) for v in o.tolist()]
    if isinstance(o, np.generic):
        return _strict(o.item())
    if o is pd.NA or o is pd.NaT:
        return None
    if isinstance(o, Enum):
        return str(o)
    return str(o)


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>msprof-py report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
td.note{color:#666;font-size:90%}table.summary td:nth-child(2){white-space:nowrap}.caption{color:#555;font-size:90%;margin:.3em 0}
.critical{color:#b00020}.warning{color:#b36b00}.info{color:#555}.finding{border-left:4px solid #ccc;padding-left:1em;margin:1.5em 0}
.chart{width:100%}details{margin:.5em 0}
</style>
<script>{{ plotlyjs }}</script>
</head><body>
{% macro chart(c) %}<div class="chart" id="chart-{{ c.key }}" style="height:{{ c.height }}px"></div><script type="application/json" class="plotly-spec" data-target="chart-{{ c.key }}">{{ c.spec }}</script>{% endmacro %}
<h1>msprof-py bottleneck report</h1>
<h2>Summary</h2>
<table class="summary">{% for k, v, note in summary %}<tr><th>{{ k }}</th><td>{{ v }}</td><td class="note">{{ note }}</td></tr>{% endfor %}</table>
{% if report.unmapped %}<h2>Events not understood</h2><p class="caption">{{ unmapped_note }}:</p>
<ul class="unmapped">{% for u in report.unmapped %}<li>{{ u.message }}</li>{% endfor %}</ul>{% endif %}
{% if charts.breakdown %}<h2>Time per step on the device</h2>
<p class="caption">Compute, communication, copy and idle never overlap (compute wins over communication, which wins over copy) and add up to the step time; idle is split by what the device waited for.</p>
{{ chart(charts.breakdown) }}
<details><summary>Table</summary><table><tr>{% for h in breakdown_head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for r in breakdown_rows %}<tr>{% for c in r %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>
{% if breakdown_more %}<p class="caption">{{ breakdown_more }} more steps in the JSON report.</p>{% endif %}</details>{% endif %}
{% for title, caption, head, rows, more in step_sections %}<h2>{{ title }}</h2><p class="caption">{{ caption }}</p>
<table class="steps"><tr>{% for h in head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for r in rows %}<tr>{% for c in r %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>
{% if more %}<p class="caption">{{ more }} more rows in the JSON report.</p>{% endif %}{% endfor %}
{% if charts.lost %}{{ chart(charts.lost) }}{% endif %}
<h2>Findings (most costly first)</h2>
{% if not report.findings %}<p>No findings.</p>{% endif %}
{% for f in report.findings %}
<div class="finding"><h3 class="{{ f.severity }}">{{ loop.index }}. [{{ f.severity }}] {{ f.title }} <small>({{ f.code }})</small></h3>
<p>{{ f.message }}</p>
{% if fix(f) %}<p class="fix"><b>{{ fix(f) }}</b></p>{% endif %}
<p>where: {{ where(f) }}; lost: {{ lost(f) }}; {{ f.metric }} = {{ metric(f.metric, f.value) }} (threshold {{ metric(f.metric, f.threshold) }})</p>
{% if f.lookup %}<table><tr><th>symptom</th><td>{{ f.lookup.symptom }}</td></tr>
<tr><th>cause</th><td>{{ f.lookup.cause }}</td></tr><tr><th>remedy</th><td>{{ f.lookup.remedy }}</td></tr></table>{% endif %}
{% if loop.index0 < charts.timelines|length and charts.timelines[loop.index0] %}{% set w = report.timelines[loop.index0] %}
<p class="caption">Evidence: the {{ {"finding": "finding's window", "evidence": "most telling event", "occurrence": "costliest occurrence"}[w.source] }}, {{ "%.3f"|format(w.highlight_start_ns / 1e6) }} to {{ "%.3f"|format(w.highlight_end_ns / 1e6) }} ms (shaded), with device ops per stream and host calls per thread around it{% if w.dropped %}; the {{ w.events|length }} longest events shown, {{ w.dropped }} shorter ones left out{% endif %}.</p>
{{ chart(charts.timelines[loop.index0]) }}{% endif %}
</div>{% endfor %}
{% if critical_rows %}<h2>Critical path</h2><p class="caption">{{ critical_note }}</p>
{% for r in critical_rows %}<h3>{{ r.title }}</h3><table><tr><th>cause</th><th>ms</th><th>share</th></tr>
{% for c in r.causes %}<tr><td>{{ c[0] }}</td><td>{{ c[1] }}</td><td>{{ c[2] }}</td></tr>{% endfor %}</table>
<table><tr><th>op</th><th>where</th><th>cause</th><th>ms</th><th>count</th></tr>
{% for o in r.ops %}<tr>{% for x in o %}<td>{{ x }}</td>{% endfor %}</tr>{% endfor %}</table>{% endfor %}
{% if critical_rows|length > 1 %}<p>Longest path: rank {{ report.critical_path.longest_rank }}.</p>{% endif %}{% endif %}
{% if report.skipped %}<h2>Analyzers skipped</h2><ul>{% for k, v in report.skipped.items() %}<li>{{ k }}: {{ v }}</li>{% endfor %}</ul>{% endif %}
{% if device_rows %}<h2>Devices</h2><table><tr>{% for h in device_head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for r in device_rows %}<tr>{% for c in r %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>{% endif %}
<h2>Streams</h2>
<table><tr><th>rank</th><th>device</th><th>stream</th><th>busy ms</th><th>idle ms</th><th>queue max</th><th>queue mean</th></tr>
{% for r in report.streams %}<tr><td>{{ r.rank }}</td><td>{{ r.device }}</td><td>{{ r.stream }}</td><td>{{ ms(r.busy_ns) }}</td><td>{{ ms(r.idle_ns) }}</td><td>{{ val(r.queue_len_max) }}</td><td>{{ val(r.queue_len_mean) }}</td></tr>{% endfor %}
</table>
{% if report.copies %}<h2>Copies</h2><p>{{ copies_note }}</p><table><tr>{% for h in copies_head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for r in report.copies %}<tr><td>{{ r.rank }}</td><td>{{ r.kind }}</td><td>{{ r.count }}</td><td>{{ gbps(r.gbps_mean) }}</td><td>{{ gbps(r.gbps_max) }}</td></tr>{% endfor %}</table>{% endif %}
<script>
document.querySelectorAll("script.plotly-spec").forEach(function (s) {
  var spec = JSON.parse(s.textContent);
  Plotly.newPlot(s.getAttribute("data-target"), spec.data, spec.layout, spec.config);
});
</script>
</body></html>
"""


# ---------------------------------------------------------------- the analysis engines
# The rank partitions of a trace are the unit of parallel work: one task per rank reads that
# rank's partition itself, runs the per-rank analyzers and summarizes it for the cross-rank ones
# (`analyzers.partitioned.map_partition`), and returns findings, metrics and small summaries;
# the driver reduces them (`reduce_partitions`). The same task function runs in-process
# (`engine="local"`, one partition at a time) or on a Dask cluster (`engine="dask"`), so no
# process ever holds more than one partition of the trace (plus the summaries).

#: An engine's partitions: (first rank, how to read it), in rank order. "table": a rank's Parquet
#: files of a partitioned table; "prof": its files under a PROF directory's host/ and device_*/.
Partition = tuple[int, str, list[str]]


def rank_partitions(path: str | Path) -> list[Partition] | None:
    """The rank partitions of a trace on disk, or None when it is not partitioned by rank (a
    single Parquet file, a JSON trace): those are loaded whole and split by rank in memory."""
    from msprof_py import loading, prof_dir

    path = Path(path)
    if prof_dir.is_prof_dir(path):
        dirs = prof_dir.raw_dirs(path)
        files: dict[int, list[str]] = {}
        for d in dirs:
            for f in sorted(d.glob("rank=*/*.parquet")):
                files.setdefault(_rank_of(f), []).append(str(f.resolve()))
        return [(r, "prof", fs) for r, fs in sorted(files.items())] or None
    path = loading.table_path(path)
    if not path.is_dir():
        return None
    files = {}
    for f in sorted(path.glob("rank=*/*.parquet")):
        files.setdefault(_rank_of(f), []).append(str(f.resolve()))
    return [(r, "table", fs) for r, fs in sorted(files.items())] or None


def _rank_of(f: Path) -> int:
    try:
        return int(f.parent.name.split("=", 1)[1])
    except (IndexError, ValueError):
        raise MsprofError(f"{f.parent}: a rank partition's directory must be named rank=N") from None


def read_partition(how: str, files: list[str], between: tuple[int, int] | None = None) -> Trace:
    """One rank's partition, read as the whole-trace readers read it (the analyzed columns of a
    table; a PROF directory's host and device parts together, sorted by time). `between`: only
    its rows that start in [t0, t1), read a row group at a time (the groups' ts statistics skip
    the others), so a window of a large partition never holds the partition."""
    import pyarrow as pa

    from analyzers.frames import ANALYSIS_COLUMNS
    from msprof_py.trace.parquet import read_trace
    from msprof_py.trace.schema import COLUMN_NAMES, canonical_dictionaries

    columns = list(ANALYSIS_COLUMNS) if how == "table" else None
    if between is None:
        parts = [read_trace(f, columns=columns) for f in files]
    else:
        parts = [_read_between(f, columns, between) for f in files]
    if how == "table":
        if len(parts) == 1:
            return parts[0]
        return Trace(table=pa.concat_tables([p.table for p in parts]), meta=parts[0].meta)
    # As prof_dir.read_raw does for the whole directory.
    table = pa.concat_tables([p.table for p in parts]) if len(parts) > 1 else parts[0].table
    order = np.lexsort((table.column("ts").to_numpy(), table.column("rank").to_numpy()))
    table = canonical_dictionaries(table.take(pa.array(order)).select(list(COLUMN_NAMES)))
    return Trace(table=table, meta=parts[0].meta)


def _read_between(path: str, columns: list[str] | None, between: tuple[int, int]) -> Trace:
    """The rows of one trace file that start in [t0, t1)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from msprof_py.trace.parquet import read_trace_meta

    t0, t1 = between
    pf = pq.ParquetFile(path)
    meta = read_trace_meta(pf, where=path)
    ts_at = pf.schema_arrow.get_field_index("ts")
    pieces = []
    for i in range(pf.num_row_groups):
        stats = pf.metadata.row_group(i).column(ts_at).statistics
        if stats is not None and stats.has_min_max and (stats.max < t0 or stats.min >= t1):
            continue
        t = pf.read_row_group(i, columns=columns)
        ts = t.column("ts")
        pieces.append(t.filter(pc.and_(pc.greater_equal(ts, pa.scalar(t0, ts.type)), pc.less(ts, pa.scalar(t1, ts.type)))))
    table = pa.concat_tables(pieces) if pieces else pf.schema_arrow.empty_table().select(columns or pf.schema_arrow.names)
    return Trace(table=table, meta=meta)


#: The local engine analyzes consecutive rank partitions together, up to this many rows a batch:
#: pandas' cost per call is then paid once a batch, not once a rank (the 8-rank slow-rank sample,
#: 101k rows: 2.8 s rank by rank, 1.3 s in one batch), and a batch is still a bounded share of
#: memory. Dask runs one task per partition, the unit of parallel work.
LOCAL_BATCH_ROWS = 1_000_000


def local_batches(parts: list[Partition] | list[Trace], budget: int | None = None) -> list[list]:
    """`parts` in consecutive groups of at most `budget` rows (default LOCAL_BATCH_ROWS; a larger
    partition alone)."""
    import pyarrow.parquet as pq

    budget = LOCAL_BATCH_ROWS if budget is None else budget
    out: list[list] = []
    rows = 0
    for part in parts:
        n = part.table.num_rows if isinstance(part, Trace) else \
            sum(pq.ParquetFile(f).metadata.num_rows for f in part[2])
        if out and out[-1] and rows + n <= budget:
            out[-1].append(part)
            rows += n
        else:
            out.append([part])
            rows = n
    return out


def analyze_partition(part: Partition | Trace | list, names: list[str] | None, window: str, reference: Any = None,
                      peers: Any = None, extra: Any = None):
    """The task of one partition (or a batch of consecutive ones): read it (unless it is given in
    memory), map the analyzers over it (and `extra` over its frames: analyzers.partitioned)."""
    from analyzers.partitioned import map_partition

    return map_partition(_partition_trace(part), names, window=window, reference=reference, peers=peers, extra=extra)


def frames_task(part: Partition | Trace | list, window: str, fn: Any, *args: Any) -> Any:
    """The task of one partition (or a batch of consecutive ones) that reads it and returns
    `fn(frames, *args)`."""
    return fn(Frames(_partition_trace(part), window=window), *args)


def partition_arrivals(part: Partition | Trace | list):
    """The task that reads a partition's collective arrivals only (a few columns)."""
    from analyzers.causality.collectives import ARRIVAL_READ
    from analyzers.partitioned import partition_arrivals as arrivals
    from msprof_py.trace.parquet import read_trace

    parts = part if isinstance(part, list) else [part]
    out = []
    for p in parts:
        if isinstance(p, Trace):
            out.append(arrivals(p))
        else:
            out += [arrivals(read_trace(f, columns=ARRIVAL_READ)) for f in p[2]]
    return pd.concat(out, ignore_index=True)


def _partition_trace(part: Partition | Trace | list) -> Trace:
    """A partition (or a batch of consecutive ones) as one Trace."""
    if isinstance(part, list):
        import pyarrow as pa

        from msprof_py.trace.schema import canonical_dictionary

        traces = [p if isinstance(p, Trace) else read_partition(p[1], p[2]) for p in part]
        trace = traces[0]
        if len(traces) > 1:
            # One chunk per column, dictionaries unified (the partitions' differ), as a whole read gives.
            table = pa.concat_tables([t.table for t in traces])
            table = pa.Table.from_arrays(
                [canonical_dictionary(col.combine_chunks()) if pa.types.is_dictionary(col.type)
                 else col.combine_chunks() for col in table.columns], schema=table.schema)
            trace = Trace(table=table, meta=trace.meta)
    else:
        trace = part if isinstance(part, Trace) else read_partition(part[1], part[2])
    return trace


def split_by_rank(trace: Trace) -> list[Trace]:
    """A trace loaded whole (not partitioned on disk) as one Trace per rank, in rank order."""
    import pyarrow.compute as pc

    col = trace.table.column("rank")
    return [Trace(table=trace.table.filter(pc.equal(col, r)), meta=trace.meta)
            for r in sorted(col.unique().to_pylist())]


def analyze(parts: list[Partition] | list[Trace], names: list[str] | None = None, *, window: str = "all",
            engine: str = "local", scheduler: str | None = None, workers: int | None = None,
            progress: bool | None = None, input_bytes: int = 0, console: Any = None, extra: Any = None,
            then: Any = None) -> AnalysisResult:
    """Run the analyzers partition by partition (`rank_partitions`, or `split_by_rank` of a loaded
    trace) and reduce: the same `AnalysisResult` as `analyzers.run` on the whole trace.

    `engine` "local" runs the partitions in this process, one at a time; "dask" runs one task per
    partition on the Dask scheduler at `scheduler` (its workers must see the partition files at
    the same paths), or, without one, on a LocalCluster of `workers` single-threaded worker
    processes started for this run. `progress` (None: only on a terminal and a large input) shows
    a bar of partitions done on stderr (or on the rich `console` given).

    `extra` (a picklable function of a partition's frames) runs in each partition's task beside the
    analyzers; `then(result, extras, each)` runs on the same engine once the result is reduced, with
    the extras in rank order and `each(fn, *args)`, which maps `fn(frames, *args)` over the
    partitions again (msprof_py.report_parts: the report of a partitioned trace)."""
    from analyzers.partitioned import bandwidth_reference, reduce_partitions, selected
    from msprof_py import loading

    try:
        selected(names)
    except ValueError as exc:
        raise MsprofError(str(exc)) from None
    if engine == "local" and (scheduler or workers):
        raise MsprofError("--scheduler and --workers go with --engine dask")
    if not parts:
        raise MsprofError("the trace has no ranks to analyze")
    with loading.progress_reporter(input_bytes, force=progress, console=console) as bar, \
            _engine(engine, scheduler, workers, len(parts)) as client:
        peers = _peer_arrivals(client, parts)
        partials = _map(client, parts, names, window, None, bar, "analyze", peers, extra)
        reference = bandwidth_reference(partials)
        if reference is not None:
            # A trace without a device preset: copies are judged against every rank's reference
            # copies, so the bandwidth analyzer runs once more per partition with the pooled ones.
            again = _map(client, parts, ["bandwidth"], window, reference, bar, "bandwidth", peers)
            for p, q in zip(partials, again):
                for table in ("findings", "metrics", "skipped"):
                    getattr(p, table).pop("bandwidth", None)
                    if "bandwidth" in getattr(q, table):
                        getattr(p, table)["bandwidth"] = getattr(q, table)["bandwidth"]
        result = reduce_partitions(partials, names)
        if then is not None:
            then(result, [p.extra for p in partials],
                 lambda fn, *args: _each(client, parts, window, fn, args, bar, "report"))
    return result


DASK_MISSING = "the Dask engine needs the dask extra: pip install 'msprof-py[dask]'"


@contextlib.contextmanager
def _engine(engine: str, scheduler: str | None, workers: int | None, n_parts: int):
    """None for the local engine; a Dask client for "dask" (on `scheduler`, or on a LocalCluster of
    `workers` single-threaded processes started here and closed on exit)."""
    if engine == "local":
        yield None
        return
    if engine != "dask":
        raise MsprofError(f"unknown engine {engine!r}; choose local or dask")
    try:
        import distributed
    except ImportError:
        raise MsprofError(DASK_MISSING) from None
    import logging
    import os

    with contextlib.ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(distributed.Client(scheduler, timeout="10s"))
            except (OSError, ValueError, TypeError) as exc:  # unreachable, refused, not an address
                raise MsprofError(f"cannot connect to the Dask scheduler {scheduler}: {' '.join(str(exc).split())}",
                                  hint="give its address as tcp://HOST:PORT") from None
        else:
            n = workers or max(min(os.cpu_count() or 1, n_parts), 1)
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                silence_logs=logging.ERROR))
            client = stack.enter_context(distributed.Client(cluster))
        yield client


def _peer_arrivals(client: Any, parts: list) -> Any:
    """Every rank's arrival at each collective, when the ranks are analyzed apart (several local
    batches, or Dask): a collective's wait then still names the rank of another partition it
    waited for. None when one batch holds every rank."""
    if client is None:
        batches = local_batches(parts)
        if len(batches) < 2:
            return None
        return pd.concat([partition_arrivals(b) for b in batches], ignore_index=True)
    if parts and isinstance(parts[0], Trace):  # in memory here already: no need to ship them
        return pd.concat([partition_arrivals(p) for p in parts], ignore_index=True)
    return pd.concat(client.gather([client.submit(partition_arrivals, p, pure=False) for p in parts]),
                     ignore_index=True)


def _map(client: Any, parts: list, names: list[str] | None, window: str, reference: Any, bar, stage: str,
         peers: Any = None, extra: Any = None) -> list:
    """`analyze_partition` over every partition, in order (`_tasks`); the pooled reference copies
    and peer arrivals go to every Dask worker once."""
    if client is not None:
        if reference is not None:
            [reference] = client.scatter([reference], broadcast=True)
        if peers is not None:
            [peers] = client.scatter([peers], broadcast=True)
    return _tasks(client, parts, analyze_partition, (names, window, reference, peers, extra), bar, stage)


def _each(client: Any, parts: list, window: str, fn: Any, args: tuple, bar, stage: str) -> list:
    """`frames_task(part, window, fn, *args)` over the partitions, in order (`_tasks`)."""
    return _tasks(client, parts, frames_task, (window, fn, *args), bar, stage)


def _tasks(client: Any, parts: list, task: Any, args: tuple, bar, stage: str) -> list:
    """`task(part, *args)` over the partitions, results in rank order: here over the local engine's
    batches, or one task per partition on the Dask `client` (partitions on disk go as file names,
    read by the worker that runs the task; partitions in memory go to the workers as data)."""
    bar(stage, 0, len(parts))
    if client is None:
        out, done = [], 0
        for batch in local_batches(parts):
            out.append(task(batch, *args))
            done += len(batch)
            bar(stage, done, len(parts))
        return out
    import distributed

    if parts and isinstance(parts[0], Trace):
        parts = client.scatter(list(parts))
    futures = [client.submit(task, part, *args, pure=False) for part in parts]
    for i, _ in enumerate(distributed.as_completed(futures), 1):
        bar(stage, i, len(futures))
    return [f.result() for f in futures]
