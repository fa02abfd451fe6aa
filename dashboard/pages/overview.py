"""Overview: summary metrics, the per-step breakdown (compute / communication / copy / idle by
cause, the same figure as the HTML report's), for a job of several ranks its step time per rank
and step as a heatmap (a click opens that rank and step on the timeline) and the bytes each rank
sent each other (the communication matrix), for a pipeline-parallel job each stage's wait per
micro-batch (the pipeline view), and the top findings, each linking to its window."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.figures_resources import link_matrices, matrix_figure
from dashboard.pages import common
from msprof_py.report import breakdown_figure, cause_label

PATH = "/"
NAME = "Overview"
TOP_FINDINGS = 5


def layout(store, entry, params: dict[str, Any]):
    ds = entry.dataset
    s = ds.report["summary"]
    ranks = common.ranks_param(params, entry)
    rows = [r for r in ds.report["breakdown"] if ranks is None or r["rank"] in ranks]
    cards = [
        common.metric_card("trace span", common.fmt_ns(s.get("span_ns")), "ov-span"),
        common.metric_card("events", f"{s.get('events', 0):,}", "ov-events"),
        common.metric_card("ranks", str(s.get("ranks", "-")), "ov-ranks"),
        common.metric_card("steps", str(s.get("steps") if s.get("steps") is not None else "-"), "ov-steps"),
        common.metric_card("mean step time", common.fmt_ns(s.get("step_time_ns_mean")), "ov-step-time"),
        common.metric_card("throughput", _num(s.get("throughput_steps_per_s"), " steps/s"), "ov-throughput"),
        common.metric_card("device utilisation", _pct(s.get("device_utilisation_mean")), "ov-util"),
        common.metric_card("bubble ratio", _pct(s.get("bubble_ratio")), "ov-bubble"),
        common.metric_card("peak memory", common.fmt_bytes(s.get("peak_memory_bytes")), "ov-peak-memory"),
    ]
    idle = s.get("idle_by_cause") or {}
    idle_line = ", ".join(f"{cause_label(c)} {_pct(v)}" for c, v in sorted(idle.items(), key=lambda kv: -kv[1]))
    parts = [common.controls(store, entry, params, ranks=ranks),
             html.H2(entry.label, className="trace-title"),
             html.Div(cards, className="metrics")]
    if idle_line:
        parts.append(html.P(f"Device idle time by cause (share of step time): {idle_line}", className="hint"))
    if rows:
        parts.append(dcc.Graph(id="ov-breakdown", figure=breakdown_figure(rows), config={"displaylogo": False}))
    else:
        parts.append(html.P("No device work in this trace: there is no per-step breakdown to draw.", className="hint"))
    table = [r for r in ds.report.get("step_table") or [] if ranks is None or r["rank"] in ranks]
    if len(ds.ranks) > 1 and table:
        parts += [html.H3("Step time per rank"),
                  html.P("Each rank's own time for each job step (its step's start to end); the colours span the "
                         "fastest to the slowest cell, so small differences show. Click a cell to open that rank "
                         "and step on the timeline.", className="hint"),
                  dcc.Graph(id="ov-steps-heatmap", figure=step_heatmap(table), config={"displaylogo": False}),
                  dcc.Store(id="ov-trace", data=entry.index)]
    if len(ds.ranks) > 1:
        parts += _communication_matrix(entry, ranks)
    if len(ds.ranks) > 1 and ds.pipeline:
        parts += [html.H3("Pipeline"),
                  html.P("Each pipeline stage's wait for its neighbour's hand-over before each micro-batch, forward "
                         "(from the stage before) and backward (from the stage after), mean over steps: the "
                         "first micro-batches' waits are the pipeline filling, the rest of the bubble is in the "
                         "backward's first. PIPELINE_BUBBLE says what more micro-batches would save.",
                         className="hint"),
                  dcc.Graph(id="ov-pipeline", figure=pipeline_heatmap(ds.pipeline), config={"displaylogo": False})]
    parts.append(html.H3("Top findings"))
    parts.append(_top_findings(entry))
    skipped = ds.report.get("skipped") or {}
    if skipped:
        parts.append(html.Details([html.Summary(f"{len(skipped)} analyzers had nothing to work on"),
                                   html.Ul([html.Li(f"{k}: {v}") for k, v in sorted(skipped.items())])]))
    return html.Div(parts)


def _communication_matrix(entry, ranks: list[int] | None) -> list:
    """The bytes each rank sent to each other rank (communication_matrix.json, the figures the
    Communication page and communication.json share), with a link to that page; nothing when the
    trace records no link traffic."""
    ds = entry.dataset
    shown = ranks if ranks is not None else ds.ranks
    m = link_matrices(ds.communication_matrix, shown).get("bytes")
    if m is None:
        return []
    return [html.H3("Communication matrix"),
            html.P(["Bytes each rank sent to each other rank over the run (communication_matrix.json). ",
                    dcc.Link("Communication", href="/communication" + common.query(trace=entry.index)),
                    " has its bandwidth, the waits between ranks and the findings about them."], className="hint"),
            dcc.Graph(id="ov-comm-matrix", figure=matrix_figure(m), config={"displaylogo": False})]


def _top_findings(entry) -> html.Div:
    findings = entry.dataset.findings
    if not findings:
        return html.P("No findings: the analyzers saw no problem in this trace.", className="hint", id="ov-none")
    items = []
    for i, f in enumerate(findings[:TOP_FINDINGS]):
        href = "/timeline" + common.query(trace=entry.index, finding=i)
        items.append(html.Li([
            html.Span(f["severity"], className=f"sev sev-{f['severity']}"),
            dcc.Link(f"{f['code']}: {f['title']}", href=href, id=f"ov-finding-{i}"),
            html.Span(f" · {common.where(f)} · costs {common.fmt_cost(f)}", className="hint"),
            html.Div(f["message"], className="message"),
        ]))
    more = len(findings) - TOP_FINDINGS
    tail = [dcc.Link(f"all {len(findings)} findings", href="/findings" + common.query(trace=entry.index))] \
        if more > 0 else []
    return html.Div([html.Ol(items, className="findings-list"), *tail])


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.3g}{unit}"


def step_heatmap(table: list[dict[str, Any]]) -> go.Figure:
    """Ranks (rows, the first at the top) x job steps (columns): each rank's step time (ms), the
    cell's customdata (rank, start ns, end ns) for the click."""
    ranks = sorted({int(r["rank"]) for r in table})
    steps = sorted({int(r["step"]) for r in table})
    ri, si = {r: i for i, r in enumerate(ranks)}, {s: j for j, s in enumerate(steps)}
    z = np.full((len(ranks), len(steps)), np.nan)
    custom = np.zeros((len(ranks), len(steps), 3), dtype=np.int64)
    for r in table:
        i, j = ri[int(r["rank"])], si[int(r["step"])]
        z[i, j] = r["step_ns"] / 1e6
        custom[i, j] = (int(r["rank"]), int(r["start_ns"]), int(r["end_ns"]))
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(s) for s in steps], y=[f"r{r}" for r in ranks], customdata=custom, colorscale="Blues",
        colorbar={"title": "ms"}, xgap=1, ygap=1,
        hovertemplate="rank %{y}, step %{x}: %{z:,.3f} ms<extra></extra>"))
    fig.update_layout(title="Step time per rank and step (ms)", height=min(160 + 22 * len(ranks), 900),
                      margin={"l": 60, "r": 20, "t": 40, "b": 40}, xaxis_title="step", yaxis_title="rank",
                      yaxis={"autorange": "reversed", "type": "category"}, xaxis={"type": "category"})
    return fig


def pipeline_heatmap(cells: list[dict[str, Any]]) -> go.Figure:
    """Stage and direction (rows, stage 0 forward at the top) x micro-batch (columns): the mean wait
    (ms) for the neighbour's hand-over before that micro-batch."""
    rows = list(dict.fromkeys((c["stage"], c["rank"], c["direction"]) for c in cells))
    m = max(c["micro_batch"] for c in cells) + 1
    ri = {r: i for i, r in enumerate(rows)}
    z = np.full((len(rows), m), np.nan)
    for c in cells:
        z[ri[(c["stage"], c["rank"], c["direction"])], c["micro_batch"]] = c["waited_ns"] / 1e6
    fig = go.Figure(go.Heatmap(
        z=[[None if np.isnan(v) else float(v) for v in row] for row in z], x=[str(j) for j in range(m)],
        y=[f"stage {s} (r{r}) {d}" for s, r, d in rows], colorscale="Blues", zmin=0, colorbar={"title": "ms"},
        xgap=1, ygap=1, hoverongaps=False,
        hovertemplate="%{y}, micro-batch %{x}: waited %{z:,.3f} ms<extra></extra>"))
    fig.update_layout(title="Pipeline: wait for the hand-over per stage and micro-batch (ms)",
                      height=min(160 + 26 * len(rows), 900), margin={"l": 160, "r": 20, "t": 40, "b": 40},
                      xaxis_title="micro-batch", yaxis={"autorange": "reversed", "type": "category"},
                      xaxis={"type": "category"})
    return fig


def register(app, store) -> None:
    @app.callback(Output("url", "href", allow_duplicate=True), Input("ov-steps-heatmap", "clickData"),
                  State("ov-trace", "data"), prevent_initial_call=True)
    def _open_step(click, trace):
        return step_href(trace, click)


def step_href(trace: int | None, click: dict[str, Any] | None) -> str:
    """The timeline at the clicked cell's rank and step."""
    point = (click or {}).get("points", [{}])[0]
    cell = point.get("customdata")
    if trace is None or not (isinstance(cell, list) and len(cell) == 3):
        raise PreventUpdate
    rank, t0, t1 = (int(x) for x in cell)
    return "/timeline" + common.query(trace=trace, rank=rank, t0=t0, t1=t1)
