"""The dashboard's memory and communication pages: their figure builders and layouts on sample
traces, each number checked against one worked out here from the trace table with pandas, and
the two pages in a headless browser.

Samples: resnet50-infer-leak (a layer-4 buffer kept every step), llm-train-2server-slow-link
(16 ranks, rank 0's and rank 8's RoCE NICs at 25%), bert-train-dp-slow-rank (8 ranks, rank 3
late at the AllReduces), and a hand-built Kineto trace with only `[memory]` instants, a failed
allocation and counters named like an HTML tag.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from dash.exceptions import PreventUpdate
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from dashboard.data import Dataset, Store
from dashboard.figures_resources import (
    MAX_POINTS,
    MiB,
    Series,
    allocation_series,
    bandwidth_figure,
    counter_series,
    downsample,
    fragmentation,
    leak_fits,
    link_matrices,
    link_series,
    memory_figure,
    op_rate_series,
    rate_steps,
    wait_matrix,
)
from dashboard.pages import communication, memory, overview
from msprof_py.trace import import_bytes

ROOT = Path(__file__).resolve().parents[1]
LEAK = ROOT / "sample_traces/emulated/resnet50-infer-leak/trace"
SLOW_LINK = ROOT / "sample_traces/emulated/llm-train-2server-slow-link/trace"
SLOW_RANK = ROOT / "sample_traces/emulated/bert-train-dp-slow-rank/trace"
XSS = "<img src=x onerror=alert(1)>"
ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"
MiB_INT = 1 << 20


@pytest.fixture(scope="module")
def store() -> Store:
    return Store.open([LEAK, SLOW_LINK, SLOW_RANK])


@pytest.fixture(scope="module")
def leak(store) -> Dataset:
    return store.entries[0].dataset


@pytest.fixture(scope="module")
def slow_link(store) -> Dataset:
    return store.entries[1].dataset


@pytest.fixture(scope="module")
def slow_rank(store) -> Dataset:
    return store.entries[2].dataset


def kineto_trace():
    """Five ProfilerStep#s; each allocates a 4 MiB workspace and frees it, and keeps 1 MiB
    (a leak); a failed 64 MiB request; counters named like an HTML tag."""
    ev: list[dict[str, Any]] = []
    base = 1 << 40

    def mem(ts, addr, nbytes, total):
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Device Type": 1, "Device Id": 0, "Addr": addr, "Bytes": nbytes, "Total Allocated": total}}

    for k in range(5):
        t0 = 1000 + 1000 * k
        ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": t0,
                "dur": 900},
               mem(t0 + 100, base + 10 * MiB_INT, 4 * MiB_INT, (k + 4) * MiB_INT),
               mem(t0 + 200, base + k * MiB_INT, MiB_INT, (k + 5) * MiB_INT),
               mem(t0 + 300, base + 10 * MiB_INT, -4 * MiB_INT, (k + 1) * MiB_INT),
               {"ph": "C", "name": f"{XSS} reserved", "pid": 1, "tid": 0, "ts": t0 + 100,
                "args": {"bytes": (k + 8) * MiB_INT}},
               {"ph": "C", "name": f"{XSS}.hccs GB/s", "pid": 1, "tid": 0, "ts": t0 + 100, "args": {"GB/s": 3.0}},
               {"ph": "C", "name": f"{XSS}.hccs GB/s", "pid": 1, "tid": 0, "ts": t0 + 400, "args": {"GB/s": 0.0}}]
    ev.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[OutOfMemory]", "pid": 1, "tid": 1,
               "ts": 6500, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 64 * MiB_INT,
                                    "Total Allocated": 6 * MiB_INT}})
    return import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode())


@pytest.fixture(scope="module")
def kineto() -> Store:
    return Store.of({"kineto-xss": Dataset.from_trace(kineto_trace())})


def table(ds: Dataset) -> pd.DataFrame:
    df = ds.trace.table.select(["rank", "ph", "name", "kind", "ts", "dur", "device", "stream", "corr", "bytes",
                                "value"]).to_pandas()
    for c in ("ph", "name", "kind"):
        df[c] = df[c].astype(str)
    return df


# ---------------------------------------------------------------- component helpers


def walk(component) -> list[Any]:
    """The component and everything under it, text children included."""
    out = [component]
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        for c in children:
            out += walk(c)
    elif isinstance(children, str):
        out.append(children)
    elif children is not None:
        out += walk(children)
    return out


def by_id(layout) -> dict[str, Any]:
    return {c.id: c for c in walk(layout) if getattr(c, "id", None)}


def texts(component) -> str:
    return " ".join(c for c in walk(component) if isinstance(c, str))


def links(component) -> list[tuple[str, str]]:
    return [(c.id, c.href) for c in walk(component) if type(c).__name__ == "Link"]


def page(module, store: Store, index: int, **params):
    return module.layout(store, store.entries[index], {"trace": str(index), **params})


# ---------------------------------------------------------------- memory: data and figure


def test_allocated_curve_is_the_alloc_free_totals_and_live_the_running_sum(leak):
    df = table(leak)
    mem = df[df["kind"].isin(["alloc", "free"])].sort_values("ts", kind="stable")
    (allocated,) = [s for s in allocation_series(leak.frames.memory) if s.quantity == "allocated"]
    (live,) = [s for s in allocation_series(leak.frames.memory) if s.quantity == "live"]
    assert (allocated.rank, allocated.device) == (0, 0)
    assert allocated.x.tolist() == mem["ts"].tolist()
    assert allocated.y[-1] == mem["value"].iloc[-1] == 6455033856.0
    signed = np.where(mem["kind"] == "alloc", mem["bytes"], -mem["bytes"])
    assert live.y.tolist() == np.cumsum(signed).tolist()
    # What stays allocated at the end: the six layer-4 buffers the leak keeps.
    assert live.y[-1] == 6 * 1073742336


def test_live_bytes_at_step_ends_are_what_the_leak_fit_reads(leak):
    (live,) = [s for s in allocation_series(leak.frames.memory) if s.quantity == "live"]
    df = table(leak)
    steps = df[(df["kind"] == "step") & (df["ph"] == "X") & (df["rank"] == 0)].sort_values("ts")
    ends = (steps["ts"] + steps["dur"]).to_numpy(np.int64)
    at_end = live.y[np.searchsorted(live.x, ends, side="right") - 1]
    assert at_end.tolist() == leak.report["metrics"]["memory"]["r0.d0"]["live_at_step_end"]


def test_leak_fit_is_the_leaked_buffer_per_step_over_the_steps(leak):
    df = table(leak)
    kept = df[df["name"] == "[memory] resnet50.forward:layer4_features"]
    steps = df[(df["kind"] == "step") & (df["ph"] == "X")].sort_values("ts")
    (fit,) = leak_fits(leak.findings, leak.report["metrics"]["memory"], leak.frames.steps)
    assert leak.findings[fit.finding]["code"] == "MEMORY_LEAK"
    assert [i for i, f in enumerate(leak.findings) if f["code"] == "MEMORY_LEAK"] == [fit.finding]
    assert fit.bytes_per_step == pytest.approx(kept["bytes"].iloc[0], rel=1e-9)
    assert set(kept["bytes"]) == {1073742336} and len(kept) == fit.steps == len(steps) == 6
    assert fit.r2 == pytest.approx(1.0)
    assert fit.step_end_ns.tolist() == (steps["ts"] + steps["dur"]).astype(np.int64).tolist()
    # R^2 = 1: the line goes through every step end.
    assert fit.fitted == pytest.approx(fit.observed, rel=1e-12)
    assert fit.site == ("[memory] resnet50.forward:layer4_features", 6, 1073742336)
    assert fit.lost_bytes == leak.findings[fit.finding]["cost"]


def test_memory_counters_are_the_allocated_reserved_and_used_series(leak):
    df = table(leak)
    c = df[df["kind"] == "counter"]
    series = {s.name: s for s in counter_series(leak.frames.counters)}
    assert sorted(series) == ["Device memory allocated", "Device memory reserved", "Device memory used"]
    for name, s in series.items():
        rows = c[c["name"] == name].sort_values("ts", kind="stable")
        assert s.x.tolist() == rows["ts"].tolist() and s.y[-1] == rows["value"].iloc[-1]
    assert {s.name: s.quantity for s in series.values()} == {
        "Device memory allocated": "allocated counter", "Device memory reserved": "reserved",
        "Device memory used": "used"}


def test_memory_figure_draws_webgl_steps_and_the_fit_over_the_steps(leak):
    series = allocation_series(leak.frames.memory) + counter_series(leak.frames.counters)
    fits = leak_fits(leak.findings, leak.report["metrics"]["memory"], leak.frames.steps)
    fig = memory_figure(series, fits, leak.span[0])
    curves = [t for t in fig.data if t.type == "scattergl"]
    assert len(curves) == 5 and all(t.line.shape == "hv" for t in curves)
    (allocated,) = [t for t in curves if t.name == "allocated ([memory] events)"]
    assert allocated.y[-1] * MiB == table(leak).query("kind in ['alloc', 'free']")["value"].iloc[-1]
    (line,) = [t for t in fig.data if t.type == "scatter" and t.mode == "lines"]
    assert line.name.startswith(f"#{fits[0].finding + 1} leak fit r0 dev 0: +1,024.00 MiB/step (R² 1.000)")
    assert np.allclose(np.asarray(line.x) * 1e6 + leak.span[0], fits[0].step_end_ns)
    assert np.allclose(np.asarray(line.y) * MiB, fits[0].fitted)


def test_long_series_are_downsampled_keeping_their_extremes():
    x = np.arange(200_000, dtype=np.int64) * 1000
    y = np.sin(np.arange(200_000) / 5000.0) * 1e9 + 2e9
    y[123_457] = 9e9
    s = Series(0, 0, "allocated", "allocated", x, y)
    fig = memory_figure([s], [], 0)
    (t,) = fig.data
    assert len(t.x) <= MAX_POINTS and max(t.y) * MiB == 9e9
    bw = bandwidth_figure([Series(0, None, "HCCS (rank → rank)", "r0->r1.hccs", x, y / 1e9)] * 8, 0)
    assert all(len(t.x) <= MAX_POINTS and max(t.y) == 9.0 and t.type == "scattergl" for t in bw.data)
    short_x, short_y = downsample(x[:100], y[:100])
    assert short_x.tolist() == x[:100].tolist() and short_y.tolist() == y[:100].tolist()


def test_fragmentation_at_the_peak_of_reserved_minus_allocated(leak):
    df = table(leak)
    c = df[df["kind"] == "counter"]
    res = c[c["name"] == "Device memory reserved"].sort_values("ts", kind="stable")
    alloc = c[c["name"] == "Device memory allocated"].sort_values("ts", kind="stable")
    # Allocated as of each reserved sample, by hand.
    holes = []
    for ts, r in zip(res["ts"], res["value"]):
        before = alloc[alloc["ts"] <= ts]
        holes.append((r - (before["value"].iloc[-1] if len(before) else 0.0), ts, r))
    best = max(holes, key=lambda h: h[0])
    (fr,) = fragmentation(leak.frames.counters, leak.frames.alloc_failures, allocation_series(leak.frames.memory))
    assert (fr.rank, fr.device) == (0, 0)
    assert (fr.unallocated, fr.at_ns, fr.reserved) == best
    assert fr.allocated == fr.reserved - fr.unallocated
    assert fr.peak_allocated == alloc["value"].max()
    assert fr.failures == 0 and fr.largest_free is None


def test_failed_allocations_and_peak_from_events_without_counters(kineto):
    ds = kineto.entries[0].dataset
    series = allocation_series(ds.frames.memory)
    (fr,) = fragmentation(ds.frames.counters, ds.frames.alloc_failures, series)
    assert (fr.rank, fr.device, fr.failures, fr.requested) == (0, 0, 1, 64 * MiB_INT)
    # Kineto states no largest free block; the peak is the [memory] events' own total.
    assert fr.largest_free is None and fr.reserved is None
    assert fr.peak_allocated == 9 * MiB_INT


# ---------------------------------------------------------------- memory: page


def test_memory_page_shows_curves_the_leak_table_linking_to_its_window_and_cards(store, leak):
    lay = page(memory, store, 0)
    ids = by_id(lay)
    assert {"controls", "mem-curves", "mem-leaks", "mem-frag"} <= set(ids)
    (i,) = [i for i, f in enumerate(leak.findings) if f["code"] == "MEMORY_LEAK"]
    assert links(ids["mem-leaks"]) == [(f"mem-finding-{i}", f"/timeline?trace=0&finding={i}")]
    row = texts(ids["mem-leaks"])
    assert "r0 dev 0" in row and "1 GiB" in row and "1.000" in row and "6 GiB" in row
    assert "[memory] resnet50.forward:layer4_features (6 × 1 GiB)" in row
    cards = {c.children[1].children: c.children[0].children for c in walk(ids["mem-frag"])
             if getattr(c, "className", None) == "metric"}
    assert cards["share of reserved not allocated"] == "0.2%"
    assert cards["free in the cache (reserved − allocated)"] == "12 MiB"


def test_memory_page_respects_the_rank_selector(store, slow_link):
    fig = by_id(page(memory, store, 1, rank="3"))["mem-curves"].figure
    assert {t.legendgroup for t in fig.data} == {"r3 dev 3"}
    all_ranks = by_id(page(memory, store, 1))["mem-curves"].figure
    assert {t.legendgroup for t in all_ranks.data} == {f"r{r} dev {r % 8}" for r in slow_link.ranks}
    # Only four devices drawn at first, the others one legend click away.
    assert sum(1 for t in all_ranks.data if t.visible is True) == 4 * 5


def test_memory_page_of_a_trace_without_memory_events_says_so():
    s = Store.open([ROOT / "sample_traces/real/tiny_base.json.gz"])
    assert s.entries[0].dataset.frames.memory.empty
    ids = by_id(page(memory, s, 0))
    assert "mem-none" in ids and "mem-curves" not in ids
    assert texts(ids["mem-none"]).startswith("No memory events in this trace")


def test_memory_page_of_a_kineto_trace_escapes_counter_names_and_shows_failures(kineto):
    ds = kineto.entries[0].dataset
    ids = by_id(page(memory, kineto, 0))
    fig = ids["mem-curves"].figure
    names = [t.name for t in fig.data]
    assert f"{ESCAPED} reserved" in names and not any(XSS in (n or "") for n in names)
    assert all(XSS not in (t.hovertemplate or "") for t in fig.data)
    (i,) = [i for i, f in enumerate(ds.findings) if f["code"] == "MEMORY_LEAK"]
    assert links(ids["mem-leaks"]) == [(f"mem-finding-{i}", f"/timeline?trace=0&finding={i}")]
    cells = [texts(c) for c in walk(ids["mem-leaks"]) if type(c).__name__ == "Td"]
    assert cells[1:] == ["r0 dev 0", "1 MiB", "1.000", "5", "5 MiB", "[memory] (5 × 1 MiB)"]
    cards = {c.children[1].children: c.children[0].children for c in walk(ids["mem-frag"])
             if getattr(c, "className", None) == "metric"}
    assert cards["failed allocations"] == "1" and cards["largest failed request"] == "64 MiB"
    assert cards["largest free block"] == "-"


# ---------------------------------------------------------------- communication: data and figures


def test_link_series_are_the_gb_per_s_counters(slow_link):
    df = table(slow_link)
    c = df[(df["kind"] == "counter") & df["name"].str.endswith(" GB/s")]
    series = link_series(slow_link.counters.series)
    assert len(series) == c.groupby(["rank", "name"]).ngroups == 16 * 11
    s = next(s for s in series if s.name == "r8.roce_tx")
    rows = c[c["name"] == "r8.roce_tx GB/s"].sort_values("ts", kind="stable")
    assert s.quantity == "RoCE NIC" and s.x.tolist() == rows["ts"].tolist() and s.y.max() == 6.25
    assert {s.rank for s in link_series(slow_link.counters.series, [2, 9])} == {2, 9}


def test_link_matrices_are_communication_matrix_json_summed_over_ops(slow_link):
    from msprof_py import communication
    from msprof_py.summaries import Rows

    matrix = communication.summaries(Rows(slow_link.trace))[1]
    m = link_matrices(slow_link.communication_matrix, slow_link.ranks)
    assert m["bytes"].z.shape == (16, 16) and m["bandwidth"].z.shape == (16, 16)
    # Each cell is the sum over every op of the file's link: the page, the file and
    # communication.json's per-transport figures are one computation.
    links = [pairs[p] for steps in matrix.values() for kinds in steps.values() for ops in kinds.values()
             for pairs in ops.values() for p in pairs if p == "2-5"]
    assert links and {link["Transport Type"] for link in links} == {"HCCS"}
    size, time = sum(x["Transit Size(MB)"] for x in links), sum(x["Transit Time(ms)"] for x in links)
    assert m["bytes"].z[2, 5] == pytest.approx(size / 1024, rel=1e-12)
    assert m["bandwidth"].z[2, 5] == pytest.approx(size / time, rel=1e-12) == pytest.approx(26.7029, abs=1e-4)
    # Across servers the NIC's traffic is shared out to the peer in the same position (RDMA); the
    # slow link (rank 8's NIC at a quarter) shows a quarter of the NIC's 23.8419 MB/ms.
    assert m["bytes"].z[0, 8] > 0 and m["bandwidth"].z[0, 8] == pytest.approx(23.8419 / 4, abs=1e-3)
    assert np.isnan(m["bytes"].z[3, 3]) and np.isnan(m["bytes"].z[0, 9])


def test_wait_matrix_rows_are_each_ranks_wait_tasks_and_the_column_the_slow_rank(slow_rank):
    from analyzers.ranks import collective_parts, match_collectives

    m = wait_matrix(match_collectives(collective_parts(slow_rank.frames)), slow_rank.ranks)
    assert m.z.shape == (8, 8)
    (f,) = [f for f in slow_rank.findings if f["code"] == "SLOW_RANK"]
    assert int(np.nanargmax(np.nansum(m.z, axis=0))) == f["rank"] == 3
    # Each rank's row adds up to the time its collectives' wait tasks (sharing their corr) ran.
    df = table(slow_rank)
    colls = df[(df["kind"] == "collective") & df["corr"].notna()]
    waits = df[(df["kind"] == "wait") & (df["ph"] == "X") & df["stream"].notna()].merge(
        colls[["rank", "corr"]].drop_duplicates(), on=["rank", "corr"])
    per_rank = waits.groupby("rank")["dur"].sum().reindex(slow_rank.ranks, fill_value=0)
    assert (np.nansum(m.z, axis=1) * 1e6).round().tolist() == per_rank.astype(float).tolist()


def test_rate_steps_add_overlapping_transfers():
    x, y = rate_steps(np.array([0, 5]), np.array([10, 15]), np.array([10.0, 20.0]))
    assert x.tolist() == [0, 5, 10, 15] and y.tolist() == [1.0, 3.0, 2.0, 0.0]


def test_rate_from_ops_carries_each_streams_bytes(leak):
    df = table(leak)
    ops = df[df["kind"].isin(["memcpy", "collective"]) & (df["ph"] == "X") & df["stream"].notna()
             & (df["bytes"] > 0) & (df["dur"] > 0)]
    series = op_rate_series(leak.frames.device_ops)
    assert {(s.rank, s.device, int(s.name.split("stream ")[1].split()[0])) for s in series} == {
        (int(r), int(d), int(st)) for r, d, st in ops[["rank", "device", "stream"]].drop_duplicates().to_numpy()}
    for s in series:
        stream = int(s.name.split("stream ")[1].split()[0])
        carried = float((s.y[:-1] * np.diff(s.x)).sum())
        assert carried == pytest.approx(float(ops[ops["stream"] == stream]["bytes"].sum()), rel=1e-9)
        assert s.y[-1] == 0.0


def test_bandwidth_figure_marks_the_slow_links_red(slow_link):
    slow = {e["link"] for f in slow_link.findings if f["code"] == "SLOW_LINK" for e in f["evidence"]}
    assert slow == {"r0.roce_rx", "r0.roce_tx", "r8.roce_rx", "r8.roce_tx"}
    fig = bandwidth_figure(link_series(slow_link.counters.series), slow_link.span[0], slow=slow,
                           nominal={"r1.roce_tx": 25.0})
    curves = [t for t in fig.data if t.legendgroup != "nominal"]
    assert len(curves) == 16 * 11 and all(t.line.shape == "hv" for t in curves)
    assert {t.name for t in curves if t.line.color == "#d62728"} == slow
    assert fig.layout.meta["groups"] == ["HCCS (rank → rank)", "PCIe (host ↔ device)", "RoCE NIC"]
    (nominal,) = [t for t in fig.data if t.legendgroup == "nominal"]
    assert list(nominal.y) == [25.0, 25.0]
    # 7,040 points in all: SVG; WebGL takes over for long series.
    assert fig.layout.meta["webgl"] is False and {t.type for t in curves} == {"scatter"}


# ---------------------------------------------------------------- communication: page


def test_communication_page_lists_exactly_the_slow_link_findings(store, slow_link):
    ids = by_id(page(communication, store, 1))
    expected = [i for i, f in enumerate(slow_link.findings) if f["code"] in ("SLOW_LINK", "SLOW_RANK")]
    assert [f["code"] for f in slow_link.findings if f["code"] in ("SLOW_LINK", "SLOW_RANK")] == ["SLOW_LINK"]
    assert links(ids["comm-findings"]) == [(f"comm-finding-{i}", f"/timeline?trace=1&finding={i}") for i in expected]
    matrix = ids["comm-matrix"].figure
    assert np.asarray(matrix.data[0].z, dtype=float).shape == (16, 16)
    assert list(matrix.data[0].x) == list(matrix.data[0].y) == [f"r{r}" for r in slow_link.ranks]
    assert ids["comm-matrix-kind"].value == "bytes"
    assert [o["value"] for o in ids["comm-matrix-kind"].options] == ["wait", "bytes", "bandwidth"]
    assert ids["comm-bandwidth"].figure.layout.meta["curves"] == 16 * 11
    assert "comm-none" not in ids


def test_communication_page_of_the_slow_rank_opens_on_who_waited_for_whom(store, slow_rank):
    ids = by_id(page(communication, store, 2))
    (i,) = [i for i, f in enumerate(slow_rank.findings) if f["code"] == "SLOW_RANK"]
    assert links(ids["comm-findings"]) == [(f"comm-finding-{i}", f"/timeline?trace=2&finding={i}")]
    assert "waited for by ranks 0, 1, 2, 4, 5, 6, 7" in texts(ids["comm-findings"])
    assert ids["comm-matrix-kind"].value == "wait"
    z = np.asarray(ids["comm-matrix"].figure.data[0].z, dtype=float)
    assert z.shape == (8, 8) and int(np.nanargmax(np.nansum(z, axis=0))) == 3


def test_communication_page_respects_the_rank_selector(store):
    ids = by_id(page(communication, store, 1, rank="0,8"))
    assert np.asarray(ids["comm-matrix"].figure.data[0].z, dtype=float).shape == (2, 2)
    assert {re.match(r"r\d+", t.name).group() for t in ids["comm-bandwidth"].figure.data
            if t.legendgroup != "nominal"} == {"r0", "r8"}
    assert len(links(ids["comm-findings"])) == 1
    others = by_id(page(communication, store, 1, rank="5"))
    assert links(others["comm-findings"]) == [] and "comm-matrix-none" in others


def test_communication_page_of_one_rank_without_collectives_says_so(store, kineto):
    ids = by_id(page(communication, store, 0))
    assert texts(ids["comm-none"]) == "No communication in this trace: it has one rank and no collectives."
    assert "comm-matrix" not in ids and links(ids["comm-findings"]) == []
    # Its host-device copy links are still drawn.
    assert {t.name for t in ids["comm-bandwidth"].figure.data if t.legendgroup != "nominal"} == {
        "r0.d0.pcie_h2d", "r0.d0.pcie_d2h"}
    names = [t.name for t in by_id(page(communication, kineto, 0))["comm-bandwidth"].figure.data]
    assert f"{ESCAPED}.hccs" in names and XSS not in " ".join(n or "" for n in names)


# ---------------------------------------------------------------- in a browser

#: What headless chromium's software WebGL logs about itself while plotly reads pixels back
#: (renderer messages, not the app's).
GL_NOISE = ("WebGL", "GL Driver Message")


def app_logs(dash_duo) -> list[dict]:
    return [e for e in dash_duo.get_logs()
            if not (e.get("source") == "rendering" and any(n in e.get("message", "") for n in GL_NOISE))]


def plot_meta(dash_duo, graph: str):
    return dash_duo.driver.execute_script(
        f"const g = document.querySelector('#{graph} .js-plotly-plot'); return g && g.layout && g.layout.meta;")


def test_browser_memory_and_communication_pages(dash_duo, store, leak):
    from dashboard.app import create_app

    dash_duo.start_server(create_app(store))
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/memory?trace=0")
    dash_duo.wait_for_element("#mem-curves .main-svg")
    (i,) = [i for i, f in enumerate(leak.findings) if f["code"] == "MEMORY_LEAK"]
    link = dash_duo.wait_for_element(f"#mem-finding-{i}")
    assert link.get_attribute("href").endswith(f"/timeline?trace=0&finding={i}")
    assert plot_meta(dash_duo, "mem-curves")["fits"] == 1
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/communication?trace=2")
    dash_duo.wait_for_element("#comm-matrix .main-svg")
    dash_duo.wait_for_element("#comm-bandwidth .main-svg")
    assert plot_meta(dash_duo, "comm-matrix")["kind"] == "wait"
    dash_duo.find_element("#comm-matrix-kind input[value='bytes']").click()
    WebDriverWait(dash_duo.driver, 10).until(lambda _: (plot_meta(dash_duo, "comm-matrix") or {}).get("kind")
                                            == "bytes")
    assert app_logs(dash_duo) == []


def test_browser_shows_trace_text_as_text(dash_duo, kineto):
    from dashboard.app import create_app

    dash_duo.start_server(create_app(kineto))
    for path, graph in (("/memory", "mem-curves"), ("/communication", "comm-bandwidth")):
        dash_duo.wait_for_page(url=f"{dash_duo.server_url}{path}?trace=0")
        dash_duo.wait_for_element(f"#{graph} .main-svg")
        legend = [e.text for e in dash_duo.driver.find_elements(By.CSS_SELECTOR, f"#{graph} .legendtext")]
        assert any(XSS in t for t in legend), legend
        # (Counted by script: an empty find_elements would sit out the driver's implicit wait.)
        assert dash_duo.driver.execute_script("return document.querySelectorAll('#page img').length") == 0
    assert app_logs(dash_duo) == []


# ---------------------------------------------------------------- overview: step time per rank
def test_overview_heatmap_is_each_ranks_step_time_and_a_click_opens_that_rank_and_step(store, slow_rank):
    ids = by_id(page(overview, store, 2))
    fig = ids["ov-steps-heatmap"].figure
    heat = fig.data[0]
    table = {(r["rank"], r["step"]): r for r in slow_rank.report["step_table"]}
    assert np.asarray(heat.z).shape == (8, 3) and list(heat.y) == [f"r{r}" for r in range(8)]
    assert list(heat.x) == ["0", "1", "2"]
    for (rank, step), r in table.items():
        assert heat.z[rank][step] == r["step_ns"] / 1e6
        assert list(heat.customdata[rank][step]) == [rank, r["start_ns"], r["end_ns"]]
    cell = {"points": [{"customdata": list(heat.customdata[3][1])}]}
    r = table[(3, 1)]
    assert overview.step_href(2, cell) == f"/timeline?trace=2&rank=3&t0={r['start_ns']}&t1={r['end_ns']}"
    with pytest.raises(PreventUpdate):
        overview.step_href(2, {"points": [{}]})
    # A single rank has no job to split: no heatmap.
    assert "ov-steps-heatmap" not in by_id(page(overview, store, 0))


def test_overview_shows_the_communication_matrix_the_communication_page_draws(store, slow_link):
    ids = by_id(page(overview, store, 1))
    z = np.asarray(ids["ov-comm-matrix"].figure.data[0].z, dtype=float)
    expected = link_matrices(slow_link.communication_matrix, slow_link.ranks)["bytes"].z
    np.testing.assert_array_equal(z, expected)
    # 16 ranks on two servers: traffic between the servers is on it (rank 0 and 8 are peers over RoCE).
    assert z.shape == (16, 16) and z[0, 8] > 0 and z[8, 0] > 0
    # One rank: no matrix.
    assert "ov-comm-matrix" not in by_id(page(overview, store, 0))


def test_a_cross_rank_finding_opens_the_timeline_with_every_rank_it_involves(store, slow_rank):
    from dashboard.pages import timeline

    (i,) = [i for i, f in enumerate(slow_rank.findings) if f["code"] == "SLOW_RANK"]
    f = slow_rank.findings[i]
    assert f["rank"] == 3 and f["ranks"] == [0, 1, 2, 4, 5, 6, 7]
    state = by_id(page(timeline, store, 2, finding=str(i)))["tl-state"].data
    assert state["ranks"] == list(range(8))  # the straggler and the ranks that waited for it
    # A finding of one rank still opens on its rank alone; a rank the URL names wins.
    (j,) = [j for j, g in enumerate(slow_rank.findings) if g["code"] == "BUBBLE_DATA"] or [None]
    if j is not None:
        g = slow_rank.findings[j]
        expected = sorted({g["rank"], *g["ranks"]})
        assert by_id(page(timeline, store, 2, finding=str(j)))["tl-state"].data["ranks"] == expected
    assert by_id(page(timeline, store, 2, finding=str(i), rank="3"))["tl-state"].data["ranks"] == [3]


def test_evidence_timelines_of_a_job_name_the_rank_of_every_lane(slow_rank):
    from msprof_py.breakdown import evidence_window, finding_ranks

    (f,) = [f for f in slow_rank.findings if f["code"] == "SLOW_RANK"]
    assert finding_ranks(f) == [3, 0, 1, 2, 4, 5, 6, 7]
    w = evidence_window(slow_rank.frames, f)
    assert w["ranks"][0] == 3 and set(w["ranks"]) == set(range(8))
    assert all(re.match(r"r\d+ ", lane) for lane in w["lanes"])
    shown = {int(re.match(r"r(\d+) ", e["lane"]).group(1)) for e in w["events"]}
    assert 3 in shown and len(shown) > 1  # the straggler and ranks that waited for it
    # A finding on one rank of the job: its lanes still say which rank.
    g = next(g for g in slow_rank.findings if g["code"] == "BUBBLE_COLLECTIVE")
    one = {**g, "ranks": [], "evidence": [e for e in g["evidence"] if e["rank"] == g["rank"]],
           "occurrences": [o for o in g["occurrences"] if o["rank"] == g["rank"]]}
    lanes = evidence_window(slow_rank.frames, one)["lanes"]
    assert lanes and all(re.match(rf"r{one['rank']} ", lane) for lane in lanes)


def test_overview_draws_the_pipeline_view_of_a_pipeline_job_only(store):
    from analyzers.causality import pipeline
    from runtime_emu import scenarios

    ds = Dataset.from_trace(scenarios.run("llm-pipeline", switches=["pipeline-bubble"], seed=0).trace)
    pipe = by_id(page(overview, Store.of({"pipe": ds}), 0))["ov-pipeline"].figure.data[0]
    assert list(pipe.y) == ["stage 0 (r0) backward", "stage 1 (r1) forward", "stage 1 (r1) backward",
                            "stage 2 (r2) forward", "stage 2 (r2) backward", "stage 3 (r3) forward"]
    assert list(pipe.x) == ["0", "1", "2", "3"]
    cells = pipeline.view_cells(pipeline.view(pipeline.own_transfers(ds.frames)))
    assert pipe.z[5][0] == cells[-4]["waited_ns"] / 1e6 and pipe.z[5][0] > 10
    # A data-parallel job has no pipeline.
    for index in range(3):
        assert "ov-pipeline" not in by_id(page(overview, store, index))
