"""Cluster analyses (`msprof-py cluster`) of a large multi-rank trace: whole trace on one process
against partition by partition, in-process and on 2 Dask workers, side by side.

    msprof-py emulate llm-train --ranks 64 --param servers=8 --steps 620 \\
        --stream --export off --ground-truth off --output /tmp/cluster
    python benchmarks/bench_cluster.py --trace /tmp/cluster/PROF_...

Without --trace it emulates a small one (--ranks, --steps) into a temporary directory first.

What it runs (this machine is shared: compare within one run):

  * whole trace   the plain way, in a fresh child process: load the whole trace
                  (`msprof_py.loading.load_any`, as every command loads one), then the
                  analyses over it (`analyzers.cluster.report`, communication.json from
                  `summaries.Rows`, the step table); its peak RSS: the driver holds everything;
  * partitioned, in-process   `msprof_py.cluster.analyze(partitions, engine="local")` in a fresh
                  child process: one rank partition (or a batch of small ones, <= 1M rows) at a
                  time; its peak RSS;
  * partitioned, Dask 2 workers   the same with `engine="dask"` on a LocalCluster of 2
                  single-threaded workers started (and warmed) before the clock; each worker's
                  peak RSS (psutil) and the driver's.

Every run's result must equal the whole-trace one's (SAME / DIFF). The largest partition is
printed beside the peaks: a worker holds one partition at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import timed_on_dask  # noqa: E402

from msprof_py.report import rank_partitions  # noqa: E402

_WHOLE = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from analyzers import Frames
from analyzers.causality import pipeline
from analyzers.cluster import report
from msprof_py import communication, loading
from msprof_py.summaries import Rows, cluster_step_table
trace = loading.load_any({trace!r})
comm, matrix = communication.summaries(Rows(trace))
steps = cluster_step_table(trace)
frames = Frames(trace)
res = {{"steps": steps.to_dict("records"), **report(frames, matrix),
       "communication_time": communication.op_time_split(comm),
       "pipeline": pipeline.view_cells(pipeline.view(pipeline.own_transfers(frames)))}}
t = time.perf_counter() - t0
json.dump({{"s": t, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "result": res}},
          open({out!r}, "w"), default=str)
"""

_LOCAL = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from msprof_py.cluster import analyze
from msprof_py.report import rank_partitions
res = analyze(rank_partitions({trace!r}), engine="local", progress=False)
t = time.perf_counter() - t0
json.dump({{"s": t, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "result": res}},
          open({out!r}, "w"), default=str)
"""


def child(code: str, trace: Path, out: Path) -> dict:
    subprocess.run([sys.executable, "-c", code.format(root=str(ROOT), trace=str(trace), out=str(out))], check=True)
    return json.loads(out.read_text())


def run_dask(trace: Path, workers: int) -> dict:
    from msprof_py.cluster import analyze

    out = timed_on_dask(workers, lambda address: analyze(rank_partitions(trace), engine="dask", scheduler=address,
                                                         progress=False))
    return {**out, "result": json.loads(json.dumps(out["result"], default=str))}


def plain(o):
    """Floats to 9 significant digits (sums over ranks in another order differ in the last bits)."""
    if isinstance(o, dict):
        return {k: plain(v) for k, v in o.items()}
    if isinstance(o, list):
        return [plain(v) for v in o]
    if isinstance(o, float):
        return float(f"{o:.9g}") if math.isfinite(o) else str(o)
    return o


def make_trace(ranks: int, steps: int, out: Path) -> Path:
    subprocess.run([str(Path(sys.executable).with_name("msprof-py")), "emulate", "llm-train", "--ranks", str(ranks), "--param",
                    "servers=2", "--steps", str(steps), "--stream", "--export", "off", "--ground-truth", "off",
                    "--output", str(out)], check=True, stdout=subprocess.DEVNULL)
    return next(out.glob("PROF_*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="a PROF_* directory or rank-partitioned table (default: emulate one)")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-whole", action="store_true",
                    help="skip the whole-trace run (a 50M-row trace does not fit one process's memory here); "
                         "the partitioned runs are then compared with each other")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        trace = args.trace or make_trace(args.ranks, args.steps, tmp / "emu")
        import pyarrow.parquet as pq

        parts = rank_partitions(trace)
        if not parts:
            sys.exit(f"{trace}: not a rank-partitioned trace")
        rows = {r: sum(pq.ParquetFile(f).metadata.num_rows for f in files) for r, _, files in parts}
        print(f"trace {trace}: {len(parts)} ranks, {sum(rows.values()):,} rows; largest partition rank "
              f"{max(rows, key=rows.get)} with {max(rows.values()):,} rows")
        whole = None if args.no_whole else child(_WHOLE, trace, tmp / "whole.json")
        local = child(_LOCAL, trace, tmp / "local.json")
        dask = run_dask(trace, 2)
        ref = plain((whole or local)["result"])
        same = {k: "SAME" if plain(r["result"]) == ref else "DIFF" for k, r in (("local", local), ("dask", dask))}
        gb = 1e9
        print(f"{'run':34} {'time':>9} {'peak RSS':>24}  result")
        if whole:
            print(f"{'whole trace, one process':34} {whole['s']:8.1f}s {whole['peak_rss'] / gb:21.2f} GB  reference")
        print(f"{'partitioned, in-process':34} {local['s']:8.1f}s {local['peak_rss'] / gb:21.2f} GB  "
              f"{same['local'] if whole else 'reference'}")
        print(f"{'partitioned, Dask 2 workers':34} {dask['s']:8.1f}s "
              f"{' / '.join(f'{p / gb:.2f}' for p in dask['peak_rss']):>21} GB  {same['dask']}")
        if whole:
            print(f"peak memory, whole / in-process: {whole['peak_rss'] / local['peak_rss']:.2f}x; "
                  f"time, whole / Dask 2 workers: {whole['s'] / dask['s']:.2f}x")
        print(f"time, in-process / Dask 2 workers: {local['s'] / dask['s']:.2f}x")
        driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"Dask driver (this process) peak RSS {driver / gb:.2f} GB")
        slow = [r["rank"] for r in local["result"]["slow_ranks"]]
        print(f"slow ranks {slow}; slow links {len(local['result']['slow_links'])}; steps rows "
              f"{len(local['result']['steps'])}")
        if "DIFF" in same.values():
            sys.exit("a partitioned run's result differs from the whole trace's")


if __name__ == "__main__":
    main()
