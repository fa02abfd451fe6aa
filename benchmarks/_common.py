"""Helpers the benchmark scripts share (they run as scripts: `python benchmarks/NAME.py`)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def dist_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def environment(**packages: str) -> dict:
    """Machine and package versions to store next to measured figures."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count()}
    env.update({label: dist_version(dist) for label, dist in packages.items()})
    return env


def save_json(path: Path, data: dict) -> None:
    """Write a benchmark's figures (with `environment()` inside) for later comparison."""
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")


def sample_rss(pids: list[int], peaks: dict[int, int], stop: Any, every_s: float = 0.003) -> None:
    """Until `stop` (a threading.Event) is set, keep each process's peak RSS in `peaks` (psutil):
    run it in a thread beside the work being measured."""
    import time

    import psutil

    procs = {pid: psutil.Process(pid) for pid in pids}
    while not stop.is_set():
        for pid, p in procs.items():
            try:
                peaks[pid] = max(peaks.get(pid, 0), p.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(every_s)


def warm_worker() -> int:
    """Run on each Dask worker before timing (`client.run`): import what an analysis task imports;
    returns the worker's pid."""
    import analyzers.partitioned  # noqa: F401
    import msprof_py.report  # noqa: F401
    from analyzers.finding import _load_all

    _load_all()
    return os.getpid()


def timed_on_dask(workers: int, fn: Any) -> dict:
    """Run `fn(scheduler_address)` on a fresh LocalCluster of `workers` single-threaded worker
    processes, warmed (`warm_worker`) before the clock starts: {"s": seconds, "peak_rss": each
    worker's peak RSS (psutil, sampled while it ran), "base_rss": each one's warm RSS, "result"}."""
    import logging
    import threading
    import time

    import psutil
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        pids = list(client.run(warm_worker).values())
        base = {pid: psutil.Process(pid).memory_info().rss for pid in pids}
        peaks: dict[int, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=(pids, peaks, stop), daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        result = fn(cluster.scheduler_address)
        took = time.perf_counter() - t0
        stop.set()
        sampler.join()
    return {"s": took, "peak_rss": [peaks.get(p, base[p]) for p in pids], "base_rss": [base[p] for p in pids],
            "result": result}
