"""`create_app(store) -> Dash`: the dashboard over the traces of a `Store`.

The app holds no module-level data: the store lives on the Flask server's config, and each
page's layout function looks it up in the request it serves. The page a user sees is named by
its URL alone (`/timeline?trace=0&rank=1&t0=...&t1=...&finding=3`), so a view can be
bookmarked, and a finding's row links to the timeline at its window.

Pages are Dash pages, one module each under `dashboard.pages`; each has `PATH`, `NAME`,
`layout(store, entry, params)` and `register(app, store)` for its callbacks, and may set
`NEEDS_DATASET = False` when it handles an unreadable trace itself (compare picks two traces) (callbacks are
registered on the app instance, so two apps in one process never share state).
"""

from __future__ import annotations

import logging
from typing import Any, Callable
from urllib.parse import parse_qs

import dash
import flask
from dash import Input, Output, dcc, html

from dashboard.data import Store
from dashboard.pages import PAGES, common

STORE_KEY = "msprof_store"
log = logging.getLogger("dashboard")


def create_app(store: Store, *, title: str = "msprof-py dashboard") -> dash.Dash:
    """A Dash app over `store` (debug stays off: errors show as one-line panels, never tracebacks)."""
    # eager_loading: plotly.js (4.8 MB) loads with the page's other scripts instead of after the
    # first layout round trip, which shortens the first, cold draw of the timeline.
    app = dash.Dash(__name__, use_pages=True, pages_folder="", title=title, update_title=None,
                    suppress_callback_exceptions=True, assets_folder=_assets(), eager_loading=True)
    app.server.config[STORE_KEY] = store
    for module in PAGES:
        dash.register_page(module.__name__, path=module.PATH, name=module.NAME, title=f"{module.NAME} · {title}",
                           layout=_page(module), order=PAGES.index(module))
    app.layout = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        html.Header([
            html.Span("msprof-py", className="brand"),
            html.Nav([dcc.Link(m.NAME, href=m.PATH, id=f"nav-{m.NAME.lower().replace(' ', '-')}", className="nav")
                      for m in PAGES], id="nav"),
            html.Span(_status(store), id="store-status", className="status"),
        ], className="header"),
        html.Main(dash.page_container, id="page"),
    ])
    common.register(app, store)
    for module in PAGES:
        module.register(app, store)

    @app.callback([Output(f"nav-{m.NAME.lower().replace(' ', '-')}", "href") for m in PAGES],
                  Input("_pages_location", "search"))
    def _nav(search: str | None):
        # Keep the trace and rank the user picked while moving between pages.
        q = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if k in ("trace", "rank")}
        query = "&".join(f"{k}={v}" for k, v in q.items())
        return [m.PATH + (f"?{query}" if query else "") for m in PAGES]

    return app


def store_of_request() -> Store:
    return flask.current_app.config[STORE_KEY]


def _page(module) -> Callable[..., Any]:
    def layout(**params: Any):
        store = store_of_request()
        entry = store.entry(params.get("trace"))
        if entry.dataset is None and getattr(module, "NEEDS_DATASET", True):
            return html.Div([common.controls(store, entry, params), common.error_panel(entry.error or "no data")])
        try:
            return module.layout(store, entry, params)
        except Exception as exc:  # noqa: BLE001 - a page must never become a traceback page
            log.exception("page %s failed", module.PATH)
            return common.error_panel(f"{module.NAME} could not be drawn: {type(exc).__name__}: {exc}"[:300])

    layout.__name__ = f"{module.__name__.rsplit('.', 1)[-1]}_layout"
    return layout


def _status(store: Store) -> str:
    ok = sum(1 for e in store.entries if e.dataset is not None)
    bad = len(store.entries) - ok
    return f"{ok} trace{'s' if ok != 1 else ''} loaded" + (f", {bad} unreadable" if bad else "")


def _assets() -> str:
    from pathlib import Path

    return str(Path(__file__).with_name("assets"))
