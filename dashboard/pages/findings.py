"""Findings: every finding of the selected trace, most costly first, in a sortable, filterable grid.

A row carries the problem-lookup text of its code (symptom, cause, remedy) next to the analyzer's
message, so the grid answers "what is wrong, why, and what to change" without a second page.
Clicking a row opens the timeline at that finding (`/timeline?trace=..&finding=i`).

Cells are plain text (AG Grid's default renderer): kernel and thread names come from the trace
and may hold markup, which must show as the characters it is made of.
"""

from __future__ import annotations

from typing import Any

import dash_ag_grid as dag
from dash import Input, Output, Patch, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.data import Entry, Store
from dashboard.pages import common
from msprof_py.compare import fix_text

PATH = "/findings"
NAME = "Findings"
#: Long free-text columns wrap (and grow the row) instead of hiding most of their text.
WRAPPED = {"wrapText": True, "autoHeight": True, "cellStyle": {"lineHeight": "1.35", "wordBreak": "normal"}}
COLUMNS: list[dict[str, Any]] = [
    {"field": "n", "headerName": "#", "width": 85, "filter": "agNumberColumnFilter"},
    {"field": "severity", "width": 110,
     "cellClassRules": {f"sev-{s}": f"params.value === '{s}'" for s in ("critical", "warning", "info")}},
    {"field": "code", "width": 190},
    {"field": "title", "width": 230, **WRAPPED},
    {"field": "where", "width": 130},
    # Sorted by the number; shown, filtered and quick-searched as the human text.
    {"field": "cost", "width": 110, "type": "rightAligned",
     "valueFormatter": {"function": "params.data.cost_text"},
     "filterValueGetter": {"function": "params.data.cost_text"},
     "getQuickFilterText": {"function": "params.data.cost_text"}},
    # What fixing it saves, predicted by replaying the trace with its remedy (analyzers.whatif).
    {"field": "fix", "width": 230, **WRAPPED},
    {"field": "step", "width": 95, "filter": "agNumberColumnFilter"},
    {"field": "symptom", "width": 240, **WRAPPED},
    {"field": "cause", "width": 260, **WRAPPED},
    {"field": "remedy", "width": 280, **WRAPPED},
    {"field": "message", "width": 420, **WRAPPED},
]
DEFAULT_COL = {"sortable": True, "resizable": True, "filter": "agTextColumnFilter", "floatingFilter": True}


def rows(entry: Entry, ranks: list[int] | None = None) -> list[dict[str, Any]]:
    """One grid row per finding (of `ranks`, None for all), in rank order; `id` is the finding's
    index in the dataset's ranked list, the `finding` parameter of the timeline's URL."""
    out = []
    for i, f in enumerate(entry.dataset.findings):
        if not _on_ranks(f, ranks):
            continue
        lk = f.get("lookup") or {}
        out.append({
            "id": str(i), "n": i + 1, "severity": f["severity"], "code": f["code"], "title": f["title"],
            "where": common.where(f), "cost": f.get("cost") if f.get("cost_unit") else None,
            "cost_text": common.fmt_cost(f), "fix": fix_text(f) or "-", "step": f.get("step"), "symptom": lk.get("symptom", ""),
            "cause": lk.get("cause", ""), "remedy": lk.get("remedy", ""), "message": f["message"],
        })
    return out


def _on_ranks(f: dict[str, Any], ranks: list[int] | None) -> bool:
    """A finding belongs to the chosen ranks if it names one of them, or names no rank at all
    (a finding about the whole job is shown whatever the rank selection)."""
    if ranks is None:
        return True
    named = [r for r in [f.get("rank"), *(f.get("ranks") or [])] if r is not None]
    return not named or any(r in ranks for r in named)


def layout(store: Store, entry: Entry, params: dict[str, Any]):
    ranks = common.ranks_param(params, entry)
    top = common.controls(store, entry, params, ranks=ranks)
    data = rows(entry, ranks)
    total = len(entry.dataset.findings)
    if not total:
        return html.Div([top, html.P("No findings: the analyzers saw no problem in this trace.", className="hint",
                                     id="findings-none")])
    if not data:
        return html.Div([top, html.P(f"None of the {total} findings is on the chosen ranks.", className="hint",
                                     id="findings-none")])
    shown = f"{len(data)} of {total}" if len(data) != total else str(total)
    return html.Div([
        top,
        html.Div([
            dcc.Input(id="findings-filter", type="search", className="select wide", style={"flex": "0 1 36em"},
                      placeholder="filter all columns (code, kernel name, remedy, ...)"),
            html.Span(f"{shown} findings, most costly first · click a row to see it on the timeline",
                      className="hint", id="findings-count"),
        ], className="controls"),
        dag.AgGrid(id="findings-grid", rowData=data, columnDefs=COLUMNS, defaultColDef=DEFAULT_COL,
                   getRowId="params.data.id", rowStyle={"cursor": "pointer"},
                   dashGridOptions={"animateRows": False, "quickFilterText": ""},
                   style={"height": "calc(100vh - 190px)", "minHeight": "320px"}),
        dcc.Store(id="findings-trace", data=entry.index),
    ])


def finding_href(trace: int, cell: dict[str, Any] | None) -> str | None:
    """The timeline URL for a clicked cell of the grid (its row id is the finding's index)."""
    row = (cell or {}).get("rowId")
    try:
        index = int(row)
    except (TypeError, ValueError):
        return None
    return "/timeline" + common.query(trace=trace, finding=index)


def register(app, store: Store) -> None:
    @app.callback(Output("findings-grid", "dashGridOptions"), Input("findings-filter", "value"),
                  prevent_initial_call=True)
    def _filter(text: str | None):
        patch = Patch()
        patch["quickFilterText"] = text or ""
        return patch

    @app.callback(Output("url", "href", allow_duplicate=True), Input("findings-grid", "cellClicked"),
                  State("findings-trace", "data"), prevent_initial_call=True)
    def _open(cell, trace):
        href = finding_href(trace, cell)
        if href is None:
            raise PreventUpdate
        return href
