"""Scale benchmark: the `llm-train-2server` scenario (16 ranks on two servers, HCCL hierarchical
ReduceScatter / AllGather, ~85k trace rows per step at 22 layers) scaled up until its trace holds
at least `--events` rows (default 10 million).

What it measures, in one process:

  * events      rows of the trace table `scenarios.run()` returns (every row counts: device tasks,
                host API slices, flows, counters, memory instants, collectives, metadata);
  * wall time   `scenarios.run()` from the call to its return: building the Runtime, emulating
                every rank, resolving the ground truth and building the Arrow trace table;
                with `--write DIR`, writing the rank-partitioned Parquet is timed separately;
  * events/s    events / wall time;
  * peak RSS    `resource.getrusage(RUSAGE_SELF).ru_maxrss` after the run (the process's high-water
                mark, so it includes the two small calibration runs, which peak far lower).

`--stream DIR` runs the same job writing its trace into DIR while it runs (`scenarios.run(...,
trace_path=DIR)`, see msprof_py.trace.writer): the wall time then includes the Parquet write, the
events are counted from the files, and the peak RSS shows what the recorder no longer holds.

`--no-gc` runs the measured run with Python's cyclic garbage collector disabled (`gc.disable()`),
to show what its passes over the growing recording cost; the default keeps it on, as a user's
program would.

The step count comes from two calibration runs (1 and 2 steps at `--layers` layers): events grow
linearly with steps, so steps = ceil((target - events(1)) / (events(2) - events(1))) + 1.

Run (from the repo root, with the dev venv):

    python benchmarks/bench_scale.py                          # >= 10M events, 22 layers
    python benchmarks/bench_scale.py --events 1000000         # a quick look
    python benchmarks/bench_scale.py --write /tmp/scale --json bench_scale.json
    python benchmarks/bench_scale.py --no-gc                  # the same without the cyclic GC
    python benchmarks/bench_scale.py --stream /tmp/scale      # written while it runs

It prints a table and exits 0; it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import resource
import shutil
import sys
import time
from pathlib import Path

from _common import save_json
from rich.console import Console
from rich.table import Table

from runtime_emu import scenarios

SCENARIO = "llm-train-2server"
TINYLLAMA_LAYERS = 22


def events(layers: int, steps: int) -> int:
    return scenarios.run(SCENARIO, layers=layers, steps=steps).trace.table.num_rows


def plan(target: int, layers: int) -> tuple[int, int, int]:
    """(steps, events of a 1-step run, events per extra step) to reach `target` events."""
    one, two = events(layers, 1), events(layers, 2)
    per_step = two - one
    return max(1, math.ceil((target - one) / per_step) + 1), one, per_step


def measure_streamed(layers: int, steps: int, out: Path) -> dict:
    import pyarrow.parquet as pq

    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    result = scenarios.run(SCENARIO, layers=layers, steps=steps, trace_path=out)
    wall = time.perf_counter() - t0
    files = sorted(out.rglob("*.parquet"))
    row = {"scenario": SCENARIO, "ranks": len(files), "layers": layers, "steps": steps,
           "events": sum(pq.ParquetFile(f).metadata.num_rows for f in files), "wall_s": wall, "gc": True,
           "streamed": True, "stream_fallback": result.stream_fallback,
           "parquet_bytes": sum(f.stat().st_size for f in files)}
    row["events_per_s"] = row["events"] / wall
    del result
    row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return row


def measure(layers: int, steps: int, write: Path | None, use_gc: bool = True) -> dict:
    if not use_gc:
        gc.collect()
        gc.disable()
    t0 = time.perf_counter()
    result = scenarios.run(SCENARIO, layers=layers, steps=steps)
    wall = time.perf_counter() - t0
    gc.enable()
    out = {"scenario": SCENARIO, "ranks": result.trace.meta.world_size, "layers": layers, "steps": steps,
           "events": result.trace.table.num_rows, "wall_s": wall, "gc": use_gc}
    out["events_per_s"] = out["events"] / wall
    if write is not None:
        from msprof_py.trace import write_trace

        if write.exists():
            shutil.rmtree(write)
        t0 = time.perf_counter()
        write_trace(result.trace, write)
        out["write_s"] = time.perf_counter() - t0
        out["parquet_bytes"] = sum(f.stat().st_size for f in write.rglob("*.parquet"))
    del result
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return out


def show(row: dict, planned: tuple[int, int, int], target: int) -> None:
    table = Table(title=f"{SCENARIO} scaled to >= {target:,} events ({platform.python_implementation()} "
                        f"{platform.python_version()}, {platform.machine()}, gc {'on' if row['gc'] else 'off'})")
    for col in ("ranks", "layers", "steps", "events", "wall time", "events/s", "peak RSS", "RSS/event"):
        table.add_column(col, justify="right")
    table.add_row(str(row["ranks"]), str(row["layers"]), str(row["steps"]), f"{row['events']:,}",
                  f"{row['wall_s']:.1f} s", f"{row['events_per_s']:,.0f}", f"{row['peak_rss_bytes'] / 2**30:.2f} GiB",
                  f"{row['peak_rss_bytes'] / row['events']:.0f} B")
    console = Console(width=120)
    console.print(table)
    steps, one, per_step = planned
    console.print(f"calibration: {one:,} events for 1 step, {per_step:,} per further step at {row['layers']} layers")
    if "write_s" in row:
        console.print(f"Parquet write: {row['write_s']:.1f} s, {row['parquet_bytes'] / 2**20:.1f} MiB")
    if row.get("streamed"):
        console.print(f"streamed while running (wall time includes the write): {row['parquet_bytes'] / 2**20:.1f} MiB"
                      + (f"; fell back: {row['stream_fallback']}" if row["stream_fallback"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="target trace rows (default 10M)")
    parser.add_argument("--layers", type=int, default=TINYLLAMA_LAYERS, help="decoder layers (default 22)")
    parser.add_argument("--write", type=Path, help="also write the rank-partitioned Parquet here and time it")
    parser.add_argument("--json", type=Path, help="write the measurement as JSON here")
    parser.add_argument("--no-gc", action="store_true", help="disable the cyclic garbage collector for the run")
    parser.add_argument("--stream", type=Path, metavar="DIR", help="write the trace into DIR while the job runs")
    args = parser.parse_args(argv)
    if args.stream and (args.write or args.no_gc):
        parser.error("--stream goes alone (it writes the trace itself, with the collector on)")
    planned = plan(args.events, args.layers)
    if args.stream:
        row = measure_streamed(args.layers, planned[0], args.stream)
    else:
        row = measure(args.layers, planned[0], args.write, use_gc=not args.no_gc)
    show(row, planned, args.events)
    if args.json:
        save_json(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
