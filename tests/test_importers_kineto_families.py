"""Kineto traces from every backend family, written the way libkineto writes them.

The layout followed here is libkineto's Chrome trace writer: every event's `cat` is its
activity type's name; a device event has pid = device and tid = stream (XPU: the queue's
index), plus whatever args the backend's plugin adds ("device", "stream", "correlation" for
CUPTI and MTIA; "device", "sycl queue", "correlation" for XPU; none for some plugins); a
launch and its device task are joined by an `ac2g` flow, "s" on the call and "f" with
bp "e" on the task, id = the correlation id. A runtime call that enqueues nothing gets a
lone "f".

One scenario (two profiler steps plus a cut-short third, kernels on one stream, copies on
another) is written for each family, so the expected figures are the same for all and are
worked out by hand below. Holistic Trace Analysis is run on the same trace where it knows the
family (CUDA, MTIA); it finds launches by a fixed list of call names and device work by a
fixed list of categories with a "stream" arg, so for the other families it is run on the same
scenario written with CUDA's names (same times, devices, streams and correlation ids).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import warnings
from dataclasses import dataclass, replace

import pandas as pd
import pytest
from typer.testing import CliRunner

from analyzers.frames import Frames
from analyzers.streams import queue_series, queue_summary, stream_time
from msprof_py.cli import app
from msprof_py.trace import import_bytes, import_trace
from msprof_py.trace.schema import DEVICE_KINDS

HOST_PID = 4242
#: (launch ts, task ts, task dur) in us, which stream ("k": kernels, "c": copies). The last
#: one is launched in ProfilerStep#3, the step HTA drops as cut short.
OPS = (
    (10, 20, 30, "k"), (22, 50, 10, "k"), (30, 40, 20, "c"),
    (110, 120, 10, "k"), (115, 140, 5, "k"), (120, 150, 10, "c"),
    (210, 220, 10, "k"),
)
LAUNCH_DUR = 5
CORR0 = 1000
STEPS = ((1, 0, 100), (2, 100, 100), (3, 200, 50))

# Worked out by hand from OPS, in the analysis window (steps 1 and 2):
# stream k runs 20-50, 50-60, 120-130, 140-145: idle 0 + 60 + 10 = 70 us;
# stream c runs 40-60, 150-160: idle 90 us.
IDLE_US = {"k": 70.0, "c": 90.0}
# Queue length, +1 at each launch and -1 at each task start, per stream:
# k: 10 +1, 20 -1, 22 +1, 50 -1, 110 +1, 115 +1, 120 -1, 140 -1 -> 1,0,1,0,1,2,1,0
# c: 30 +1, 40 -1, 120 +1, 150 -1                              -> 1,0,1,0
QUEUE = {"k": (8, 6 / 8, 2), "c": (4, 2 / 4, 1)}


@dataclass(frozen=True)
class Family:
    name: str
    runtime_cat: str
    kernel_launch: str
    copy_launch: str
    kernel_cat: str
    copy_cat: str
    kernel_name: str
    copy_name: str
    device: int
    streams: dict  # "k" / "c" -> stream (tid) id
    placement: str = "stream"  # device event args: "stream", "queue" (XPU), "none"
    corr_args: bool = True  # whether events carry a "correlation" arg
    extra: tuple = ()  # more events, as (cat, name, where, ts, dur, args)
    hta_knows: bool = False


CUDA = Family("cuda", "cuda_runtime", "cudaLaunchKernel", "cudaMemcpyAsync", "kernel", "gpu_memcpy",
              "void at::native::vectorized_elementwise_kernel<4>", "Memcpy HtoD (Pinned -> Device)",
              device=0, streams={"k": 7, "c": 20}, hta_knows=True,
              extra=(("cuda_runtime", "cudaStreamSynchronize", "host", 62, 3, {"cbid": 131, "correlation": 2001}),
                     ("cuda_sync", "Stream Sync", "k", 60, 2, {"correlation": 2001, "stream": 7, "device": 0}),
                     ("cuda_driver", "cuGetProcAddress", "host", 90, 1, {"cbid": 1, "correlation": 2002}),
                     ("gpu_user_annotation", "## forward ##", "k", 19, 32, {"External id": 3}),
                     ("cuda_event", "Event Record", "c", 61, 0, {"device": 0, "stream": 20}),
                     ("overhead", "Activity Buffer Request", "host", 1, 1, {}),
                     ("cuda_profiler_range", "range 0", "host", 3, 2, {})))
MTIA = Family("mtia", "mtia_runtime", "runFunction - job_prep_and_submit_for_execution",
              "runFunction - job_prep_and_submit_for_execution", "mtia_ccp_events", "mtia_ccp_events",
              "fused_linear_relu", "dma_h2d", device=1, streams={"k": 102, "c": 1}, hta_knows=True,
              extra=(("mtia_insight", "ccp.trace", "k", 21, 3, {"device": 1, "stream": 102}),
                     ("mtia_counters", "hbm", "host", 4, 1, {})))
#: MTIA written by a plugin that adds no correlation arg: only the flows link.
MTIA_FLOWS = replace(MTIA, name="mtia_flows", corr_args=False, hta_knows=False)
HPU = Family("hpu", "hpu_op", "synLaunch", "synMemCopyAsync", "kernel", "gpu_memcpy", "mult_fwd_bf16",
             "Memcpy HtoD", device=0, streams={"k": 1, "c": 2})
XPU = Family("xpu", "xpu_runtime", "urEnqueueKernelLaunch", "urEnqueueUSMMemcpy", "kernel", "gpu_memcpy",
             "at::native::xpu::VectorizedElementwiseKernel", "Memcpy M2D (Memory -> Device)",
             device=0, streams={"k": 0, "c": 1}, placement="queue",
             extra=(("xpu_driver", "zeCommandListAppendLaunchKernel", "host", 11, 2, {"correlation": 3001}),
                    ("xpu_sync", "Queue Sync", "k", 61, 1, {"device": 0}),
                    ("xpu_scope_profiler", "scope", "host", 2, 1, {})))
PRIVATEUSE1 = Family("privateuse1", "privateuse1_runtime", "launchKernel", "memcpyAsync", "kernel", "gpu_memcpy",
                     "matmul_kernel", "Memcpy HtoD", device=2, streams={"k": 3, "c": 4},
                     extra=(("privateuse1_driver", "drvSubmit", "host", 12, 1, {"correlation": 4001}),))
#: An accelerator libkineto has never heard of, whose plugin writes Kineto's layout.
ACME = Family("acme", "acme_runtime", "acmeLaunch", "acmeCopyAsync", "acme_device_ops", "acme_device_ops",
              "conv2d_tile", "acme memcpy h2d", device=3, streams={"k": 5, "c": 6},
              extra=(("acme_logging", "log flush", "host", 70, 2, {}),))
#: The same, but its plugin writes no args at all: device and stream from pid and tid,
#: links from the flows only, and a driver category.
ACME_FLOWS = replace(ACME, name="acme_flows", runtime_cat="acme_driver", kernel_cat="acme_engine",
                     copy_cat="acme_engine", placement="none", corr_args=False,
                     extra=(("gpu_user_annotation", "## forward ##", "k", 19, 32, {}),))
FAMILIES = (CUDA, MTIA, MTIA_FLOWS, HPU, XPU, PRIVATEUSE1, ACME, ACME_FLOWS)


def _hta_view(f: Family) -> Family:
    """The family as HTA can read it (itself when HTA knows it)."""
    if f.hta_knows:
        return f
    if f.name == "mtia_flows":
        return MTIA
    return replace(CUDA, name=f"{f.name}_as_cuda", device=f.device, streams=f.streams, extra=())


def kineto_trace(f: Family) -> dict:
    """The scenario written as libkineto writes it for family `f`."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": HOST_PID, "args": {"name": "thread 4242 (python3)"}},
        {"ph": "M", "name": "process_name", "pid": f.device, "tid": 0, "args": {"name": f"{f.name.upper()} {f.device}"}},
    ]
    for s in f.streams.values():
        ev.append({"ph": "M", "name": "thread_name", "pid": f.device, "tid": s, "args": {"name": f"stream {s}"}})
    for n, ts, dur in STEPS:
        ev.append(_x("user_annotation", f"ProfilerStep#{n}", HOST_PID, HOST_PID, ts, dur, {"External id": n}))
        ev.append(_x("cpu_op", "aten::linear", HOST_PID, HOST_PID, ts + 5, 40 if n < 3 else 15,
                     {"External id": 10 + n, "Sequence number": n}))
    ev.append(_x("python_function", "train.py(12): step", HOST_PID, HOST_PID, 2, 95, {"Python id": 1}))
    ev.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "marker#1", "pid": HOST_PID,
               "tid": HOST_PID, "ts": 6, "args": {}})
    for i, (launch_ts, ts, dur, role) in enumerate(OPS):
        corr = CORR0 + i + 1
        copy = role == "c"
        stream = f.streams[role]
        rt_args = {"External id": 10 + (1 if launch_ts < 100 else 2 if launch_ts < 200 else 3)}
        if f.corr_args:
            rt_args["correlation"] = corr
        ev.append(_x(f.runtime_cat, f.copy_launch if copy else f.kernel_launch, HOST_PID, HOST_PID,
                     launch_ts, LAUNCH_DUR, rt_args))
        ev.append(_x(f.copy_cat if copy else f.kernel_cat, f.copy_name if copy else f.kernel_name, f.device, stream,
                     ts, dur, _device_args(f, stream, corr, copy)))
        ev.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": HOST_PID, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": f.device, "tid": stream, "ts": ts, "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
    for cat, name, where, ts, dur, args in f.extra:
        pid, tid = (HOST_PID, HOST_PID) if where == "host" else (f.device, f.streams[where])
        ev.append(_x(cat, name, pid, tid, ts, dur, args))
        if "correlation" in args and where == "host":  # a call that enqueued nothing: a lone "f"
            ev.append({"ph": "f", "id": args["correlation"], "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
    return {"schemaVersion": 1, "deviceProperties": [{"id": f.device, "name": f"{f.name} device"}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "traceEvents": ev, "traceName": f"{f.name}.pt.trace.json"}


def _x(cat, name, pid, tid, ts, dur, args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _device_args(f: Family, stream: int, corr: int, copy: bool) -> dict:
    if f.placement == "none":
        return {}
    if f.placement == "queue":  # XPU: the SYCL queue's own id; the stream is the tid
        args = {"device": f.device, "sycl queue": 94_000_000_000 + stream, "l0 queue": f"0x{0x5600 + stream:016x}"}
    else:
        args = {"device": f.device, "stream": stream}
    if copy:
        args["bytes"] = 4096
    if f.corr_args:
        args["correlation"] = corr
    return args


_imported: dict[str, pd.DataFrame] = {}


def imported(f: Family) -> pd.DataFrame:
    if f.name not in _imported:
        _imported[f.name] = import_bytes(json.dumps(kineto_trace(f)).encode(), where=f.name).to_pandas()
    return _imported[f.name]


# ---------------------------------------------------------------- rows, kinds, links

@pytest.mark.parametrize("f", FAMILIES, ids=lambda f: f.name)
def test_device_rows_have_device_stream_and_their_launch(f):
    df = imported(f).sort_values("ts", kind="stable")
    work = df[df.kind.isin(DEVICE_KINDS)]
    by_start = sorted(range(len(OPS)), key=lambda i: OPS[i][1])
    assert work.kind.tolist() == ["memcpy" if OPS[i][3] == "c" else "kernel" for i in by_start]
    assert work.device.tolist() == [f.device] * len(OPS)
    assert work.stream.tolist() == [f.streams[OPS[i][3]] for i in by_start]
    assert work["corr"].tolist() == [CORR0 + i + 1 for i in by_start]
    launches = df[df.kind == "launch"]
    assert launches.name.tolist() == [f.copy_launch if op[3] == "c" else f.kernel_launch for op in OPS]
    assert launches["corr"].tolist() == [CORR0 + i + 1 for i in range(len(OPS))]
    assert launches.device.isna().all() and launches.stream.isna().all()
    # Each task sits in the step of the call that launched it.
    assert work.step.tolist() == [1 if OPS[i][0] < 100 else 2 if OPS[i][0] < 200 else 3 for i in by_start]


@pytest.mark.parametrize("f", FAMILIES, ids=lambda f: f.name)
def test_host_rows_and_flows(f):
    df = imported(f)
    assert (df.kind == "step").sum() == 3
    assert df[df.cat == "cpu_op"].kind.tolist() == ["api"] * 3
    assert df[df.cat == "python_function"].kind.tolist() == ["api"]
    assert df[df.cat == "cpu_instant_event"].kind.tolist() == ["marker"]
    flows = df[df.cat == "ac2g"]
    assert set(flows.kind) == {"flow"}
    assert sorted(flows[flows.ph == "s"]["corr"]) == [CORR0 + i + 1 for i in range(len(OPS))]
    assert (df.kind == "meta").sum() == 3 + len(f.streams)


def test_cuda_extras():
    df = imported(CUDA).set_index("name")
    assert df.loc["cudaStreamSynchronize", "kind"] == "sync"
    assert (df.loc["Stream Sync", "kind"], df.loc["Stream Sync", "stream"]) == ("sync", 7)
    assert df.loc["cuGetProcAddress", "kind"] == "api"
    # Device-side records that are not work: on their stream, but markers.
    assert df.loc["## forward ##", ["kind", "device", "stream"]].tolist() == ["marker", 0, 7]
    assert df.loc["Event Record", ["kind", "device", "stream"]].tolist() == ["marker", 0, 20]
    assert df.loc["Activity Buffer Request", "kind"] == "marker"
    assert df.loc["range 0", "kind"] == "marker"


def test_mtia_extras():
    df = imported(MTIA).set_index("name")
    assert df.loc["ccp.trace", ["kind", "device", "stream"]].tolist() == ["marker", 1, 102]
    assert df.loc["hbm", "kind"] == "marker"
    assert pd.isna(df.loc["hbm", "device"])


def test_xpu_extras():
    df = imported(XPU).set_index("name")
    # The driver call under the launch has a correlation id no device task carries.
    assert df.loc["zeCommandListAppendLaunchKernel", "kind"] == "api"
    assert df.loc["Queue Sync", ["kind", "device", "stream"]].tolist() == ["sync", 0, 0]
    assert df.loc["scope", "kind"] == "marker"


def test_flows_bind_to_the_task_not_the_annotation_around_it():
    # The annotation encloses the first kernel's flow end too: the innermost slice takes it.
    df = imported(ACME_FLOWS)
    note = df[df.name == "## forward ##"].iloc[0]
    assert (note.kind, note.device, note.stream) == ("marker", 3, 5)
    assert pd.isna(note["corr"])
    assert df[(df.kind == "kernel") & (df.ts == 20_000)]["corr"].tolist() == [CORR0 + 1]


def test_flow_inside_its_slice_binds_to_the_innermost_enclosing_slice():
    # Chrome binds a flow end to the slice around it; Kineto happens to put it at the start.
    ev = [_x("cpu_op", "aten::mm", HOST_PID, HOST_PID, 0, 50, {}),
          _x("acme_runtime", "acmeLaunch", HOST_PID, HOST_PID, 10, 10, {}),
          _x("acme_runtime", "acmeLaunch", HOST_PID, HOST_PID, 30, 10, {}),
          _x("acme_ops", "tile_a", 3, 5, 100, 20, {}),
          _x("acme_ops", "tile_b", 3, 5, 130, 20, {}),
          {"ph": "s", "id": 8, "pid": HOST_PID, "tid": HOST_PID, "ts": 12, "cat": "ac2g", "name": "ac2g"},
          {"ph": "f", "id": 8, "pid": 3, "tid": 5, "ts": 135, "cat": "ac2g", "name": "ac2g", "bp": "e"},
          {"ph": "s", "id": 9, "pid": HOST_PID, "tid": HOST_PID, "ts": 30, "cat": "ac2g", "name": "ac2g"},
          {"ph": "f", "id": 9, "pid": 3, "tid": 5, "ts": 100, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    df = import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).to_pandas()
    x = df[df.ph == "X"].sort_values("ts")
    assert x.kind.tolist() == ["api", "launch", "launch", "kernel", "kernel"]
    assert x["corr"].tolist()[1:] == [8, 9, 9, 8]
    assert x.stream.tolist()[3:] == [5, 5]


def test_unknown_accelerator_host_category_stays_on_the_host():
    df = imported(ACME).set_index("name")
    assert df.loc["log flush", "kind"] == "marker"
    assert pd.isna(df.loc["log flush", "device"]) and pd.isna(df.loc["log flush", "stream"])


# One event of each category libkineto writes (ActivityType names, libkineto/include/ActivityType.h),
# on the track Kineto puts it: device categories on (device 0, stream 7), the rest on the host.
ACTIVITY_KINDS = {
    "cpu_op": "api", "user_annotation": "api", "gpu_user_annotation": "marker", "gpu_memcpy": "memcpy",
    "gpu_memset": "memset", "kernel": "kernel", "external_correlation": "marker", "cuda_runtime": "api",
    "cuda_driver": "api", "python_function": "api", "overhead": "marker", "mtia_runtime": "api",
    "mtia_ccp_events": "kernel", "mtia_insight": "marker", "cuda_sync": "sync", "cuda_event": "marker",
    "mtia_counters": "marker", "glow_runtime": "api", "cuda_profiler_range": "marker", "hpu_op": "api",
    "xpu_runtime": "api", "xpu_driver": "api", "collective_comm": "collective", "privateuse1_runtime": "api",
    "privateuse1_driver": "api", "xpu_scope_profiler": "marker", "xpu_sync": "sync",
}
DEVICE_SIDE = {"gpu_user_annotation", "gpu_memcpy", "gpu_memset", "kernel", "mtia_ccp_events", "mtia_insight",
               "cuda_sync", "cuda_event", "collective_comm", "xpu_sync"}


def test_every_kineto_activity_category_has_a_kind():
    ev = [{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "instant", "pid": HOST_PID, "tid": HOST_PID,
           "ts": 1, "args": {}}]
    for i, cat in enumerate(ACTIVITY_KINDS):
        dev = cat in DEVICE_SIDE
        ev.append(_x(cat, f"op_{cat}", 0 if dev else HOST_PID, 7 if dev else HOST_PID, 10 * i + 10, 5,
                     {"device": 0, "stream": 7} if dev else {}))
    df = import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).to_pandas()
    got = dict(zip(df.cat, df.kind))
    assert got == {**ACTIVITY_KINDS, "cpu_instant_event": "marker"}
    placed = df[df.cat.isin(DEVICE_SIDE)]
    assert placed.device.tolist() == [0] * len(DEVICE_SIDE) and placed.stream.tolist() == [7] * len(DEVICE_SIDE)
    assert df[~df.cat.isin(DEVICE_SIDE)].stream.isna().all()


def test_trace_of_only_new_categories_is_detected_as_kineto():
    # No top-level Kineto keys: the categories alone say Kineto.
    ev = [_x("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", HOST_PID, HOST_PID, 0, 5,
             {"correlation": 7}),
          _x("mtia_ccp_events", "gemm", 1, 3, 10, 5, {"device": 1, "stream": 3, "correlation": 7})]
    trace = import_bytes(json.dumps({"traceEvents": ev}).encode())
    assert trace.meta.source_format == "kineto"
    df = trace.to_pandas()
    assert df.kind.tolist() == ["launch", "kernel"]
    assert df.stream.tolist()[1] == 3


def test_stream_arg_alone_does_not_make_a_host_category_device_work():
    # ROCm writes "stream" on its runtime calls; an unknown host category that says which
    # stream it targets, without a device, is not device work either.
    ev = [_x("cuda_runtime", "hipLaunchKernel", HOST_PID, HOST_PID, 0, 5, {"correlation": 9, "stream": 0}),
          _x("kernel", "k", 0, 0, 10, 5, {"device": 0, "stream": 0, "correlation": 9}),
          _x("acme_host_queue", "submit", HOST_PID, HOST_PID, 20, 5, {"stream": 4})]
    df = import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).to_pandas()
    assert df.kind.tolist() == ["launch", "kernel", "marker"]
    assert df.stream.isna().tolist() == [True, False, True]


def test_flow_with_one_end_links_nothing():
    # A lone "f" on a call (Kineto writes one on calls that enqueue nothing) gives the call
    # no device task, and a device event without any link keeps a null correlation.
    ev = [_x("acme_runtime", "acmeSync", HOST_PID, HOST_PID, 0, 5, {}),
          {"ph": "f", "id": 77, "pid": HOST_PID, "tid": HOST_PID, "ts": 0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
          _x("acme_ops", "tile", 3, 5, 10, 5, {"device": 3, "stream": 5})]
    df = import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).to_pandas()
    assert df[df.ph == "X"].kind.tolist() == ["api", "kernel"]
    assert df[df.ph == "X"]["corr"].isna().all()


def test_odd_device_args_fall_back_to_pid_and_tid():
    # A stream written as text that is no number, a device as a hex string: the event is kept,
    # with what can be read.
    ev = [_x("kernel", "k", 2, 9, 10, 5, {"device": "0x1", "stream": "default", "correlation": 5}),
          _x("cuda_runtime", "cudaLaunchKernel", HOST_PID, HOST_PID, 0, 5, {"correlation": 5})]
    df = import_bytes(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()).to_pandas()
    k = df[df.name == "k"].iloc[0]
    assert (k.kind, k.device, k.stream, k["corr"]) == ("kernel", 1, 9, 5)


# ---------------------------------------------------------------- HTA side by side

@pytest.fixture(scope="module")
def hta_dir(tmp_path_factory):
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    warnings.filterwarnings("ignore")
    logging.getLogger("hta").setLevel(logging.ERROR)
    yield tmp_path_factory.mktemp("hta_families")
    os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)


_hta_runs: dict[str, object] = {}


def _hta(f: Family, root):
    from hta.trace_analysis import TraceAnalysis

    view = _hta_view(f)
    if view.name not in _hta_runs:
        d = root / view.name
        d.mkdir()
        with gzip.open(d / f"{view.name}.pt.trace.json.gz", "wt") as fh:
            json.dump(kineto_trace(view), fh)
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            _hta_runs[view.name] = TraceAnalysis(trace_dir=str(d))
        finally:
            logging.disable(previous)
        shutil.rmtree(d)
    return _hta_runs[view.name]


def _ours(f: Family) -> Frames:
    return Frames(import_bytes(json.dumps(kineto_trace(f)).encode()), window="complete_steps")


@pytest.mark.parametrize("f", FAMILIES, ids=lambda f: f.name)
def test_idle_time_per_stream_matches_hta(f, hta_dir):
    idle, _ = _hta(f, hta_dir).get_idle_time_breakdown(ranks=[0], visualize=False)
    theirs = idle.groupby("stream")["idle_time"].sum().to_dict()  # us
    ours = {int(r.stream): r.idle_ns / 1000 for r in stream_time(_ours(f)).itertuples()}
    expected = {f.streams[role]: us for role, us in IDLE_US.items()}
    assert theirs == expected
    assert ours == expected


@pytest.mark.parametrize("f", FAMILIES, ids=lambda f: f.name)
def test_queue_length_per_stream_matches_hta(f, hta_dir):
    summary = _hta(f, hta_dir).get_queue_length_summary(ranks=[0])["queue_length"].reset_index()
    theirs = {int(r.stream): (int(r["count"]), r["mean"], int(r["max"])) for _, r in summary.iterrows()}
    ours = {int(r.stream): (int(r.count), r.mean, int(r.max)) for r in queue_summary(queue_series(_ours(f))).itertuples()}
    expected = {f.streams[role]: q for role, q in QUEUE.items()}
    assert theirs == expected
    assert ours == expected


# ---------------------------------------------------------------- the CLI

runner = CliRunner()


def test_info_shows_the_mtia_devices_and_streams(tmp_path):
    src = tmp_path / "mtia.pt.trace.json"
    src.write_text(json.dumps(kineto_trace(MTIA)))
    result = runner.invoke(app, ["info", str(src), "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["streams"] == [{"rank": 0, "device": 1, "streams": [1, 102]}]
    assert got["kinds"]["kernel"] == 5 and got["kinds"]["memcpy"] == 2 and got["kinds"]["launch"] == 7
    plain = runner.invoke(app, ["info", str(src)])
    assert plain.exit_code == 0
    # One device, whose id is 1 (however the line spells count and ids).
    lines = [line for line in plain.stdout.splitlines() if line.startswith("devices")]
    assert len(lines) == 1 and "-" not in lines[0]
    assert set(re.findall(r"\d+", lines[0])) == {"1"}


def test_info_on_a_truncated_mtia_trace_is_a_one_line_error(tmp_path):
    src = tmp_path / "mtia.pt.trace.json"
    text = json.dumps(kineto_trace(MTIA))
    src.write_text(text[: len(text) // 2])
    result = runner.invoke(app, ["info", str(src)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_import_file_matches_import_bytes(tmp_path):
    src = tmp_path / "acme.json"
    src.write_text(json.dumps(kineto_trace(ACME_FLOWS)))
    assert import_trace(src).table.equals(import_bytes(src.read_bytes(), where=str(src)).table)
