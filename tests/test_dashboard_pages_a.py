"""The dashboard's findings, problem-lookup and compare pages: their content against the analyzers'
own output (unit tests on the layout functions), and the wiring in a headless browser."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import dash_ag_grid as dag
import pytest
from dash import dcc, html
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from analyzers.finding import lookup_table
from dashboard.app import create_app
from dashboard.data import Dataset, Entry, Store
from dashboard.pages import common, compare, findings, lookup, timeline
from msprof_py.compare import compare as compare_reports
from msprof_py.compare import cost_text

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "emulated"
LEAK = SAMPLES / "resnet50-infer-leak" / "trace"
HEALTHY = SAMPLES / "resnet50-infer" / "trace"
HOSTILE = "<img src=x onerror=alert(1)>"
ROWS = ".ag-center-cols-container .ag-row"


@pytest.fixture(scope="module")
def store() -> Store:
    return Store.open([LEAK, HEALTHY])


def _variant(ds: Dataset, **changes: Any) -> Dataset:
    """The same trace with a changed copy of its report (the original stays as loaded)."""
    rep = copy.deepcopy(ds.report)
    rep.update(changes)
    return Dataset(ds.trace, ds.frames, rep)


@pytest.fixture(scope="module")
def hostile_store(store: Store) -> Store:
    """The leak trace whose first finding's title is markup, as a kernel name can be."""
    ds = store.entries[0].dataset
    found = copy.deepcopy(ds.findings)
    found[0]["title"] = HOSTILE
    return Store.of({"hostile": _variant(ds, findings=found)})


def find(component: Any, ident: str) -> Any:
    """The component with id `ident` in a layout tree, or None."""
    if getattr(component, "id", None) == ident:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            hit = find(child, ident)
            if hit is not None:
                return hit
    return None


def texts(component: Any) -> list[str]:
    """Every text in a layout tree, in document order."""
    if component is None:
        return []
    if isinstance(component, (str, int, float)):
        return [str(component)]
    if isinstance(component, (list, tuple)):
        return [t for c in component for t in texts(c)]
    return texts(getattr(component, "children", None))


def links(component: Any) -> list[dcc.Link]:
    if isinstance(component, (list, tuple)):
        return [k for c in component for k in links(c)]
    if isinstance(component, dcc.Link):
        return [component]
    children = getattr(component, "children", None)
    return links(children) if children is not None and not isinstance(children, (str, int, float)) else []


def table_rows(table: html.Table) -> list[list[str]]:
    """The body rows of an html.Table as lists of cell texts."""
    body = next(part for part in table.children if isinstance(part, html.Tbody))
    return [[" ".join(texts(cell)) for cell in row.children] for row in body.children]


# --- findings -------------------------------------------------------------------------------------


def test_findings_grid_lists_every_finding_in_rank_order(store: Store) -> None:
    entry = store.entries[0]
    ds = entry.dataset
    page = findings.layout(store, entry, {})
    grid = find(page, "findings-grid")
    assert isinstance(grid, dag.AgGrid)
    assert len(ds.findings) == 2
    assert len(grid.rowData) == len(ds.findings)
    assert grid.rowData[0]["code"] == ds.findings[0]["code"] == "MEMORY_LEAK"
    for i, (row, f) in enumerate(zip(grid.rowData, ds.findings)):
        assert row["n"] == i + 1 and row["id"] == str(i)
        assert (row["severity"], row["title"], row["message"]) == (f["severity"], f["title"], f["message"])
        assert row["where"] == common.where(f)
        assert row["cost_text"] == common.fmt_cost(f)
        assert row["step"] == f["step"]
        assert (row["symptom"], row["cause"], row["remedy"]) == tuple(f["lookup"][k] for k in
                                                                       ("symptom", "cause", "remedy"))
    assert grid.rowData[0]["cost"] == ds.findings[0]["cost"] == 6442454016  # 6 x 1,073,742,336 B leaked
    assert grid.rowData[0]["cost_text"] == "6,140 MiB"
    # SYNC_STALL has no cost: it sorts as empty and shows "-".
    assert grid.rowData[1]["cost"] is None and grid.rowData[1]["cost_text"] == "-"
    assert grid.getRowId == "params.data.id"
    assert page.children[0].id == "controls"
    assert find(page, "findings-filter") is not None
    assert find(page, "findings-trace").data == 0


def test_findings_grid_shows_what_each_fix_saves() -> None:
    """Each time finding's fix, replayed on the trace: the grid's "fix" column and its cost."""
    entry = Store.open([SAMPLES / "yolo-pipeline-no-triple-buffer" / "trace"]).entries[0]
    grid = find(findings.layout(Store.of({"yolo": entry.dataset}), entry, {}), "findings-grid")
    assert [(r["code"], r["fix"], r["cost"]) for r in grid.rowData] == [
        ("BUBBLE_COPY", "fix: copy -> saves 11.2 ms (41.1%)", 11216744.0),
        ("BUBBLE_DATA", "fix: data -> saves 1.75 ms (6.40%)", 1747040.0),
        ("LAUNCH_BOUND", "fix: launch -> saves 0.0150 ms (0.0550%)", 15000.0),
        ("BUBBLE_SYNC", "fix: sync -> saves 0 ms (0%)", 0.0),
        ("SYNC_STALL", "-", None)]


def test_timeline_banner_of_a_finding_shows_what_its_fix_saves() -> None:
    entry = Store.open([SAMPLES / "yolo-pipeline-no-triple-buffer" / "trace"]).entries[0]
    store = Store.of({"yolo": entry.dataset})
    page = timeline.layout(store, store.entries[0], {"finding": "0"})
    assert find(page, "tl-fix").children == "fix: copy -> saves 11.2 ms (41.1%)"
    # SYNC_STALL (the last finding) has no fix of its own: no line.
    page = timeline.layout(store, store.entries[0], {"finding": str(len(entry.dataset.findings) - 1)})
    assert find(page, "tl-finding") is not None and find(page, "tl-fix") is None


def test_findings_grid_columns_render_plain_text(store: Store) -> None:
    grid = find(findings.layout(store, store.entries[0], {}), "findings-grid")
    assert [c["field"] for c in grid.columnDefs] == ["n", "severity", "code", "title", "where", "cost", "fix",
                                                     "step", "symptom", "cause", "remedy", "message"]
    assert grid.columnDefs[0]["headerName"] == "#"
    for col in [*grid.columnDefs, grid.defaultColDef]:
        assert not {"cellRenderer", "cellRendererSelector"} & set(col), col
    assert not getattr(grid, "dangerously_allow_code", False)
    assert grid.defaultColDef["filter"] == "agTextColumnFilter" and grid.defaultColDef["sortable"]
    cost = next(c for c in grid.columnDefs if c["field"] == "cost")
    assert cost["valueFormatter"] == {"function": "params.data.cost_text"}


def test_findings_click_opens_the_timeline_at_the_finding() -> None:
    assert findings.finding_href(1, {"rowId": "1", "colId": "code", "rowIndex": 0}) == "/timeline?trace=1&finding=1"
    assert findings.finding_href(0, {"rowId": "0"}) == "/timeline?trace=0&finding=0"
    assert findings.finding_href(0, None) is None
    assert findings.finding_href(0, {"rowId": None}) is None


def test_findings_of_other_ranks_are_left_out(store: Store) -> None:
    entry = store.entries[0]
    assert [r["code"] for r in findings.rows(entry, [0])] == [f["code"] for f in entry.dataset.findings]
    assert findings.rows(entry, [1]) == []
    # A finding that names no rank concerns the whole job: it stays whatever the ranks.
    assert findings._on_ranks({"rank": None, "ranks": []}, [3])
    assert findings._on_ranks({"rank": None, "ranks": [1, 3]}, [3])
    assert not findings._on_ranks({"rank": 0, "ranks": []}, [3])


def test_findings_page_without_findings_says_so(store: Store) -> None:
    clean = Store.of({"clean": _variant(store.entries[1].dataset, findings=[])})
    page = findings.layout(clean, clean.entries[0], {})
    assert find(page, "findings-grid") is None
    assert texts(find(page, "findings-none")) == ["No findings: the analyzers saw no problem in this trace."]


# --- problem lookup --------------------------------------------------------------------------------


def test_lookup_grid_is_the_whole_table_in_the_traces_platform_words(store: Store) -> None:
    entry = store.entries[0]
    assert entry.dataset.report["platform"] == "ascend"
    table = lookup_table("ascend")
    page = lookup.layout(store, entry, {})
    grid = find(page, "lookup-grid")
    assert len(grid.rowData) == len(lookup_table()) == len(table)
    assert [r["code"] for r in grid.rowData] == list(table)
    assert [c["field"] for c in grid.columnDefs] == ["code", "symptom", "cause", "remedy", "references", "count"]
    assert grid.columnDefs[-1]["headerName"] == "findings in this trace"
    row = {r["code"]: r for r in grid.rowData}
    launch = table["BUBBLE_HOST_LAUNCH"]
    assert row["BUBBLE_HOST_LAUNCH"]["symptom"] == launch.symptom != lookup_table()["BUBBLE_HOST_LAUNCH"].symptom
    assert row["BUBBLE_HOST_LAUNCH"]["references"] == "; ".join(launch.references)
    counts = {c: n for c, n in ((r["code"], r["count"]) for r in grid.rowData) if n}
    assert counts == {"MEMORY_LEAK": 1, "SYNC_STALL": 1}
    assert sum(r["count"] for r in grid.rowData) == len(entry.dataset.findings)
    for col in [*grid.columnDefs, grid.defaultColDef]:
        assert "cellRenderer" not in col
    assert find(page, "lookup-search") is not None


def test_lookup_shows_the_first_entry_with_findings_and_links_them(store: Store) -> None:
    entry = store.entries[0]
    ds = entry.dataset
    first = next(c for c in lookup_table("ascend") if any(f["lookup"]["code"] == c for f in ds.findings))
    page = lookup.layout(store, entry, {})
    assert find(page, "lookup-grid").selectedRows == {"ids": [first]}
    detail = find(page, "lookup-detail")
    linked = [i for i, f in enumerate(ds.findings) if f["lookup"]["code"] == first]
    assert linked
    assert [k.href for k in links(detail)] == [f"/timeline?trace=0&finding={i}" for i in linked]
    assert f"{first}: {lookup_table('ascend')[first].symptom}" in texts(detail)


def test_lookup_detail_of_a_chosen_entry(store: Store) -> None:
    entry = store.entries[0]
    leak = lookup.detail(entry, "MEMORY_LEAK")
    assert [k.href for k in links(leak)] == ["/timeline?trace=0&finding=0"]
    assert texts(links(leak)[0]) == [f"#1 {entry.dataset.findings[0]['title']}"]
    sync = lookup.detail(entry, "SYNC_STALL")
    assert [k.href for k in links(sync)] == ["/timeline?trace=0&finding=1"]
    none = lookup.detail(entry, "BUBBLE_COPY")
    assert links(none) == []
    assert texts(find(none, "lookup-none")) == ["No finding of resnet50-infer-leak/trace links to BUBBLE_COPY."]
    # The URL's code picks the entry shown first; a code the table lacks falls back to the default.
    assert lookup.default_code(entry, {"code": "BUBBLE_COPY"}) == "BUBBLE_COPY"
    assert lookup.default_code(entry, {"code": "<b>nope</b>"}) == lookup.default_code(entry, {})
    other = store.entries[1]
    page = lookup.layout(store, other, {"trace": "1"})
    assert [k.href for k in links(find(page, "lookup-detail"))] == ["/timeline?trace=1&finding=0"]


# --- compare ---------------------------------------------------------------------------------------


def test_compare_table_is_the_cli_diff(store: Store) -> None:
    base, new = store.entries
    diff = compare_reports(base.dataset.report, new.dataset.report)
    page = compare.layout(store, base, {})
    assert find(page, "compare-base").value == 0 and find(page, "compare-new").value == 1
    rows = table_rows(find(page, "compare-table"))
    assert [r[0] for r in rows] == [m["metric"] for m in diff["metrics"]]
    by_metric = {r[0]: r for r in rows}
    for label in ("throughput (steps/s)", "step time (ms)"):
        m = next(m for m in diff["metrics"] if m["metric"] == label)
        assert by_metric[label] == [label, f"{m['base']:,.3f}", f"{m['new']:,.3f}", f"{m['change']:+.1%}"]
    assert by_metric["throughput (steps/s)"] == ["throughput (steps/s)", "364.426", "397.162", "+9.0%"]
    assert by_metric["step time (ms)"] == ["step time (ms)", "2.744", "2.518", "-8.2%"]
    util = next(m for m in diff["metrics"] if m["metric"] == "device utilisation")
    assert by_metric["device utilisation"][1:3] == [f"{util['base']:.1%}", f"{util['new']:.1%}"]
    found = table_rows(find(page, "compare-findings"))
    assert len(found) == len(diff["findings"])
    for row, c in zip(found, diff["findings"]):
        assert row == [c["code"], f"{c['base_count']} → {c['new_count']}",
                       cost_text(c["base_cost"], c["unit"]) if c["base_count"] else "-",
                       cost_text(c["new_cost"], c["unit"]) if c["new_count"] else "-", c["status"]]
    assert found[0] == ["MEMORY_LEAK", "1 → 0", "6,140 MiB", "-", "fixed"]
    # A fixed finding's code links to the lookup in the trace that still has it.
    assert links(find(page, "compare-findings"))[0].href == "/lookup?trace=0&code=MEMORY_LEAK"


def test_compare_traces_come_from_the_url(store: Store) -> None:
    page = compare.layout(store, store.entries[0], {"base": "1", "new": "0"})
    assert (find(page, "compare-base").value, find(page, "compare-new").value) == (1, 0)
    assert "resnet50-infer/trace → resnet50-infer-leak/trace" in texts(page)
    assert compare.pick(store, {"base": "9", "new": "x"}) == (0, 1)
    assert compare.pick(store, {"base": "1"}) == (1, 0)
    # A selector reporting the value the page already shows must not reload it.
    assert compare.compare_href(store, 0, 1, "") is None
    assert compare.compare_href(store, 1, 0, "?base=1&new=0") is None
    assert compare.compare_href(store, 1, 0, "") == "/compare?base=1&new=0"
    assert compare.compare_href(store, 0, 0, "?base=0&new=1") == "/compare?base=0&new=0"


def test_compare_needs_two_traces(store: Store) -> None:
    one = Store([store.entries[0]])
    page = compare.layout(one, one.entries[0], {})
    assert texts(find(page, "compare-none")) == [compare.ONE_TRACE]
    assert compare.ONE_TRACE == ("Start the dashboard with two traces to compare them: "
                                 "msprof-py dashboard BASE NEW")
    assert find(page, "compare-table") is None


def test_compare_with_an_unreadable_trace_shows_why(store: Store, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json", encoding="utf-8")
    bad = Store.open([broken]).entries[0]
    assert bad.dataset is None and bad.error
    mixed = Store([store.entries[0], Entry(1, bad.path, bad.label, None, bad.error)])
    page = compare.layout(mixed, mixed.entries[0], {})
    panel = next(c for c in page.children if getattr(c, "className", None) == "error-panel")
    assert texts(panel) == texts(common.error_panel(bad.error))
    assert find(page, "compare-table") is None
    assert find(page, "compare-base") is not None


# --- in the browser --------------------------------------------------------------------------------


def _wait(dash_duo, condition, timeout: float = 10) -> Any:
    return WebDriverWait(dash_duo.driver, timeout).until(lambda _: condition())


def _codes(dash_duo) -> list[str]:
    """The code column of the rows a grid shows, read in one go (a filtering grid replaces its rows)."""
    return dash_duo.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", f"{ROWS} [col-id='code']")


def test_browser_findings_row_opens_timeline(dash_duo, hostile_store: Store) -> None:
    ds = hostile_store.entries[0].dataset
    dash_duo.start_server(create_app(hostile_store))
    dash_duo.wait_for_element("#nav-overview")
    dash_duo.driver.get(dash_duo.server_url + "/findings")
    dash_duo.wait_for_element(ROWS)
    _wait(dash_duo, lambda: len(_codes(dash_duo)) == len(ds.findings))
    title = dash_duo.find_element(f"{ROWS}[row-index='0'] [col-id='title']")
    # Markup from the trace is shown as its characters, never parsed.
    assert title.text == HOSTILE
    assert dash_duo.driver.find_elements(By.CSS_SELECTOR, "#findings-grid img") == []
    # The quick filter searches every column (the cost as shown, too).
    dash_duo.find_element("#findings-filter").send_keys("MiB")
    _wait(dash_duo, lambda: _codes(dash_duo) == ["MEMORY_LEAK"])
    dash_duo.find_element(f"{ROWS} [col-id='code']").click()
    _wait(dash_duo, lambda: dash_duo.driver.current_url.endswith("/timeline?trace=0&finding=0"))
    dash_duo.wait_for_element("#tl-graph")
    dash_duo.wait_for_contains_text("#tl-finding", HOSTILE)
    assert dash_duo.get_logs() == []


def _quick_match(text: str) -> list[str]:
    """The lookup codes AG Grid's quick filter keeps for `text`: rows holding every word of it."""
    words = text.lower().split()
    return [e.code for e in lookup_table("ascend").values()
            if all(w in " ".join((e.code, e.symptom, e.cause, e.remedy, *e.references)).lower() for w in words)]


def test_browser_lookup_search_filters_rows(dash_duo, store: Store) -> None:
    dash_duo.start_server(create_app(store))
    dash_duo.wait_for_element("#nav-overview")
    dash_duo.driver.get(dash_duo.server_url + "/lookup")
    dash_duo.wait_for_element(ROWS)
    dash_duo.wait_for_contains_text("#lookup-detail", "MEMORY_LEAK")
    before = len(_codes(dash_duo))
    assert _quick_match("leak") == ["MEMORY_LEAK"] and before > 1
    search = dash_duo.find_element("#lookup-search")
    search.send_keys("leak")
    _wait(dash_duo, lambda: _codes(dash_duo) == ["MEMORY_LEAK"])
    # Clicking an entry lists this trace's findings that link to it.
    search.send_keys(Keys.CONTROL, "a")
    search.send_keys(Keys.BACKSPACE, "spend much")
    assert _quick_match("spend much") == ["SYNC_STALL"]
    _wait(dash_duo, lambda: _codes(dash_duo) == ["SYNC_STALL"])
    dash_duo.find_element(f"{ROWS} [col-id='code']").click()
    dash_duo.wait_for_contains_text("#lookup-detail", "SYNC_STALL: ")
    link = dash_duo.wait_for_element("#lookup-finding-1")
    assert link.get_attribute("href").endswith("/timeline?trace=0&finding=1")
    assert dash_duo.get_logs() == []


def test_browser_compare_shows_the_diff(dash_duo, store: Store) -> None:
    diff = compare_reports(store.entries[0].dataset.report, store.entries[1].dataset.report)
    throughput = diff["metrics"][0]
    assert throughput["metric"] == "throughput (steps/s)"
    dash_duo.start_server(create_app(store))
    dash_duo.wait_for_element("#nav-overview")
    dash_duo.driver.get(dash_duo.server_url + "/compare")
    dash_duo.wait_for_element("#compare-table")
    cells = dash_duo.find_elements("#compare-table tbody tr:first-child td")
    assert [c.text for c in cells] == ["throughput (steps/s)", f"{throughput['base']:,.3f}",
                                       f"{throughput['new']:,.3f}", f"{throughput['change']:+.1%}"]
    dash_duo.wait_for_text_to_equal("#compare-findings tbody tr:first-child td:last-child", "fixed")
    assert dash_duo.driver.current_url.endswith("/compare")
    # Swapping the traces in the selectors goes through the URL, and the page follows it.
    dash_duo.find_element("#compare-base").click()
    dash_duo.find_element("[role='option'][data-option-index='1']").click()
    _wait(dash_duo, lambda: dash_duo.driver.current_url.endswith("/compare?base=1&new=1"))
    dash_duo.wait_for_element("#compare-same")
    dash_duo.find_element("#compare-new").click()
    dash_duo.find_element("[role='option'][data-option-index='0']").click()
    _wait(dash_duo, lambda: dash_duo.driver.current_url.endswith("/compare?base=1&new=0"))
    dash_duo.wait_for_text_to_equal("#compare-findings tbody tr:first-child td:last-child", "new")
    dash_duo.wait_for_contains_text("#page h3", "resnet50-infer/trace → resnet50-infer-leak/trace")
    assert dash_duo.get_logs() == []
