"""Timeline: lanes for host threads and each rank / device / stream, counter tracks under them.

URL parameters: `trace`, `rank` (e.g. `1` or `0,3`), `t0` / `t1` (window, ns since the trace's
clock origin), `finding` (index in the ranked findings: opens on its window with it highlighted),
`sel` (a table row: that event is selected and its launch -> task flow drawn).

Zoom (drag or scroll) and pan ask the server for the new window: a lane gets its real events when
they fit the shape budget, its per-pixel occupancy otherwise (`dashboard.lod`). Double-click
shows the whole trace again. Clicking an event selects it: its details appear under the plot and
the flow to the device task it launched (or from the launch that created it) is drawn.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from dash import Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from dashboard.data import Dataset, Store
from dashboard.figures import Highlight, Marker, timeline_figure
from dashboard.pages import common
from msprof_py.breakdown import finding_ranks, finding_window
from msprof_py.compare import fix_text

PATH = "/timeline"
NAME = "Timeline"
#: Counter tracks shown first (the user picks others): matched on the series name.
DEFAULT_COUNTERS = re.compile(r"memory (allocated|reserved)|queue depth|GB/s", re.IGNORECASE)
MAX_DEFAULT_COUNTERS = 3
GRAPH_CONFIG = {"scrollZoom": True, "displaylogo": False, "doubleClick": "reset", "responsive": True,
                "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}


def finding_highlight(ds: Dataset, index: int | None) -> tuple[Highlight | None, dict[str, Any] | None]:
    if index is None or not 0 <= index < len(ds.findings):
        return None, None
    f = ds.findings[index]
    w = finding_window(f, ds.span)
    if w is None:
        return None, f
    ranks = finding_ranks(f, w[2], cap=None)  # every rank it involves is on screen
    occ = [(int(o["ts_ns"]), int(o["ts_ns"]) + int(o.get("dur_ns") or 0)) for o in f.get("occurrences") or []
           if o.get("ts_ns") is not None and (not ranks or o.get("rank") is None or o.get("rank") in ranks)]
    evidence = [e for e in f.get("evidence") or [] if isinstance(e, dict)
                and (not ranks or e.get("rank") is None or e.get("rank") in ranks)]
    return Highlight(w[0], w[1], occ, label=f"#{index + 1} {f['code']}", evidence=evidence), f


def markers(ds: Dataset, ranks: list[int] | None) -> list[Marker]:
    """The findings of these ranks (and those that name no rank) for the findings lane."""
    out = []
    for i, f in enumerate(ds.findings):
        w = finding_window(f, ds.span)
        if w is None or (ranks is not None and w[2] is not None and w[2] not in ranks):
            continue
        out.append(Marker(i, w[0], w[1], f["severity"], f"#{i + 1} {f['code']}: {f['title']} · {common.where(f)}"
                                                         f" · costs {common.fmt_cost(f)}"))
    return out


def padded(a: int, b: int, span: tuple[int, int]) -> tuple[int, int]:
    """A window around [a, b] with 15% room each side (at least 20 us), inside the trace."""
    pad = max((b - a) * 0.15, 20_000)
    return int(max(a - pad, span[0])), int(min(b + pad, span[1]))


def layout(store: Store, entry, params: dict[str, Any]):
    ds = entry.dataset
    h, f = finding_highlight(ds, common.int_param(params, "finding"))
    ranks = common.ranks_param(params, entry, default_all=False)
    if "rank" not in params and f is not None:
        # A finding opens with every rank it involves: a straggler with the ranks that waited for
        # it, a problem found on several ranks with each of them.
        w = finding_window(f, ds.span)
        if w is not None:
            involved = [r for r in finding_ranks(f, w[2], cap=None) if r in ds.ranks]
            if involved:
                ranks = sorted(involved)
    t0, t1 = common.int_param(params, "t0"), common.int_param(params, "t1")
    if t0 is None or t1 is None or t1 <= t0:
        t0, t1 = padded(h.start_ns, h.end_ns, ds.span) if h is not None else ds.span
    keys = ds.counters.keys(ranks)
    chosen = [k for k in keys if DEFAULT_COUNTERS.search(k[1])][:MAX_DEFAULT_COUNTERS]
    selected = common.int_param(params, "sel")
    fig = timeline_figure(ds, ranks, t0, t1, counters=chosen, highlight=h, selected=selected,
                          findings=markers(ds, ranks), budget=store.max_shapes)
    state = {"trace": entry.index, "ranks": ranks, "t0": t0, "t1": t1, "selected": selected,
             "highlight": None if h is None else [h.start_ns, h.end_ns, h.occurrences, h.label, h.evidence]}
    banner = []
    if f is not None:
        banner = [html.Div([html.Strong(f"#{common.int_param(params, 'finding') + 1} {f['code']}: "),
                            html.Span(f["title"]), html.Span(f" · {common.where(f)} · costs {common.fmt_cost(f)}"),
                            *([html.Div(fix_text(f), className="fix", id="tl-fix")] if fix_text(f) else []),
                            html.Div(f["lookup"]["remedy"] if f.get("lookup") else "", className="remedy")],
                           className="finding-banner", id="tl-finding")]
    return html.Div([
        common.controls(store, entry, params, ranks=ranks),
        *banner,
        html.Div([
            html.Label("counters", htmlFor="tl-counters"),
            dcc.Dropdown(id="tl-counters", multi=True, value=[_key(k) for k in chosen], className="select wide",
                         options=[{"label": f"r{k[0]} {k[1]}", "value": _key(k)} for k in keys],
                         placeholder="no counter tracks"),
            html.Button("Whole trace", id="tl-reset", className="button"),
            html.Span(id="tl-info", className="hint", children=_info(fig)),
        ], className="controls"),
        # The plot is drawn by DRAW_JS from the tl-figure store, not by a dcc.Graph (see DRAW_JS).
        html.Div(html.Div(id="tl-plot"), id="tl-graph", className="timeline-graph"),
        html.Div(_details(ds, selected), id="tl-details", className="details"),
        dcc.Store(id="tl-figure", data=fig),
        dcc.Store(id="tl-drawn"),
        dcc.Store(id="tl-config", data=GRAPH_CONFIG),
        dcc.Store(id="tl-state", data=state),
        dcc.Store(id="tl-window"),
        dcc.Store(id="tl-click"),
    ])


def _key(k: tuple[int, str]) -> str:
    return json.dumps([k[0], k[1]])


def _info(fig) -> str:
    m = fig["layout"]["meta"]
    return (f"{m['shapes']:,} shapes sent · {m['lanes_events']} lanes with events, "
            f"{m['lanes_occupancy']} as occupancy")


def _details(ds: Dataset, row: int | None):
    if row is None:
        return html.Span("Click an event to see its details and its launch → task flow.", className="hint")
    index = ds.lanes
    pos = index.position(row)
    if pos is None:
        return html.Span("The selected event is not on the timeline.", className="hint")
    idx = np.array([pos])
    lane = index.lane_at(pos)
    fields = {"name": index.names(idx)[0], "kind": index.kinds(idx)[0], "lane": lane.label,
              "start": f"{(index.ts[pos] - ds.span[0]) / 1e6:.6f} ms", "duration": common.fmt_ns(
                  float(index.end[pos] - index.ts[pos]))}
    for col in ("bytes", "corr", "step"):
        v = index.column(col, idx)[0]
        if v is not None:
            fields[col] = f"{int(v):,}" if col == "bytes" else str(v)
    linked = index.linked(pos)[1:]
    if linked:
        fields["linked"] = ", ".join(f"{index.names(np.array([p]))[0]} on {index.lane_at(p).label}" for p in linked)
    args = index.column("args", idx)[0]
    rows = [html.Tr([html.Th(k), html.Td(v)]) for k, v in fields.items()]
    if args:
        try:
            args = json.dumps(json.loads(args), indent=1)
        except ValueError:
            pass
        rows.append(html.Tr([html.Th("args"), html.Td(html.Pre(args))]))
    return html.Table(rows, className="kv", id="tl-selected")


#: Draws the timeline: `Plotly.react` on the tl-plot div whenever the server sends a figure.
#:
#: Not a dcc.Graph: on a zoom, dcc.Graph writes the new axis range back into its `figure` prop,
#: which makes it re-plot the old figure (a full redraw of up to 20k shapes, 40% of a zoom of all
#: ranks) just before the server's figure for the new window arrives. Here plotly draws the zoom
#: once itself, and the events go to stores with `set_props`:
#:   * a zoom, pan or reset -> tl-window ({range: [a, b]} in ms, or {reset: t}); other relayouts
#:     (autosize, hover settings) send nothing, since a newer request for the same callback makes
#:     Dash drop the answer to an older one and the zoom would be lost;
#:   * a click -> tl-click, shaped like dcc.Graph's clickData.
#: Returns the drawn figure's datarevision (tl-drawn), a state tests and benchmarks can wait on.
DRAW_JS = """
function(fig, config) {
    const gd = document.getElementById('tl-plot');
    if (!gd || !fig) { return dash_clientside.no_update; }
    const prev = window.__msprofTimeline;
    if (prev && prev !== gd && !document.body.contains(prev)) { Plotly.purge(prev); }
    window.__msprofTimeline = gd;
    Plotly.react(gd, fig.data, fig.layout, config);
    if (!gd.__msprofBound) {
        gd.__msprofBound = true;
        gd.on('plotly_relayout', ev => {
            const w = windowOf(ev || {});
            if (w) { dash_clientside.set_props('tl-window', {data: w}); }
        });
        gd.on('plotly_click', ev => {
            const p = ev && ev.points && ev.points[0];
            if (!p) { return; }
            dash_clientside.set_props('tl-click', {data: {t: Date.now(), points: [{
                curveNumber: p.curveNumber, pointNumber: p.pointNumber, x: p.x, y: p.y,
                customdata: p.customdata === undefined ? null : p.customdata}]}});
        });
    }
    return fig.layout.datarevision;

    function windowOf(relayout) {
        for (const [k, v] of Object.entries(relayout)) {
            let m = k.match(/^(xaxis\\d*)\\.range$/);
            if (m && Array.isArray(v) && v.length === 2) { return {range: [Number(v[0]), Number(v[1])]}; }
            m = k.match(/^(xaxis\\d*)\\.range\\[0\\]$/);
            if (m && relayout[m[1] + '.range[1]'] !== undefined) {
                return {range: [Number(v), Number(relayout[m[1] + '.range[1]'])]};
            }
            if (/^xaxis\\d*\\.autorange$/.test(k) && v) { return {reset: Date.now()}; }
        }
        return null;
    }
}
"""

#: The "Whole trace" button: the same reset a double-click asks for.
RESET_JS = "function(n) { return n ? {reset: Date.now()} : dash_clientside.no_update; }"


def register(app, store: Store) -> None:
    @app.callback(Output("url", "href", allow_duplicate=True), Input("tl-click", "data"),
                  State("tl-state", "data"), prevent_initial_call=True)
    def _open_finding(click, state):
        point = (click or {}).get("points", [{}])[0]
        mark = point.get("customdata")
        if not (isinstance(mark, list) and len(mark) == 2 and mark[0] == "finding") or not state:
            raise PreventUpdate
        return PATH + common.query(trace=state["trace"], finding=int(mark[1]))

    app.clientside_callback(DRAW_JS, Output("tl-drawn", "data"), Input("tl-figure", "data"),
                            State("tl-config", "data"))
    app.clientside_callback(RESET_JS, Output("tl-window", "data"), Input("tl-reset", "n_clicks"),
                            prevent_initial_call=True)

    @app.callback(Output("tl-figure", "data"), Output("tl-state", "data"), Output("tl-details", "children"),
                  Output("tl-info", "children"),
                  Input("tl-window", "data"), Input("tl-click", "data"), Input("tl-counters", "value"),
                  State("tl-state", "data"), prevent_initial_call=True)
    def _update(window, click, counters, state):
        if not state:
            raise PreventUpdate
        ds = store.entry(state["trace"]).dataset
        if ds is None:
            raise PreventUpdate
        t0, t1 = state["t0"], state["t1"]
        details = no_update
        trig = ctx.triggered_id
        if trig == "tl-window":
            if window and window.get("range"):
                a, b = window["range"]
                t0, t1 = int(ds.span[0] + a * 1e6), int(ds.span[0] + b * 1e6)
                if t1 <= t0:
                    raise PreventUpdate
            else:
                t0, t1 = ds.span
        elif trig == "tl-click":
            point = (click or {}).get("points", [{}])[0]
            row = point.get("customdata")
            if row is None or isinstance(row, list) or int(row) < 0:
                raise PreventUpdate  # a finding's bar opens it (`_open_finding`)
            state["selected"] = int(row)
            details = _details(ds, int(row))
        state["t0"], state["t1"] = t0, t1
        keys = [tuple(json.loads(v)) for v in counters or []]
        hl = state.get("highlight")
        h = Highlight(hl[0], hl[1], [tuple(o) for o in hl[2]], hl[3], hl[4]) if hl else None
        fig = timeline_figure(ds, state["ranks"], t0, t1, counters=keys, highlight=h, selected=state.get("selected"),
                              findings=markers(ds, state["ranks"]), budget=store.max_shapes)
        return fig, state, details, _info(fig)
