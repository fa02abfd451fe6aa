"""Scale-out benchmark: rank-partitioned analysis in-process and on 1 and 2 Dask workers, and the
README's SQL questions in DuckDB against pandas, on one large multi-rank trace.

The trace is a PROF_* directory or a rank-partitioned table directory. The README's large run
makes one (about 50M rows, 64 ranks over 8 servers; about 10 minutes here):

    msprof-py emulate llm-train --ranks 64 --param servers=8 --steps 620 \\
        --stream --export off --ground-truth off --output /tmp/cluster
    python benchmarks/bench_scale_out.py --trace /tmp/cluster/PROF_...

Without --trace it emulates a small one (--ranks, --steps) into a temporary directory first.

What it runs, side by side in one process tree (this machine is shared: compare ratios):

  * in-process   `msprof_py.report.analyze(partitions, engine="local")` in a fresh child
                 process: partitions one after another; its peak RSS;
  * Dask, 1 and 2 workers   the same call with `engine="dask"` on a `distributed.LocalCluster`
                 of that many single-threaded worker processes, started (and the analyzers
                 imported on them) before the clock starts; the peak RSS of every worker,
                 sampled with psutil. Target: 1 -> 2 workers >= 1.6x faster. The findings of
                 every run must equal the in-process run's (SAME / DIFF);
  * SQL          each query of the README's "SQL over traces" section, run by DuckDB over the
                 Parquet files (`msprof_py.sql(trace, query).fetchall()`), and the same question
                 answered the plain pandas way (read the columns it needs with
                 `pandas.read_parquet`, filter, group); the answers must agree. Best of --repeat.

The largest partition is printed beside the workers' peaks: a worker holds one partition at a
time (rank 0 of an emulated cluster is the largest: it records every link of the cluster).
Needs the dask extra (`pip install -e '.[dev]'` brings it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import timed_on_dask  # noqa: E402

from msprof_py import prof_dir  # noqa: E402
from msprof_py.report import analyze, rank_partitions  # noqa: E402

GB = 1e9
TARGET_SCALING = 1.6
DEVICE_WORK = ("kernel", "memcpy", "memset", "collective")


# ============================================================================ the trace
def make_trace(ranks: int, steps: int, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "msprof_py.cli", "emulate", "llm-train", "--ranks", str(ranks),
                    "--param", f"servers={max(2, ranks // 8)}", "--steps", str(steps), "--stream", "--export", "off",
                    "--ground-truth", "off", "--output", str(out)], check=True)
    [prof] = prof_dir.prof_dirs(out)
    return prof


def parquet_files(trace: Path) -> list[Path]:
    if prof_dir.is_prof_dir(trace):
        return [f for d in prof_dir.raw_dirs(trace) for f in sorted(d.glob("rank=*/*.parquet"))]
    return sorted(trace.glob("rank=*/*.parquet"))


def partition_rows(parts: list) -> list[tuple[int, int]]:
    """(rank, rows) of every partition, from the Parquet footers."""
    return [(rank, sum(pq.ParquetFile(f).metadata.num_rows for f in files)) for rank, _how, files in parts]


# ============================================================================ analysis
def findings_of(result) -> list[dict]:
    return [f.to_dict() for f in result.ranked()]


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from msprof_py.report import analyze, rank_partitions
parts = rank_partitions({trace!r})
t0 = time.perf_counter()
res = analyze(parts, engine="local", progress=False)
t = time.perf_counter() - t0
json.dump({{"s": t, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "findings": [f.to_dict() for f in res.ranked()]}}, open({out!r}, "w"), default=str)
"""


def run_in_process(trace: Path, tmp: Path) -> dict:
    out = tmp / "local.json"
    subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), trace=str(trace), out=str(out))], check=True)
    return json.loads(out.read_text())


def run_dask(parts: list, workers: int) -> dict:
    out = timed_on_dask(workers, lambda address: analyze(parts, engine="dask", scheduler=address, progress=False))
    res = out.pop("result")
    return {**out, "findings": json.loads(json.dumps(findings_of(res), default=str))}


# ============================================================================ SQL vs pandas
def readme_queries() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## SQL over traces", 1)[1].split("\n## ", 1)[0]
    queries = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(queries) == 3, "the README's SQL section has three example queries"
    return queries


def _read(files: list[Path], columns: list[str], kinds: tuple[str, ...]) -> pd.DataFrame:
    """What a pandas user reads: the columns the question needs, the rows of these kinds."""
    frames = [pd.read_parquet(f, columns=columns, filters=[("kind", "in", list(kinds))]) for f in files]
    df = pd.concat(frames, ignore_index=True)
    df["kind"] = df["kind"].astype(str)
    return df


def pandas_idle(files: list[Path]) -> list[tuple]:
    df = _read(files, ["rank", "device", "stream", "kind", "ph", "ts", "dur", "corr"], DEVICE_WORK)
    df = df[(df["ph"].astype(str) == "X") & df["stream"].notna()]
    df["end"] = df["ts"] + df["dur"].fillna(0)
    df = df.sort_values(["rank", "device", "stream", "ts"], kind="stable")
    keys = ["rank", "device", "stream"]
    prev_end = df.groupby(keys)["end"].cummax().groupby([df[k] for k in keys]).shift()
    df["gap"] = (df["ts"] - prev_end.fillna(df["ts"])).clip(lower=0)
    g = df.groupby(keys).agg(tasks=("ts", "size"), first=("ts", "min"), last=("end", "max"), idle=("gap", "sum"))
    g["span"] = g["last"] - g["first"]
    g["pct"] = (100 * g["idle"] / g["span"]).round(1)
    g = g.reset_index().sort_values(["pct", "rank", "stream"]).head(4)
    return [(int(r.rank), int(r.device), int(r.stream), int(r.tasks), int(r.span), int(r.idle), float(r.pct))
            for r in g.itertuples()]


def pandas_top_kernels(files: list[Path]) -> list[tuple]:
    df = _read(files, ["step", "name", "kind", "ph", "dur", "stream"], ("kernel",))
    df = df[(df["ph"].astype(str) == "X") & df["stream"].notna()]
    df["name"] = df["name"].astype(str)
    g = df.groupby(["step", "name"]).agg(calls=("dur", "size"), total=("dur", "sum")).reset_index()
    g = g.sort_values(["step", "total", "name"], ascending=[True, False, True]).groupby("step").head(3)
    return [(int(r.step), r.name, int(r.calls), int(r.total)) for r in g.itertuples()]


def pandas_memory_peak(files: list[Path]) -> list[tuple]:
    df = _read(files, ["rank", "device", "kind", "ts", "bytes"], ("alloc", "free"))
    df["delta"] = np.where(df["kind"] == "alloc", df["bytes"], -df["bytes"])
    df["dev"] = df["device"].fillna(-1)
    df = df.sort_values(["rank", "dev", "ts"], kind="stable")
    df["live"] = df.groupby(["rank", "dev"])["delta"].cumsum()
    peak = df.groupby(["rank", "dev"])["live"].max()
    return [(int(r), int(d), int(p), round(p / 2**20, 1)) for (r, d), p in peak.items()]


def _plain(rows: list[tuple]) -> list[tuple]:
    return [tuple(float(v) if isinstance(v, float) else int(v) if isinstance(v, (int, np.integer)) else v
                  for v in row) for row in rows]


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def run_sql(trace: Path, repeat: int) -> list[dict]:
    import msprof_py

    files = parquet_files(trace)
    peers = (("per-stream idle (top 4)", pandas_idle), ("top kernels per step", pandas_top_kernels),
             ("memory high-water per rank", pandas_memory_peak))
    out = []
    for query, (label, peer) in zip(readme_queries(), peers):
        t_sql, got = best(lambda q=query: msprof_py.sql(trace, q).fetchall(), repeat)
        t_pd, want = best(lambda p=peer: p(files), repeat)
        out.append({"question": label, "duckdb_s": t_sql, "pandas_s": t_pd, "rows": len(got),
                    "agree": _plain(got) == _plain(want)})
    return out


# ============================================================================ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="PROF_* dir or rank-partitioned table (default: emulate a small one)")
    ap.add_argument("--ranks", type=int, default=16, help="ranks of the emulated trace without --trace")
    ap.add_argument("--steps", type=int, default=20, help="steps of the emulated trace without --trace")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each SQL / pandas question (best counts)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        trace = args.trace or make_trace(args.ranks, args.steps, tmp / "run")
        parts = rank_partitions(trace)
        if not parts:
            sys.exit(f"{trace}: not a rank-partitioned trace (a PROF_* dir or a rank=R/ table directory)")
        sizes = partition_rows(parts)
        total = sum(n for _, n in sizes)
        big_rank, big_rows = max(sizes, key=lambda x: x[1])
        console.print(f"trace {trace}: {total:,} rows in {len(parts)} rank partitions; largest rank {big_rank} "
                      f"({big_rows:,} rows), median {int(np.median([n for _, n in sizes])):,}")
        local = run_in_process(trace, tmp)
        console.print(f"in-process: {local['s']:.1f} s, peak RSS {local['peak_rss'] / GB:.2f} GB")
        dask = {}
        for n in (1, 2):
            dask[n] = run_dask(parts, n)
            console.print(f"dask {n} worker(s): {dask[n]['s']:.1f} s, peak RSS per worker "
                          f"{', '.join(f'{p / GB:.2f}' for p in dask[n]['peak_rss'])} GB")
        sql = run_sql(trace, args.repeat)

    scaling = dask[1]["s"] / dask[2]["s"]
    same = all(d["findings"] == local["findings"] for d in dask.values())
    t = Table(title=f"rank-partitioned analysis, {total:,} rows, {len(parts)} ranks")
    for col in ("run", "time", "peak RSS per process", "findings", "vs in-process"):
        t.add_column(col, justify="left" if col == "run" else "right")
    t.add_row("in-process (local engine)", f"{local['s']:.1f} s", f"{local['peak_rss'] / GB:.2f} GB",
              str(len(local["findings"])), "")
    for n, d in dask.items():
        t.add_row(f"Dask, {n} worker{'s' if n > 1 else ''}", f"{d['s']:.1f} s",
                  ", ".join(f"{p / GB:.2f} GB" for p in d["peak_rss"]), str(len(d["findings"])),
                  f"{local['s'] / d['s']:.2f}x, {'SAME' if d['findings'] == local['findings'] else 'DIFF'}")
    console.print(t)
    q = Table(title="README SQL questions: DuckDB over the Parquet files vs pandas (best of %d)" % args.repeat)
    for col in ("question", "DuckDB", "pandas", "pandas / DuckDB", "answers"):
        q.add_column(col, justify="left" if col == "question" else "right")
    for r in sql:
        q.add_row(r["question"], f"{r['duckdb_s']:.2f} s", f"{r['pandas_s']:.2f} s",
                  f"{r['pandas_s'] / r['duckdb_s']:.1f}x", f"{r['rows']} rows, {'agree' if r['agree'] else 'DIFFER'}")
    console.print(q)
    verdict = "PASS" if scaling >= TARGET_SCALING else "MISS"
    console.print(f"SUMMARY: Dask 1 -> 2 workers {scaling:.2f}x ({verdict} >= {TARGET_SCALING}x); findings "
                  f"{'SAME' if same else 'DIFF'} in every run; largest partition {big_rows:,} rows; "
                  f"SQL answers {'agree' if all(r['agree'] for r in sql) else 'DIFFER'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": total, "ranks": len(parts), "largest_partition_rows": big_rows,
                                         "in_process": {k: local[k] for k in ("s", "peak_rss")},
                                         "dask": {n: {k: d[k] for k in ("s", "peak_rss", "base_rss")}
                                                  for n, d in dask.items()},
                                         "scaling_1_to_2": scaling, "findings_same": same, "sql": sql}, indent=1))


if __name__ == "__main__":
    main()
