"""Import time of a Kineto trace whose launches and tasks are linked by correlation args
against the same trace linked by `ac2g` flows only (an accelerator plugin that writes no args).

    python benchmarks/bench_kineto_links.py [--launches N]
"""

from __future__ import annotations

import argparse
import json
import time

from msprof_py.trace import import_bytes


def trace(launches: int, flows_only: bool) -> bytes:
    """`launches` launch + task pairs on two streams, laid out as libkineto writes them."""
    ev = []
    for i in range(launches):
        corr, launch_ts, task_ts, stream = i + 1, i * 10, i * 10 + 7, 7 + i % 2
        if flows_only:
            ev.append({"ph": "X", "cat": "acme_driver", "name": "acmeLaunch", "pid": 1, "tid": 1,
                       "ts": launch_ts, "dur": 3, "args": {}})
            ev.append({"ph": "X", "cat": "acme_engine", "name": "tile", "pid": 0, "tid": stream,
                       "ts": task_ts, "dur": 15, "args": {}})
        else:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch_ts, "dur": 3, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "tile", "pid": 0, "tid": stream, "ts": task_ts,
                       "dur": 15, "args": {"device": 0, "stream": stream, "correlation": corr}})
        ev.append({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": task_ts, "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
    return json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=50_000)
    args = parser.parse_args()
    for flows_only in (False, True):
        data = trace(args.launches, flows_only)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            table = import_bytes(data).table
            best = min(best, time.perf_counter() - t0)
        launches = sum(1 for k in table.column("kind").to_pylist() if k == "launch")
        print(f"{'flows only' if flows_only else 'correlation args'}: {table.num_rows} events, "
              f"{launches} launches linked, import {best:.2f} s (best of 3)")


if __name__ == "__main__":
    main()
