"""Memory of rank-partitioned analysis on Dask: a worker holds one rank partition, never the trace.

Emulates a multi-rank job, writes it partitioned by rank, then runs `msprof_py.report.analyze`
with the Dask engine on a LocalCluster of single-threaded workers while sampling each worker
process's RSS (psutil, every few ms). Prints, per worker, its peak RSS above its warm baseline
(analyzers imported) next to the largest partition's in-memory (Arrow) size and the whole trace's,
and the peak of a whole-trace `analyzers.run` in a fresh process for reference; asserts that no
worker grew by as much as the whole trace's analysis does, and that every worker stayed within
`--factor` x the largest partition (a partition's pandas views cost a few times its Arrow size).

    python benchmarks/bench_partitioned_memory.py [--ranks 8] [--layers 22] [--steps 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import logging
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _common import sample_rss, warm_worker

MB = 1e6


_WHOLE = """
import sys, threading, time, psutil
from analyzers import run
from analyzers.finding import _load_all
from analyzers.frames import ANALYSIS_COLUMNS
from msprof_py.trace.parquet import read_trace
_load_all()
me, peak, stop = psutil.Process(), [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], me.memory_info().rss)
        time.sleep(0.003)
base = me.memory_info().rss
t = threading.Thread(target=sample, daemon=True)
t.start()
t0 = time.perf_counter()
run(read_trace(sys.argv[1], columns=list(ANALYSIS_COLUMNS)))
took = time.perf_counter() - t0
stop.set()
t.join()
print(base, peak[0], took)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="llm-train-2server")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--factor", type=float, default=8.0,
                    help="a worker's peak growth may be at most this many times the largest partition")
    args = ap.parse_args()

    import distributed

    from msprof_py import report
    from msprof_py.trace import write_trace
    from runtime_emu import scenarios

    params = {"servers": 2} if args.scenario.startswith("llm") else {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace"
        t = time.perf_counter()
        res = scenarios.run(args.scenario, switches=["slow-rank"], seed=0, ranks=args.ranks, steps=args.steps,
                            layers=args.layers, **params)
        whole_bytes, rows = res.trace.table.nbytes, len(res.trace)
        write_trace(res.trace, path, partition_by_rank=True)
        del res
        print(f"emulated {args.scenario}: {args.ranks} ranks, {rows:,} events, {whole_bytes / MB:.1f} MB in memory "
              f"({time.perf_counter() - t:.1f} s)")
        parts = report.rank_partitions(path)
        sizes = {p[0]: report.read_partition(p[1], p[2]).table.nbytes for p in parts}
        largest = max(sizes.values())
        print(f"largest partition: {largest / MB:.1f} MB (rank {max(sizes, key=sizes.get)}); "
              f"whole trace {whole_bytes / MB:.1f} MB")

        out = subprocess.run([sys.executable, "-c", _WHOLE, str(path)], capture_output=True, text=True, check=True)
        base, peak, whole_s = out.stdout.split()
        base, peak = int(base), int(peak)
        whole_growth = peak - base
        print(f"whole-trace analyzers.run in one process: {float(whole_s):.1f} s, peak RSS {peak / MB:.0f} MB, "
              f"{whole_growth / MB:.0f} MB above its warm baseline")

        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
                distributed.Client(cluster) as client:
            pids = list(client.run(warm_worker).values())
            baseline = {pid: psutil.Process(pid).memory_info().rss for pid in pids}
            peaks: dict[int, int] = {}
            stop = threading.Event()
            sampler = threading.Thread(target=sample_rss, args=(pids, peaks, stop), daemon=True)
            sampler.start()
            t = time.perf_counter()
            # The engine's own tasks, on this cluster (the workers read the partition files).
            result = report.analyze(parts, engine="dask", scheduler=cluster.scheduler_address)
            took = time.perf_counter() - t
            stop.set()
            sampler.join()
            partials = client.gather([client.submit(report.analyze_partition, p, None, "all", pure=False)
                                      for p in parts])
        summaries = sum(len(pickle.dumps(p)) for p in partials)
        print(f"dask engine: {len(result.findings)} findings in {took:.1f} s on {args.workers} workers; "
              f"what the tasks returned: {summaries / MB:.2f} MB pickled")
        worst = 0
        for pid in pids:
            growth = peaks.get(pid, baseline[pid]) - baseline[pid]
            worst = max(worst, growth)
            print(f"  worker pid {pid}: baseline {baseline[pid] / MB:.0f} MB, peak {peaks.get(pid, 0) / MB:.0f} MB, "
                  f"growth {growth / MB:.0f} MB = {growth / largest:.1f} x the largest partition, "
                  f"{growth / max(whole_growth, 1):.0%} of the whole-trace run's growth")
        assert worst <= args.factor * largest + 64 * MB, (
            f"a worker grew {worst / MB:.0f} MB: more than {args.factor} x the largest partition")
        assert worst < whole_growth, "a worker grew as much as the whole-trace analysis"
        print(f"bound holds: every worker's growth <= {args.factor:g} x largest partition + 64 MB, and < the "
              f"whole-trace run's growth")


if __name__ == "__main__":
    main()
