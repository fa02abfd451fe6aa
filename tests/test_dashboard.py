"""The dashboard's core: level of detail, the timeline, safety, the command, and browser tests
that open every page, follow a finding to its window, zoom within the shape limit and prove
that hostile names stay text.

Browser tests use `dash_duo` (headless Debian chromium, see conftest.py) and wait on page state.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import console_errors
from plotly.offline import get_plotlyjs_version
from typer.testing import CliRunner

from dashboard.app import PLOTLY_BUNDLE, PLOTLY_ROUTE, create_app
from dashboard.data import Store
from dashboard.figures import merge_runs, timeline_figure
from dashboard.lod import LaneIndex
from msprof_py.cli import app as cli
from msprof_py.trace import import_bytes

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "emulated"
BERT = SAMPLES / "bert-train-dp" / "trace"
LEAK = SAMPLES / "resnet50-infer-leak" / "trace"
XSS = "<img src=x onerror=alert(1)>"
BOLD = "<b>bold</b>"
PAGES = {"/": "#ov-span", "/timeline": "#tl-graph", "/findings": "#findings-grid", "/lookup": "#lookup-grid",
         "/memory": "#mem-curves", "/communication": "#comm-bandwidth", "/compare": "#compare-table"}

runner = CliRunner()


@pytest.fixture(scope="module")
def store() -> Store:
    return Store.open([BERT, LEAK])


def hostile_trace(path: Path) -> Path:
    """A Kineto trace whose kernel and host thread have names that are HTML."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": BOLD}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": XSS, "pid": 0, "tid": 7, "ts": 20, "dur": 50,
         "args": {"device": 0, "stream": 7, "correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 80, "dur": 40,
         "args": {"device": 0, "stream": 7, "correlation": 8}},
    ]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return path


def lanes_table(events: list[tuple[int, int, int]]) -> pa.Table:
    """A table of kernels (ts, dur, stream) on device 0 of rank 0, in the trace table's types."""
    ev = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": s, "ts": t / 1000, "dur": d / 1000,
           "args": {"device": 0, "stream": s, "correlation": i + 1}} for i, (t, d, s) in enumerate(events)]
    return import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).table


# ------------------------------------------------------------------ level of detail (no browser)

def test_a_quiet_window_sends_exactly_its_events():
    table = lanes_table([(0, 100_000, 7), (200_000, 100_000, 7), (250_000, 10_000, 8), (900_000, 50_000, 7)])
    index = LaneIndex(table)
    views = index.window(index.lanes, 150_000, 600_000)
    got = {v.lane.key[1]: sorted(index.names(v.events)) for v in views}
    # k0 ends at 100 us, before the window; k3 starts after it.
    assert got == {7: ["k1"], 8: ["k2"]}


def test_occupancy_is_the_covered_share_of_each_bucket():
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 10_000_000, 400))
    events = [(int(t), int(rng.integers(1_000, 60_000)), 7) for t in starts]
    table = lanes_table(events)
    index = LaneIndex(table)
    (view,) = index.window(index.lanes, 0, 10_000_000, budget=100, buckets=50)
    assert view.events is None and len(view.busy) == 50
    # Brute force on the table's own times (the importer moves the origin to the first event):
    # mark every covered nanosecond, bucket by bucket.
    ts, dur = table.column("ts").to_numpy(), table.column("dur").to_numpy()
    grid = np.zeros(10_000_000, bool)
    for t, d in zip(ts, dur):
        grid[t:t + d] = True
    assert np.allclose(view.busy, grid.reshape(50, -1).mean(axis=1), atol=1e-6)
    assert view.counts.tolist() == np.histogram(ts, bins=np.linspace(0, 10_000_000, 51))[0].tolist()


@pytest.mark.parametrize("budget", [500, 3_000, 20_000])
def test_no_view_holds_more_shapes_than_its_budget(store, budget):
    ds = store.entries[0].dataset
    a, b = ds.span
    for k in range(0, 12, 2):
        w = (b - a) >> k
        fig = timeline_figure(ds, None, a + (b - a - w) // 2, a + (b - a + w) // 2, budget=budget)
        assert shapes_in(fig) == fig["layout"]["meta"]["shapes"] <= budget


def shapes_in(fig: dict) -> int:
    """Slices sent (hover points) plus non-empty occupancy cells, counted from the figure's data."""
    n = 0
    for t in fig["data"]:
        if t.get("meta") == "hover":
            n += len(t["x"])
        elif t.get("meta") == "occupancy":
            n += int(np.count_nonzero(~np.isnan(np.asarray(t["z"], float))))
    return n


def test_runs_closer_than_a_pixel_merge_per_lane():
    a = np.array([0.0, 1.05, 3.0, 0.0, 0.5])
    b = np.array([1.0, 2.0, 4.0, 0.2, 0.6])
    lane = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
    ra, rb, rl = merge_runs(a, b, lane, 0.1)
    assert ra.tolist() == [0.0, 3.0, 0.0, 0.5] and rb.tolist() == [2.0, 4.0, 0.2, 0.6]
    assert rl.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_counter_tracks_are_downsampled_and_keep_their_peak(store):
    ds = store.entries[0].dataset
    key = max(ds.counters.series, key=lambda k: len(ds.counters.series[k][0]))
    ts, value = ds.counters.series[key]
    x, y = ds.counters.window(key, int(ts[0]), int(ts[-1]), n_out=100)
    assert len(x) <= 100 < len(ts)
    assert y.max() == value.max()


def test_device_stream_markers_share_the_streams_lane(store):
    index = store.entries[0].dataset.lanes
    labels = [ln.label for ln in index.lanes_of([0])]
    # Rank 0 of bert-train-dp: its host thread, then its two device streams (event records and
    # waits that run on a stream are on that stream's lane, not a lane of their own).
    assert labels == ["r0 rank 0 (2)", "r0 dev 0 stream 1", "r0 dev 0 stream 2"]


# ------------------------------------------------------------------ safety (no browser)

def test_hostile_names_are_escaped_in_every_label(tmp_path):
    ds = Store.open([hostile_trace(tmp_path / "t.json")]).entries[0].dataset
    fig = timeline_figure(ds, None, *ds.span)
    ticks = fig["layout"]["yaxis"]["ticktext"]
    hover = [h for t in fig["data"] if t.get("meta") == "hover" for h in t["hovertext"]]
    assert ticks == ["r0 &lt;b&gt;bold&lt;/b&gt; (1)", "r0 dev 0 stream 7"]
    assert [h.split("<br>")[0] for h in hover] == ["<b>cudaLaunchKernel</b>",
                                                    "<b>&lt;img src=x onerror=alert(1)&gt;</b>", "<b>gemm</b>"]


def test_a_corrupt_trace_becomes_a_one_line_error_and_the_others_load(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": ')
    s = Store.open([bad, LEAK])
    assert s.entries[0].dataset is None and s.entries[1].dataset is not None
    assert "bad.json" in s.entries[0].error and "\n" not in s.entries[0].error


def test_requests_never_open_a_path(store, monkeypatch):
    import dash

    import dashboard.data as data

    app = create_app(store)
    opened = []
    monkeypatch.setattr(data, "load_trace", lambda p: opened.append(p))
    layout = next(p["layout"] for p in dash.page_registry.values() if p["path"] == "/timeline")
    with app.server.test_request_context("/timeline"):
        for trace in ("../../../../etc/passwd", "/etc/passwd", "7", "-1", "1"):
            html = str(layout(trace=trace))
            assert "passwd" not in html
    assert opened == []


# ------------------------------------------------------------------ the command

def test_missing_trace_is_a_one_line_error_with_exit_2(tmp_path):
    r = runner.invoke(cli, ["dashboard", str(tmp_path / "nope.json")])
    assert r.exit_code == 2
    assert r.output.strip() == f"msprof-py: error: {tmp_path / 'nope.json'}: no such file or directory"


@pytest.mark.parametrize("port", ["0", "70000"])
def test_bad_port_is_a_one_line_error_with_exit_2(port):
    r = runner.invoke(cli, ["dashboard", str(LEAK), "--port", port])
    assert r.exit_code == 2
    assert r.output.strip() == f"msprof-py: error: --port must be 1..65535, got {port}"


def test_it_serves_on_loopback_with_debug_off(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "dashboard", str(LEAK), "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Debug mode" in line:
                break
        assert f"dashboard: http://127.0.0.1:{port}/  (Ctrl+C stops it)\n" in lines
        assert any("Debug mode: off" in ln for ln in lines)
        assert wait_for_page(proc, f"http://127.0.0.1:{port}/timeline").startswith(b"<!DOCTYPE html>")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def wait_for_page(proc: subprocess.Popen, url: str, timeout: float = 30.0) -> bytes:
    """The page's body once the server answers (it binds its socket just after its banner)."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url) as resp:
                assert resp.status == 200
                return resp.read()
        except urllib.error.URLError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# ------------------------------------------------------------------ in the browser

def plot_state(duo) -> dict:
    return duo.driver.execute_script(
        "const gd = document.querySelector('#tl-graph .js-plotly-plot');"
        "return gd && gd.layout && gd.layout.meta ? {range: gd.layout.xaxis.range, meta: gd.layout.meta,"
        " annotations: (gd.layout.annotations || []).length, data: gd.data.map(t => ({meta: t.meta,"
        " n: t.meta === 'hover' ? t.x.length : 0,"
        " cells: t.meta === 'occupancy' ? [].concat(...t.z).filter(v => v !== null && !isNaN(v)).length : 0}))}"
        " : null;")


def wait_plot(duo, predicate, timeout: int = 20) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    holder = {}

    def ready(_):
        st = plot_state(duo)
        if st and predicate(st):
            holder["state"] = st
            return True
        return False

    WebDriverWait(duo.driver, timeout).until(ready)
    return holder["state"]


def test_every_page_opens_without_console_errors(dash_duo, store):
    dash_duo.start_server(create_app(store))
    for path, selector in PAGES.items():
        dash_duo.wait_for_page(f"{dash_duo.server_url}{path}")
        dash_duo.wait_for_element(selector, timeout=20)
        assert dash_duo.driver.find_elements("css selector", ".error-panel") == []
    # The nav keeps the trace the user picked.
    dash_duo.wait_for_page(f"{dash_duo.server_url}/memory?trace=1")
    dash_duo.wait_for_element("#mem-curves", timeout=20)
    assert dash_duo.find_element("#nav-timeline").get_attribute("href").endswith("/timeline?trace=1")
    # The pages draw with the dashboard's plotly.js bundle, never Dash's full plotly.min.js.
    scripts = dash_duo.driver.execute_script(
        "return [window.Plotly && Plotly.version, performance.getEntriesByType('resource').map(e => e.name)]")
    assert scripts[0] == get_plotlyjs_version()
    assert [u for u in scripts[1] if "plotly" in u.rsplit("/", 1)[-1]] == [dash_duo.server_url + PLOTLY_ROUTE]
    assert console_errors(dash_duo) == []


def test_the_plotly_bundle_matches_the_plotly_package():
    # A plotly upgrade without a rebuilt bundle (dashboard/js/README.md) fails here.
    assert PLOTLY_BUNDLE.is_file(), f"rebuild {PLOTLY_BUNDLE.name} as dashboard/js/README.md says"
    head = PLOTLY_BUNDLE.read_text(encoding="utf-8")[:200]
    assert head.startswith(f"/*! plotly.js v{get_plotlyjs_version()} (core, bar, heatmap, scattergl)")


def test_clicking_a_finding_opens_the_timeline_on_its_window(dash_duo, store):
    ds = store.entries[0].dataset
    f = ds.findings[0]
    occ = [(o["ts_ns"], o["ts_ns"] + o["dur_ns"]) for o in f["occurrences"]]
    assert occ, "bert-train-dp's top finding is a bubble with occurrences"
    dash_duo.start_server(create_app(store))
    dash_duo.wait_for_page(f"{dash_duo.server_url}/")
    dash_duo.find_element("#ov-finding-0").click()
    st = wait_plot(dash_duo, lambda s: True)
    assert "finding=0" in dash_duo.driver.current_url
    a, b = st["meta"]["window_ns"]
    # The view is the finding's most telling evidence (its longest idle piece) with a margin,
    # inside one of its occurrences, not the whole trace.
    ev = f["evidence"][0]
    assert a <= ev["ts"] and ev["ts"] + ev["dur"] <= b
    assert any(s < b and e > a for s, e in occ)
    assert b - a < (ds.span[1] - ds.span[0]) / 2
    origin = ds.span[0]
    assert st["range"] == pytest.approx([(a - origin) / 1e6, (b - origin) / 1e6])
    assert dash_duo.find_element("#tl-finding").text.startswith(f"#1 {f['code']}:")
    # The view opens on every rank the finding involves (a problem found on all the job's ranks).
    involved = sorted({f["rank"], *f["ranks"]})
    assert len(involved) > 1
    assert dash_duo.find_element("#rank-select").text.startswith("".join(f"rank {r}" for r in involved))
    assert console_errors(dash_duo) == []


def test_the_findings_lane_shows_every_finding_and_opens_one(dash_duo, store):
    ds = store.entries[1].dataset  # resnet50-infer-leak: one rank, so every finding is on it
    dash_duo.start_server(create_app(store))
    dash_duo.wait_for_page(f"{dash_duo.server_url}/timeline?trace=1")
    st = wait_plot(dash_duo, lambda s: True)
    marks = dash_duo.driver.execute_script(
        "const gd = document.querySelector('#tl-graph .js-plotly-plot');"
        "return gd.data.filter(t => t.name === 'findings').flatMap(t => t.customdata.map(c => c[1]));")
    assert sorted(marks) == list(range(len(ds.findings)))
    last = len(ds.findings) - 1
    dash_duo.driver.execute_script("""
        const gd = document.querySelector('#tl-graph .js-plotly-plot');
        const c = gd.data.findIndex(t => t.name === 'findings' && t.customdata.some(d => d[1] === arguments[0]));
        const p = gd.data[c].customdata.findIndex(d => d[1] === arguments[0]);
        gd.emit('plotly_click', {points: [{curveNumber: c, pointNumber: p, x: gd.data[c].x[p], y: -1,
                                            customdata: gd.data[c].customdata[p], data: gd.data[c],
                                            fullData: gd._fullData[c]}]});""", last)
    dash_duo.wait_for_contains_text("#tl-finding", f"#{last + 1} {ds.findings[last]['code']}:", timeout=20)
    assert f"finding={last}" in dash_duo.driver.current_url
    assert st["meta"]["shapes"] >= len(ds.findings)
    assert console_errors(dash_duo) == []


def test_zooming_keeps_the_shapes_under_the_limit(dash_duo):
    s = Store.open([BERT])
    s.max_shapes = 2_000
    dash_duo.start_server(create_app(s))
    dash_duo.wait_for_page(f"{dash_duo.server_url}/timeline?rank=all")
    st = wait_plot(dash_duo, lambda s: True)
    assert st["meta"]["lanes_occupancy"] > 0  # 12k slices do not fit 2,000 shapes
    first = st["meta"]["window_ns"]
    # Count the full redraws: a zoom is drawn by plotly itself, then once with the server's figure
    # (never re-plotted in between, as a dcc.Graph would).
    dash_duo.driver.execute_script(
        "window.__reacts = 0; const r = Plotly.react;"
        "Plotly.react = function(...a) { window.__reacts += 1; return r.apply(this, a); };")
    for zoom in range(1, 8):
        x0, x1 = st["range"]
        mid, quarter = (x0 + x1) / 2, (x1 - x0) / 4
        dash_duo.driver.execute_script(
            "Plotly.relayout(document.querySelector('#tl-graph .js-plotly-plot'), {'xaxis.range': arguments[0]});",
            [mid - quarter, mid + quarter])
        before = st["meta"]["window_ns"]
        st = wait_plot(dash_duo, lambda s, before=before: s["meta"]["window_ns"] != before)
        sent = sum(t["n"] + t["cells"] for t in st["data"])
        assert sent == st["meta"]["shapes"] <= 2_000
        assert dash_duo.driver.execute_script("return window.__reacts") == zoom
    assert st["meta"]["window_ns"][1] - st["meta"]["window_ns"][0] < (first[1] - first[0]) / 100
    # Zoomed in 128x, every lane shows its real events.
    assert st["meta"]["lanes_occupancy"] == 0
    dash_duo.find_element("#tl-reset").click()
    st = wait_plot(dash_duo, lambda s: s["meta"]["window_ns"] == first)
    assert console_errors(dash_duo) == []


def test_selecting_a_launch_draws_its_flow_to_the_kernel(dash_duo, tmp_path):
    s = Store.open([hostile_trace(tmp_path / "t.json")])
    dash_duo.start_server(create_app(s))
    dash_duo.wait_for_page(f"{dash_duo.server_url}/timeline")
    st = wait_plot(dash_duo, lambda s: True)
    assert st["annotations"] == 0
    # A click on the launch (what plotly reports for a click on its hover point).
    dash_duo.driver.execute_script("""
        const gd = document.querySelector('#tl-graph .js-plotly-plot');
        const c = gd.data.findIndex(t => t.meta === 'hover' && t.name === 'launch');
        gd.emit('plotly_click', {points: [{curveNumber: c, pointNumber: 0, x: gd.data[c].x[0], y: gd.data[c].y[0],
                                            customdata: gd.data[c].customdata[0], data: gd.data[c],
                                            fullData: gd._fullData[c]}]});""")
    dash_duo.wait_for_contains_text("#tl-selected", "cudaLaunchKernel", timeout=20)
    st = wait_plot(dash_duo, lambda s: s["annotations"] == 1)
    assert XSS in dash_duo.find_element("#tl-selected").text  # the linked kernel, literally
    assert console_errors(dash_duo) == []


def test_hostile_names_render_literally(dash_duo, tmp_path):
    s = Store.open([hostile_trace(tmp_path / "t.json")])
    dash_duo.start_server(create_app(s))
    dash_duo.wait_for_page(f"{dash_duo.server_url}/timeline")
    wait_plot(dash_duo, lambda s: True)
    ticks = [t.text for t in dash_duo.driver.find_elements("css selector", "#tl-graph .ytick text")]
    assert f"r0 {BOLD} (1)" in ticks
    # Move the mouse over the kernel (as the browser reports it to plotly): the label shows the
    # name as characters.
    dash_duo.driver.execute_script("""
        const gd = document.querySelector('#tl-graph .js-plotly-plot'), fl = gd._fullLayout;
        const c = gd.data.findIndex(t => t.meta === 'hover' && t.name === 'kernel');
        const r = gd.getBoundingClientRect();
        const x = r.left + fl.xaxis._offset + fl.xaxis.l2p(gd.data[c].x[0]);
        const y = r.top + fl.yaxis._offset + fl.yaxis.l2p(gd.data[c].y[0]);
        gd.querySelector('.nsewdrag').dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y,
                                                                                 bubbles: true}));""")
    dash_duo.wait_for_contains_text("#tl-graph .hoverlayer", XSS, timeout=20)
    assert dash_duo.driver.execute_script("return document.querySelectorAll('img').length") == 0
    assert dash_duo.driver.execute_script("return document.querySelectorAll('#tl-graph b').length") == 0
    assert console_errors(dash_duo) == []


def test_a_corrupt_trace_shows_an_error_panel_not_a_traceback(dash_duo, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_bytes(b"\x00\x01 not a trace")
    s = Store.open([bad, LEAK])
    dash_duo.start_server(create_app(s))
    for path in ("/", "/timeline", "/findings"):
        dash_duo.wait_for_page(f"{dash_duo.server_url}{path}")
        panel = dash_duo.wait_for_element(".error-panel", timeout=20)
        assert "broken.json" in panel.text and "\n" not in panel.text.strip()
        assert "Traceback" not in dash_duo.driver.page_source
    # The other trace is one pick away.
    dash_duo.wait_for_page(f"{dash_duo.server_url}/?trace=1")
    dash_duo.wait_for_element("#ov-span", timeout=20)
    assert re.search(r"\d", dash_duo.find_element("#ov-span").text)
    assert console_errors(dash_duo) == []


# ------------------------------------------------------------------ real traces

def test_every_page_draws_every_real_trace(real_traces):
    """Each page's layout on each real trace (Kineto CUDA / ROCm / NCCL, torch_npu): no error
    panel, and a whole-trace timeline within the shape budget."""
    import dash

    paths = sorted((real_traces / "kineto").glob("*.json.gz")) + [real_traces / "ascend" / "torch_npu_trace_view.json.gz"]
    s = Store.open(paths)
    app = create_app(s)
    layouts = {p["path"]: p["layout"] for p in dash.page_registry.values()}
    assert set(layouts) == set(PAGES)
    for entry in s.entries:
        assert entry.error is None, entry.error
        with app.server.test_request_context("/"):
            for path, layout in layouts.items():
                tree = str(layout(trace=str(entry.index)))
                assert "error-panel" not in tree, (entry.label, path)
        ds = entry.dataset
        fig = timeline_figure(ds, None, *ds.span)
        assert shapes_in(fig) == fig["layout"]["meta"]["shapes"] <= 20_000
        assert fig["layout"]["meta"]["lanes_events"] + fig["layout"]["meta"]["lanes_occupancy"] == len(ds.lanes.lanes)


def test_compare_draws_both_breakdowns_on_one_scale(store):
    from dashboard.pages import compare

    tree = compare.layout(store, store.entries[0], {"base": "0", "new": "1"})
    graphs = {}

    def walk(node):
        if getattr(node, "id", None) in ("compare-breakdown-base", "compare-breakdown-new"):
            graphs[node.id] = node.figure
        children = getattr(node, "children", None)
        for child in children if isinstance(children, (list, tuple)) else [children]:
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)

    walk(tree)
    assert set(graphs) == {"compare-breakdown-base", "compare-breakdown-new"}
    longest = max(r["step_ns"] for e in store.entries for r in e.dataset.report["breakdown"]) / 1e6
    assert graphs["compare-breakdown-base"].layout.yaxis.range == graphs["compare-breakdown-new"].layout.yaxis.range
    assert graphs["compare-breakdown-base"].layout.yaxis.range[1] == pytest.approx(longest * 1.05)


def test_a_findings_evidence_is_outlined_on_its_lane():
    from dashboard.pages.timeline import finding_highlight, padded

    ds = Store.open([SAMPLES / "yolo-pipeline-no-triple-buffer" / "trace"]).entries[0].dataset
    (i, f), = [(i, f) for i, f in enumerate(ds.findings) if f["code"] == "SYNC_STALL"]
    h, _ = finding_highlight(ds, i)
    t0, t1 = padded(h.start_ns, h.end_ns, ds.span)
    fig = timeline_figure(ds, None, t0, t1, highlight=h)
    (ev,) = [t for t in fig["data"] if t.get("meta") == "evidence"]
    boxes = np.asarray(ev["x"], float).reshape(-1, 6)
    # The stalled synchronize calls in the window, as the finding lists them.
    want = sorted((e["ts"], e["ts"] + e["dur"]) for e in f["evidence"] if e["ts"] <= t1 and e["ts"] + e["dur"] >= t0)
    origin = ds.span[0]
    got = sorted(zip(boxes[:, 0], boxes[:, 1]))
    assert len(got) == len(want) >= 1
    assert np.allclose(got, [((a - origin) / 1e6, (b - origin) / 1e6) for a, b in want], rtol=0, atol=1e-9)
    # On the host thread's lane (the first lane), where the calls are.
    assert set(np.asarray(ev["y"], float).reshape(-1, 6)[:, 0] + 0.45) == {0.0}
