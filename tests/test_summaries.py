"""msprof-compatible summaries: written out, read back with pandas, and checked against the trace.

Expected numbers are computed here from the trace table with plain Python (Decimal microseconds,
a hand-written interval union), not with the code under test.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from msprof_py import prof_dir
from msprof_py.communication import MiB
from msprof_py.summaries import HEADERS, summaries
from runtime_emu import scenarios

#: The headers as msprof / torch_npu write them (see msprof_py.summaries for the sources).
MSPROF_HEADERS = {
    "op_summary": "Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type,OP State,Task Type,Task Start Time(us),"
                  "Task Duration(us),Task Wait Time(us),Block Dim,Mix Block Dim,Input Shapes,Input Data Types,"
                  "Input Formats,Output Shapes,Output Data Types,Output Formats",
    "op_statistic": "Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)",
    "api_statistic": "Device_id,Level,API Name,Time(us),Count,Avg(us),Min(us),Max(us),Variance",
    "task_time": "Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),task_start(us),task_stop(us)",
    "step_trace_time": "Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,"
                       "Bubble,Communication(Not Overlapped and Exclude Receive),Preparing",
    "npu_mem": "Device_id,event,ddr(KB),hbm(KB),memory(KB),timestamp(us)",
    "memory_record": "Component,Timestamp(us),Total Allocated(KB),Total Reserved(KB),Device",
    "operator_memory": "Name,Size(KB),Allocation Time(us),Duration(us),Allocation Total Allocated(KB),"
                       "Allocation Total Reserved(KB),Release Total Allocated(KB),Release Total Reserved(KB),Device",
}


def us(ns: int) -> Decimal:
    return Decimal(int(ns)) / 1000


def total_us(col: pd.Series) -> Decimal:
    return sum((Decimal(v) for v in col), Decimal(0))


@pytest.fixture(scope="module", params=["yolo-pipeline", "bert-train-dp"])
def case(request, tmp_path_factory):
    """A scenario's trace, its exports written to a PROF dir and read back (all as text)."""
    if request.param == "yolo-pipeline":
        result = scenarios.run("yolo-pipeline", switches=["leak"], steps=4)
    else:
        result = scenarios.run("bert-train-dp", steps=2, ranks=4)
    prof = prof_dir.new_prof_dir(tmp_path_factory.mktemp("out"))
    files = prof_dir.write_exports(prof, result.trace, stamp="20250101120000")
    csvs = {f.name.rsplit("_", 1)[0]: pd.read_csv(f, dtype=str, keep_default_na=False) for f in files
            if f.suffix == ".csv"}
    jsons = {f.stem: json.loads(f.read_text()) for f in files
             if f.suffix == ".json" and not f.name.startswith("msprof")}
    df = result.trace.table.to_pandas()
    for c in ("kind", "name", "cat", "ph"):
        df[c] = df[c].astype(object)
    return request.param, df, csvs, jsons, result.ground_truth, [f.name for f in files]


def device_pids(df: pd.DataFrame) -> set:
    meta = df[(df["kind"] == "meta") & (df["name"] == "process_name")]
    return set(meta.loc[meta["args"].str.contains('"Ascend Hardware"', regex=False), "pid"])


def device_tasks(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["ph"] == "X") & df["pid"].isin(device_pids(df)) & (df["kind"] != "meta")]


def test_file_names_and_headers_are_msprofs(case) -> None:
    _, df, csvs, jsons, _, names = case
    # A job of several ranks also gets msprof-analyze's cluster_step_trace_time.csv (no stamp).
    job = ["cluster_step_trace_time.csv"] if df["rank"].nunique() > 1 else []
    assert sorted(names) == sorted([f"{n}_20250101120000.csv" for n in MSPROF_HEADERS] + job +
                                   ["communication.json", "communication_matrix.json", "msprof_20250101120000.json"])
    for name, header in MSPROF_HEADERS.items():
        assert ",".join(csvs[name].columns) == header == ",".join(HEADERS[name])


def test_op_summary_and_op_statistic_total_the_kernels(case) -> None:
    _, df, csvs, _, _, _ = case
    kernels = df[df["kind"] == "kernel"]
    ops = df[df["kind"].isin(["kernel", "collective"])]
    summary = csvs["op_summary"]
    assert len(summary) == len(ops)
    assert total_us(summary["Task Duration(us)"]) == sum(us(d) for d in ops["dur"])
    assert sorted(summary["Task Start Time(us)"]) == sorted(f"{us(t):.3f}" for t in ops["ts"])
    stat = csvs["op_statistic"]
    assert total_us(stat["Total Time(us)"]) == sum(us(d) for d in kernels["dur"])
    assert stat["Count"].astype(int).sum() == len(kernels)
    for _, g in stat.groupby("Device_id"):
        # Each ratio is rounded to 3 decimals: the sum is 100 within half a unit per row.
        assert sum(float(r) for r in g["Ratio(%)"]) == pytest.approx(100, abs=0.0005 * len(g))
    assert set(stat["Core Type"]) <= {"AI_CORE", "AI_VECTOR_CORE"}


def test_op_summary_wait_time_is_the_gap_after_the_previous_task_on_the_stream(case) -> None:
    _, df, csvs, _, _, _ = case
    tasks = device_tasks(df).sort_values(["rank", "device", "stream", "ts"])
    expect = {}
    for _, g in tasks.groupby(["rank", "device", "stream"]):
        reach = None
        for r in g.itertuples():
            gap = 0 if reach is None else max(0, r.ts - reach)
            if r.kind == "kernel":
                expect[(int(r.device), int(r.corr))] = f"{us(gap):.3f}"
            reach = r.ts + r.dur if reach is None else max(reach, r.ts + r.dur)
    summary = csvs["op_summary"]
    kernels = summary[summary["Task ID"] != "N/A"]
    got = {(int(d), int(t)): w
           for d, t, w in zip(kernels["Device_id"], kernels["Task ID"], kernels["Task Wait Time(us)"])}
    assert got == expect


def test_api_statistic_counts_every_api_call(case) -> None:
    _, df, csvs, _, _, _ = case
    apis = df[(df["cat"] == "AscendCL") & (df["ph"] == "X")]
    stat = csvs["api_statistic"]
    assert stat["Count"].astype(int).sum() == len(apis)
    assert total_us(stat["Time(us)"]) == sum(us(d) for d in apis["dur"])
    got = stat.groupby("API Name")["Count"].apply(lambda c: c.astype(int).sum()).to_dict()
    assert got == apis.groupby("name").size().to_dict()
    assert all(level == ("hccl" if name.startswith("Hccl") else "acl")
               for level, name in zip(stat["Level"], stat["API Name"]))


def test_task_time_lists_every_device_task(case) -> None:
    _, df, csvs, _, _, _ = case
    tasks = device_tasks(df)
    tt = csvs["task_time"]
    assert len(tt) == len(tasks)
    assert total_us(tt["task_time(us)"]) == sum(us(d) for d in tasks["dur"])
    assert sorted(tt["task_stop(us)"]) == sorted(f"{us(t + d):.3f}" for t, d in zip(tasks["ts"], tasks["dur"]))


def union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def test_step_trace_time_has_one_row_per_step_and_splits_it(case) -> None:
    name, df, csvs, _, _, _ = case
    steps = df[df["kind"] == "step"]
    st = csvs["step_trace_time"]
    assert len(st) == len(steps)
    tasks = device_tasks(df)
    for (rank, step), _ in steps.groupby(["rank", "step"]):
        mine = tasks[(tasks["rank"] == rank) & (tasks["step"] == step)]
        compute = [(t, t + d) for t, d in zip(mine.loc[mine["kind"] == "kernel", "ts"],
                                              mine.loc[mine["kind"] == "kernel", "dur"])]
        comm_rows = mine[(mine["kind"] == "collective") | ((mine["kind"] == "wait") & (mine["cat"] == "hccl"))]
        comm = [(t, t + d) for t, d in zip(comm_rows["ts"], comm_rows["dur"])]
        device = int(mine["device"].min())
        [row] = st[(st["Device_id"] == str(device)) & (st["Step"] == str(int(step)))].to_dict("records")
        assert Decimal(row["Computing"]) == us(union_ns(compute))
        assert Decimal(row["Communication"]) == us(union_ns(comm))
        assert Decimal(row["Overlapped"]) == us(union_ns(compute) + union_ns(comm) - union_ns(compute + comm))
        parts = Decimal(row["Computing"]) + Decimal(row["Communication(Not Overlapped)"]) + Decimal(row["Free"])
        assert parts == Decimal(row["Stage"])
    if name == "bert-train-dp":
        assert (st["Communication"].map(Decimal) > 0).all()


def test_communication_totals_match_the_collectives(case) -> None:
    name, df, _, jsons, truth, _ = case
    coll = df[df["kind"] == "collective"]
    comm, matrix = jsons["communication"], jsons["communication_matrix"]
    if name == "yolo-pipeline":
        assert comm == {} and matrix == {}
        return
    ops = [(rank, info) for rank, steps in comm.items() for kinds in steps.values()
           for info in kinds["collective"].values()]
    assert len(ops) == len(coll)
    # The op's duration is its links' busy time (transit) and the time inside it no link ran
    # (idle): the emulated ops record no wait task inside them.
    assert sum(round((i["Communication Time Info"]["Transit Time(ms)"] + i["Communication Time Info"]["Idle Time(ms)"])
                     * 1e6) for _, i in ops) == coll["dur"].sum()
    # What a rank transmitted per transport is what its links carried (the matrix), not the op's
    # payload (a ring or mesh algorithm sends a share of it over each of its links).
    sizes = sum(b["Transit Size(MB)"] for _, i in ops for b in i["Communication Bandwidth Info"].values())
    links = sum(link["Transit Size(MB)"] for steps in matrix.values() for kinds in steps.values()
                for pairs in kinds["collective"].values() for link in pairs.values())
    assert round(sizes * MiB) == round(links * MiB) > 0
    notify = df[(df["kind"] == "wait") & (df["cat"] == "hccl")]
    assert sum(round(i["Communication Time Info"]["Wait Time(ms)"] * 1e6) for _, i in ops) == notify["dur"].sum()
    for rank, group in coll.groupby("rank"):
        assert sum(len(k["collective"]) for k in comm[str(rank)].values()) == len(group)
    # The link matrix integrates the link-rate counters: it agrees with the bytes the emulator
    # knows it moved over each HCCS link.
    moved: dict[str, float] = {}
    for rank, steps in matrix.items():
        for kinds in steps.values():
            for pairs in kinds["collective"].values():
                for pair, link in pairs.items():
                    if pair.startswith(f"{rank}-"):
                        moved[pair] = moved.get(pair, 0.0) + link["Transit Size(MB)"] * MiB
    expect = {k.replace("r", "").replace("->", "-").replace(".hccs", ""): v
              for k, v in truth["hccl"]["link_bytes"].items() if k.endswith(".hccs")}
    assert moved.keys() == expect.keys()
    for pair, nbytes in expect.items():
        assert moved[pair] == pytest.approx(nbytes, rel=1e-4)


def test_memory_summaries_follow_the_allocations(case) -> None:
    _, df, csvs, _, _, _ = case
    mem = df[df["kind"].isin(["alloc", "free"])]
    allocs, frees = mem[mem["kind"] == "alloc"], mem[mem["kind"] == "free"]
    record = csvs["memory_record"]
    assert len(record) == len(mem)
    assert sorted(record["Total Allocated(KB)"].map(float)) == sorted(round(v / 1024, 3) for v in mem["value"])
    used = df[(df["kind"] == "counter") & (df["name"] == "Device memory used")]
    assert len(csvs["npu_mem"]) == len(used)
    op_mem = csvs["operator_memory"]
    assert len(op_mem) == len(allocs)
    assert sum(float(v) for v in op_mem["Size(KB)"]) == pytest.approx(allocs["bytes"].sum() / 1024, abs=0.01)
    # Every free ends one allocation; what is never freed has no duration.
    assert (op_mem["Duration(us)"] == "").sum() == len(allocs) - len(frees)


def test_leaked_buffers_show_as_never_released(tmp_path: Path) -> None:
    result = scenarios.run("yolo-pipeline", switches=["leak"], steps=4)
    op_mem = summaries(result.trace)["operator_memory"]
    leaked = op_mem[op_mem["Duration(us)"] == ""]
    [leak] = result.ground_truth["problems"]
    assert set(leaked["Name"]) == {leak["where"]["call_site"]}
    assert len(leaked) == 4


def test_summaries_are_deterministic() -> None:
    a = summaries(scenarios.run("yolo-pipeline", steps=2, seed=5).trace)
    b = summaries(scenarios.run("yolo-pipeline", steps=2, seed=5).trace)
    for name in HEADERS:
        assert a[name].equals(b[name]), name
    assert a["communication"] == b["communication"]


# ---------------------------------------------------------------------- op_statistic by op type
def test_op_statistic_groups_the_instances_of_an_operator():
    # YOLOv5s has 60 convolutions per forward pass (57 in backbone and neck, 3 in the Detect
    # head), named Conv2D0 .. Conv2D88 by their place in the graph: msprof's op_statistic shows
    # them as one Conv2D row, 60 per image.
    steps = 3
    trace = scenarios.run("yolo-pipeline", steps=steps).trace
    stat = summaries(trace)["op_statistic"]
    conv = stat[stat["OP Type"] == "Conv2D"]
    assert conv[["Device_id", "Core Type", "Count"]].to_dict("records") == [
        {"Device_id": 0, "Core Type": "AI_CORE", "Count": 60 * steps}]
    # Op types that end in digits stay whole (the index is not stripped off the name).
    assert {"MaxPoolV3", "ResizeNearestNeighborV2", "ConcatD"} <= set(stat["OP Type"])
    assert not any(t.startswith("Conv2D") and t != "Conv2D" for t in stat["OP Type"])
    summary = summaries(trace)["op_summary"]
    assert set(summary.loc[summary["Op Name"].str.startswith("Conv2D"), "OP Type"]) == {"Conv2D"}


def test_an_op_type_with_quotes_is_recorded_as_json_and_read_back():
    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime_emu.device import Kernel
    from runtime_emu.runtime import Runtime

    rt = Runtime()
    rt.set_device(0)
    s = rt.create_stream()
    rt.launch_kernel(Kernel('my"op\\1', 5_000, op_type='My"Op\\'), 1, s)
    rt.launch_kernel(Kernel("plain7", 5_000), 1, s)  # no op type given: the name stands for it
    rt.synchronize_device()
    trace = rt.finish().trace
    kernels = trace.table.filter(pc.equal(trace.table["kind"].cast(pa.string()), "kernel"))
    assert [json.loads(a)["OP Type"] for a in kernels["args"].to_pylist()] == ['My"Op\\', "plain7"]
    stat = summaries(trace)["op_statistic"]
    assert sorted(stat["OP Type"]) == ['My"Op\\', "plain7"]
