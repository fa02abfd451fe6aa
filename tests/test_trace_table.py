"""The trace event table on real traces: exact import, lossless round trips, Parquet layout.

Expected numbers are computed here from the raw JSON with the standard library (Decimal for
timestamps), independently of the importers under test.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from msprof_py.errors import TraceFormatError
from msprof_py.trace import (
    build_table,
    export_chrome,
    import_bytes,
    import_trace,
    read_trace,
    to_chrome_bytes,
    write_trace,
)
from msprof_py.trace.importers import EXPORT_KEY
from msprof_py.trace.schema import COLUMN_NAMES

KINETO = [
    "alexnet_critical_path.json.gz", "amd_mi250_rocm.json.gz", "event_sync_multi_stream.json.gz",
    "nccl_2rank_rank0.json.gz", "ns_resolution_rank0.json.gz", "queue_16rank_rank0.json.gz",
    "sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz", "tiny_base.json.gz",
]
ALL_JSON = [f"kineto/{f}" for f in KINETO] + ["ascend/torch_npu_trace_view.json.gz"]
#: Round trips also cover the other producers' layouts: ROCm grids, a DLRM worker, and torch_npu
#: timelines read from their output folder (Block Dim from the kernel_details.csv beside them).
ROUND_TRIP = ALL_JSON + [
    "kineto/mi300_resnet_ddp_rank0.json.gz", "kineto/sglang_qwen3_mi300.json.gz",
    "kineto/dlrm_8rank/worker3_step_12.1694128201557.pt.trace.json.gz",
    *(f"ascend/resnet_2rank_level1_text/rank{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json" for r in (0, 1))]


def raw_json(path: Path):
    """The trace parsed exactly: floats as Decimal, ints as int."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh, parse_float=Decimal)
    return doc["traceEvents"] if isinstance(doc, dict) else doc, doc


def us_to_ns(v) -> int:
    return int((Decimal(str(v)) * 1000).to_integral_value())


_cache: dict[str, object] = {}


def imported(real_traces: Path, rel: str):
    if rel not in _cache:
        _cache[rel] = import_trace(real_traces / rel)
    return _cache[rel]


@pytest.mark.parametrize("rel", ALL_JSON)
def test_every_event_imported_with_exact_ns_timestamps(real_traces, rel):
    events, _doc = raw_json(real_traces / rel)
    trace = imported(real_traces, rel)
    assert len(trace) == len(events)
    expected = sorted(us_to_ns(e["ts"]) for e in events if "ts" in e)
    has_ts = [e for e in events if "ts" in e]
    origin = trace.meta.origin_ns
    assert origin == expected[0]
    # Rows whose source had no ts (some M events) sit at the origin.
    got = sorted((trace.table.column("ts").to_numpy() + origin).tolist())
    no_ts = len(events) - len(has_ts)
    assert got == sorted(expected + [origin] * no_ts)
    durs = sorted(us_to_ns(e["dur"]) for e in events if "dur" in e)
    assert sorted(trace.table.column("dur").drop_null().to_pylist()) == durs


@pytest.mark.parametrize("rel", ALL_JSON)
def test_ids_and_args_kept_exactly(real_traces, rel):
    events, _doc = raw_json(real_traces / rel)
    trace = imported(real_traces, rel)
    assert Counter(trace.table.column("id").drop_null().to_pylist()) == Counter(
        str(e["id"]) for e in events if "id" in e)
    args = [json.loads(a, parse_float=Decimal) for a in trace.table.column("args").drop_null().to_pylist()]
    want = [e["args"] for e in events if "args" in e]
    assert sorted(map(repr, args)) == sorted(map(repr, want))


def test_ids_above_2_pow_53_survive(real_traces):
    trace = imported(real_traces, "ascend/torch_npu_trace_view.json.gz")
    ids = set(trace.table.column("id").drop_null().to_pylist())
    assert "1704161511422904204" in ids  # async_npu flow id, > 2**53
    assert int("1704161511422904204") > 2**53


@pytest.mark.parametrize("rel", [f"kineto/{f}" for f in KINETO])
def test_kineto_kinds_match_categories(real_traces, rel):
    events, doc = raw_json(real_traces / rel)
    trace = imported(real_traces, rel)
    kinds = Counter(trace.table.column("kind").to_pylist())
    x = [e for e in events if e.get("ph") == "X"]
    kernels = [e for e in x if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    assert kinds["kernel"] == len(kernels) - len(nccl)
    assert kinds["collective"] == len(nccl)
    assert kinds["memcpy"] == sum(e.get("cat") == "gpu_memcpy" for e in x)
    assert kinds["memset"] == sum(e.get("cat") == "gpu_memset" for e in x)
    assert kinds["meta"] == sum(e.get("ph") == "M" for e in events)
    assert kinds["flow"] == sum(e.get("ph") in ("s", "t", "f") for e in events)
    # A step's mirror on the GPU (gpu_user_annotation, PyTorch 2.x) is the device's annotation of it, no step.
    assert kinds["step"] == sum(e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
                                for e in x)
    rank = (doc.get("distributedInfo") or {}).get("rank", 0) if isinstance(doc, dict) else 0
    assert set(trace.table.column("rank").to_pylist()) == {rank}


@pytest.mark.parametrize("rel", [f"kineto/{f}" for f in KINETO])
def test_kineto_device_rows_carry_stream_device_corr_bytes(real_traces, rel):
    events, _doc = raw_json(real_traces / rel)
    trace = imported(real_traces, rel)
    t = trace.table
    dev = t.filter(pc.is_in(t.column("kind"), value_set=pa.array(["kernel", "memcpy", "memset", "collective"])))
    got = sorted(zip(dev.column("ts").to_pylist(), dev.column("stream").to_pylist(),
                     dev.column("device").to_pylist(), dev.column("corr").to_pylist(),
                     dev.column("bytes").to_pylist()))
    want = sorted(
        (us_to_ns(e["ts"]) - trace.meta.origin_ns, e["args"].get("stream", e["tid"]),
         e["args"].get("device", e["pid"]), e["args"].get("correlation"), e["args"].get("bytes"))
        for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert got == want


def test_kineto_launches_link_to_their_kernels(real_traces):
    events, _doc = raw_json(real_traces / "kineto/queue_16rank_rank0.json.gz")
    trace = imported(real_traces, "kineto/queue_16rank_rank0.json.gz")
    df = trace.to_pandas()
    launches = df[df.kind == "launch"]
    dev = df[df.kind.isin(["kernel", "memcpy", "memset", "collective"])]
    device_corr = {e["args"]["correlation"] for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"}
    single = {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"}
    expected = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in single
                and e["args"].get("correlation") in device_corr]
    assert len(launches) == len(expected) == 6530  # the 70 cudaGraphLaunch calls stay "api"
    assert set(launches["corr"]) <= set(dev["corr"])
    # Every device row that has a launch in the trace got the step of that launch.
    merged = dev.merge(launches[["corr", "step"]], on="corr", suffixes=("", "_launch"))
    both = merged.dropna(subset=["step_launch"])
    assert (both.step == both.step_launch).all()
    assert sorted(df[df.kind == "step"].step.astype(int)) == [550, 551, 552, 553, 554]


def test_distributed_info_gives_rank_and_world_size(real_traces):
    trace = imported(real_traces, "kineto/sampled_128rank_rank1.json.gz")
    assert trace.meta.world_size == 128
    assert set(trace.table.column("rank").to_pylist()) == {1}
    assert trace.meta.source_meta["distributedInfo"]["backend"] == "nccl"


def test_string_pids_keep_their_names(real_traces):
    trace = imported(real_traces, "kineto/alexnet_critical_path.json.gz")
    df = trace.to_pandas()
    spans = df[df.name == "PyTorch Profiler (0)"].iloc[0]
    assert json.loads(spans.extra) == {"pid": "Spans", "tid": "PyTorch Profiler"}
    assert spans.pid < 0  # synthetic id, stable across imports
    assert spans.pid == import_trace(real_traces / "kineto/alexnet_critical_path.json.gz").to_pandas() \
        .query("name == 'PyTorch Profiler (0)'").pid.iloc[0]


def test_ascend_tracks_by_process_name(real_traces):
    events, _doc = raw_json(real_traces / "ascend/torch_npu_trace_view.json.gz")
    trace = imported(real_traces, "ascend/torch_npu_trace_view.json.gz")
    assert trace.meta.source_format == "ascend"
    df = trace.to_pandas()
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    hw = [e for e in events if e.get("ph") == "X" and procs.get(e["pid"]) == "Ascend Hardware"]
    dev = df[df.kind.isin(["kernel", "memcpy", "memset", "collective"])]
    assert len(dev) == len(hw) == 276
    assert Counter(dev.kind) == {"kernel": 253, "memset": 21, "memcpy": 2}
    assert set(dev.stream) == {3}
    # Each HostToDevice flow end (bp=e) binds to the task starting at that instant: same corr.
    ends = [e for e in events if e.get("ph") == "f" and e.get("cat") == "HostToDevice"]
    starts_by_ts = {int(ts): i for i, ts in dev.ts.items()}
    for e in ends:
        row = dev.loc[starts_by_ts[us_to_ns(e["ts"]) - trace.meta.origin_ns]]
        assert row["corr"] == int(e["id"])
    cann = [e for e in events if e.get("ph") == "X" and procs.get(e["pid"]) == "CANN"]
    # A CANN slice holding the start of a HostToDevice flow is the launch of that task.
    flow_starts = [e for e in events if e.get("ph") == "s" and e.get("cat") == "HostToDevice"]
    launches = {id(c) for f in flow_starts for c in cann if c["tid"] == f["tid"]
                and us_to_ns(c["ts"]) <= us_to_ns(f["ts"]) <= us_to_ns(c["ts"]) + us_to_ns(c["dur"])}
    syncs = sum("Synchronize" in c["name"] for c in cann)
    # aclopCompileAndExecute compiles its operator, then launches it: op_compile, not launch.
    compiles = {id(c) for c in cann if c["name"].startswith("AscendCL@aclopCompile")}
    cann_pid = next(p for p, n in procs.items() if n == "CANN")
    assert Counter(df[df.pid == cann_pid].kind) == Counter({
        "api": len(cann) - len(launches | compiles) - syncs, "launch": len(launches - compiles), "sync": syncs,
        "op_compile": len(compiles), "meta": sum(e.get("ph") == "M" and e["pid"] == cann_pid for e in events),
        "flow": len(flow_starts)})
    assert len(launches) == 146 and len(compiles) == len(compiles & launches) == 11
    # The Python process's DataLoader spans are data loading; nothing else is.
    loads = df[df.kind == "data_load"]
    assert loads.name.astype(str).tolist() == ["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"] * 2
    assert loads["dur"].tolist() == [1302013, 16571]


def test_kineto_data_load_annotations(real_traces):
    """The sampled 128-rank job wraps its batch's host-to-device copies in `## data_load ##`."""
    df = imported(real_traces, "kineto/sampled_128rank_rank0.json.gz").to_pandas()
    loads = df[df.kind == "data_load"]
    assert loads.name.astype(str).tolist() == ["## data_load ##"] * 2
    assert loads["dur"].tolist() == [3918000, 3807000]


@pytest.mark.parametrize("rel", ROUND_TRIP)
def test_round_trip_json_parquet_json(real_traces, rel, tmp_path):
    """import -> Parquet -> export JSON -> import gives an identical table and metadata."""
    first = imported(real_traces, rel)
    write_trace(first, tmp_path / "t.parquet")
    reread = read_trace(tmp_path / "t.parquet")
    assert reread.table.equals(first.table) and reread.meta == first.meta
    export_chrome(reread, tmp_path / "t.json.gz")
    again = import_trace(tmp_path / "t.json.gz")
    assert again.meta == first.meta
    for col in COLUMN_NAMES:
        assert again.table.column(col).equals(first.table.column(col)), col
    assert again.table.equals(first.table)


@pytest.mark.parametrize("rel", ALL_JSON)
def test_export_without_typed_block_rederives_the_same_columns(real_traces, rel):
    """The typed columns are a pure function of the events: a viewer-edited export (block
    dropped) imports to the same table, with only the origin moved to the first event."""
    first = imported(real_traces, rel)
    text = to_chrome_bytes(first)
    cut = text.rindex(b',\n"' + EXPORT_KEY.encode() + b'":')
    stripped = import_bytes(text[:cut] + b"}")
    assert stripped.meta.source_format == first.meta.source_format
    assert stripped.table.equals(first.table)


def test_export_is_relative_microseconds_with_three_decimals(real_traces):
    trace = imported(real_traces, "kineto/ns_resolution_rank0.json.gz")
    doc = json.loads(to_chrome_bytes(trace), parse_float=Decimal)
    ts = [e["ts"] for e in doc["traceEvents"]]
    assert min(ts) == Decimal("0.000")
    assert all(isinstance(v, Decimal) and -v.as_tuple().exponent == 3 for v in ts)
    assert max(ts) < Decimal(10) ** 7  # seconds-scale, not epoch: no float mis-nesting
    assert doc[EXPORT_KEY]["origin_ns"] == trace.meta.origin_ns
    assert doc["deviceProperties"] == json.loads(json.dumps(trace.meta.source_meta["deviceProperties"]),
                                                 parse_float=Decimal)


def test_partitioned_directory_by_rank(real_traces, tmp_path):
    r0 = imported(real_traces, "kineto/sampled_128rank_rank0.json.gz")
    r1 = imported(real_traces, "kineto/sampled_128rank_rank1.json.gz")
    cols = {c: pa.concat_arrays([r0.table.column(c).combine_chunks().cast(pa.string())
                                 if pa.types.is_dictionary(r0.table.column(c).type) else r0.table.column(c).combine_chunks(),
                                 r1.table.column(c).combine_chunks().cast(pa.string())
                                 if pa.types.is_dictionary(r1.table.column(c).type) else r1.table.column(c).combine_chunks()])
            for c in COLUMN_NAMES}
    both = build_table(cols, r0.meta)
    out = write_trace(both, tmp_path / "job")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet")) == [
        "rank=0/part-0.parquet", "rank=1/part-0.parquet"]
    back = read_trace(out)
    assert back.table.equals(both.table)
    assert back.table.column("rank").to_pylist() == [0] * len(r0) + [1] * len(r1)
    assert read_trace(out / "rank=1" / "part-0.parquet").table.num_rows == len(r1)


def test_same_input_gives_byte_identical_parquet(real_traces, tmp_path):
    a = import_trace(real_traces / "kineto/nccl_2rank_rank0.json.gz")
    b = import_trace(real_traces / "kineto/nccl_2rank_rank0.json.gz")
    write_trace(a, tmp_path / "a.parquet")
    write_trace(b, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_table_is_sorted_by_rank_then_ts(real_traces):
    t = imported(real_traces, "kineto/queue_16rank_rank0.json.gz").table
    key = np.lexsort((t.column("ts").to_numpy(), t.column("rank").to_numpy()))
    assert np.array_equal(key, np.arange(t.num_rows))


def test_lenient_import_skips_each_kind_of_malformed_event():
    good = '{"ph":"X","name":"ok%d","pid":1,"tid":1,"ts":%d,"dur":1}'
    bad = [
        '{"ph":"X","name":"neg","pid":1,"tid":1,"ts":5,"dur":-5}',
        '{"ph":"X","name":"list","pid":1,"tid":1,"ts":[5]}',
        '{"ph":"s","name":"boolid","pid":1,"tid":1,"ts":5,"id":true}',  # an id of any size is fine; a boolean is none
        '{"ph":"X","name":"nots","pid":1,"tid":1,"ts":"abc"}',
        '{"name":"noph","pid":1,"tid":1,"ts":5}',
        '{"ph":"X","name":"tid","pid":1,"tid":{"a":1},"ts":5}',
        '7',
    ]
    events = [good % (i, i) for i in range(3)] + bad
    trace = import_bytes(("[" + ",".join(events) + "]").encode() + b"", lenient=True)
    assert trace.table.column("name").to_pylist() == ["ok0", "ok1", "ok2"]
    assert trace.meta.extra["skipped_events"] == len(bad)
    with pytest.raises(TraceFormatError, match="event 3: negative 'dur'"):
        import_bytes(("[" + ",".join(events[:4]) + "]").encode())


def test_errors_name_the_event_index_across_batches():
    from msprof_py.trace.chrome import CHUNK_EVENTS

    events = ['{"ph":"X","name":"a","pid":1,"tid":1,"ts":%d,"dur":1}' % i for i in range(CHUNK_EVENTS + 10)]
    events[CHUNK_EVENTS + 3] = '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":-2}'
    with pytest.raises(TraceFormatError, match=f"event {CHUNK_EVENTS + 3}: negative 'dur'"):
        import_bytes(bytearray(("[" + ",\n".join(events) + "]").encode()))
    # The in-place batching restores the buffer: a good file imports every event.
    events[CHUNK_EVENTS + 3] = events[0]
    data = bytearray(("[" + ",\n".join(events) + "]").encode())
    before = bytes(data)
    assert len(import_bytes(data)) == CHUNK_EVENTS + 10
    assert bytes(data) == before


def test_a_kind_dictionary_may_hold_unused_values_but_rows_may_not_use_unknown_ones(real_traces, tmp_path):
    from msprof_py.trace.schema import validate

    table = import_trace(real_traces / "kineto/nccl_2rank_rank0.json.gz").table
    kinds = table.column("kind").combine_chunks()
    extra = pa.DictionaryArray.from_arrays(kinds.indices, pa.concat_arrays([kinds.dictionary, pa.array(["bogus"])]))
    validate(table.set_column(table.schema.get_field_index("kind"), "kind", extra), where="t")  # unused: fine
    used = pa.DictionaryArray.from_arrays(pc.if_else(pc.equal(kinds.indices, 0), len(kinds.dictionary), kinds.indices),
                                          extra.dictionary)
    with pytest.raises(TraceFormatError, match=r"t: unknown kind\(s\) \['bogus'\]"):
        validate(table.set_column(table.schema.get_field_index("kind"), "kind", used), where="t")
