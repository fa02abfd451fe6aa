"""Per-stream numbers (idle time, queue length, copy bandwidth) on a hand-made Kineto trace.

Every expected value below is worked out by hand from the events (times in us in the JSON, ns
in the results), so the vectorised implementation is pinned to the definitions it documents.
"""

from __future__ import annotations

import json

import pytest

from analyzers.frames import Frames
from analyzers.memcpy import bandwidth_in_use, bandwidth_summary
from analyzers.streams import (
    copy_bandwidth,
    queue_series,
    queue_summary,
    stream_time,
)
from msprof_py.trace import import_bytes


def _launch(name: str, ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}


def _op(cat: str, name: str, ts: float, dur: float, stream: int, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


EVENTS = [
    _launch("cudaLaunchKernel", 10, 1), _op("kernel", "gemm", 20, 10, 7, 1),
    _launch("cudaLaunchKernel", 12, 2), _op("kernel", "relu", 30, 5, 7, 2),
    _launch("cudaMemcpyAsync", 14, 3), _op("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 15, 4, 8, 3, bytes=4000),
    # One launch, two kernels sharing its correlation id: no one-to-one launch, not queued.
    _launch("cudaLaunchKernel", 16, 4), _op("kernel", "a", 40, 5, 7, 4), _op("kernel", "b", 50, 5, 7, 4),
    # The profiler's own bandwidth figure wins over bytes / dur (1000 B / 2000 ns = 0.5).
    _launch("cudaMemsetAsync", 16.5, 5), _op("gpu_memset", "Memset (Device)", 21, 2, 8, 5, bytes=1000,
                                              **{"memory bandwidth (GB/s)": 0.75}),
    _launch("cudaMemcpyAsync", 16.8, 6), _op("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 17, 4, 9, 6, bytes=2000),
    _launch("cudaMemcpyAsync", 60, 7), _op("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 61, 1, 9, 7, bytes=500),
]


@pytest.fixture(scope="module")
def frames() -> Frames:
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": EVENTS}
    return Frames(import_bytes(json.dumps(doc).encode()))


def _rows(df, cols):
    return [tuple(r) for r in df[cols].itertuples(index=False)]


def test_stream_time_busy_and_idle_per_stream(frames):
    st = stream_time(frames)
    cols = ["stream", "ops", "busy_ns", "idle_ns", "first_ns", "last_ns"]
    # ts are relative to the first event (10 us). Stream 7: 20-30, 30-35, 40-45, 50-55 -> idle 5 + 5 us.
    assert _rows(st, cols) == [(7, 4, 25_000, 10_000, 10_000, 45_000),
                               (8, 2, 6_000, 2_000, 5_000, 13_000),
                               (9, 2, 5_000, 40_000, 7_000, 52_000)]


def test_queue_length_series_and_summary(frames):
    q = queue_series(frames)
    by_stream = {s: _rows(q[q["stream"] == s], ["ts", "queue_length"]) for s in (7, 8, 9)}
    assert by_stream[7] == [(0, 1), (2_000, 2), (10_000, 1), (20_000, 0)]  # correlation 4 left out
    assert by_stream[8] == [(4_000, 1), (5_000, 0), (6_500, 1), (11_000, 0)]
    assert by_stream[9] == [(6_800, 1), (7_000, 0), (50_000, 1), (51_000, 0)]
    s = queue_summary(q)
    assert _rows(s, ["stream", "count", "mean", "max"]) == [(7, 4, 1.0, 2), (8, 4, 0.5, 1), (9, 4, 0.5, 1)]
    # With fan_out, both kernels of correlation 4 count against their one launch.
    fan = queue_series(frames, fan_out=True)
    assert _rows(fan[fan["stream"] == 7], ["ts", "queue_length"]) == [
        (0, 1), (2_000, 2), (6_000, 3), (6_000, 4), (10_000, 3), (20_000, 2), (30_000, 1), (40_000, 0)]


def test_copy_kinds_bandwidth_and_concurrent_sum(frames):
    c = copy_bandwidth(frames)
    assert _rows(c, ["stream", "kind", "ts", "end", "gbps"]) == [
        (8, "Memcpy HtoD", 5_000, 9_000, 1.0), (8, "Memset", 11_000, 13_000, 0.75),
        (9, "Memcpy HtoD", 7_000, 11_000, 0.5), (9, "Memcpy DtoD", 51_000, 52_000, 0.5)]
    series = bandwidth_in_use(c)
    htod = series[series["kind"] == "Memcpy HtoD"]
    assert _rows(htod, ["ts", "gbps"]) == [(5_000, 1.0), (7_000, 1.5), (9_000, 0.5), (11_000, 0.0)]
    s = bandwidth_summary(c)
    assert _rows(s, ["kind", "count", "gbps_mean", "gbps_max"]) == [
        ("Memcpy DtoD", 1, 0.5, 0.5), ("Memcpy HtoD", 3, 1.0, 1.5), ("Memset", 1, 0.75, 0.75)]
