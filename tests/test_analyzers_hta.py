"""Our per-stream numbers against Holistic Trace Analysis on the same real Kineto traces.

HTA is run here, side by side, as the peer. Two of its defaults are matched explicitly:
its analysis window (host events before the last ProfilerStep and the device work they
launched: our `window="complete_steps"`) and its rounding of nanosecond timestamps to whole
microseconds, which we turn off with HTA's own switch (HTA_DISABLE_NS_ROUNDING=1) because it
inflates idle time by up to 2 us per kernel while our timestamps are exact; where that default
parts from our figure, a test pins both (HTA_ROUNDING).
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings

import pytest
from test_bandwidth_hta import OVERLAPPING, kineto_trace

from analyzers.frames import Frames
from analyzers.memcpy import bandwidth_summary
from analyzers.streams import copy_bandwidth, queue_series, queue_summary, stream_time
from msprof_py.trace import import_trace

KINETO = ["alexnet_critical_path", "amd_mi250_rocm", "event_sync_multi_stream", "nccl_2rank_rank0",
          "ns_resolution_rank0", "queue_16rank_rank0", "sampled_128rank_rank0", "sampled_128rank_rank1", "tiny_base"]


@pytest.fixture(scope="module")
def hta_env(tmp_path_factory):
    import os

    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    warnings.filterwarnings("ignore")
    logging.getLogger("hta").setLevel(logging.ERROR)
    yield tmp_path_factory.mktemp("hta")
    os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)


def _both(real_traces, hta_env, name):
    """HTA on a copy of the trace, its rank, and our frames over the same window. `real_traces`
    is the shared traces' folder, or a trace file of a test's own."""
    from hta.trace_analysis import TraceAnalysis

    src = real_traces if real_traces.is_file() else real_traces / "kineto" / f"{name}.json.gz"
    d = hta_env / name
    d.mkdir(exist_ok=True)
    shutil.copy(src, d / src.name)
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        hta = TraceAnalysis(trace_dir=str(d))
    finally:
        logging.disable(previous)
    rank = list(hta.t.traces)[0]
    return hta, rank, Frames(import_trace(src), window="complete_steps")


@pytest.mark.parametrize("name", KINETO)
def test_idle_time_per_stream_matches_hta(real_traces, hta_env, name):
    hta, rank, frames = _both(real_traces, hta_env, name)
    idle, _ = hta.get_idle_time_breakdown(ranks=[rank], visualize=False)
    theirs = idle.groupby("stream")["idle_time"].sum().to_dict()  # microseconds
    ours = {int(r.stream): r.idle_ns / 1000 for r in stream_time(frames).itertuples()}
    assert set(theirs) <= set(ours)
    for stream, t in theirs.items():
        assert ours[stream] == pytest.approx(t, rel=0.01, abs=0.01), stream


#: Idle time per stream where we deliberately part from HTA's default: unless HTA_DISABLE_NS_ROUNDING
#: is set (as every other test here sets it), HTA rounds nanosecond timestamps to whole microseconds,
#: and each kernel's rounded start and end move its gaps; our timestamps stay the trace's nanoseconds.
#: (trace, stream) -> (ours in ns, HTA without the rounding in us, HTA's default in us), HTA 0.5 run
#: here on the shared traces; where its default matches ours it is not listed.
HTA_ROUNDING = {
    ("amd_mi250_rocm", 0): (8_762_845, 8762.84, 8780.0),
    ("nccl_2rank_rank0", 7): (356_898_730, 356898.73, 359402.0),
    ("nccl_2rank_rank0", 40): (381_488_447, 381488.45, 381499.0),
    ("ns_resolution_rank0", 7): (6_452_701, 6452.77, 10113.0),  # sub-us kernels: +57% idle
}


def _hta_idle(hta_env, name: str, *, rounding: bool) -> dict[int, float]:
    """HTA's idle time per stream (us) of the copy `_both` made, with or without its ns rounding."""
    import os

    from hta.trace_analysis import TraceAnalysis

    if rounding:
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        hta = TraceAnalysis(trace_dir=str(hta_env / name))
        idle, _ = hta.get_idle_time_breakdown(ranks=[list(hta.t.traces)[0]], visualize=False)
    finally:
        logging.disable(previous)
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    return idle.groupby("stream")["idle_time"].sum().to_dict()


@pytest.mark.parametrize("name", sorted({n for n, _ in HTA_ROUNDING}))
def test_idle_time_where_htas_default_rounds_to_whole_microseconds(real_traces, hta_env, name):
    _, _, frames = _both(real_traces, hta_env, name)
    ours = {int(r.stream): int(r.idle_ns) for r in stream_time(frames).itertuples()}
    exact, rounded = _hta_idle(hta_env, name, rounding=False), _hta_idle(hta_env, name, rounding=True)
    for (trace, stream), (mine, theirs_exact, theirs_default) in HTA_ROUNDING.items():
        if trace != name:
            continue
        assert ours[stream] == mine
        assert exact[stream] == pytest.approx(theirs_exact, abs=1e-6)
        assert mine / 1000 == pytest.approx(theirs_exact, rel=0.01, abs=0.1), "same timestamps: HTA agrees"
        assert rounded[stream] == theirs_default, (
            f"HTA's default rounds the trace's ns timestamps to whole us: {theirs_default} us idle on stream "
            f"{stream}, where the exact timestamps give {mine / 1000} us (ours)")
    listed = {s for t, s in HTA_ROUNDING if t == name}
    for stream, t in rounded.items():  # every other stream: the rounding changes nothing there
        if stream not in listed:
            assert ours[stream] / 1000 == pytest.approx(t, rel=0.01, abs=0.01), stream


@pytest.mark.parametrize("name", KINETO)
def test_queue_length_summary_matches_hta(real_traces, hta_env, name):
    hta, rank, frames = _both(real_traces, hta_env, name)
    theirs = hta.get_queue_length_summary(ranks=[rank])
    ours = queue_summary(queue_series(frames))
    if theirs is None:
        assert ours.empty
        return
    theirs = theirs["queue_length"].reset_index()
    assert len(theirs) == len(ours)
    for row in ours.itertuples():
        t = theirs[theirs["stream"] == row.stream].iloc[0]
        assert row.max == t["max"]  # exactly
        assert row.count == t["count"]
        assert row.mean == pytest.approx(t["mean"], rel=0.01)


@pytest.mark.parametrize("name", [*KINETO, "overlapping_copies"])
def test_memcpy_bandwidth_summary_matches_hta(real_traces, hta_env, name):
    """HTA's statistics are over its time series of bandwidth in use (copies of a kind running at
    once summed), so its count is of samples, not copies; ours must be the same figures."""
    if name == "overlapping_copies":
        src = hta_env / "overlapping_copies.json"  # copies overlapping on three streams, beside an HtoD copy
        src.write_text(json.dumps(kineto_trace(OVERLAPPING)))
        hta, rank, frames = _both(src, hta_env, name)
    else:
        hta, rank, frames = _both(real_traces, hta_env, name)
    theirs = hta.get_memory_bw_summary(ranks=[rank])
    ours = bandwidth_summary(copy_bandwidth(frames))
    if theirs is None or theirs.empty:  # e.g. ROCm copies without byte counts
        assert ours.empty
        return
    theirs = theirs["memory_bw_gbps"].reset_index()
    assert sorted(theirs["name"]) == sorted(ours["kind"])
    for row in ours.itertuples():
        t = theirs[theirs["name"] == row.kind].iloc[0]
        assert row.count == t["count"]
        assert row.gbps_mean == pytest.approx(t["mean"], rel=0.01)
        assert row.gbps_max == pytest.approx(t["max"], rel=0.01)
        assert row.gbps_min == pytest.approx(t["min"], rel=0.01)
        assert row.gbps_p50 == pytest.approx(t["50%"], rel=0.01)
    if name == "overlapping_copies":  # by hand: samples 4 6 7 5 1 9 8 0.5 GB/s; a per-copy mean would be 3.1
        dtod = ours[ours["kind"] == "Memcpy DtoD"].iloc[0]
        assert (dtod["copies"], dtod["count"], dtod["gbps_mean"], dtod["gbps_max"]) == (5, 8, 5.0625, 9.0)


@pytest.mark.parametrize("name", KINETO)
def test_all_analyzers_run_on_every_real_trace(real_traces, name):
    from analyzers import run

    result = run(import_trace(real_traces / "kineto" / f"{name}.json.gz"))
    assert set(result.skipped) | {f.analyzer for f in result.findings} <= {
        "bandwidth", "bubbles", "cores", "launch", "links", "memory", "queue", "ranks", "sync"}
    assert all(f.lookup is not None and f.lookup.remedy for f in result.findings)
