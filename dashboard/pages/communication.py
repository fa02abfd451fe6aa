"""Communication: bandwidth in use per link over time, a rank x rank matrix, and the slow-rank
and slow-link findings.

Where the numbers come from:

- bandwidth: the link-rate counters ("r0->r1.hccs GB/s", "r8.roce_tx GB/s", "r0.d0.pcie_h2d
  GB/s": what the emulator records and msprof's hardware-bandwidth counters play the part of);
  a trace without them gets the rate computed from its collectives' and copies' bytes /
  duration per stream. Nominal rates and slow links come from the links analyzer (its
  metrics and SLOW_LINK findings);
- matrix: bytes each rank-to-rank link carried (the integral of its rate counter) and its
  mean rate while busy, or the time each rank waited for each other rank in the collectives
  the slow-rank analyzer matched across ranks (`analyzers.ranks.match_collectives`);
- findings: SLOW_RANK (analyzers/ranks.py) and SLOW_LINK (analyzers/links.py), each linking
  to the timeline at its window.

A trace with one rank and no collectives says so instead of drawing empty charts (its
host-device copy links, if it has any, are still drawn).
"""

from __future__ import annotations

from typing import Any

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from analyzers.ranks import collective_parts, match_collectives
from dashboard.data import Dataset, Store
from dashboard.figures_resources import (
    Matrix,
    bandwidth_figure,
    link_matrices,
    link_series,
    matrix_figure,
    op_rate_series,
    wait_matrix,
)
from dashboard.pages import common

PATH = "/communication"
NAME = "Communication"
CODES = ("SLOW_RANK", "SLOW_LINK")
MATRIX_LABELS = {"wait": "wait for another rank (collectives)", "bytes": "bytes per link",
                 "bandwidth": "rate while busy per link"}
GRAPH_CONFIG = {"displaylogo": False, "scrollZoom": True}


def has_collectives(ds: Dataset) -> bool:
    ops = ds.frames.device_ops
    return bool((ops["kind"].astype(str) == "collective").any()) if not ops.empty else False


def matrices(ds: Dataset, ranks: list[int] | None) -> dict[str, Matrix]:
    """The rank x rank matrices the trace has data for, over `ranks` (all when None)."""
    shown = ranks if ranks is not None else ds.ranks
    if len(shown) < 2:
        return {}
    out: dict[str, Matrix] = {}
    wait = wait_matrix(match_collectives(collective_parts(ds.frames)), shown)
    if wait is not None:
        out["wait"] = wait
    out.update(link_matrices(ds.communication_matrix, shown))
    return out


def findings_of(ds: Dataset, ranks: list[int] | None) -> list[tuple[int, dict[str, Any]]]:
    """SLOW_RANK / SLOW_LINK findings (index in `ds.findings`) involving one of `ranks`: as the
    finding's rank, one of its ranks, or the rank of one of its links."""
    out = []
    for i, f in enumerate(ds.findings):
        if f["code"] not in CODES:
            continue
        involved = {f.get("rank"), *(f.get("ranks") or []),
                    *(e.get("rank") for e in f.get("evidence") or [] if isinstance(e, dict))}
        if ranks is None or involved & set(ranks):
            out.append((i, f))
    return out


def layout(store: Store, entry, params: dict[str, Any]):
    ds: Dataset = entry.dataset
    ranks = common.ranks_param(params, entry)
    parts: list[Any] = [common.controls(store, entry, params, ranks=ranks), html.H2("Communication")]
    alone = len(ds.ranks) < 2 and not has_collectives(ds)
    if alone:
        parts.append(html.P("No communication in this trace: it has one rank and no collectives.",
                            className="hint", id="comm-none"))
    parts += _bandwidth(ds, ranks, alone)
    if not alone:
        parts += _matrix(entry, ranks)
    found = findings_of(ds, ranks)
    parts += [html.H3("Slow ranks and slow links"), html.Div(_findings(entry, found), id="comm-findings")]
    parts.append(dcc.Store(id="comm-state", data={"trace": entry.index, "ranks": ranks}))
    return html.Div(parts)


def _bandwidth(ds: Dataset, ranks: list[int] | None, alone: bool) -> list[Any]:
    series = link_series(ds.counters.series, ranks)
    source = "the link-rate counters"
    if not series:
        series = op_rate_series(ds.frames.device_ops, ranks)
        source = "collectives' and copies' bytes / duration per stream (the trace has no link-rate counters)"
        unsized = _collectives_without_bytes(ds, ranks)
        if unsized:
            source += f"; {unsized:,} collectives state no byte count and are not in it"
    title = "Bandwidth in use per link"
    if not series:
        return [] if alone else [html.H3(title), html.P("No link-rate counters and no collectives or copies with a "
                                                         "byte count: bandwidth over time cannot be drawn.",
                                                         className="hint", id="comm-bandwidth-none")]
    slow = {e["link"] for _, f in findings_of(ds, None) if f["code"] == "SLOW_LINK"
            for e in f.get("evidence") or [] if isinstance(e, dict) and e.get("link")}
    nominal = {m["link"]: m["nominal_gbps"] for m in (ds.report["metrics"].get("links") or {}).get("links") or []
               if m.get("nominal_gbps")}
    fig = bandwidth_figure(series, ds.span[0], slow=slow, nominal=nominal)
    hint = f"{len(series)} curve{'s' if len(series) != 1 else ''} from {source}."
    if slow:
        hint += " Red: the links a slow-link finding names."
    if any(s.name in nominal for s in series):
        hint += " Dotted: the links' nominal rate."
    return [html.H3(title), html.P(hint, className="hint"),
            dcc.Graph(id="comm-bandwidth", figure=fig, config=GRAPH_CONFIG)]


def _collectives_without_bytes(ds: Dataset, ranks: list[int] | None) -> int:
    ops = ds.frames.device_ops
    if ops.empty:
        return 0
    mine = ops[(ops["kind"].astype(str) == "collective") & ~(ops["bytes"].fillna(0) > 0)]
    return int(len(mine) if ranks is None else mine["rank"].isin(ranks).sum())


def default_kind(ds: Dataset, available: dict[str, Matrix]) -> str:
    """Who waited for whom when a rank is slow (or no link counters); bytes per link otherwise."""
    if "wait" in available and (any(f["code"] == "SLOW_RANK" for f in ds.findings) or "bytes" not in available):
        return "wait"
    return "bytes" if "bytes" in available else next(iter(available))


def _matrix(entry, ranks: list[int] | None) -> list[Any]:
    ds = entry.dataset
    head = html.H3("Rank by rank")
    shown = ranks if ranks is not None else ds.ranks
    if len(shown) < 2:
        why = ("One rank in this trace: no rank-to-rank matrix." if len(ds.ranks) < 2
               else "One rank shown: no rank-to-rank matrix (pick two or more ranks).")
        return [head, html.P(why, className="hint", id="comm-matrix-none")]
    available = matrices(ds, ranks)
    if not available:
        return [head, html.P("No collectives matched across ranks and no rank-to-rank link counters: nothing to put "
                             "in a matrix.", className="hint", id="comm-matrix-none")]
    kind = default_kind(ds, available)
    return [head,
            dcc.RadioItems(id="comm-matrix-kind", value=kind, inline=True, className="controls",
                           options=[{"label": MATRIX_LABELS[k], "value": k} for k in available]),
            dcc.Graph(id="comm-matrix", figure=matrix_figure(available[kind]), config={"displaylogo": False})]


def _findings(entry, found: list[tuple[int, dict[str, Any]]]):
    if not found:
        return html.P("No slow rank and no slow link: the analyzers found no straggler and every link with "
                      "traffic reached at least half its nominal rate.", className="hint")
    items = []
    for i, f in found:
        extra = ""
        if f["code"] == "SLOW_RANK" and f.get("ranks"):
            extra = f" · waited for by ranks {', '.join(map(str, f['ranks']))}"
        items.append(html.Li([
            html.Span(f["severity"], className=f"sev sev-{f['severity']}"),
            dcc.Link(f"#{i + 1} {f['code']}: {f['title']}", href="/timeline" + common.query(trace=entry.index,
                                                                                           finding=i),
                     id=f"comm-finding-{i}"),
            html.Span(f" · {common.where(f)} · costs {common.fmt_cost(f)}{extra}", className="hint"),
            html.Div(f["message"], className="message"),
        ]))
    return html.Ol(items, className="findings-list")


def register(app, store: Store) -> None:
    @app.callback(Output("comm-matrix", "figure"), Input("comm-matrix-kind", "value"), State("comm-state", "data"),
                  prevent_initial_call=True)
    def _matrix_kind(kind, state):
        if not state or kind is None:
            raise PreventUpdate
        ds = store.entry(state.get("trace")).dataset
        if ds is None:
            raise PreventUpdate
        available = matrices(ds, state.get("ranks"))
        if kind not in available:
            raise PreventUpdate
        return matrix_figure(available[kind])
