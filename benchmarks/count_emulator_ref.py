"""Instructions per task of the reference model (bench_emulator_ref.py), runtime_emu and SimPy.

Wall-clock ratios on a shared 2-core machine move by a third from one run to the next, so a
change of a few percent in the emulator's hot path cannot be seen in them. This counts
instructions instead (valgrind's cachegrind, `I refs`), which repeat to a few thousand in two
billion: each side runs the model twice, with `--tasks` M and 2M launches, in a fresh process
with the hash seed fixed, address randomisation off and numpy's BLAS on one thread (its idle
threads spin), and the difference of the two counts divided by M is the cost of one more task,
start-up and imports cancelled out. runtime_emu is counted in three phases, each to the end of:

  * launch    ``acl.init()`` .. the last ``acl.rt.launch_kernel`` (per launch);
  * sync      .. ``acl.rt.synchronize_device()`` (the device simulation, per task);
  * finalize  .. ``acl.finalize()`` (the trace table, per task);

and SimPy's ``env.run()`` with its recording. Printed: instructions per task of each, and SimPy's
over runtime_emu's end to end. Instructions are not time (the table build runs on both cores
and waits on memory), so this tracks the hot path between two commits; bench_emulator_ref.py
gives the time ratio the target is set on.

Needs valgrind (Debian: ``apt-get install valgrind``) and setarch (util-linux). Run from the
repo root with the dev venv (SimPy):

    python benchmarks/count_emulator_ref.py                 # M = 10000 (about three minutes)
    python benchmarks/count_emulator_ref.py --tasks 20000 --json counts.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("launch", "sync", "finalize")


def child(side: str, tasks: int, phase: str) -> None:
    """The model in this process, up to the end of `phase`; then exit at once (no teardown)."""
    sys.path.insert(0, str(HERE))
    from bench_emulator_ref import kernel_name, make_durations, make_preset, run_simpy

    streams = 8
    durations = make_durations(tasks, 0)
    if side == "simpy":
        run_simpy(durations, streams)
        os._exit(0)
    from runtime_emu import Kernel, acl

    kernels = {ns: Kernel(kernel_name(ns), block_ns=ns, core="cube") for ns in set(durations)}
    preset = make_preset(-(-tasks // streams))
    if phase == "none":
        os._exit(0)
    acl.init(seed=0, preset=preset)
    acl.rt.set_device(0)
    handles = [acl.rt.create_stream() for _ in range(streams)]
    launch = acl.rt.launch_kernel
    for i, ns in enumerate(durations):
        launch(kernels[ns], 1, handles[i % streams])
    if phase in ("sync", "finalize"):
        acl.rt.synchronize_device()
    if phase == "finalize":
        acl.finalize()
    os._exit(0)


def count(side: str, tasks: int, phase: str) -> int:
    """Instructions of one child run under cachegrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cmd = ["setarch", "-R", "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--child", side, "--tasks", str(tasks), "--phase", phase]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        sys.exit(f"count_emulator_ref: the {side} {phase} run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tasks", type=int, default=10_000, help="M: the runs launch M and 2M tasks (default 10000)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the counts as JSON to OUT")
    ap.add_argument("--child", choices=("emu", "simpy"), help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("none", *PHASES), default="finalize", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.tasks, args.phase)
    if args.tasks < 1000:
        ap.error("--tasks must be >= 1000 (smaller runs are mostly start-up)")
    missing = [tool for tool in ("valgrind", "setarch") if shutil.which(tool) is None]
    if missing:
        ap.error(f"needs {' and '.join(missing)} (Debian: apt-get install valgrind util-linux)")

    from rich.console import Console
    from rich.table import Table

    import runtime_emu
    from runtime_emu import tables

    console = Console()
    m = args.tasks
    core = "compiled (mypyc)" if runtime_emu.COMPILED else "pure Python"
    console.print(f"runtime_emu core: {core}; trace table build: {tables.state()}; M = {m:,} tasks", highlight=False)
    per: dict[str, float] = {}
    with console.status("counting ...") as status:
        for side, phase in (("simpy", "finalize"), *(("emu", p) for p in PHASES)):
            status.update(f"counting {side} {phase}: {m:,} and {2 * m:,} tasks under cachegrind ...")
            per[f"{side}_{phase}"] = (count(side, 2 * m, phase) - count(side, m, phase)) / m
    launch = per["emu_launch"]
    sim = per["emu_sync"] - per["emu_launch"]
    build = per["emu_finalize"] - per["emu_sync"]
    simpy = per["simpy_finalize"]
    t = Table(title=f"instructions per task (2M - M runs, M = {m:,})", title_justify="left")
    for col in ("what", "instructions / task", "share of runtime_emu"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("SimPy: simulation + recording", f"{simpy:,.0f}", "")
    for what, v in (("runtime_emu: launch", launch), ("runtime_emu: device simulation", sim),
                    ("runtime_emu: trace table", build), ("runtime_emu: end to end", per["emu_finalize"])):
        t.add_row(what, f"{v:,.0f}", f"{100 * v / per['emu_finalize']:.0f}%")
    console.print(t)
    ratio = simpy / per["emu_finalize"]
    summary = (f"SUMMARY ({core} core): SimPy {simpy:,.0f} instructions per task, runtime_emu {per['emu_finalize']:,.0f} "
               f"(launch {launch:,.0f}, simulation {sim:,.0f}, table {build:,.0f}): SimPy / runtime_emu = {ratio:.2f}")
    console.print(summary, markup=False, highlight=False)
    if args.json:
        sys.path.insert(0, str(HERE))
        from _common import environment, save_json

        save_json(args.json, {"benchmark": "count_emulator_ref", "tasks": m, "per_task": per, "launch": launch,
                              "simulation": sim, "table": build, "simpy": simpy, "ratio": ratio,
                              "env": environment(simpy="simpy", msprof_py="msprof-py"), "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
