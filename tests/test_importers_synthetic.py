"""Importer rules the bundled real traces do not exercise, on small hand-built traces."""

from __future__ import annotations

import json

import pytest

from msprof_py.trace import import_bytes, import_trace


def _table(events, **top):
    doc = {**top, "traceEvents": events} if top else events
    return import_bytes(json.dumps(doc).encode()).to_pandas()


def test_kineto_memory_instants_become_alloc_and_free():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 140000000000, "Bytes": 4096,
                  "Total Allocated": 4096, "Total Reserved": 2097152}},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20,
         "args": {"Device Type": 0, "Device Id": -1, "Addr": 94000000000, "Bytes": 64, "Total Allocated": 64}},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 30,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 140000000000, "Bytes": -4096,
                  "Total Allocated": 0}},
    ]
    df = _table(ev, schemaVersion=1, distributedInfo={"rank": 3})
    mem = df[df.name == "[memory]"]
    assert mem.kind.tolist() == ["alloc", "alloc", "free"]
    assert mem["bytes"].tolist() == [4096, 64, 4096]
    assert mem.addr.tolist() == [140000000000, 94000000000, 140000000000]
    assert mem.value.tolist() == [4096.0, 64.0, 0.0]
    assert mem.device.tolist()[0] == 0 and mem.device.isna().tolist() == [False, True, False]
    assert mem.step.tolist() == [7, 7, 7]
    assert set(df["rank"]) == {3}


def test_kineto_dataloader_spans_become_data_load():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "pid": 1, "tid": 1, "ts": 1, "dur": 30},
        {"ph": "X", "cat": "python_function", "name": "torch/utils/data/dataloader.py(631): __next__",
         "pid": 1, "tid": 1, "ts": 2, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
         "pid": 1, "tid": 2, "ts": 3, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "## data_load ##", "pid": 1, "tid": 1, "ts": 40, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::to", "pid": 1, "tid": 1, "ts": 41, "dur": 2},
        {"ph": "X", "cat": "user_annotation", "name": "## forward ##", "pid": 1, "tid": 1, "ts": 50, "dur": 20},
        {"ph": "X", "cat": "python_function", "name": "upload_metrics", "pid": 1, "tid": 1, "ts": 71, "dur": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 60, "dur": 3,
         "args": {"correlation": 9}},
    ]
    df = _table(ev, schemaVersion=1, distributedInfo={"rank": 1})
    assert df.sort_values("ts").kind.tolist() == [
        "step", "data_load", "data_load", "data_load", "data_load", "api", "api", "api", "api"]
    assert df[df.kind == "data_load"].step.tolist() == [2, 2, 2, 2]


def test_kineto_out_of_memory_instant_becomes_alloc_fail():
    ev = [
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[OutOfMemory]", "pid": 1, "tid": 1, "ts": 10,
         "args": {"Device Type": 1, "Device Id": 2, "Bytes": 85899345920, "Total Allocated": 4194304,
                  "Total Reserved": 20971520}},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[OutOfMemory]", "pid": 1, "tid": 1, "ts": 20,
         "args": {"Device Type": 0, "Device Id": -1, "Bytes": 1024}},
    ]
    df = _table(ev, schemaVersion=1)
    assert df.kind.tolist() == ["alloc_fail", "alloc_fail"]
    assert df["bytes"].tolist() == [85899345920, 1024]
    assert df.device.isna().tolist() == [False, True] and df.device.tolist()[0] == 2
    # PyTorch does not say how large the largest free block was.
    assert df.value.isna().all() and df.addr.isna().all()


def test_ascend_python_dataloader_spans_become_data_load():
    ev = [
        {"ph": "M", "name": "process_name", "pid": 5, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": 6, "tid": 0, "args": {"name": "CANN"}},
        {"ph": "X", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "pid": 5, "tid": 5,
         "ts": "1704161511421128.989", "dur": 1302.013, "cat": "cpu_op", "args": {"Sequence number": -1}},
        {"ph": "X", "name": "aten::add", "pid": 5, "tid": 5, "ts": "1704161511422500.000", "dur": 3, "cat": "cpu_op"},
        {"ph": "X", "name": "AscendCL@aclrtSynchronizeStream", "pid": 6, "tid": 5, "ts": "1704161511422510.000",
         "dur": 3},
        {"ph": "i", "s": "t", "name": "[OutOfMemory]", "pid": 5, "tid": 5, "ts": "1704161511422520.000",
         "args": {"Device Type": 20, "Device Id": 0, "Bytes": 1073741824, "Total Allocated": 0}},
    ]
    df = _table(ev)
    assert import_bytes(json.dumps(ev).encode()).meta.source_format == "ascend"
    real = df[df.ph != "M"]
    assert real.kind.tolist() == ["data_load", "api", "sync", "alloc_fail"]
    assert real["dur"].tolist()[0] == 1302013
    assert real["bytes"].tolist()[3] == 1073741824 and real.device.tolist()[3] == 0


def test_ascend_counters_hccl_and_overlap_tracks():
    ev = [
        {"ph": "M", "name": "process_name", "pid": 10, "tid": 0, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "process_name", "pid": 20, "tid": 0, "args": {"name": "Overlap Analysis"}},
        {"ph": "M", "name": "process_name", "pid": 30, "tid": 0, "args": {"name": "NPU MEM"}},
        {"ph": "M", "name": "process_name", "pid": 40, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "M", "name": "process_labels", "pid": 40, "tid": 0, "args": {"labels": "NPU 5"}},
        {"ph": "X", "name": "hcom_allReduce__123_0_1", "pid": 10, "tid": 2, "ts": "100.000", "dur": 50.5,
         "args": {"Stream Id": 7, "data size(B)": 1048576}},
        {"ph": "X", "name": "Notify_Wait", "pid": 10, "tid": 2, "ts": "101.000", "dur": 10},
        {"ph": "X", "name": "Communication", "pid": 20, "tid": 1, "ts": "100.000", "dur": 50.5},
        {"ph": "C", "name": "APP/DDR", "pid": 30, "tid": 0, "ts": "100.000", "args": {"KB": 2048.5}},
        {"ph": "X", "name": "MatMul", "pid": 40, "tid": 2, "ts": "90.000", "dur": 5,
         "args": {"Task Type": "AI_CORE", "Stream Id": 2, "Task Id": 1}},
    ]
    df = _table(ev)
    assert import_bytes(json.dumps(ev).encode()).meta.source_format == "ascend"
    by_name = df.set_index("name")
    assert by_name.loc["hcom_allReduce__123_0_1", "kind"] == "collective"
    assert by_name.loc["hcom_allReduce__123_0_1", "stream"] == 7
    assert by_name.loc["hcom_allReduce__123_0_1", "bytes"] == 1048576
    assert by_name.loc["hcom_allReduce__123_0_1", "dur"] == 50500
    assert by_name.loc["Notify_Wait", "kind"] == "wait"
    assert by_name.loc["Communication", "kind"] == "marker"
    assert by_name.loc["APP/DDR", "kind"] == "counter"
    assert by_name.loc["APP/DDR", "value"] == 2048.5
    assert by_name.loc["MatMul", "kind"] == "kernel"
    assert by_name.loc["MatMul", "device"] == 5  # from the "NPU 5" process label
    assert by_name.loc["MatMul", "stream"] == 2


def test_generic_chrome_trace_keeps_phases():
    ev = [
        {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 1.5},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 9},
        {"ph": "C", "name": "queue", "pid": 1, "tid": 0, "ts": 2, "args": {"depth": 3}},
        {"ph": "b", "cat": "io", "name": "read", "id": "0x1f", "pid": 1, "tid": 1, "ts": 3},
        {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 4, "s": "p", "cname": "good"},
    ]
    trace = import_bytes(json.dumps(ev).encode())
    df = trace.to_pandas()
    assert trace.meta.source_format == "chrome"
    assert df.kind.tolist() == ["marker", "counter", "marker", "marker", "marker"]
    assert df.ts.tolist() == [0, 500, 1500, 2500, 7500]
    assert df.value.tolist()[1] == 3.0
    assert df.id.tolist()[2] == "0x1f"
    assert json.loads(df.extra.tolist()[3]) == {"s": "p", "cname": "good"}


@pytest.mark.parametrize("name", ["nccl_2rank_rank0.json.gz", "tiny_base.json.gz"])
def test_analysis_only_import_has_every_column_analyzers_read(real_traces, name):
    """What `analyze` / `report` load from JSON: typed columns as a full import, no verbatim text."""
    from analyzers.frames import ANALYSIS_COLUMNS

    path = real_traces / "kineto" / name
    full, lean = import_trace(path), import_trace(path, analysis_only=True)
    assert lean.table.num_rows == full.table.num_rows
    assert lean.table.select(list(ANALYSIS_COLUMNS)).equals(full.table.select(list(ANALYSIS_COLUMNS)))
    assert lean.table.column("id").equals(full.table.column("id"))
    assert lean.table.column("args").null_count == lean.table.num_rows
    assert lean.table.column("extra").null_count == lean.table.num_rows
    assert full.table.column("args").null_count < full.table.num_rows  # the full import keeps them
