"""Compare: two loaded traces side by side, as `msprof-py diff` prints them, and their per-step
breakdowns next to each other on one scale.

`msprof_py.compare.compare(base, new)` gives the summary metrics before and after with their
relative change (coloured by whether it is an improvement) and, per finding code and cost unit,
the count and cost on each side with a status (fixed / new / better / worse / same). The page
shows both tables; each code links to the problem lookup in the trace where it occurs.

URL parameters: `base` and `new` (indexes of loaded traces; defaults 0 and 1). Picking another
trace in a selector changes the URL, and the page is drawn again from it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.data import Entry, Store
from dashboard.pages import common
from msprof_py.compare import compare, cost_text
from msprof_py.report import breakdown_figure

PATH = "/compare"
#: The page picks its two traces itself and shows an unreadable one as an error panel.
NEEDS_DATASET = False
NAME = "Compare"
ONE_TRACE = "Start the dashboard with two traces to compare them: msprof-py dashboard BASE NEW"
GOOD, BAD = "#2e7d32", "#c62828"
STATUS_COLOURS = {"fixed": GOOD, "better": GOOD, "new": BAD, "worse": BAD}
TABLE_STYLE = {"borderCollapse": "collapse", "margin": "0.3em 0 1em", "background": "#fff"}
CELL = {"padding": "0.25em 0.9em", "borderBottom": "1px solid #e3e3e3"}


def _th(text: str, num: bool = False, **kw: Any) -> html.Th:
    return html.Th(text, style={**CELL, "textAlign": "right" if num else "left", "borderBottom": "2px solid #ccc"},
                   **kw)


def _td(child: Any, num: bool = False, colour: str | None = None) -> html.Td:
    style = {**CELL, "textAlign": "right" if num else "left", **({"color": colour} if colour else {})}
    if num:
        style["fontVariantNumeric"] = "tabular-nums"
    return html.Td(child, style=style)


def pick(store: Store, params: dict[str, Any]) -> tuple[int, int]:
    """The two traces the URL asks for; a missing or unknown index means the default (0 and 1)."""
    n = len(store.entries)
    base, new = common.int_param(params, "base"), common.int_param(params, "new")
    base = base if base is not None and 0 <= base < n else 0
    new = new if new is not None and 0 <= new < n else (1 if base == 0 else 0)
    return base, new


def number(value: float | None, unit: str) -> str:
    """A metric as the CLI's diff prints it: ratios as percentages, others with 3 decimals."""
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.1%}"
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


def change_text(change: float | None) -> str:
    return "" if change is None else f"{change:+.1%}"


def metrics_table(diff: dict[str, Any], base: Entry, new: Entry) -> html.Table:
    head = html.Tr([_th("metric"), _th(base.label, True, title="base"), _th(new.label, True, title="new"),
                    _th("change", True)])
    body = []
    for r in diff["metrics"]:
        colour = None if r["better"] is None else GOOD if r["better"] else BAD
        body.append(html.Tr([_td(r["metric"]), _td(number(r["base"], r["unit"]), True),
                             _td(number(r["new"], r["unit"]), True), _td(change_text(r["change"]), True, colour)]))
    return html.Table([html.Thead(head), html.Tbody(body)], id="compare-table", style=TABLE_STYLE)


def findings_table(diff: dict[str, Any], base: Entry, new: Entry) -> html.Table | html.P:
    if not diff["findings"]:
        return html.P("Neither trace has findings.", className="hint", id="compare-findings")
    head = html.Tr([_th("code"), _th("findings (base → new)", True), _th("base cost", True), _th("new cost", True),
                    _th("status")])
    body = []
    for c in diff["findings"]:
        where = base if c["status"] == "fixed" else new
        link = dcc.Link(c["code"], href="/lookup" + common.query(trace=where.index, code=c["code"]),
                        title=f"the lookup entry, with its findings in {where.label}")
        body.append(html.Tr([
            _td(link), _td(f"{c['base_count']} → {c['new_count']}", True),
            _td(cost_text(c["base_cost"], c["unit"]) if c["base_count"] else "-", True),
            _td(cost_text(c["new_cost"], c["unit"]) if c["new_count"] else "-", True),
            _td(c["status"], colour=STATUS_COLOURS.get(c["status"])),
        ]))
    return html.Table([html.Thead(head), html.Tbody(body)], id="compare-findings", style=TABLE_STYLE)


def selectors(store: Store, base: int, new: int) -> html.Div:
    options = [{"label": e.label + ("" if e.dataset else " (unreadable)"), "value": e.index} for e in store.entries]
    return html.Div([
        html.Label("base", htmlFor="compare-base"),
        dcc.Dropdown(id="compare-base", options=options, value=base, clearable=False, className="select wide"),
        html.Label("new", htmlFor="compare-new"),
        dcc.Dropdown(id="compare-new", options=options, value=new, clearable=False, className="select wide"),
    ], className="controls", id="compare-controls")


def layout(store: Store, entry: Entry, params: dict[str, Any]):
    if len(store.entries) < 2:
        return html.Div([html.H2("Compare", className="trace-title"),
                         html.P(ONE_TRACE, className="hint", id="compare-none")])
    b, n = pick(store, params)
    base, new = store.entries[b], store.entries[n]
    top = [html.H2("Compare", className="trace-title"), selectors(store, b, n)]
    unreadable = {e.index: e for e in (base, new) if e.dataset is None}
    if unreadable:
        return html.Div(top + [common.error_panel(e.error or "no data") for e in unreadable.values()])
    diff = compare(base.dataset.report, new.dataset.report)
    parts = top
    if b == n:
        parts.append(html.P("Both selectors name the same trace: every change is zero.", className="hint",
                            id="compare-same"))
    parts += [
        html.H3(f"{base.label} → {new.label}"),
        metrics_table(diff, base, new),
        html.H3("Findings by code (cost: time in ms, memory in MiB)"),
        findings_table(diff, base, new),
        *side_by_side(base, new),
    ]
    return html.Div(parts)


def side_by_side(base: Entry, new: Entry) -> list[Any]:
    """Both traces' per-step breakdowns (compute / communication / copy / idle by cause), next to
    each other with the same y scale, so a step that got shorter looks shorter."""
    rows = [e.dataset.report["breakdown"] for e in (base, new)]
    if not any(rows):
        return []
    top = max((r["step_ns"] for rs in rows for r in rs), default=0) / 1e6 * 1.05
    graphs = []
    for side, entry, rs in (("base", base, rows[0]), ("new", new, rows[1])):
        if not rs:
            graphs.append(html.Div(html.P(f"{entry.label}: no device work, no breakdown.", className="hint"),
                                   style={"flex": "1"}))
            continue
        fig = breakdown_figure(rs)
        fig.update_layout(title=f"{side}: {entry.label}", yaxis_range=[0, top], height=380, showlegend=side == "new")
        graphs.append(html.Div(dcc.Graph(id=f"compare-breakdown-{side}", figure=fig, config={"displaylogo": False}),
                               style={"flex": "1", "minWidth": "0"}))
    return [html.H3("Time per step on the device (ms), same scale"),
            html.Div(graphs, style={"display": "flex", "gap": "1em"})]


def compare_href(store: Store, base: Any, new: Any, search: str | None) -> str | None:
    """The URL for a selector change, or None when the selectors name the traces the page already
    shows (a selector reports its value when it is drawn: that must not reload the page)."""
    if base is None or new is None:
        return None
    q = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items()}
    if pick(store, q) == (base, new):
        return None
    return PATH + common.query(base=base, new=new)


def register(app, store: Store) -> None:
    @app.callback(Output("url", "href", allow_duplicate=True), Input("compare-base", "value"),
                  Input("compare-new", "value"), State("_pages_location", "search"), prevent_initial_call=True)
    def _pick(base, new, search):
        href = compare_href(store, base, new, search)
        if href is None:
            raise PreventUpdate
        return href
