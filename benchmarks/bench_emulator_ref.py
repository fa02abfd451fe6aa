"""Reference-model benchmark: an issue's small stream/core model in plain SimPy and in runtime_emu.

An issue measured runtime_emu against SimPy on a deliberately simple model and reported
runtime_emu at 0.65x SimPy's tasks/s end to end (``acl.init()`` .. ``acl.finalize()``) and
1.03x up to ``synchronize_device()``, the schedules checked task by task. ``bench_emulator.py``
compares the two on the emulator's full semantics (host overheads, full queues, two core types,
priorities), where SimPy has to be written the emulator's way; this script keeps the issue's
model instead, so that its figure can be reproduced and tracked: the SimPy side is what a SimPy
user would write for it, and the runtime_emu side is an AscendCL-style program.

The model:

  * ``--tasks`` (default 400_000) one-block kernels, launched round-robin over ``--streams``
    (default 8) streams: task i goes to stream i % streams, 50k per stream by default;
  * each kernel runs 10..22 ns (integers, uniform), drawn from ``random.Random(--seed)`` once
    and given to both sides, so both simulate the same program;
  * 4 Cube cores; a stream runs its tasks one at a time in FIFO order, a waiting kernel takes
    the next free core, oldest first;
  * zero host costs: launches, other API calls, synchronize and the dispatch to the device take
    no simulated time, so every launch is issued at t = 0 and the launch order only decides
    which streams reach the cores first; every stream queue holds all its launches
    (``--queue-tasks`` sets a smaller one: the host then blocks on full queues, which changes
    the emulator's work but not the schedule);
  * recording on: SimPy appends (stream, start, end) per task to a list, as a profiler would;
    runtime_emu records what it always records (launch API slices, flows, task slices,
    queue-depth counters) and builds its trace table in ``acl.finalize()``.

SimPy: one process per stream that, per task, requests a core from a
``simpy.Resource(capacity=4)`` and holds it for the kernel's duration; the processes start in
stream order, which is the round-robin launch order. runtime_emu: ``acl.init(preset=...)`` with
a preset of 4 Cube cores and zero overheads, ``set_device``, ``create_stream`` per stream, every
``launch_kernel(kernel, 1, stream)``, ``synchronize_device()``, ``finalize()``.

Before timing, the two are checked to produce the same schedule on ``--check-tasks`` (default
4000) tasks: per stream, in FIFO order, every task's (kernel, start, end) must be equal (SAME /
DIFF with the largest |difference|). With integer durations in a narrow range many kernels end
in the same nanosecond, so this also checks that both hand out cores in the same order on ties.
The last timed run is compared the same way.

What it measures (wall clock, best of ``--repeat``, a fresh model each time, after a small
warm-up of both so imports and first calls do not count):

  * SimPy        ``simpy.Environment()`` .. ``env.run()`` returns (simulation + recording);
  * runtime_emu  ``acl.init()`` .. ``acl.rt.synchronize_device()`` returns, and
                 .. ``acl.finalize()`` returns (end to end: + the trace table); also printed,
                 without a target: ``acl.init()`` .. the last launch returns, and how many
                 garbage collections ran meanwhile (a host far ahead of the device used to
                 leave an object per queued launch for them to walk); and every run's time,
                 the first one's ratio apart: it is the first of its size in the process, so
                 the block pool its row buffers and table take memory from is empty and it
                 faults all of it in (runtime_emu/_rowbuf.h), where later runs reuse it.

Target (reported PASS/MISS; the exit code is 0 either way, this is a measurement):
runtime_emu tasks/s end to end (init .. finalize, recording on) >= 5x SimPy's tasks/s.
The ratio up to synchronize is printed against the same bar for comparison.

Run (from the repo root, with the dev venv, which brings in SimPy):

    python benchmarks/bench_emulator_ref.py                        # 8 x 50k tasks, best of 3
    python benchmarks/bench_emulator_ref.py --tasks 80000 --repeat 5 --json ref.json
    MSPROF_PY_PURE=1 python benchmarks/bench_emulator_ref.py       # the pure-Python emulator core

It prints which runtime_emu core ran, compiled (mypyc, built at install) or pure Python, and
which build made the trace table: native (runtime_emu/_rowtable.c, built at install) or Arrow.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from array import array
from collections import defaultdict
from itertools import chain
from pathlib import Path

import simpy
from _common import environment, save_json

import runtime_emu
from runtime_emu import PRESETS, Kernel, Preset, acl, tables

TARGET_SPEEDUP = 5.0  # runtime_emu tasks/s (init .. finalize, recording on) over SimPy's, at least

CUBE_CORES = 4
DURATION_NS = (10, 22)  # one-block kernel run time, inclusive range


# ============================================================================ workload
def make_durations(n: int, seed: int) -> list[int]:
    """Run time (ns) of each launch, in launch order; both sides take the same list."""
    rng = random.Random(seed)
    lo, hi = DURATION_NS
    return [rng.randint(lo, hi) for _ in range(n)]


def kernel_name(ns: int) -> str:
    """One kernel per run time, so the schedule check also matches which kernel ran."""
    return f"k{ns}ns"


def make_preset(queue_tasks: int) -> Preset:
    """4 Cube cores, every host-side cost zero: the issue's device."""
    return PRESETS["910B3"].with_(name="ref-4cube", cube_cores=CUBE_CORES, launch_overhead_ns=0, api_overhead_ns=0,
                                  sync_overhead_ns=0, dispatch_latency_ns=0, queue_tasks=queue_tasks)


# ============================================================================ SimPy
def run_simpy(durations: list[int], streams: int) -> list[tuple[int, int, int]]:
    """The model as a SimPy user writes it; returns the recording: (stream, start, end) per task."""
    env = simpy.Environment()
    cores = simpy.Resource(env, capacity=CUBE_CORES)
    log: list[tuple[int, int, int]] = []
    record = log.append

    def stream(sid: int, work: list[int]):
        for ns in work:  # FIFO: the next task waits for this one
            with cores.request() as req:
                yield req
                start = env.now
                yield env.timeout(ns)
            record((sid, start, env.now))

    for s in range(streams):  # started in round-robin order: stream 1 reaches the cores first
        env.process(stream(s + 1, durations[s::streams]))
    env.run()
    return log


def simpy_timed(durations: list[int], streams: int) -> tuple[float, array]:
    """SimPy's run time, and its recording packed into one flat array (outside the timing), so
    that its tuples are not alive, and scanned by the GC, while runtime_emu is timed."""
    t0 = time.perf_counter()
    log = run_simpy(durations, streams)
    t = time.perf_counter() - t0
    flat = array("q", chain.from_iterable(log))
    del log
    return t, flat


def unpack(flat: array) -> list[tuple[int, int, int]]:
    return list(zip(flat[0::3], flat[1::3], flat[2::3]))


# ============================================================================ runtime_emu
def emu_timed(durations: list[int], streams: int, preset: Preset) -> dict:
    """The model as an AscendCL program, timed at synchronize_device() and at finalize()."""
    lo, hi = DURATION_NS
    kernels = {ns: Kernel(kernel_name(ns), block_ns=ns, core="cube") for ns in range(lo, hi + 1)}
    gc.collect()
    t0 = time.perf_counter()
    rt = acl.init(seed=0, preset=preset)
    acl.rt.set_device(0)
    handles = [acl.rt.create_stream() for _ in range(streams)]
    launch = acl.rt.launch_kernel
    collections = sum(g["collections"] for g in gc.get_stats())
    for i, ns in enumerate(durations):
        launch(kernels[ns], 1, handles[i % streams])
    t_launched = time.perf_counter()
    collections = sum(g["collections"] for g in gc.get_stats()) - collections
    acl.rt.synchronize_device()
    t_sync = time.perf_counter()
    res = acl.finalize()
    t_end = time.perf_counter()
    out = {"launch_s": t_launched - t0, "launch_gc_collections": collections, "sync_s": t_sync - t0,
           "finalize_s": t_end - t0, "log": rt.task_log, "rows": len(res.trace), "stream_ids": [h.id for h in handles]}
    # acl keeps the last runtime as its current one; an empty program replaces it, so the
    # finished run's objects are not still alive (and scanned by the GC) while SimPy is timed.
    del rt, res
    acl.init(preset=preset)
    acl.finalize()
    return out


# ============================================================================ schedule check
def compare(durations: list[int], streams: int, sim_log: list[tuple], emu: dict) -> dict:
    """Per stream, in FIFO order: (kernel, start, end) of every task on both sides."""
    per_sim: dict[int, list] = defaultdict(list)
    per_emu: dict[int, list] = defaultdict(list)
    for sid, start, end in sim_log:
        per_sim[sid].append((start, end))
    for name, sid, start, end in emu["log"]:
        per_emu[sid].append((name, start, end))
    out = {"tasks": len(durations), "tasks_simpy": len(sim_log), "tasks_emu": len(emu["log"]), "max_abs_ns": 0,
           "tasks_differing": 0, "first_differences": [], "end_ns_simpy": max((e for _, _, e in sim_log), default=0),
           "end_ns_emu": max((e for _, _, _, e in emu["log"]), default=0)}
    for s in range(streams):
        want = [kernel_name(ns) for ns in durations[s::streams]]
        a, b = per_sim.get(s + 1, []), per_emu.get(emu["stream_ids"][s], [])
        out["tasks_differing"] += abs(len(a) - len(b)) + sum(1 for n, x in zip(want, b) if x[0] != n)
        for i, (x, y) in enumerate(zip(a, b)):
            d = max(abs(x[0] - y[1]), abs(x[1] - y[2]))
            if d:
                out["tasks_differing"] += 1
                out["max_abs_ns"] = max(out["max_abs_ns"], d)
                if len(out["first_differences"]) < 3:
                    out["first_differences"].append({"stream": s + 1, "index": i, "simpy": list(x),
                                                     "runtime_emu": list(y[1:])})
    out["same"] = out["tasks_differing"] == 0 and len(sim_log) == len(emu["log"]) == len(durations)
    return out


# ============================================================================ output
def verdict(ok: bool, yes: str = "PASS", no: str = "MISS") -> str:
    return f"[bold green]{yes}[/]" if ok else f"[bold red]{no}[/]"


def describe_check(c: dict) -> str:
    return (f"{c['tasks']:,} tasks: {c['tasks_differing']} differ, max |d| {c['max_abs_ns']} ns, end "
            f"{c['end_ns_simpy']:,} ns (SimPy) / {c['end_ns_emu']:,} ns (runtime_emu)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tasks", type=int, default=400_000, help="kernel launches in the timed run (default 400000)")
    ap.add_argument("--streams", type=int, default=8, help="streams, launched round-robin (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs; the best is kept (default 3)")
    ap.add_argument("--check-tasks", type=int, default=4000, help="tasks in the schedule check (default 4000)")
    ap.add_argument("--queue-tasks", type=int, default=0,
                    help="tasks a stream queue holds (default 0: all its launches, so the host never blocks)")
    ap.add_argument("--seed", type=int, default=0, help="kernel duration seed (default 0)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the numbers as JSON to OUT")
    args = ap.parse_args(argv)
    if min(args.tasks, args.streams, args.repeat, args.check_tasks) < 1 or args.queue_tasks < 0:
        ap.error("--tasks, --streams, --repeat and --check-tasks must be >= 1, --queue-tasks >= 0")

    from rich.console import Console
    from rich.table import Table

    console = Console()
    core = "compiled (mypyc)" if runtime_emu.COMPILED else "pure Python"
    console.print(f"runtime_emu core: {core}; trace table build: {tables.state()} (MSPROF_PY_PURE=1 runs the "
                  "pure-Python modules and the Arrow build)", markup=False, highlight=False)
    n, streams = args.tasks, args.streams
    queue_tasks = args.queue_tasks or -(-max(n, args.check_tasks) // streams)
    preset = make_preset(queue_tasks)
    console.print(f"model: {n:,} one-block kernels of {DURATION_NS[0]}-{DURATION_NS[1]} ns, {streams} streams "
                  f"round-robin, {CUBE_CORES} cube cores, zero host costs, stream queues of {queue_tasks:,} tasks, "
                  f"recording on", highlight=False)

    with console.status("warm-up ..."):
        small = make_durations(500, args.seed + 1)
        run_simpy(small, streams)
        emu_timed(small, streams, preset)
    with console.status(f"schedule check ({args.check_tasks:,} tasks) ..."):
        durations = make_durations(args.check_tasks, args.seed)
        check = compare(durations, streams, run_simpy(durations, streams), emu_timed(durations, streams, preset))
    console.print(f"schedule check, {describe_check(check)}: " + verdict(check["same"], "SAME", "DIFF"),
                  highlight=False)
    for d in check["first_differences"]:
        console.print(f"  [red]stream {d['stream']} task #{d['index']}: SimPy {tuple(d['simpy'])} vs runtime_emu "
                      f"{tuple(d['runtime_emu'])}[/]")

    durations = make_durations(n, args.seed)
    sim_s, launch_s, sync_s, fin_s = [], [], [], []
    sim_log = array("q")
    emu: dict = {}
    for i in range(args.repeat):
        sim_log, emu = array("q"), {}  # the previous run's memory goes before the next is timed
        gc.collect()
        with console.status(f"run {i + 1}/{args.repeat}: SimPy, {n:,} tasks ..."):
            t, sim_log = simpy_timed(durations, streams)
        sim_s.append(t)
        with console.status(f"run {i + 1}/{args.repeat}: runtime_emu, {n:,} tasks ..."):
            emu = emu_timed(durations, streams, preset)
        launch_s.append(emu["launch_s"])
        sync_s.append(emu["sync_s"])
        fin_s.append(emu["finalize_s"])
    timed_check = compare(durations, streams, unpack(sim_log), emu)

    best_sim, best_sync, best_fin = min(sim_s), min(sync_s), min(fin_s)
    sim_rate, sync_rate, fin_rate = n / best_sim, n / best_sync, n / best_fin
    ratio_sync, ratio_fin = sync_rate / sim_rate, fin_rate / sim_rate
    t = Table(title=f"{n:,} tasks, {streams} streams, {CUBE_CORES} cube cores, recording on, best of {args.repeat} "
                    f"({core} core)", title_justify="left")
    for col, just in (("measurement", "left"), ("time", "right"), ("rate", "right"), ("ratio", "right"),
                      ("target", "right"), ("result", "center")):
        t.add_column(col, justify=just)
    t.add_row("SimPy env .. run()", f"{best_sim:.3f} s", f"{sim_rate:,.0f} tasks/s", "", "", "")
    t.add_row("emu init .. sync", f"{best_sync:.3f} s", f"{sync_rate:,.0f} tasks/s",
              f"{ratio_sync:.2f}x SimPy", f">= {TARGET_SPEEDUP:g}x", verdict(ratio_sync >= TARGET_SPEEDUP))
    t.add_row("emu init .. finalize", f"{best_fin:.3f} s", f"{fin_rate:,.0f} tasks/s",
              f"{ratio_fin:.2f}x SimPy", f">= {TARGET_SPEEDUP:g}x", verdict(ratio_fin >= TARGET_SPEEDUP))
    t.add_row("same schedule", "", f"max |d| {timed_check['max_abs_ns']} ns",
              f"{timed_check['tasks_differing']} differ", "0", verdict(timed_check["same"], "SAME", "DIFF"))
    console.print(t)
    console.print(f"runtime_emu: init .. the last launch {min(launch_s):.3f} s (garbage collections meanwhile: "
                  f"{emu['launch_gc_collections']}), finalize() {best_fin - best_sync:.3f} s ({emu['rows']:,} trace "
                  f"rows); timed run {describe_check(timed_check)}", highlight=False)
    # The first timed run is the first of this size in the process: the table build's block pool
    # (where the row buffers and the table's columns take their memory) has no blocks of its size
    # yet, so it faults its memory in; later runs reuse it (runtime_emu/_rowbuf.h).
    console.print("each run, init .. finalize: " + ", ".join(f"{t:.3f} s" for t in fin_s)
                  + " (SimPy: " + ", ".join(f"{t:.3f} s" for t in sim_s) + "); the first in a pool without "
                  f"blocks of its size: {sim_s[0] / fin_s[0]:.2f}x SimPy's same run", highlight=False)
    summary = (f"SUMMARY ({core} core): runtime_emu init..finalize {ratio_fin:.2f}x SimPy tasks/s "
               f"({'PASS' if ratio_fin >= TARGET_SPEEDUP else 'MISS'} >= {TARGET_SPEEDUP:g}x), "
               f"{ratio_sync:.2f}x up to synchronize; schedules "
               + ("agree" if check["same"] and timed_check["same"]
                  else "DIFFER (the timing compares different models)"))

    if args.json:
        save_json(args.json, {
            "benchmark": "bench_emulator_ref",
            "model": {"tasks": n, "streams": streams, "cube_cores": CUBE_CORES, "duration_ns": list(DURATION_NS),
                      "queue_tasks": queue_tasks, "seed": args.seed, "host_costs_ns": 0, "recording": True},
            "repeat": args.repeat,
            "target_speedup": TARGET_SPEEDUP,
            "env": {**environment(simpy="simpy", msprof_py="msprof-py"), "runtime_emu_compiled": runtime_emu.COMPILED,
                    "trace_table_build": tables.state()},
            "schedule_check": check,
            "timed_run_check": timed_check,
            "simpy_s": best_sim, "simpy_all_s": sim_s, "simpy_tasks_per_s": sim_rate,
            "emu_launch_s": min(launch_s), "emu_launch_all_s": launch_s,
            "emu_launch_gc_collections": emu["launch_gc_collections"],
            "emu_sync_s": best_sync, "emu_sync_all_s": sync_s, "emu_sync_tasks_per_s": sync_rate,
            "emu_finalize_s": best_fin, "emu_finalize_all_s": fin_s, "emu_finalize_tasks_per_s": fin_rate,
            "emu_trace_rows": emu["rows"],
            "ratio_sync": ratio_sync, "ratio_finalize": ratio_fin,
            "pass": ratio_fin >= TARGET_SPEEDUP,
            "summary": summary,
        })
    console.print(summary, markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
