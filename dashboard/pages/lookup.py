"""Problem lookup: the whole symptom -> cause -> remedy table the analyzers' findings link to, in the
words of the trace's platform, with how many findings of the selected trace each entry explains.

The table is worth browsing on its own (what can go wrong, and what to change), so every entry is
listed, not only those this trace triggered. Clicking an entry lists, under the grid, this
trace's findings that link to it, each opening the timeline at its window. The page opens on
the entry named by `code` in the URL, else on the first entry that has findings.
"""

from __future__ import annotations

from typing import Any

import dash_ag_grid as dag
from dash import Input, Output, Patch, State, dcc, html
from dash.exceptions import PreventUpdate

from analyzers.finding import PLATFORMS, LookupEntry, lookup_table
from dashboard.data import Entry, Store
from dashboard.pages import common

PATH = "/lookup"
NAME = "Problem lookup"
WRAPPED = {"wrapText": True, "autoHeight": True, "cellStyle": {"lineHeight": "1.35", "wordBreak": "normal"}}
COLUMNS: list[dict[str, Any]] = [
    {"field": "code", "flex": 2, "minWidth": 235},
    {"field": "symptom", "flex": 3, "minWidth": 200, **WRAPPED},
    {"field": "cause", "flex": 3, "minWidth": 220, **WRAPPED},
    {"field": "remedy", "flex": 4, "minWidth": 240, **WRAPPED},
    {"field": "references", "flex": 3, "minWidth": 200, **WRAPPED},
    {"field": "count", "headerName": "findings in this trace", "width": 110, "filter": "agNumberColumnFilter",
     "type": "rightAligned", "wrapHeaderText": True, "autoHeaderHeight": True},
]
PLATFORM_NAMES = {"ascend": "Ascend", "cuda": "CUDA", "rocm": "ROCm"}
DEFAULT_COL = {"sortable": True, "resizable": True, "filter": "agTextColumnFilter", "floatingFilter": True}


def platform_of(entry: Entry) -> str:
    """The platform whose wording the table uses: the trace's, if the table knows it."""
    platform = entry.dataset.report.get("platform")
    return platform if platform in PLATFORMS else "unknown"


def table(entry: Entry) -> dict[str, LookupEntry]:
    return lookup_table(platform_of(entry))


def linked(entry: Entry, code: str) -> list[int]:
    """Indexes (in the ranked findings) of this trace's findings that link to lookup entry `code`."""
    return [i for i, f in enumerate(entry.dataset.findings) if (f.get("lookup") or {}).get("code") == code]


def rows(entry: Entry) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for f in entry.dataset.findings:
        code = (f.get("lookup") or {}).get("code")
        counts[code] = counts.get(code, 0) + 1
    return [{"code": e.code, "symptom": e.symptom, "cause": e.cause, "remedy": e.remedy,
             "references": "; ".join(e.references), "count": counts.get(e.code, 0)} for e in table(entry).values()]


def default_code(entry: Entry, params: dict[str, Any]) -> str | None:
    """The entry shown first: the URL's `code` if the table has it, else the first entry (in the
    table's order) that has findings in this trace, else none."""
    codes = table(entry)
    asked = params.get("code")
    if isinstance(asked, str) and asked in codes:
        return asked
    return next((c for c in codes if linked(entry, c)), None)


def detail(entry: Entry, code: str | None):
    """What the page shows under the grid for lookup entry `code`: its text and the findings of
    this trace that link to it, each a link to the timeline at that finding."""
    codes = table(entry)
    if code is None or code not in codes:
        return html.P("Click an entry to list the findings of this trace that link to it.", className="hint")
    e = codes[code]
    idx = linked(entry, code)
    parts: list[Any] = [
        html.H3(f"{e.code}: {e.symptom}"),
        html.Table([html.Tr([html.Th("cause"), html.Td(e.cause)]), html.Tr([html.Th("remedy"), html.Td(e.remedy)])]
                   + ([html.Tr([html.Th("references"), html.Td(html.Ul([html.Li(r) for r in e.references]))])]
                      if e.references else []), className="kv"),
    ]
    if not idx:
        parts.append(html.P(f"No finding of {entry.label} links to {code}.", className="hint", id="lookup-none"))
        return html.Div(parts)
    items = []
    for i in idx:
        f = entry.dataset.findings[i]
        items.append(html.Li([
            html.Span(f["severity"], className=f"sev sev-{f['severity']}"),
            dcc.Link(f"#{i + 1} {f['title']}", href="/timeline" + common.query(trace=entry.index, finding=i),
                     id=f"lookup-finding-{i}"),
            html.Span(f" · {common.where(f)} · costs {common.fmt_cost(f)}", className="hint"),
            html.Div(f["message"], className="message"),
        ]))
    n = len(idx)
    parts += [html.P(f"{n} finding{'s' if n != 1 else ''} of {entry.label} link{'s' if n == 1 else ''} to {code}:"),
              html.Ol(items, className="findings-list")]
    return html.Div(parts)


def layout(store: Store, entry: Entry, params: dict[str, Any]):
    data = rows(entry)
    code = default_code(entry, params)
    platform = platform_of(entry)
    wording = f"in {PLATFORM_NAMES[platform]} terms" if platform in PLATFORM_NAMES else "in platform-neutral terms"
    return html.Div([
        common.controls(store, entry, params, show_ranks=False),
        html.Div([
            dcc.Input(id="lookup-search", type="search", className="select wide", style={"flex": "0 1 36em"},
                      placeholder="search symptoms, causes, remedies ..."),
            html.Span(f"{len(data)} entries, {wording} · click one to list this trace's findings that link to it",
                      className="hint"),
        ], className="controls"),
        dag.AgGrid(id="lookup-grid", rowData=data, columnDefs=COLUMNS, defaultColDef=DEFAULT_COL,
                   getRowId="params.data.code", rowStyle={"cursor": "pointer"},
                   dashGridOptions={"animateRows": False, "quickFilterText": "",
                                    "rowSelection": {"mode": "singleRow", "checkboxes": False,
                                                     "enableClickSelection": True}},
                   selectedRows={"ids": [code]} if code else None,
                   scrollTo={"rowId": code, "rowPosition": "middle"} if code else None,
                   style={"height": "55vh", "minHeight": "280px"}),
        html.Div(detail(entry, code), id="lookup-detail", className="details"),
        dcc.Store(id="lookup-trace", data=entry.index),
    ])


def register(app, store: Store) -> None:
    @app.callback(Output("lookup-grid", "dashGridOptions"), Input("lookup-search", "value"),
                  prevent_initial_call=True)
    def _search(text: str | None):
        patch = Patch()
        patch["quickFilterText"] = text or ""
        return patch

    @app.callback(Output("lookup-detail", "children"), Input("lookup-grid", "cellClicked"),
                  State("lookup-trace", "data"), prevent_initial_call=True)
    def _select(cell, trace):
        code = (cell or {}).get("rowId")
        entry = store.entry(trace)
        if not isinstance(code, str) or entry.dataset is None:
            raise PreventUpdate
        return detail(entry, code)
