"""Kernel rows carry their launch's blocks (`value`) and the cores of their kind on their device
(`addr`), and AscendCL's operator compile calls are kind op_compile: on real traces.

Expected figures come from the raw files (JSON, kernel_details.csv) read here with the standard
library, beside exact counts known from the files.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msprof_py.trace import import_bytes, import_trace
from msprof_py.trace.importers import kineto
from msprof_py.trace.schema import KINDS

RANK0 = "ascend/resnet_2rank_level1_text/rank0_ascend_pt"
RANK0_VIEW = f"{RANK0}/ASCEND_PROFILER_OUTPUT/trace_view.json"
RANK1_VIEW = "ascend/resnet_2rank_level1_text/rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"


def doc(path: Path) -> dict:
    data = json.loads((gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read())
    return data if isinstance(data, dict) else {"traceEvents": data}


def kernels(trace) -> pd.DataFrame:
    df = trace.to_pandas()
    return df[df.kind == "kernel"]


def ns(us: str) -> int:
    return int(Decimal(us.strip()) * 1000)


# --- Kineto -------------------------------------------------------------------------------

#: trace -> (kernel rows, with a block count, with a core count, the core counts)
KINETO = {
    "alexnet_critical_path.json.gz": (79, 79, 79, {108}),
    "amd_mi250_rocm.json.gz": (14, 0, 14, {104}),  # ROCm 6.2 Kineto writes no grid
    "event_sync_multi_stream.json.gz": (3, 3, 3, {108}),
    "mi300_resnet_ddp_rank0.json.gz": (2978, 2226, 2978, {304}),
    "nccl_2rank_rank0.json.gz": (2679, 2679, 2679, {108}),
    "ns_resolution_rank0.json.gz": (4350, 4350, 4350, {80}),
    "queue_16rank_rank0.json.gz": (6000, 6000, 6000, {108}),
    "sampled_128rank_rank0.json.gz": (1144, 1144, 1144, {108}),  # no deviceProperties
    "sampled_128rank_rank1.json.gz": (1094, 1094, 1094, {108}),  # no deviceProperties
    "sglang_qwen3_mi300.json.gz": (527, 527, 527, {304}),
    "tiny_base.json.gz": (6, 6, 6, {80}),  # no deviceProperties
    "dlrm_8rank/worker3_step_12.1694128201557.pt.trace.json.gz": (307, 307, 307, {80}),
}
ROCM = ("amd_mi250_rocm.json.gz", "mi300_resnet_ddp_rank0.json.gz", "sglang_qwen3_mi300.json.gz")


@pytest.mark.parametrize("rel", KINETO)
def test_kineto_kernel_counts(real_traces, rel):
    k = kernels(import_trace(real_traces / "kineto" / rel))
    n, with_value, with_addr, cores = KINETO[rel]
    assert (len(k), k["value"].notna().sum(), k["addr"].notna().sum()) == (n, with_value, with_addr)
    assert set(k["addr"].dropna().astype(int)) == cores


@pytest.mark.parametrize("rel", ["alexnet_critical_path.json.gz", "nccl_2rank_rank0.json.gz",
                                 "sampled_128rank_rank0.json.gz", "dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz"])
def test_cuda_value_is_the_grid_and_addr_the_device_sms(real_traces, rel):
    """Every CUDA kernel row: value = grid x*y*z; addr = numSms of its device's deviceProperties
    entry, or, without deviceProperties, the SM count its "blocks per SM" implies."""
    path = real_traces / "kineto" / rel
    d = doc(path)
    sms = {p["id"]: p["numSms"] for p in d.get("deviceProperties", [])}
    k = kernels(import_trace(path))
    by_corr = {e["args"]["correlation"]: e for e in d["traceEvents"] if e.get("cat") == "kernel"}
    for corr, value, addr in zip(k["corr"], k["value"], k["addr"]):
        a = by_corr[corr]["args"]
        assert value == math.prod(a["grid"])
        assert addr == (sms[a["device"]] if sms else round(math.prod(a["grid"]) / a["blocks per SM"]))


def test_named_kernels(real_traces):
    df = kernels(import_trace(real_traces / "kineto/alexnet_critical_path.json.gz"))
    conv = df[df.name == "cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1"].iloc[0]
    assert json.loads(conv["args"])["grid"] == [3025, 1, 1] and (conv["value"], conv["addr"]) == (3025, 108)  # A100
    # ROCm: hipLaunchKernel's grid is in blocks, hipExtModuleLaunchKernel's in work items.
    df = kernels(import_trace(real_traces / "kineto/mi300_resnet_ddp_rank0.json.gz")).dropna(subset=["value"])
    cat = df[df.name.str.startswith("void at::native::(anonymous namespace)::CatArrayBatchedCopy")].iloc[0]
    assert json.loads(cat["args"])["grid"] == [1, 40, 1] and (cat["value"], cat["addr"]) == (40, 304)
    tr = df[df.name == "batched_transpose_256x4_half"].iloc[0]
    assert json.loads(tr["args"])["grid"] == [501760, 1, 1] and (tr["value"], tr["addr"]) == (501760 / 256, 304)
    # A partial workgroup is a block: 784 work items in 256-wide groups are 4 blocks (x 64 in z).
    part = df[df.name.str.startswith("transpose_NCHW2CNHW_V2_2D_WG")]
    part = part[part["args"].map(lambda a: json.loads(a)["grid"] == [784, 1, 64])].iloc[0]
    assert part["value"] == 4 * 64
    # sglang's kernels run on device 9, deviceProperties describes only the one device it saw (id 0).
    sg = kernels(import_trace(real_traces / "kineto/sglang_qwen3_mi300.json.gz"))
    assert set(sg.device) == {9} and set(sg["addr"]) == {304} and sg["value"].sum() == 28382044


@pytest.mark.parametrize("rel", [r for r in KINETO if r not in ROCM])
def test_blocks_per_sm_gives_the_device_properties_count(real_traces, rel):
    """Without deviceProperties, "blocks per SM" gives each CUDA trace's kernels the SM count
    deviceProperties states; nccl_2rank prints the figure with six decimals (0.009259 for 1/108)."""
    d = doc(real_traces / "kineto" / rel)
    with_props = kernels(import_trace(real_traces / "kineto" / rel))
    d.pop("deviceProperties", None)
    without = kernels(import_bytes(json.dumps(d).encode()))
    assert without["addr"].tolist() == with_props["addr"].tolist() and without["addr"].notna().all()


def test_no_core_count_when_the_trace_does_not_say(real_traces):
    # ROCm writes no "blocks per SM": without deviceProperties its kernels have no core count.
    d = doc(real_traces / "kineto/amd_mi250_rocm.json.gz")
    d.pop("deviceProperties")
    assert kernels(import_bytes(json.dumps(d).encode()))["addr"].isna().all()
    # Devices of different sizes: a ROCm kernel's device number is not deviceProperties' id.
    d = doc(real_traces / "kineto/amd_mi250_rocm.json.gz")
    for i, p in enumerate(d["deviceProperties"]):
        p["numSms"] = 104 + i
    assert kernels(import_bytes(json.dumps(d).encode()))["addr"].isna().all()
    # ... a CUDA kernel's is: its own device's entry.
    d = doc(real_traces / "kineto/alexnet_critical_path.json.gz")
    for p in d["deviceProperties"]:
        p["numSms"] = 132 if p["id"] == 0 else 108
    assert set(kernels(import_bytes(json.dumps(d).encode()))["addr"]) == {132}
    # A "blocks per SM" that is not grid / SMs (a constant) says nothing.
    d = doc(real_traces / "kineto/tiny_base.json.gz")
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["blocks per SM"] = 16
    assert kernels(import_bytes(json.dumps(d).encode()))["addr"].isna().all()


@pytest.mark.parametrize("rel", ["kineto/nccl_2rank_rank0.json.gz", "kineto/mi300_resnet_ddp_rank0.json.gz",
                                 "ascend/torch_npu_trace_view.json.gz"])
def test_other_rows_unchanged(real_traces, rel, monkeypatch):
    """Only kernel rows' value and addr change: a collective keeps its communicator and call
    number, a copy its bandwidth."""
    now = import_trace(real_traces / rel).to_pandas()
    monkeypatch.setattr(kineto, "_kernel_shape", lambda *a: None)
    from msprof_py.trace.importers import ascend
    monkeypatch.setattr(ascend, "_kernel_shape", lambda *a: None)
    before = import_trace(real_traces / rel).to_pandas()
    kern = now.kind == "kernel"
    pd.testing.assert_frame_equal(now[~kern], before[~kern])
    pd.testing.assert_frame_equal(now[kern].drop(columns=["value", "addr"]), before[kern].drop(columns=["value", "addr"]))
    assert before[kern][["value", "addr"]].isna().all().all()


# --- torch_npu ------------------------------------------------------------------------------

def details(real_traces: Path, view: str) -> dict[tuple[int, int, int], dict]:
    with open(real_traces / view.replace("trace_view.json", "kernel_details.csv"), newline="") as fh:
        return {(ns(r["Start Time(us)"]), int(r["Stream ID"]), int(r["Task ID"])): r
                for r in csv.DictReader(fh) if r["Task ID"] != "N/A"}


@pytest.mark.parametrize("view", [RANK0_VIEW, RANK1_VIEW])
def test_torch_npu_block_dim_from_kernel_details(real_traces, view):
    """torch_npu's timeline has no Block Dim: the kernel_details.csv beside it gives each kernel
    task its own (found by start, stream and task id); DSA tasks (Block Dim 0) have none."""
    trace = import_trace(real_traces / view)
    k = kernels(trace)
    rows = details(real_traces, view)
    assert len(k) == 305 and k["value"].notna().sum() == 173 and k["addr"].isna().all()
    for ts, stream, args, value in zip(k.ts, k.stream, k["args"], k["value"]):
        r = rows.get((ts + trace.meta.origin_ns, stream, json.loads(args)["Task Id"]))
        want = int(r["Block Dim"]) if r and int(r["Block Dim"]) else None
        assert (None if np.isnan(value) else value) == want
    named = k[k.name == "trans_TransData_0"].iloc[0]
    assert named["value"] == 32  # kernel_details: AI_VECTOR_CORE, Block Dim 32
    assert Counter(k["value"].dropna().astype(int)).most_common(3) == [(32, 49), (48, 47), (1, 24)]


def test_torch_npu_trace_alone_has_no_block_dim(real_traces):
    k = kernels(import_trace(real_traces / "ascend/torch_npu_trace_view.json.gz"))
    assert len(k) == 253 and k["value"].isna().all() and k["addr"].isna().all()
    # ...nor does the same timeline read from bytes (no folder around it).
    data = (real_traces / RANK0_VIEW).read_bytes()
    assert kernels(import_bytes(data))[["value", "addr"]].isna().all().all()


def test_torch_npu_core_counts_from_device_info(real_traces, tmp_path):
    """Where the output folder keeps the device's info.json (PROF_*/device_N/info.json.N, which
    this sample's folder lacks; written here as msprof writes it), kernels get the cores of
    their kind: vector cores for AI_VECTOR_CORE / MIX_AIV kernels, AI cores for AI_CORE ones."""
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(real_traces / RANK0, folder)
    device = folder / "PROF_000001_20250109165203456_ABCDEFGHIJKLMNOP" / "device_0"
    device.mkdir(parents=True)
    (device / "info.json.0").write_text(json.dumps(
        {"DeviceInfo": [{"id": 0, "env_type": 3, "ai_core_num": 24, "aiv_num": 48, "aic_frequency": "1850"}]}))
    (device / "info.json.0.done").write_text("")
    k = kernels(import_trace(folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"))
    rows = details(real_traces, RANK0_VIEW)
    origin = import_trace(real_traces / RANK0_VIEW).meta.origin_ns
    want = []
    for ts, stream, args in zip(k.ts, k.stream, k["args"]):
        r = rows.get((ts + origin, stream, json.loads(args)["Task Id"]))
        core = r["Accelerator Core"] if r and int(r["Block Dim"]) else None
        want.append(48 if core in ("AI_VECTOR_CORE", "MIX_AIV") else 24 if core == "AI_CORE" else None)
    assert [None if np.isnan(a) else a for a in k["addr"]] == want
    assert Counter(k["addr"].dropna().astype(int)) == {48: 150, 24: 23}


# --- op_compile -----------------------------------------------------------------------------

def test_op_compile_is_the_last_kind():
    assert KINDS[-1] == "op_compile" and KINDS.index("host_idle") == len(KINDS) - 2


@pytest.mark.parametrize("view, calls, with_corr, tasks", [
    ("ascend/torch_npu_trace_view.json.gz", 11, 11, {"kernel": 11}),
    (RANK0_VIEW, 19, 5, {"memcpy": 10}),
    (RANK1_VIEW, 19, 5, {"memcpy": 10}),
])
def test_op_compile_calls(real_traces, view, calls, with_corr, tasks):
    """aclopCompileAndExecute is op_compile; the call keeps the correlation of the task it
    launched, and that task takes the call's step. The opCompile step inside it stays api."""
    df = import_trace(real_traces / view).to_pandas()
    oc = df[df.kind == "op_compile"]
    assert set(oc.name) == {"AscendCL@aclopCompileAndExecute"} and len(oc) == calls
    assert oc["corr"].notna().sum() == with_corr
    assert Counter(df[df.name == "AscendCL@opCompile"].kind) == {"api": calls}
    launched = df[df["corr"].isin(oc["corr"].dropna()) & (df.ph == "X") & (df.kind != "op_compile")]
    assert Counter(launched.kind) == tasks
    step_of = dict(zip(oc["corr"], oc["step"]))
    assert all(s == step_of[c] for c, s in zip(launched["corr"], launched["step"]))

