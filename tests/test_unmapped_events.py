"""What an importer did not understand is said, not lost: `info` and the report list each category
or event shape kept only as generic rows (kind marker), with its exact count, from the trace table
itself (so from a stored Parquet table too).

tests/data/kineto_unknown_category.json is a hand-written Kineto trace of one step: 3 kernels and
their launches, beside 6 events of a category no Kineto build writes ("gpu_hw_counters": 5 slices
on the device's track without the "device" / "stream" args device work carries, and an instant)
and one CPU op written as a "B" / "E" pair (a known category in a phase the importer does not
read). Its markers that are meant (the profiler's own span, its "Iteration Start" instant) are not
listed.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msprof_py import report
from msprof_py.cli import app
from msprof_py.summary import UNMAPPED_TITLE, summarize, unmapped
from msprof_py.trace import import_bytes, import_trace, read_trace, write_trace

runner = CliRunner()
FIXTURE = Path(__file__).parent / "data" / "kineto_unknown_category.json"
UNKNOWN = "6 events of unknown category 'gpu_hw_counters'"
PAIR = "2 begin/end events ('B', 'E') of category 'cpu_op', a shape the importer does not read"


def _listing(trace) -> list[tuple[int, str | None, tuple[str, ...], str, str]]:
    return [(u.count, u.category, u.phases, u.reason, u.message) for u in unmapped(trace.table, trace.meta.source_format)]


def _kinds(trace) -> dict[str, int]:
    return summarize(trace).kinds


# ---------------------------------------------------------------- the fixture: listed, kernels kept

def test_unknown_category_and_unread_shape_are_listed_with_exact_counts():
    trace = import_trace(FIXTURE)
    assert _listing(trace) == [
        (6, "gpu_hw_counters", ("X", "i"), "category", UNKNOWN),
        (2, "cpu_op", ("B", "E"), "phase", PAIR),
    ]
    # The device work beside them is read as such: the 3 kernels, their launches, the step.
    assert _kinds(trace) == {"marker": 10, "kernel": 3, "api": 3, "launch": 3, "meta": 2, "step": 1}


def test_listing_comes_from_the_stored_table(tmp_path):
    """Written to Parquet and read back (typed columns only, as `info` reads them), the table
    still says what was not understood: kind, cat and ph are all it needs."""
    trace = import_trace(FIXTURE)
    write_trace(trace, tmp_path / "t.parquet")
    stored = read_trace(tmp_path / "t.parquet", columns=["kind", "cat", "ph"])
    assert stored.meta.source_format == "kineto"
    assert _listing(stored) == _listing(trace)


def test_info_lists_them_in_text_and_json():
    text = runner.invoke(app, ["info", str(FIXTURE)])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    at = lines.index(f"{UNMAPPED_TITLE}:")
    assert lines[at + 1: at + 3] == [f"  {UNKNOWN}", f"  {PAIR}"]
    doc = json.loads(runner.invoke(app, ["info", str(FIXTURE), "--json"]).stdout)
    assert doc["unmapped"] == [
        {"count": 6, "category": "gpu_hw_counters", "phases": ["X", "i"], "reason": "category", "message": UNKNOWN},
        {"count": 2, "category": "cpu_op", "phases": ["B", "E"], "reason": "phase", "message": PAIR},
    ]


def test_info_on_a_stored_table_lists_them(tmp_path):
    out = tmp_path / "job"
    imported = runner.invoke(app, ["import", str(FIXTURE), "-o", str(out)])
    assert imported.exit_code == 0, imported.output
    doc = json.loads(runner.invoke(app, ["info", str(out), "--json"]).stdout)
    assert [u["message"] for u in doc["unmapped"]] == [UNKNOWN, PAIR]


def test_report_lists_them_in_markdown_html_and_json():
    rep = report.build(import_trace(FIXTURE), timelines=0)
    assert [u["message"] for u in rep["unmapped"]] == [UNKNOWN, PAIR]
    md = report.to_markdown(rep).splitlines()
    at = md.index("## Events not understood")
    assert md[at + 2] == f"{report.UNMAPPED_NOTE}:"
    assert md[at + 4: at + 6] == [f"- {UNKNOWN}", f"- {PAIR}"]
    html = report.to_html(rep)
    assert ("<ul class=\"unmapped\"><li>6 events of unknown category &#39;gpu_hw_counters&#39;</li>"
            "<li>2 begin/end events (&#39;B&#39;, &#39;E&#39;) of category &#39;cpu_op&#39;, a shape the importer "
            "does not read</li></ul>") in html
    assert json.loads(report.to_json(rep))["unmapped"][0] == {
        "count": 6, "category": "gpu_hw_counters", "phases": ["X", "i"], "reason": "category", "message": UNKNOWN}


# ---------------------------------------------------------------- real traces

def test_real_traces_with_only_meant_markers_list_nothing(real_traces):
    """mi300_resnet_ddp_rank0 keeps 24 markers (21 gpu_user_annotation mirrors, Kineto's 2 instants,
    its profiler span), the torch_npu rank 382 (its Overlap Analysis slices): all meant."""
    for path, markers in ((real_traces / "kineto" / "mi300_resnet_ddp_rank0.json.gz", 24),
                          (real_traces / "ascend" / "resnet_2rank_level1_text" / "rank0_ascend_pt", 382)):
        trace = import_trace(path)
        assert _kinds(trace)["marker"] == markers
        assert _listing(trace) == []
        rep = report.build(trace, timelines=0)
        assert rep["unmapped"] == []
        assert "## Events not understood" not in report.to_markdown(rep)
        assert "Events not understood" not in report.to_html(rep)
    text = runner.invoke(app, ["info", str(real_traces / "kineto" / "mi300_resnet_ddp_rank0.json.gz")]).stdout
    assert UNMAPPED_TITLE not in text


def _tiny_base(real_traces) -> dict:
    with gzip.open(real_traces / "kineto" / "tiny_base.json.gz", "rt") as fh:
        return json.load(fh)


def test_real_kernels_in_a_new_category_are_read_or_listed_never_lost(real_traces):
    """tiny_base's 6 kernels under a category no Kineto build writes: laid out as device work
    ("device" and "stream" args) they are still read as kernels; without those args the importer
    cannot tell them from host activity, and says so with their exact count."""
    doc = _tiny_base(real_traces)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 6
    renamed = copy.deepcopy(doc)
    for e in renamed["traceEvents"]:
        if e.get("cat") == "kernel":
            e["cat"] = "gpu_kernel_v2"
    trace = import_bytes(json.dumps(renamed).encode())
    assert _kinds(trace)["kernel"] == 6
    assert _listing(trace) == []
    for e in renamed["traceEvents"]:
        if e.get("cat") == "gpu_kernel_v2":
            del e["args"]["device"], e["args"]["stream"]
    trace = import_bytes(json.dumps(renamed).encode())
    assert "kernel" not in _kinds(trace)
    assert _listing(trace) == [(6, "gpu_kernel_v2", ("X",), "category", "6 events of unknown category 'gpu_kernel_v2'")]


# ---------------------------------------------------------------- other importers

def test_generic_chrome_trace_lists_every_category_it_kept_as_markers():
    """Device work in a layout no importer recognises (PyTorch 1.8's categories without its host
    ones) falls to the generic Chrome importer, which reads phases only: every category it kept
    as markers is listed, the instant's too; its counter and metadata are read."""
    events = [{"ph": "X", "cat": "Kernel", "name": f"k{i}", "pid": 0, "tid": "stream 7", "ts": 10 * i, "dur": 5,
               "args": {"device": 0, "stream": 7}} for i in range(4)]
    events += [{"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "stream 7", "ts": 50, "dur": 3},
               {"ph": "i", "cat": "Kernel", "name": "mark", "pid": 0, "tid": 1, "ts": 60, "s": "t"},
               {"ph": "X", "name": "untitled", "pid": 1, "tid": 1, "ts": 0, "dur": 70},
               {"ph": "C", "name": "load", "pid": 1, "tid": 1, "ts": 0, "args": {"v": 1}},
               {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    trace = import_bytes(json.dumps(events).encode())
    assert trace.meta.source_format == "chrome"
    assert _listing(trace) == [
        (5, "Kernel", ("X", "i"), "category", "5 events of unknown category 'Kernel'"),
        (1, None, ("X",), "category", "1 event with no category"),
        (1, "Memcpy", ("X",), "category", "1 event of unknown category 'Memcpy'"),
    ]


def test_ascend_lists_shapes_it_does_not_read_and_not_its_overlap_slices():
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "M", "name": "process_name", "pid": 3, "tid": 0, "args": {"name": "Overlap Analysis"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": "10.000", "dur": 5},
        {"ph": "X", "name": "Add", "pid": 2, "tid": 4, "ts": "12.000", "dur": 2, "args": {"Task Type": "AI_VECTOR_CORE"}},
        {"ph": "X", "name": "Computing", "pid": 3, "tid": 0, "ts": "12.000", "dur": 2},
        {"ph": "b", "cat": "async_npu", "name": "wait", "pid": 1, "tid": 1, "ts": "11.000", "id": 7},
        {"ph": "e", "cat": "async_npu", "name": "wait", "pid": 1, "tid": 1, "ts": "12.000", "id": 7},
        {"ph": "n", "cat": "async_npu", "name": "wait", "pid": 1, "tid": 1, "ts": "11.500", "id": 7},
    ]
    trace = import_bytes(json.dumps(events).encode())
    assert trace.meta.source_format == "ascend"
    assert _kinds(trace)["marker"] == 4  # the Overlap Analysis slice and the async events
    assert _listing(trace) == [
        (3, "async_npu", ("b", "e", "n"), "phase",
         "3 async events ('b', 'e', 'n') of category 'async_npu', a shape the importer does not read")]


@pytest.mark.parametrize("fmt", ["emulator", "msprof", "unknown"])
def test_tables_no_foreign_importer_made_list_nothing(fmt):
    """The emulator's (and msprof's own) tables: their producer chose every kind."""
    trace = import_trace(FIXTURE)
    assert unmapped(trace.table, fmt) == ()
