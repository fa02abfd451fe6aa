"""Round trips: import -> export (Chrome JSON) -> import gives the same table, on every shared real
trace and on hand-written traces with ids beyond 2**64 in every field that holds ids.

Two layers. The export as written (events plus its `msprof_py` block) must come back exactly,
every column and the metadata. The events alone (the block dropped, as a viewer or another tool
sees the file) must re-derive the same table but for what the events cannot say; each such column
is pinned below with the reason.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.trace import chrome, export_chrome, import_trace, read_trace, to_chrome_bytes
from msprof_py.trace.importers import EXPORT_KEY, from_raw
from msprof_py.trace.schema import COLUMN_NAMES, Trace
from tests.conftest import REAL_TRACES

DATA = Path(__file__).parent / "data"
BIG_IDS = [DATA / "ids_beyond_64_bits_kineto.json", DATA / "ids_beyond_64_bits_torch_npu.json"]


def real_traces() -> list[str]:
    """Every timeline under shared/real_traces (globbed: a trace added there is covered too)."""
    found = [*REAL_TRACES.glob("kineto/**/*.json*"), *REAL_TRACES.glob("ascend/**/*trace_view.json*")]
    return sorted(p.relative_to(REAL_TRACES).as_posix() for p in found)


REAL = real_traces()

_cache: dict[str, Trace] = {}


def imported(rel: str) -> Trace:
    if rel not in _cache:
        _cache[rel] = import_trace(REAL_TRACES / rel)
    return _cache[rel]


def assert_same_table(got: Trace, want: Trace, skip: tuple[str, ...] = ()) -> None:
    """Column by column, exactly (type, nulls, values), then the whole table."""
    assert got.table.column_names == want.table.column_names
    for col in COLUMN_NAMES:
        if col not in skip:
            assert got.table.column(col).equals(want.table.column(col)), col


def events_alone(trace: Trace) -> Trace:
    """The export's events imported without its `msprof_py` block."""
    raw = chrome.decode(bytearray(to_chrome_bytes(trace)), where="export")
    raw.top.pop(EXPORT_KEY)
    return from_raw(raw, where="export")


# ---------------------------------------------------------------- every shared real trace

def test_the_real_traces_are_all_there():
    # The six sources of shared/real_traces/README.md: 11 Kineto files, 8 DLRM ranks, 3 torch_npu timelines.
    assert len(REAL) == 22, REAL


@pytest.mark.parametrize("rel", REAL)
def test_export_then_import_gives_the_same_table(rel, tmp_path):
    first = imported(rel)
    out = export_chrome(first, tmp_path / "t.json.gz")
    again = import_trace(out)
    assert_same_table(again, first)
    assert again.meta == first.meta
    assert again.equals(first)


@pytest.mark.parametrize("rel", REAL)
def test_the_exported_events_alone_rederive_the_table(rel):
    """What cannot come back without the block, and why:
    - meta.origin_ns: the export writes times relative to the origin (exact, and no float
      mis-nesting in Perfetto); without the block the first event is the origin, 0.
    - `value` of torch_npu kernels: their block dims come from kernel_details.csv beside
      trace_view.json in its output folder, not from any event; an export lies elsewhere.
    The rank of a torch_npu timeline comes from profiler_info_N.json beside it too, but its HCCL
    tasks' "src rank" says the same, so it comes back (checked below)."""
    first = imported(rel)
    alone = events_alone(first)
    assert alone.meta.origin_ns == 0
    assert alone.meta.source_format == first.meta.source_format
    in_output_folder = Path(rel).parent.name == "ASCEND_PROFILER_OUTPUT"
    assert_same_table(alone, first, skip=("value",) if in_output_folder else ())
    if not in_output_folder:
        return
    value, again = first.table.column("value").to_pylist(), alone.table.column("value").to_pylist()
    kind = first.table.column("kind").to_pylist()
    differ = [i for i, (a, b) in enumerate(zip(value, again)) if a != b and not (a != a and b != b)]
    assert {kind[i] for i in differ} == {"kernel"}
    assert all(again[i] is None and value[i] >= 1 for i in differ)
    assert len(differ) == 173  # of 305 kernels: the ones kernel_details.csv gives a Block Dim above 0


@pytest.mark.parametrize("rel", REAL)
def test_the_pure_python_decoder_gives_the_same_table(rel, monkeypatch):
    """Without the native scanner (MSPROF_PY_PURE_IMPORT=1 or not built) the table is the same;
    the torch_npu timelines once crashed there (their device rows' args taken out of order)."""
    monkeypatch.setattr(chrome, "_scan", None)
    assert import_trace(REAL_TRACES / rel).equals(imported(rel))


@pytest.mark.parametrize("rank", [0, 1])
def test_torch_npu_ranks_come_back_from_the_events_alone(rank):
    rel = f"ascend/resnet_2rank_level1_text/rank{rank}_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"
    assert set(imported(rel).table.column("rank").to_pylist()) == {rank}
    assert set(events_alone(imported(rel)).table.column("rank").to_pylist()) == {rank}


def test_torch_npu_flow_ids_beyond_2_pow_64_are_written_back_as_strings():
    rel = "ascend/resnet_2rank_level1_text/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"
    source = json.loads((REAL_TRACES / rel).read_bytes())
    written = json.loads(to_chrome_bytes(imported(rel)))["traceEvents"]
    assert Counter(repr(e["id"]) for e in written if "id" in e) == Counter(
        repr(expected_id(e["id"])) for e in source if "id" in e)
    wide = [e["id"] for e in written if e.get("cat") == "HostToDevice" and isinstance(e["id"], str)]
    assert len(wide) == 374 and min(int(i) for i in wide) > 2**64


def test_cli_round_trip_of_a_torch_npu_timeline(tmp_path):
    rel = "ascend/resnet_2rank_level1_text/rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"
    runner = CliRunner()
    steps = [["import", str(REAL_TRACES / rel), "-o", str(tmp_path / "a.parquet")],
             ["export", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "a.json")],
             ["import", str(tmp_path / "a.json"), "-o", str(tmp_path / "b.parquet")]]
    for argv in steps:
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (argv, result.output)
    assert read_trace(tmp_path / "b.parquet").equals(read_trace(tmp_path / "a.parquet"))
    assert set(read_trace(tmp_path / "b.parquet").table.column("rank").to_pylist()) == {1}


# ---------------------------------------------------------------- ids beyond 2**64, every field

def expected_id(v):
    """What the export writes for a source id: a JSON number when the id is the canonical text of
    an integer in -2**63 .. 2**64 - 1, else the text, as a string."""
    text = str(v)
    canonical = text.isascii() and text.lstrip("-").isdigit() and str(int(text)) == text and text != "-0"
    return int(text) if canonical and -(2**63) <= int(text) < 2**64 else text


def id_fields(e: dict) -> dict:
    """Every field of an event that holds an id, but `id` itself: Perfetto's bind_id, id2, and the
    correlation / connection / notify / external ids in args."""
    out = {k: e[k] for k in ("bind_id", "id2") if k in e}
    args = e.get("args") or {}
    out.update({k: v for k, v in args.items() if "id" in k.lower() or "correlation" in k.lower()})
    return out


@pytest.mark.parametrize("path", BIG_IDS, ids=lambda p: p.stem)
def test_the_fixtures_hold_ids_beyond_2_pow_64_in_every_field(path):
    events = json.loads(path.read_bytes())
    events = events["traceEvents"] if isinstance(events, dict) else events
    wide = Counter()
    for e in events:
        for k, v in [("id", e.get("id")), *id_fields(e).items()]:
            inner = v.get("local") if isinstance(v, dict) else v
            if inner is not None and abs(int(inner)) >= 2**63:
                wide["string" if isinstance(inner, str) else "number", k] += 1
    want = {("number", "id"), ("string", "id")}
    want |= ({("number", "bind_id"), ("number", "id2"), ("number", "correlation"), ("number", "External id")}
             if "kineto" in path.stem else
             {("number", "connection_id"), ("string", "connection_id"), ("number", "notify_id"),
              ("string", "notify_id")})
    assert want <= set(wide), sorted(wide)


@pytest.mark.parametrize("path", BIG_IDS, ids=lambda p: p.stem)
def test_ids_beyond_2_pow_64_import_export_and_import_again(path, tmp_path):
    source = json.loads(path.read_bytes())
    events = source["traceEvents"] if isinstance(source, dict) else source
    first = import_trace(path)
    # The id column holds each id's text exactly, number or string, however wide.
    assert Counter(first.table.column("id").drop_null().to_pylist()) == Counter(
        str(e["id"]) for e in events if "id" in e)
    out = export_chrome(first, tmp_path / "t.json")
    written = json.loads(out.read_bytes(), parse_float=Decimal)["traceEvents"]
    assert Counter(repr(e["id"]) for e in written if "id" in e) == Counter(
        repr(expected_id(e["id"])) for e in events if "id" in e)
    # Every other id-holding field is written back byte for byte as the producer wrote it.
    assert sorted(repr(id_fields(e)) for e in written) == sorted(repr(id_fields(e)) for e in events)
    again = import_trace(out)
    assert_same_table(again, first)
    assert again.equals(first)
    assert_same_table(events_alone(first), first)


def test_torch_npu_flows_beyond_2_pow_64_still_link_launch_and_task():
    trace = import_trace(DATA / "ids_beyond_64_bits_torch_npu.json")
    df = trace.to_pandas()
    corr = {name: df.loc[df["name"] == name, "corr"].iloc[0]
            for name in ("AscendCL@aclnnAdd_AddAiCore_Add", "Add", "AscendCL@aclnnMul_MulAiCore_Mul", "Mul")}
    assert corr["AscendCL@aclnnAdd_AddAiCore_Add"] == corr["Add"]
    assert corr["AscendCL@aclnnMul_MulAiCore_Mul"] == corr["Mul"]
    assert corr["Add"] != corr["Mul"]  # not one shared 0, as when the ids were read as "no int64"
    # The string id and the bare number of one value are one flow.
    flows = df[df["cat"] == "HostToDevice"]
    assert flows.groupby("id")["corr"].nunique().tolist() == [1, 1]


def test_an_id_too_wide_for_any_json_reader_is_a_one_line_error(tmp_path):
    src = tmp_path / "wide.json"
    src.write_text('[{"ph":"s","name":"f","pid":1,"tid":1,"ts":1,"id":1%s}]' % ("0" * 5000))
    result = CliRunner().invoke(app, ["import", str(src), "-o", str(tmp_path / "out.parquet")])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "event 0" in result.stderr
    assert not (tmp_path / "out.parquet").exists()
