"""Import benchmark: msprof-py trace import vs. Holistic Trace Analysis (HTA) load, on real traces.

What it measures, for each real Kineto trace (default: ``queue_16rank_rank0.json.gz`` and
``ns_resolution_rank0.json.gz`` from ``../shared/real_traces/kineto`` next to the repo root),
all side by side in one run:

  (a) HTA load       ``hta.trace_analysis.TraceAnalysis(trace_dir=D)``, D a temporary directory
                     holding only a copy of that one file (HTA reads directories); wall time,
                     best of N.
  (b) ours import    ``msprof_py.trace.import_trace(path)``; wall time, best of N.
  (c) parquet reload ``msprof_py.trace.read_trace(tmp/'t.parquet')`` after one
                     ``write_trace(trace, tmp/'t.parquet')``; wall time, best of N.
  (d) peak RSS       ``import_trace(path)`` in a fresh child process: RSS baseline after the
                     imports and a tiny warm-up import (psutil), peak RSS after the import
                     (``ru_maxrss``), the increase over baseline, and both against the
                     decompressed JSON size. ``ru_maxrss`` survives exec on Linux (a child of a
                     big parent inherits the parent's RSS as its peak), so these children run
                     first, while this process is still small; VmHWM is shown as a cross-check.

Before timing, a tiny trace (``kineto/tiny_base.json.gz``) is imported once by us and loaded
once by HTA so module import / first-call costs are excluded for both. HTA's logging (it logs
each parse step, several at WARNING) is silenced below ERROR.

Targets (each reported PASS/MISS; the exit code is 0 either way, this is a measurement):

  * HTA load / ours import            >= 5x
  * HTA load / ours parquet reload    >= 50x
  * peak RSS increase / decompressed  <= 3x   (peak RSS / decompressed is shown for context)

Run (from the repo root, with the dev venv):

    python benchmarks/bench_import.py
    python benchmarks/bench_import.py --repeat 5 --json bench_import.json
    python benchmarks/bench_import.py --traces-dir /path/to/real_traces
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import environment, save_json

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES_DIR = REPO_ROOT.parent / "shared" / "real_traces"
DEFAULT_FILES = ("kineto/queue_16rank_rank0.json.gz", "kineto/ns_resolution_rank0.json.gz")
WARMUP_FILE = "kineto/tiny_base.json.gz"

TARGET_HTA_OVER_IMPORT = 5.0     # HTA load / ours import, at least
TARGET_HTA_OVER_PARQUET = 50.0   # HTA load / ours parquet reload, at least
TARGET_RSS_OVER_JSON = 3.0       # peak RSS increase / decompressed JSON size, at most

MiB = 1024 * 1024

# Runs in a fresh interpreter: argv[1] = trace path, argv[2] = warm-up trace path or "".
# Prints one JSON line with byte counts.
_CHILD = r"""
import json, resource, sys
import psutil
from msprof_py.trace import import_trace
path, warm = sys.argv[1], sys.argv[2]
if warm:
    import_trace(warm)  # load lazily imported modules before the baseline
baseline = psutil.Process().memory_info().rss
trace = import_trace(path)
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
hwm = None
try:  # Linux cross-check: per-address-space peak, starts afresh at exec
    with open("/proc/self/status") as fh:
        hwm = next((int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM:")), None)
except OSError:
    pass
print(json.dumps({"baseline_rss": baseline, "peak_rss": maxrss * scale, "vmhwm": hwm,
                  "rows": trace.table.num_rows}))
"""


def silence_hta() -> None:
    """HTA logs every parse step, several of them ("Parsed ... time", "Rounding down ns resolution
    events") at WARNING, and re-applies its logging config on each HtaConfig: keep only ERROR."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    logging.disable(logging.WARNING)  # survives HTA's logging.config.fileConfig resets
    warnings.filterwarnings("ignore", module=r"hta(\.|$)")


def best_of(n: int, fn) -> tuple[float, list[float]]:
    """Wall time of `fn()`, best of n; garbage from the previous run is collected outside the clock."""
    times = []
    for _ in range(n):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result
    gc.collect()
    return min(times), times


def decompressed_size(path: Path) -> int:
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if not gz:
        return path.stat().st_size
    with gzip.open(path, "rb") as fh:
        return len(fh.read())


def single_file_dir(path: Path, parent: Path) -> Path:
    d = Path(tempfile.mkdtemp(prefix="hta_", dir=parent))
    shutil.copy2(path, d / path.name)
    return d


def hta_load(trace_dir: Path):
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=str(trace_dir))


def child_rss(path: Path, warm: Path | None) -> dict:
    """Peak RSS of `import_trace(path)` in a fresh interpreter.

    Caveat handled by the caller: on Linux, ru_maxrss survives exec, so a child forked from a
    large parent reports at least the parent's RSS at fork time. Children are therefore run
    first, while this process is still small, and the parent's RSS at spawn is recorded.
    """
    import psutil

    parent_rss = psutil.Process().memory_info().rss
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(warm) if warm else ""],
        capture_output=True, text=True, cwd=str(REPO_ROOT),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed for {path} (exit {proc.returncode}):\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["parent_rss_at_spawn"] = parent_rss
    return out


def bench_file(path: Path, repeat: int, rss: dict, work: Path) -> dict:
    from msprof_py.trace import import_trace, read_trace, write_trace

    hta_dir = single_file_dir(path, work)
    hta_best, hta_all = best_of(repeat, lambda: hta_load(hta_dir))

    ours_best, ours_all = best_of(repeat, lambda: import_trace(path))

    trace = import_trace(path)
    rows = trace.table.num_rows
    pq_path = work / f"{path.name}.d" / "t.parquet"
    pq_path.parent.mkdir()
    write_trace(trace, pq_path)
    del trace
    gc.collect()
    pq_best, pq_all = best_of(repeat, lambda: read_trace(pq_path))

    json_bytes = decompressed_size(path)
    delta = rss["peak_rss"] - rss["baseline_rss"]

    r_import = hta_best / ours_best
    r_parquet = hta_best / pq_best
    r_rss = delta / json_bytes
    return {
        "file": str(path),
        "name": path.name,
        "rows": rows,
        "compressed_bytes": path.stat().st_size,
        "decompressed_bytes": json_bytes,
        "parquet_bytes": pq_path.stat().st_size,
        "hta_load_s": hta_best,
        "hta_load_all_s": hta_all,
        "ours_import_s": ours_best,
        "ours_import_all_s": ours_all,
        "ours_parquet_reload_s": pq_best,
        "ours_parquet_reload_all_s": pq_all,
        "rss_baseline_bytes": rss["baseline_rss"],
        "rss_peak_bytes": rss["peak_rss"],
        "rss_delta_bytes": delta,
        "rss_vmhwm_bytes": rss["vmhwm"],
        "parent_rss_at_spawn_bytes": rss["parent_rss_at_spawn"],
        "ratio_hta_over_import": r_import,
        "ratio_hta_over_parquet": r_parquet,
        "ratio_rss_delta_over_json": r_rss,
        "ratio_rss_peak_over_json": rss["peak_rss"] / json_bytes,
        "pass_import": r_import >= TARGET_HTA_OVER_IMPORT,
        "pass_parquet": r_parquet >= TARGET_HTA_OVER_PARQUET,
        "pass_rss": r_rss <= TARGET_RSS_OVER_JSON,
    }


def verdict(ok: bool) -> str:
    return "[bold green]PASS[/]" if ok else "[bold red]MISS[/]"


def print_table(console, r: dict, repeat: int) -> None:
    from rich.table import Table

    t = Table(title=f"{r['name']}  ({r['rows']:,} rows, best of {repeat})", title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("target", justify="right")
    t.add_column("result", justify="center")
    t.add_row("HTA load", f"{r['hta_load_s']:.3f} s", "", "", "")
    t.add_row("ours import", f"{r['ours_import_s']:.3f} s",
              f"HTA/ours {r['ratio_hta_over_import']:.1f}x", f">= {TARGET_HTA_OVER_IMPORT:g}x",
              verdict(r["pass_import"]))
    t.add_row("ours parquet reload", f"{r['ours_parquet_reload_s']:.4f} s",
              f"HTA/reload {r['ratio_hta_over_parquet']:.1f}x", f">= {TARGET_HTA_OVER_PARQUET:g}x",
              verdict(r["pass_parquet"]))
    t.add_row("peak RSS delta (import)", f"{r['rss_delta_bytes'] / MiB:.1f} MiB",
              f"delta/JSON {r['ratio_rss_delta_over_json']:.2f}x", f"<= {TARGET_RSS_OVER_JSON:g}x",
              verdict(r["pass_rss"]))
    t.add_row("peak RSS (baseline)", f"{r['rss_peak_bytes'] / MiB:.1f} MiB ({r['rss_baseline_bytes'] / MiB:.1f})",
              f"peak/JSON {r['ratio_rss_peak_over_json']:.2f}x", "", "")
    if r["rss_vmhwm_bytes"] is not None:
        t.add_row("  cross-check VmHWM", f"{r['rss_vmhwm_bytes'] / MiB:.1f} MiB", "", "", "")
    t.add_row("decompressed JSON", f"{r['decompressed_bytes'] / MiB:.1f} MiB",
              f"gz {r['compressed_bytes'] / MiB:.2f} MiB", "", "")
    t.add_row("parquet file", f"{r['parquet_bytes'] / MiB:.2f} MiB", "", "", "")
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--traces-dir", type=Path, default=DEFAULT_TRACES_DIR,
                    help=f"real_traces directory (default: {DEFAULT_TRACES_DIR})")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per measurement; the best is kept (default 3)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the numbers as JSON to OUT")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")

    from rich.console import Console

    console = Console()
    silence_hta()

    files = [args.traces_dir / f for f in DEFAULT_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        console.print(f"[red]missing trace(s):[/] {', '.join(missing)}")
        return 2

    warm = args.traces_dir / WARMUP_FILE
    if not warm.is_file():
        console.print(f"[yellow]warm-up trace {warm} not found: first-call costs are not excluded[/]")
        warm = None

    # (d) first, before this process loads HTA or any trace (see child_rss).
    rss = {}
    with console.status("peak RSS: importing each trace in a fresh child process ..."):
        for f in files:
            rss[f] = child_rss(f, warm)
            if rss[f]["parent_rss_at_spawn"] >= rss[f]["peak_rss"]:
                console.print(f"[yellow]{f.name}: child ru_maxrss may be the parent's RSS inherited at spawn[/]")


    from msprof_py.trace import import_trace

    results = []
    with tempfile.TemporaryDirectory(prefix="bench_import_") as tmp:
        work = Path(tmp)
        if warm is not None:
            import_trace(warm)
            hta_load(single_file_dir(warm, work))
        gc.collect()
        for f in files:
            with console.status(f"benchmarking {f.name} ..."):
                r = bench_file(f, args.repeat, rss[f], work)
            results.append(r)
            print_table(console, r, args.repeat)

    checks = [(r["name"], label, r[key]) for r in results
              for label, key in (("HTA/import>=5x", "pass_import"), ("HTA/parquet>=50x", "pass_parquet"),
                                 ("RSS/JSON<=3x", "pass_rss"))]
    passed = sum(ok for _, _, ok in checks)
    misses = [f"{name} {label}" for name, label, ok in checks if not ok]
    summary = f"SUMMARY: {passed}/{len(checks)} targets met" + (f"; MISS: {', '.join(misses)}" if misses else "")

    if args.json:
        out = {
            "benchmark": "bench_import",
            "repeat": args.repeat,
            "targets": {"hta_over_import_min": TARGET_HTA_OVER_IMPORT,
                        "hta_over_parquet_min": TARGET_HTA_OVER_PARQUET,
                        "rss_delta_over_json_max": TARGET_RSS_OVER_JSON},
            "env": environment(hta="HolisticTraceAnalysis", msprof_py="msprof-py"),
            "results": results,
            "passed": passed,
            "checks": len(checks),
            "summary": summary,
        }
        save_json(args.json, out)

    console.print(summary, markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
