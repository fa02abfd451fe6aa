"""What every page shares: the trace and rank selectors, error panels, URL parameters, numbers."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from analyzers.grouping import rank_text
from dashboard.data import Entry, Store
from msprof_py.compare import cost_text


def error_panel(message: str) -> html.Div:
    """The one-line reason something could not be shown (text only, never a traceback)."""
    return html.Div([html.Strong("Cannot show this trace: "), html.Span(message)], className="error-panel",
                    role="alert")


def ranks_param(params: dict[str, Any], entry: Entry, default_all: bool = True) -> list[int] | None:
    """The ranks a URL asks for (`rank=1,3`), None for all; unknown ranks are dropped.

    Without `rank`, `default_all` picks all ranks; otherwise the first rank of a multi-rank trace."""
    ranks = entry.dataset.ranks
    raw = params.get("rank")
    if raw == "all":
        return None
    if raw in (None, ""):
        return None if default_all or len(ranks) <= 1 else ranks[:1]
    try:
        chosen = [int(r) for r in str(raw).split(",") if r != ""]
    except ValueError:
        return None
    chosen = [r for r in chosen if r in ranks]
    return chosen or None


def int_param(params: dict[str, Any], key: str) -> int | None:
    try:
        return int(float(params[key]))
    except (KeyError, TypeError, ValueError):
        return None


def controls(store: Store, entry: Entry, params: dict[str, Any], *, ranks: list[int] | None = None,
             show_ranks: bool = True) -> html.Div:
    """The trace selector (when several traces are loaded) and the rank selector (multi-rank traces)."""
    items = []
    if len(store.entries) > 1:
        items += [html.Label("trace", htmlFor="trace-select"),
                  dcc.Dropdown(id="trace-select", value=entry.index, clearable=False, className="select",
                               options=[{"label": e.label + ("" if e.dataset else " (unreadable)"), "value": e.index}
                                        for e in store.entries])]
    if show_ranks and entry.dataset is not None and len(entry.dataset.ranks) > 1:
        items += [html.Label("ranks", htmlFor="rank-select"),
                  dcc.Dropdown(id="rank-select", multi=True, value=ranks if ranks is not None else [],
                               placeholder="all ranks", className="select wide",
                               options=[{"label": f"rank {r}", "value": r} for r in entry.dataset.ranks]),
                  # What the page shows now: a dropdown echoing its value on mount is no change.
                  dcc.Store(id="rank-shown", data=ranks if ranks is not None else [])]
    return html.Div(items, className="controls", id="controls")


def query(**params: Any) -> str:
    """A URL query string from the parameters that are not None."""
    return "?" + urlencode({k: v for k, v in params.items() if v is not None and v != ""})


def register(app, store: Store) -> None:
    """Selector changes become a new URL for the current page (the page re-renders from it)."""

    @app.callback(Output("url", "href", allow_duplicate=True),
                  Input("trace-select", "value"), State("_pages_location", "pathname"),
                  State("_pages_location", "search"), prevent_initial_call=True)
    def _trace(value, path, search):
        from urllib.parse import parse_qs

        current = parse_qs((search or "").lstrip("?")).get("trace", ["0"])[0]
        if value is None or ctx.triggered_id is None or str(value) == current:
            raise PreventUpdate
        return (path or "/") + query(trace=value)

    @app.callback(Output("url", "href", allow_duplicate=True),
                  Input("rank-select", "value"), State("rank-shown", "data"), State("_pages_location", "pathname"),
                  State("_pages_location", "search"), prevent_initial_call=True)
    def _rank(value, shown, path, search):
        from urllib.parse import parse_qs

        if sorted(value or []) == sorted(shown or []):
            raise PreventUpdate
        q = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items()}
        new = ",".join(str(int(v)) for v in sorted(value or [])) or "all"
        keep = {k: q[k] for k in ("trace",) if k in q}
        return (path or "/") + query(**keep, rank=new)


def fmt_ns(ns: float | None) -> str:
    """A duration for people: 3 significant digits in the unit that fits."""
    if ns is None:
        return "-"
    a = abs(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if float(f"{a / scale:.3g}") >= 1:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float | None) -> str:
    """Bytes for people: 3 significant digits in binary units (1048575.99 B is '1 MiB', not
    '1.02e+03 KiB': the unit is picked after rounding)."""
    if n is None:
        return "-"
    a = abs(n)
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if float(f"{a / scale:.3g}") >= 1:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_cost(finding: dict[str, Any]) -> str:
    """A finding's cost as the reports and its own message give it: ms for time, MiB for memory."""
    return cost_text(finding.get("cost"), finding.get("cost_unit") or "")


def where(f: dict[str, Any]) -> str:
    parts = []
    for key, label in (("rank", "r"), ("device", "dev "), ("stream", "stream ")):
        if f.get(key) is not None:
            parts.append(f"{label}{f[key]}")
    if f.get("ranks"):  # a problem found on several ranks, or the ranks a straggler held up
        parts.append(f"(+ r{rank_text(f['ranks'])})")
    return " ".join(parts) or "-"


def metric_card(label: str, value: str, ident: str | None = None) -> html.Div:
    return html.Div([html.Div(value, className="metric-value", **({"id": ident} if ident else {})),
                     html.Div(label, className="metric-label")], className="metric")
