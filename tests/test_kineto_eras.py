"""Kineto traces as each era of the PyTorch profiler wrote them, read as their producers meant them.

- PyTorch 2.x mirrors each `ProfilerStep#N` on the GPU as a gpu_user_annotation: the device's
  annotation of the step, not one more step.
- PyTorch 1.8 wrote a bare JSON array, no schemaVersion, with the categories Operator, Runtime,
  Kernel, Memcpy, Memset (tests/data/kineto_pytorch18.json, written by hand in that shape).
- ROCm builds whose device names are empty still say ROCm: roctracer / HIP versions, hip* calls.
- Copy rates come from the producer's own "memory bandwidth (GB/s)" where it wrote one: its
  figure is from the exact duration, `dur` may be rounded to whole microseconds.

Expected figures are worked out by hand from the events listed with them, or read from the raw
files with the standard library.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from analyzers.frames import Frames
from analyzers.memcpy import bandwidth_summary
from analyzers.streams import copy_bandwidth
from msprof_py.cli import app
from msprof_py.trace import import_bytes, import_trace

PT18 = Path(__file__).resolve().parent / "data" / "kineto_pytorch18.json"
BASE_US = 1_700_000_000_000_000
runner = CliRunner()

#: (step, ts, dur, kernels as (launch ts, kernel ts, kernel dur)), in us from BASE_US.
TWO_STEPS = ((1, 0, 100, ((10, 40, 20), (20, 60, 30))), (2, 100, 100, ((110, 140, 20), (120, 160, 30))))
ONE_STEP = ((1, 0, 100, ((10, 40, 20), (50, 60, 30))),)


def pt2_trace(steps, *, mirrors: bool = True, device_name: str = "NVIDIA A100-SXM4-80GB",
              launch: str = "cudaLaunchKernel", top: dict | None = None) -> dict:
    """A PyTorch 2.x trace of `steps`: host ProfilerStep slices (user_annotation), one launch call
    per kernel, kernels on device 0 stream 7 joined by correlation args and ac2g flows and, with
    `mirrors`, each step's gpu_user_annotation mirror on the GPU from its first kernel's start
    to its last kernel's end (as Kineto draws it)."""
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    corr = 100
    for number, ts, dur, kernels in steps:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 4242,
                       "tid": 4242, "ts": BASE_US + ts, "dur": dur, "args": {"External id": number}})
        for launch_ts, kernel_ts, kernel_dur in kernels:
            corr += 1
            events += [
                {"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": 4242, "tid": 4242, "ts": BASE_US + launch_ts,
                 "dur": 5, "args": {"correlation": corr}},
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 4242, "tid": 4242,
                 "ts": BASE_US + launch_ts},
                {"ph": "X", "cat": "kernel", "name": f"gemm_{corr}", "pid": 0, "tid": 7, "ts": BASE_US + kernel_ts,
                 "dur": kernel_dur, "args": {"device": 0, "stream": 7, "correlation": corr}},
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": BASE_US + kernel_ts,
                 "bp": "e"},
            ]
        if mirrors:
            first, last = kernels[0][1], max(k + d for _l, k, d in kernels)
            events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{number}", "pid": 0,
                           "tid": 7, "ts": BASE_US + first, "dur": last - first,
                           "args": {"External id": number, "device": 0, "stream": 7}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": device_name, "numSms": 108}],
            **(top or {}), "traceEvents": events}


def imported(doc: dict):
    return import_bytes(json.dumps(doc).encode())


def rows(trace, kinds: tuple[str, ...], columns: tuple[str, ...]) -> list[tuple]:
    df = trace.to_pandas()
    df = df[df.kind.isin(kinds)].sort_values(["ts", "name"], kind="stable")
    return [tuple(None if v is None or v != v else v for v in r) for r in df[list(columns)].itertuples(index=False)]


# ---------------------------------------------------------------- steps and their GPU mirrors
def test_step_mirrors_on_the_gpu_are_device_annotations_not_steps():
    trace = imported(pt2_trace(TWO_STEPS))
    steps = Frames(trace).steps
    assert list(zip(steps.name, steps.ts, steps.dur)) == [("ProfilerStep#1", 0, 100_000),
                                                         ("ProfilerStep#2", 100_000, 100_000)]
    # The mirrors stay on the device, as markers of their step (40-90 us and 140-190 us).
    mirrors = rows(trace, ("marker",), ("name", "ts", "dur", "device", "stream", "step"))
    assert mirrors == [("ProfilerStep#1", 40_000, 50_000, 0, 7, 1), ("ProfilerStep#2", 140_000, 50_000, 0, 7, 2)]
    assert [r[0] for r in rows(trace, ("kernel",), ("step",))] == [1, 1, 2, 2]


def test_complete_steps_cuts_at_the_last_host_step_not_at_a_mirror():
    # Two steps: HTA's window keeps what the host did before ProfilerStep#2 (100 us) and the
    # kernels it launched: step 1's two kernels. (Cut at the last mirror, 140 us, it kept all four.)
    ops = Frames(imported(pt2_trace(TWO_STEPS)), window="complete_steps").device_ops
    assert list(ops.name) == ["gemm_101", "gemm_102"]


def test_one_step_trace_with_its_mirror_keeps_its_device_work():
    # One step is no window to cut (the mirror made it two, and the cut at its start, 40 us,
    # dropped the kernel launched at 50 us).
    trace = imported(pt2_trace(ONE_STEP))
    frames = Frames(trace, window="complete_steps")
    assert list(frames.steps.name) == ["ProfilerStep#1"]
    assert list(frames.device_ops.name) == ["gemm_101", "gemm_102"]


def test_real_rocm_ddp_trace_has_three_steps_of_16_ms(real_traces):
    trace = import_trace(real_traces / "kineto" / "mi300_resnet_ddp_rank0.json.gz")
    steps = Frames(trace).steps
    assert list(zip(steps.name, steps.dur)) == [("ProfilerStep#15", 16_798_984), ("ProfilerStep#16", 15_950_958),
                                                ("ProfilerStep#17", 15_887_029)]
    mirrors = rows(trace, ("marker",), ("name", "dur", "device", "stream", "step"))
    assert [m for m in mirrors if str(m[0]).startswith("ProfilerStep#")] == [
        ("ProfilerStep#15", 18_001, 2, 0, 15), ("ProfilerStep#16", 16_241, 2, 0, 16), ("ProfilerStep#17", 17_361, 2, 0, 17)]


def test_real_rocm_ddp_report_says_three_steps(real_traces, tmp_path):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["report", str(real_traces / "kineto" / "mi300_resnet_ddp_rank0.json.gz"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["summary"]["steps"] == 3
    assert report["summary"]["step_time_ns_mean"] == pytest.approx((16_798_984 + 15_950_958 + 15_887_029) / 3)
    assert report["platform"] == "rocm"


def test_real_rocm_mi250_trace_has_its_two_steps(real_traces):
    steps = Frames(import_trace(real_traces / "kineto" / "amd_mi250_rocm.json.gz")).steps
    assert list(zip(steps.name, steps.dur)) == [("ProfilerStep#1", 9_288_291), ("ProfilerStep#2", 49_073)]


# ---------------------------------------------------------------- PyTorch 1.8: the first layout
def test_pytorch_18_bare_array_imports_as_kineto():
    trace = import_trace(PT18)
    assert trace.meta.source_format == "kineto"
    assert Counter(trace.table.column("kind").to_pylist()) == {
        "meta": 2, "step": 2, "api": 7, "launch": 7, "sync": 2, "kernel": 3, "memcpy": 3, "memset": 1, "flow": 14,
        "marker": 2}


def test_pytorch_18_device_work_has_stream_device_correlation_and_bytes():
    trace = import_trace(PT18)
    got = rows(trace, ("kernel", "memcpy", "memset"), ("kind", "ts", "dur", "device", "stream", "corr", "bytes", "step"))
    assert got == [
        ("kernel", 100_000, 150_000, 0, 7, 101, None, 1),
        ("kernel", 400_000, 8_000, 0, 7, 102, None, 1),
        ("memcpy", 530_000, 40_000, 0, 7, 103, 1_048_576, 1),
        ("memset", 680_000, 2_000, 0, 7, 105, 4_096, 1),
        ("memcpy", 750_000, 8_000, 0, 7, 106, 2_097_152, 1),  # a peer copy: its device is the event's pid
        ("kernel", 1_050_000, 5_000, 0, 7, 107, None, 2),
        ("memcpy", 1_130_000, 20_000, 0, 7, 108, 1_048_576, 2),
    ]
    # Kernels: blocks (the grid's product) and the SMs their "blocks per SM" imply (64 / 0.8).
    assert rows(trace, ("kernel",), ("value", "addr")) == [(64.0, 80), (1024.0, 80), (256.0, 80)]


def test_pytorch_18_runtime_calls_are_launches_and_syncs_operators_host_ops():
    trace = import_trace(PT18)
    assert rows(trace, ("launch", "sync"), ("name", "kind", "corr", "step")) == [
        ("cudaLaunchKernel", "launch", 101, 1), ("cudaLaunchKernel", "launch", 102, 1),
        ("cudaMemcpyAsync", "launch", 103, 1), ("cudaStreamSynchronize", "sync", 104, 1),
        ("cudaMemsetAsync", "launch", 105, 1), ("cudaMemcpyAsync", "launch", 106, 1),
        ("cudaLaunchKernel", "launch", 107, 2), ("cudaMemcpyAsync", "launch", 108, 2),
        ("cudaStreamSynchronize", "sync", 109, 2)]
    assert [r[0] for r in rows(trace, ("api",), ("name",))] == [
        "aten::conv2d", "aten::add_", "aten::copy_", "aten::zero_", "aten::copy_", "aten::relu", "aten::copy_"]
    # The launch flows ("async" / "launch" then) carry the correlation id they stand for.
    assert sorted(r[0] for r in rows(trace, ("flow",), ("corr",))) == sorted(2 * [101, 102, 103, 105, 106, 107, 108])
    steps = Frames(trace).steps
    assert list(zip(steps.name, steps.ts, steps.dur)) == [("ProfilerStep#1", 0, 1_000_000),
                                                         ("ProfilerStep#2", 1_000_000, 400_000)]
    assert Frames(trace).platform == "cuda"


def test_pytorch_18_copy_rates_are_the_profilers_own():
    copies = copy_bandwidth(Frames(import_trace(PT18)))
    assert list(zip(copies.kind, copies.gbps)) == [
        ("Memcpy HtoD", 25.954851485148517), ("Memset", 2.56), ("Memcpy PtoP", 255.75024390243902),
        ("Memcpy DtoH", 51.653990147783254)]


def test_pytorch_18_info_lists_its_device_work():
    result = runner.invoke(app, ["info", str(PT18), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["source_format"] == "kineto"
    assert {k: info["kinds"][k] for k in ("kernel", "memcpy", "memset", "launch")} == {
        "kernel": 3, "memcpy": 3, "memset": 1, "launch": 7}
    assert info["streams"] == [{"rank": 0, "device": 0, "streams": [7]}]


def test_pytorch_18_truncated_file_is_a_one_line_error(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_bytes(PT18.read_bytes()[:3000])
    result = runner.invoke(app, ["info", str(cut)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "truncated" in result.output


def test_a_lone_kernel_category_is_not_read_as_the_first_kineto_layout():
    # "Kernel" alone is a common word another tool may use; the first layout wrote it beside
    # Operator / Runtime host events.
    doc = [{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 1, "ts": 1, "dur": 2}]
    assert import_bytes(json.dumps(doc).encode()).meta.source_format == "chrome"


# ---------------------------------------------------------------- platform
@pytest.mark.parametrize(("launch", "top", "platform"), [
    ("hipLaunchKernel", {}, "rocm"),
    ("cudaLaunchKernel", {"roctracer_version": 4.1, "hip_runtime_version": 60242134}, "rocm"),
    ("cudaLaunchKernel", {}, "cuda"),
])
def test_platform_with_empty_device_names(launch, top, platform):
    trace = imported(pt2_trace(ONE_STEP, device_name="", launch=launch, top=top))
    assert Frames(trace).platform == platform


def test_rocm_trace_with_empty_device_names_gets_rocm_wording(tmp_path):
    src = tmp_path / "rocm.json"
    src.write_text(json.dumps(pt2_trace(TWO_STEPS, device_name="", launch="hipLaunchKernel")))
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["report", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["platform"] == "rocm"


@pytest.mark.parametrize(("name", "platform"), [
    ("amd_mi250_rocm", "rocm"), ("mi300_resnet_ddp_rank0", "rocm"), ("sglang_qwen3_mi300", "rocm"),
    ("nccl_2rank_rank0", "cuda"), ("tiny_base", "cuda"),
])
def test_real_trace_platform(real_traces, name, platform):
    assert Frames(import_trace(real_traces / "kineto" / f"{name}.json.gz")).platform == platform


# ---------------------------------------------------------------- copy rates from rounded durations
def _args_rates(path: Path) -> dict[str, list[float]]:
    """Copy kind -> the producer's own rates of its copies, from the raw file."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    out: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") in ("gpu_memcpy", "gpu_memset") and "memory bandwidth (GB/s)" in e.get("args", {}):
            kind = "Memset" if e["cat"] == "gpu_memset" else " ".join(e["name"].split()[:2])
            out.setdefault(kind, []).append(e["args"]["memory bandwidth (GB/s)"])
    return out


@pytest.mark.parametrize("name", ["queue_16rank_rank0", "dlrm_8rank/worker3_step_12.1694128201557.pt.trace"])
def test_copy_rates_on_whole_microsecond_traces_are_the_profilers(real_traces, name):
    path = real_traces / "kineto" / f"{name}.json.gz"
    copies = copy_bandwidth(Frames(import_trace(path)))
    want = _args_rates(path)
    got = {k: sorted(g) for k, g in copies.groupby("kind")["gbps"]}
    assert got == {k: sorted(v) for k, v in want.items()}
    # bytes / the rounded duration would say otherwise (memsets of queue_16rank: 0.583 GB/s on average).
    rounded = (copies["bytes"] / np.maximum(copies["end"] - copies["ts"], 1)).groupby(copies["kind"]).mean()
    for kind, rates in want.items():
        assert copies[copies.kind == kind]["gbps"].mean() == pytest.approx(np.mean(rates), rel=1e-12)
        assert rounded[kind] != pytest.approx(np.mean(rates), rel=1e-3)


def test_memset_rate_of_queue_16rank_is_the_traces_and_htas(real_traces):
    path = real_traces / "kineto" / "queue_16rank_rank0.json.gz"
    copies = copy_bandwidth(Frames(import_trace(path)))
    memsets = copies[copies.kind == "Memset"]
    assert len(memsets) == 277
    assert memsets["gbps"].mean() == pytest.approx(0.43736477035458615, rel=1e-12)  # the args' mean
    # HTA's memory bandwidth summary in its window (get_memory_bw_summary): Memset mean 0.410212 GB/s over 200 samples.
    hta_window = bandwidth_summary(copy_bandwidth(Frames(import_trace(path), window="complete_steps")))
    row = hta_window[hta_window.kind == "Memset"].iloc[0]
    assert (row["count"], round(row["gbps_mean"], 6)) == (200, 0.410212)
