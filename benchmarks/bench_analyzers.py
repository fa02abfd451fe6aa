"""Analyzer benchmark: msprof-py vs Holistic Trace Analysis, side by side in one run.

(1) On the real Kineto traces, end to end: load the trace, then per-stream idle time,
    queue length summary and memcpy bandwidth summary. HTA: TraceAnalysis(trace_dir=...) +
    get_idle_time_breakdown + get_queue_length_summary + get_memory_bw_summary (HTA reads the
    JSON every time). Ours, twice: importing the JSON, and reloading the Parquet table that
    `msprof-py import` writes (how a trace is analyzed after the first time); both load what
    `msprof-py analyze` loads (typed columns; no verbatim args / extra text). Target: >= 5x.
(2) All analyzers (analyzers.run + the report overview) on a large emulated trace (a Parquet
    table: `--big PATH`, e.g. one written by benchmarks/bench_scale.py): wall time and the
    child process's peak RSS. Target: <= 3 GB.

Run:  python benchmarks/bench_analyzers.py [--repeat 3] [--big PATH_TO_TRACE]
Exit code 0 whatever the results: this is a measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import save_json
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
TRACES = ["queue_16rank_rank0", "ns_resolution_rank0", "nccl_2rank_rank0"]


def ours(path: Path) -> float:
    """Load (JSON import, or Parquet reload for a .parquet path) + the three analyses.

    The load is the one `msprof-py analyze` and `report` do: the typed columns analyzers read,
    not the verbatim args / extra text (which `import` keeps for export).
    """
    from analyzers.frames import Frames
    from analyzers.memcpy import bandwidth_summary
    from analyzers.streams import copy_bandwidth, queue_series, queue_summary, stream_time
    from msprof_py.loading import load_any

    t = time.perf_counter()
    trace = load_any(path, analysis_only=True)  # what msprof-py analyze / report load
    frames = Frames(trace, window="complete_steps")
    stream_time(frames)
    queue_summary(queue_series(frames))
    bandwidth_summary(copy_bandwidth(frames))
    return time.perf_counter() - t


def hta(path: Path, workdir: Path) -> float:
    from hta.trace_analysis import TraceAnalysis

    d = workdir / path.stem
    d.mkdir(exist_ok=True)
    if not (d / path.name).exists():
        shutil.copy(path, d / path.name)
    logging.disable(logging.CRITICAL)
    try:
        t = time.perf_counter()
        a = TraceAnalysis(trace_dir=str(d))
        rank = list(a.t.traces)[0]
        a.get_idle_time_breakdown(ranks=[rank], visualize=False)
        a.get_queue_length_summary(ranks=[rank])
        a.get_memory_bw_summary(ranks=[rank])
        return time.perf_counter() - t
    finally:
        logging.disable(logging.NOTSET)


_BIG = """
import resource, sys, time, json
from msprof_py.loading import load_any
from analyzers import Frames, run
from analyzers.overview import overview
t = time.perf_counter()
trace = load_any(sys.argv[1], analysis_only=True)  # what msprof-py analyze / report load
t_load = time.perf_counter() - t
frames = Frames(trace)
result = run(trace, frames=frames)
overview(frames, result)
print(json.dumps({"events": len(trace), "load_s": t_load, "total_s": time.perf_counter() - t,
                  "findings": len(result.findings), "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def big(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _BIG, str(path)], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mark(ratio: float) -> str:
    return f"{ratio:.1f}x {'PASS' if ratio >= 5 else 'MISS'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "real_traces")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big", type=Path, help="a large trace table to run every analyzer on")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # the setting our agreement tests compare with
    console = Console()
    results = {"traces": []}
    work = Path(tempfile.mkdtemp())
    tiny = args.traces_dir / "kineto" / "tiny_base.json.gz"
    ours(tiny)
    hta(tiny, work)  # warm-up: imports and first calls excluded on both sides
    table = Table(title=f"load + idle + queue + bandwidth, best of {args.repeat} (HTA always loads the JSON)")
    for col in ("trace", "HTA s", "ours from JSON s", "ratio", "ours from Parquet s", "ratio", "target"):
        table.add_column(col)
    from msprof_py.trace import import_trace, write_trace

    for name in TRACES:
        path = args.traces_dir / "kineto" / f"{name}.json.gz"
        table_path = work / f"{name}.parquet"
        write_trace(import_trace(path), table_path)  # what `msprof-py import` leaves for later analyses
        h = min(hta(path, work) for _ in range(args.repeat))
        o = min(ours(path) for _ in range(args.repeat))
        q = min(ours(table_path) for _ in range(args.repeat))
        results["traces"].append({"trace": name, "hta_s": h, "ours_json_s": o, "ratio_json": h / o,
                                  "ours_parquet_s": q, "ratio_parquet": h / q})
        table.add_row(name, f"{h:.3f}", f"{o:.3f}", _mark(h / o), f"{q:.3f}", _mark(h / q), ">= 5x")
    console.print(table)
    if args.big:
        b = big(args.big)
        results["big"] = b
        gb = b["peak_rss_kib"] / 2**20
        t2 = Table(title=f"all analyzers on {args.big}")
        for col in ("events", "load s", "total s", "findings", "peak RSS GB", "target", "result"):
            t2.add_column(col)
        t2.add_row(f"{b['events']:,}", f"{b['load_s']:.1f}", f"{b['total_s']:.1f}", str(b["findings"]), f"{gb:.2f}",
                   "<= 3 GB", "PASS" if gb <= 3 else "MISS")
        console.print(t2)
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        save_json(args.json, results)


if __name__ == "__main__":
    main()
