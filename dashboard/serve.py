"""Start the dashboard: load the traces named on the command line, analyse them once, serve.

Used by `msprof-py dashboard` and `python -m dashboard`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from msprof_py.errors import MsprofError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def check_paths(paths: list[Path]) -> None:
    """A path that does not exist is a typo: say so before loading anything."""
    if not paths:
        raise MsprofError("name at least one trace or PROF_* directory to show")
    for p in paths:
        if not p.exists():
            raise MsprofError(f"{p}: no such file or directory")


def load(paths: list[Path], console: Console | None = None):
    from dashboard.data import Store

    console = console or Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("loading", total=None)
        store = Store.open(paths, progress=lambda label: bar.update(task, description=f"loading and analysing "
                                                                                      f"{label}"))
        for entry in store.entries:
            if entry.dataset is not None:
                # Build the timeline index now, so the first page view does not pay for it.
                entry.dataset.lanes  # noqa: B018
                entry.dataset.counters  # noqa: B018
    for entry in store.entries:
        if entry.error:
            console.print(f"[yellow]warning:[/] {entry.error} (the dashboard shows this trace as an error panel)",
                          highlight=False)
    return store


def warm_up(app, store) -> None:
    """Serve the app's own start-up requests and draw each trace's opening timeline once before
    the URL is printed: the first visitor then does not pay for Dash building its index and
    dependency list, plotly building its template, or the first figure's imports."""
    import dash

    with app.server.test_client() as client:
        for path in ("/", "/_dash-layout", "/_dash-dependencies"):
            client.get(path)
    timeline = next(p["layout"] for p in dash.page_registry.values() if p["path"] == "/timeline")
    with app.server.test_request_context("/timeline"):
        for entry in store.entries:
            if entry.dataset is not None:
                timeline(trace=str(entry.index))


def serve(paths: list[Path], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, debug: bool = False) -> None:
    from dashboard.app import create_app

    check_paths(paths)
    if not 0 < port < 65536:
        raise MsprofError(f"--port must be 1..65535, got {port}")
    store = load(paths)
    app = create_app(store)
    warm_up(app, store)
    url = f"http://{host}:{port}/"
    print(f"dashboard: {url}  (Ctrl+C stops it)", flush=True)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.run(host=host, port=port, debug=debug, dev_tools_ui=debug, dev_tools_props_check=debug)
