"""Overview: summary metrics, the per-step breakdown (compute / communication / copy / idle by
cause, the same figure as the HTML report's) and the top findings, each linking to its window."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

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
    parts.append(html.H3("Top findings"))
    parts.append(_top_findings(entry))
    skipped = ds.report.get("skipped") or {}
    if skipped:
        parts.append(html.Details([html.Summary(f"{len(skipped)} analyzers had nothing to work on"),
                                   html.Ul([html.Li(f"{k}: {v}") for k, v in sorted(skipped.items())])]))
    return html.Div(parts)


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


def register(app, store) -> None:
    return None
