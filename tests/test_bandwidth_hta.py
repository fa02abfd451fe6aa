"""Memcpy bandwidth in use over time, as HTA defines it, on hand-made Kineto traces whose copies
overlap on several streams.

Every expected figure is worked out by hand from the copies listed with it (times in us in the
JSON, rates in GB/s); HTA is then run on the same trace, side by side, and must agree, except
in the two documented places where its figure is an accident of arithmetic (points at the same
time, float residue), where the test pins both its figure and ours.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings

import numpy as np
import pandas as pd
import pytest

from analyzers.frames import Frames
from analyzers.memcpy import bandwidth_in_use, bandwidth_summary, gbps_text
from analyzers.streams import copy_bandwidth
from msprof_py.trace import import_bytes

DTOD = "Memcpy DtoD (Device -> Device)"
HTOD = "Memcpy HtoD (Pinned -> Device)"


def kineto_trace(copies: list[tuple]) -> dict:
    """A Kineto trace of one training step holding `copies`: (name, ts_us, dur_us, stream, gbps[, device]).

    Each copy is launched 1 us before it starts; bytes agree with the rate (gbps x dur_ns)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 500},
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 500,
               "dur": 10}]
    for corr, (name, ts, dur, stream, gbps, *dev) in enumerate(copies, start=1):
        device = dev[0] if dev else 0
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                       "ts": ts - 1, "dur": 0.5, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": device, "tid": stream, "ts": ts,
                       "dur": dur, "args": {"device": device, "stream": stream, "correlation": corr,
                                            "bytes": round(gbps * dur * 1000), "memory bandwidth (GB/s)": gbps}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}


def ours(doc: dict, window: str = "all") -> tuple[pd.DataFrame, pd.DataFrame]:
    c = copy_bandwidth(Frames(import_bytes(json.dumps(doc).encode()), window=window))
    return bandwidth_in_use(c), bandwidth_summary(c)


def hta_summary(doc: dict, tmp_path) -> pd.DataFrame:
    """HTA's memory bandwidth summary of `doc` (rows: kind; columns: describe()'s)."""
    from hta.trace_analysis import TraceAnalysis

    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # timestamps as written, as in test_analyzers_hta
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = TraceAnalysis(trace_dir=str(tmp_path)).get_memory_bw_summary(ranks=[0])
    finally:
        logging.disable(previous)
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    return summary["memory_bw_gbps"].reset_index().set_index("name")


def _series(s: pd.DataFrame, kind: str) -> list[tuple[int, float]]:
    g = s[s["kind"] == kind]
    return list(zip(g["ts"].tolist(), g["gbps"].tolist()))


# Three DtoD streams overlapping, then one copy alone; an HtoD copy at the same time is another series.
OVERLAPPING = [
    (DTOD, 10, 10, 7, 4.0),   # A [10, 20)
    (DTOD, 12, 6, 8, 2.0),    # B [12, 18)
    (DTOD, 15, 10, 9, 1.0),   # C [15, 25)
    (DTOD, 22, 4, 7, 8.0),    # D [22, 26)
    (DTOD, 40, 2, 8, 0.5),    # E [40, 42)
    (HTOD, 13, 4, 10, 3.0),   # H [13, 17)
]
# In use: 10: 4, 12: 4+2, 15: +1, 18: -2, 20: -4, 22: +8, 25: -1, 26: 0, 40: 0.5, 42: 0.
DTOD_SERIES = [(10_000, 4.0), (12_000, 6.0), (15_000, 7.0), (18_000, 5.0), (20_000, 1.0), (22_000, 9.0),
               (25_000, 8.0), (26_000, 0.0), (40_000, 0.5), (42_000, 0.0)]
DTOD_SAMPLES = [4.0, 6.0, 7.0, 5.0, 1.0, 9.0, 8.0, 0.5]  # the positive points


def test_series_sums_copies_overlapping_on_three_streams():
    series, _ = ours(kineto_trace(OVERLAPPING))
    assert _series(series, "Memcpy DtoD") == DTOD_SERIES
    assert _series(series, "Memcpy HtoD") == [(13_000, 3.0), (17_000, 0.0)]
    dtod = series[series["kind"] == "Memcpy DtoD"]
    assert dtod["running"].tolist() == [1, 2, 3, 2, 1, 2, 1, 0, 1, 0]


def test_summary_statistics_are_over_samples_not_copies():
    _, s = ours(kineto_trace(OVERLAPPING))
    d = s.set_index("kind").loc["Memcpy DtoD"]
    assert (d["copies"], d["count"]) == (5, 8)
    assert d["gbps_mean"] == 40.5 / 8 == 5.0625  # not the per-copy mean (4+2+1+8+0.5)/5 = 3.1
    assert (d["gbps_min"], d["gbps_max"]) == (0.5, 9.0)
    # Sorted samples 0.5 1 4 5 6 7 8 9; quartiles by linear interpolation at 1.75, 3.5, 5.25.
    assert (d["gbps_p25"], d["gbps_p50"], d["gbps_p75"]) == (3.25, 5.5, 7.25)
    # Squared deviations from 5.0625 add up to 67.21875; sample std with 7 degrees of freedom.
    assert d["gbps_std"] == pytest.approx(math.sqrt(67.21875 / 7), rel=1e-12)
    h = s.set_index("kind").loc["Memcpy HtoD"]
    assert (h["copies"], h["count"], h["gbps_mean"], h["gbps_max"]) == (1, 1, 3.0, 3.0)
    assert math.isnan(h["gbps_std"])  # one sample: undefined, as describe() says


def test_summary_matches_hta_on_overlapping_copies(tmp_path):
    doc = kineto_trace(OVERLAPPING)
    theirs = hta_summary(doc, tmp_path)
    _, s = ours(doc, window="complete_steps")
    assert sorted(theirs.index) == sorted(s["kind"])
    for r in s.itertuples():
        t = theirs.loc[r.kind]
        assert r.count == t["count"]
        for mine, col in ((r.gbps_mean, "mean"), (r.gbps_min, "min"), (r.gbps_p25, "25%"), (r.gbps_p50, "50%"),
                          (r.gbps_p75, "75%"), (r.gbps_max, "max")):
            assert mine == pytest.approx(t[col], rel=1e-12), (r.kind, col)
        if r.count > 1:
            assert r.gbps_std == pytest.approx(t["std"], rel=1e-12)
    assert theirs.loc["Memcpy DtoD", "mean"] == pytest.approx(5.0625, rel=1e-12)


def test_copies_on_two_devices_of_a_rank_are_one_series(tmp_path):
    doc = kineto_trace([(DTOD, 10, 10, 7, 4.0, 0), (DTOD, 15, 10, 7, 2.0, 1)])
    series, s = ours(doc)
    assert _series(series, "Memcpy DtoD") == [(10_000, 4.0), (15_000, 6.0), (20_000, 2.0), (25_000, 0.0)]
    assert s[["count", "gbps_mean", "gbps_max"]].values.tolist() == [[3, 4.0, 6.0]]
    t = hta_summary(doc, tmp_path).loc["Memcpy DtoD"]
    assert (t["count"], t["mean"], t["max"]) == (3, 4.0, 6.0)


def test_zero_duration_copy_lasts_one_microsecond_as_in_hta(tmp_path):
    doc = kineto_trace([(DTOD, 10, 0, 7, 5.0), (DTOD, 10.5, 1.5, 8, 1.0)])
    series, s = ours(doc)
    assert _series(series, "Memcpy DtoD") == [(10_000, 5.0), (10_500, 6.0), (11_000, 1.0), (12_000, 0.0)]
    assert s[["count", "gbps_mean", "gbps_max"]].values.tolist() == [[3, 4.0, 6.0]]
    t = hta_summary(doc, tmp_path).loc["Memcpy DtoD"]
    assert (t["count"], t["mean"], t["max"]) == (3, 4.0, 6.0)


def test_back_to_back_copies_are_never_summed(tmp_path):
    # A [10, 20) and B [20, 30) on stream 7 never run together; C [15, 25) on stream 8 overlaps both.
    doc = kineto_trace([(DTOD, 10, 10, 7, 4.0), (DTOD, 20, 10, 7, 4.0), (DTOD, 15, 10, 8, 2.0)])
    series, s = ours(doc)
    assert _series(series, "Memcpy DtoD") == [(10_000, 4.0), (15_000, 6.0), (20_000, 6.0), (25_000, 4.0),
                                               (30_000, 0.0)]
    assert s[["count", "gbps_mean", "gbps_max"]].values.tolist() == [[4, 5.0, 6.0]]
    # HTA keeps one sample per point; here B's start sorts before A's end, so it reports
    # 4 + 4 + 2 = 10 GB/s in use at 20 us, with two copies running at most.
    t = hta_summary(doc, tmp_path).loc["Memcpy DtoD"]
    assert (t["count"], t["mean"], t["max"]) == (5, 6.0, 10.0)


def test_copies_starting_together_give_one_sample(tmp_path):
    doc = kineto_trace([(DTOD, 50, 10, 7, 1.0), (DTOD, 50, 5, 8, 2.0)])
    series, s = ours(doc)
    assert _series(series, "Memcpy DtoD") == [(50_000, 3.0), (55_000, 1.0), (60_000, 0.0)]
    assert s[["count", "gbps_mean", "gbps_max"]].values.tolist() == [[2, 2.0, 3.0]]
    # HTA also samples the moment only the first copy had started (1 GB/s): 1, 3, 1.
    t = hta_summary(doc, tmp_path).loc["Memcpy DtoD"]
    assert (t["count"], t["mean"], t["max"]) == (3, pytest.approx(5 / 3), 3.0)


def test_no_float_residue_where_nothing_runs(tmp_path):
    # 0.1 + 0.2 - 0.2 - 0.1 is 2.8e-17 in floats: HTA counts that as a fourth, positive sample.
    doc = kineto_trace([(DTOD, 10, 10, 7, 0.1), (DTOD, 12, 2, 8, 0.2)])
    series, s = ours(doc)
    assert series["gbps"].iloc[-1] == 0.0 and series["running"].iloc[-1] == 0
    d = s.iloc[0]
    assert d["count"] == 3
    assert d["gbps_mean"] == pytest.approx((0.1 + 0.3 + 0.1) / 3, rel=1e-12)
    assert d["gbps_max"] == pytest.approx(0.3, rel=1e-12)
    t = hta_summary(doc, tmp_path).loc["Memcpy DtoD"]
    assert t["count"] == 4
    assert t["mean"] == pytest.approx((0.1 + 0.3 + 0.1) / 4, rel=1e-12)


def test_seeded_random_overlaps_agree_with_hta_sample_for_sample(tmp_path):
    """Three streams of random copies with random gaps (no two points at one time): our samples
    are HTA's, less the float residue it counts where nothing runs."""
    rng = np.random.default_rng(15)
    copies = []
    for k, stream in enumerate((7, 8, 9)):
        t = 10 + 0.001 * k  # streams never share a microsecond grid point
        for i in range(60):  # >= 128 copies: with fewer, HTA keeps event indexes in an int8 column and fails
            dur = int(rng.integers(1, 30))
            copies.append((DTOD if i % 4 else HTOD, round(t, 3), dur, stream, float(rng.uniform(0.5, 50))))
            t += dur + int(rng.integers(1, 20))
    doc = kineto_trace(copies)
    from hta.trace_analysis import TraceAnalysis

    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = TraceAnalysis(trace_dir=str(tmp_path)).get_memory_bw_time_series(ranks=[0])[0]
    finally:
        logging.disable(logging.NOTSET)
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    series, s = ours(doc, window="complete_steps")
    for kind, g in theirs.groupby("name"):
        v = g["memory_bw_gbps"].to_numpy()
        mine = series.loc[(series["kind"] == kind) & (series["running"] > 0), "gbps"].to_numpy()
        np.testing.assert_allclose(mine, v[v > 1e-9], rtol=1e-9)
        row = s.set_index("kind").loc[kind]
        assert row["count"] == (v > 1e-9).sum()
        assert row["gbps_max"] == pytest.approx(v.max(), rel=1e-12)


def test_ranks_and_kinds_are_separate_series():
    copies = pd.DataFrame({"rank": [0, 1, 0], "kind": ["Memcpy DtoD", "Memcpy DtoD", "Memset"],
                           "ts": [0, 5, 5], "end": [10, 15, 15], "gbps": [1.0, 2.0, 4.0]})
    series = bandwidth_in_use(copies)
    assert [tuple(r) for r in series[["rank", "kind", "ts", "gbps"]].itertuples(index=False)] == [
        (0, "Memcpy DtoD", 0, 1.0), (0, "Memcpy DtoD", 10, 0.0), (0, "Memset", 5, 4.0), (0, "Memset", 15, 0.0),
        (1, "Memcpy DtoD", 5, 2.0), (1, "Memcpy DtoD", 15, 0.0)]
    s = bandwidth_summary(copies)
    assert s[["rank", "kind", "copies", "count", "gbps_mean"]].values.tolist() == [
        [0, "Memcpy DtoD", 1, 1, 1.0], [0, "Memset", 1, 1, 4.0], [1, "Memcpy DtoD", 1, 1, 2.0]]


def test_no_copies_and_zero_rate_copies_give_empty_summaries():
    empty = pd.DataFrame(columns=["rank", "kind", "ts", "end", "gbps"])
    assert bandwidth_in_use(empty).empty and list(bandwidth_in_use(empty).columns) == [
        "rank", "kind", "ts", "gbps", "running"]
    assert bandwidth_summary(empty).empty and "gbps_mean" in bandwidth_summary(empty).columns
    # Copies with no rate are in the series (running) but give no positive sample.
    zero = pd.DataFrame({"rank": [0], "kind": ["Memset"], "ts": [0], "end": [10], "gbps": [0.0]})
    assert bandwidth_in_use(zero)["running"].tolist() == [1, 0]
    assert bandwidth_summary(zero).empty


@pytest.mark.parametrize("gbps, text", [(5.0625, "5.06"), (56.2, "56.2"), (101.6, "102"), (1234.5, "1230"),
                                        (0.000123456, "0.000123"), (9.0, "9.00"), (99.96, "100"), (0.0, "0")])
def test_bandwidth_text_has_three_significant_digits(gbps, text):
    assert gbps_text(gbps) == text


def test_report_copies_are_the_bandwidth_in_use():
    from msprof_py import report

    rep = report.build(import_bytes(json.dumps(kineto_trace(OVERLAPPING)).encode()), timelines=0)
    assert rep["copies"] == [
        {"rank": 0, "kind": "Memcpy DtoD", "count": 8, "gbps_mean": 5.0625, "gbps_max": 9.0},
        {"rank": 0, "kind": "Memcpy HtoD", "count": 1, "gbps_mean": 3.0, "gbps_max": 3.0}]
    md = report.to_markdown(rep)
    assert "| rank | kind | samples | GB/s in use, mean | GB/s in use, max |" in md
    assert "| 0 | Memcpy DtoD | 8 | 5.06 | 9.00 |" in md
    html = report.to_html(rep)
    assert "<th>GB/s in use, mean</th>" in html
    assert "<td>Memcpy DtoD</td><td>8</td><td>5.06</td><td>9.00</td>" in html
    assert json.loads(report.to_json(rep))["copies"][0]["gbps_mean"] == 5.0625  # full precision in JSON
