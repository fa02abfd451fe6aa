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
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

import dash
import flask
from dash import Input, Output, dcc, html
from plotly.offline import get_plotlyjs_version

from dashboard.data import Store
from dashboard.pages import PAGES, common

STORE_KEY = "msprof_store"
#: The plotly.js the pages load: a bundle of the trace types the dashboard draws (`dashboard/js/`),
#: one fifth of the full plotly.min.js in compile time. It is a plain script of the page, so
#: dcc.Graph finds `window.Plotly` and never fetches Dash's full plotly.min.js (Dash's
#: `eager_loading` would load plotly.js early too, but with every lazy chunk of every component
#: library: 16 MB of JavaScript with MathJax and AG Grid Enterprise, which doubles the first load).
PLOTLY_BUNDLE = Path(__file__).with_name("static") / f"plotly-{get_plotlyjs_version()}-msprof.min.js"
PLOTLY_ROUTE = f"/_msprof/{PLOTLY_BUNDLE.name}"

#: Dash's page with two small scripts around its bundles. Dash loads babel-polyfill 7 (core-js 2),
#: which judges today's `parseInt` / `parseFloat` / `String.prototype.trim` non-compliant (U+180E
#: stopped being white space in Unicode 6.3) and swaps in JavaScript versions; plotly.js parses
#: every colour it styles with them, which was a tenth of a zoom's redraw time. The first script
#: keeps the browser's own functions, the second puts back any the polyfill replaced.
INDEX = """<!DOCTYPE html>
<html>
    <head>
        <script>window.__msprofNatives = [[window, "parseInt", parseInt], [window, "parseFloat", parseFloat],
            [Number, "parseInt", Number.parseInt], [Number, "parseFloat", Number.parseFloat],
            [String.prototype, "trim", String.prototype.trim]];</script>
        {%metas%}
        <title>{%title%}</title>
        {%favicon%}
        {%css%}
    </head>
    <body>
        {%app_entry%}
        <footer>
            {%config%}
            {%scripts%}
            <script>for (const [o, k, f] of window.__msprofNatives) { if (o[k] !== f) { o[k] = f; } }</script>
            {%renderer%}
        </footer>
    </body>
</html>"""
log = logging.getLogger("dashboard")


def create_app(store: Store, *, title: str = "msprof-py dashboard") -> dash.Dash:
    """A Dash app over `store` (debug stays off: errors show as one-line panels, never tracebacks)."""
    app = dash.Dash(__name__, use_pages=True, pages_folder="", title=title, update_title=None,
                    suppress_callback_exceptions=True, assets_folder=_assets(),
                    external_scripts=[PLOTLY_ROUTE] if PLOTLY_BUNDLE.is_file() else [])
    if not PLOTLY_BUNDLE.is_file():
        log.warning("no plotly.js bundle for plotly.js %s (%s): pages load the full plotly.js, a slower first "
                    "load; rebuild it as dashboard/js/README.md says", get_plotlyjs_version(), PLOTLY_BUNDLE.name)
    app.index_string = INDEX
    app.server.config[STORE_KEY] = store
    # One fixed file: no part of a request's path is ever joined to a directory.
    app.server.add_url_rule(PLOTLY_ROUTE, "plotly_bundle", _plotly_bundle)
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


def _plotly_bundle() -> flask.Response:
    if not PLOTLY_BUNDLE.is_file():
        flask.abort(404)
    return flask.send_file(PLOTLY_BUNDLE, mimetype="text/javascript", max_age=365 * 86400)


def _assets() -> str:
    return str(Path(__file__).with_name("assets"))
