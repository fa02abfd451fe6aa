"""Memcpy bandwidth: our figures against Holistic Trace Analysis's on the same traces.

For every real Kineto trace with copies, and for a seeded synthetic one whose DtoD copies overlap
on three streams (a share of them back to back on their stream, as a busy copy stream runs),
prints per copy kind HTA's `get_memory_bw_summary` (count, mean, max), ours
(`analyzers.memcpy.bandwidth_summary`: the same series, one sample per time, no float residue)
and the per-copy rate mean, which is not a bandwidth in use. HTA runs with its ns-rounding off
(HTA_DISABLE_NS_ROUNDING=1) and both sides over the complete profiler steps, as the tests do.

Run:  python benchmarks/bandwidth_vs_hta.py [--traces DIR] [--copies 1500] [--seed 1]
Exit code 0 whatever the results: this is a measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analyzers.frames import Frames  # noqa: E402
from analyzers.memcpy import bandwidth_summary, gbps_text  # noqa: E402
from analyzers.streams import copy_bandwidth  # noqa: E402
from msprof_py.trace import import_trace  # noqa: E402


def synthetic(path: Path, copies: int, seed: int) -> None:
    """DtoD copies on streams 7, 8, 9; 40% start the moment the previous one on their stream ends."""
    rng = np.random.default_rng(seed)
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 1e7},
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 1e7,
               "dur": 10}]
    corr = 0
    for stream in (7, 8, 9):
        t = 10.0 + stream
        for _ in range(copies):
            nbytes, dur = int(rng.integers(1000, 4_000_000)), round(float(rng.uniform(0.5, 80)), 3)
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                           "ts": round(t - 1, 3), "dur": 0.5, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0,
                           "tid": stream, "ts": round(t, 3), "dur": dur,
                           "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": nbytes,
                                    "memory bandwidth (GB/s)": nbytes / (dur * 1000)}})
            t = round(t + dur, 3) + (0 if rng.random() < 0.4 else round(float(rng.uniform(0, 100)), 3))
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}))


def hta_summary(trace: Path, work: Path):
    from hta.trace_analysis import TraceAnalysis

    d = work / trace.name.split(".")[0]
    d.mkdir()
    shutil.copy(trace, d / trace.name)
    logging.disable(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hta = TraceAnalysis(trace_dir=str(d))
        s = hta.get_memory_bw_summary(ranks=[list(hta.t.traces)[0]])
    return None if s is None or s.empty else s["memory_bw_gbps"].reset_index().set_index("name")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "real_traces" / "kineto")
    p.add_argument("--copies", type=int, default=1500, help="copies per stream in the synthetic trace")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        synth = work / "synthetic_overlapping_dtod.json"
        synthetic(synth, a.copies, a.seed)
        traces = [*sorted(a.traces.glob("*.json.gz")), synth]
        print(f"{'trace':32} {'kind':12} {'copies':>6} | {'HTA count':>9} {'mean':>7} {'max':>7} | "
              f"{'our count':>9} {'mean':>7} {'max':>7} | per-copy rate mean")
        for trace in traces:
            c = copy_bandwidth(Frames(import_trace(trace), window="complete_steps"))
            ours = bandwidth_summary(c)
            theirs = hta_summary(trace, work)
            for r in ours.itertuples():
                t = theirs.loc[r.kind] if theirs is not None and r.kind in theirs.index else None
                h = (f"{int(t['count']):>9} {gbps_text(t['mean']):>7} {gbps_text(t['max']):>7}" if t is not None
                     else f"{'-':>9} {'-':>7} {'-':>7}")
                rate = c.loc[(c["rank"] == r.rank) & (c["kind"] == r.kind), "gbps"].mean()
                print(f"{trace.name.split('.')[0]:32} {r.kind:12} {r.copies:>6} | {h} | {r.count:>9} "
                      f"{gbps_text(r.gbps_mean):>7} {gbps_text(r.gbps_max):>7} | {gbps_text(rate)}")


if __name__ == "__main__":
    main()
