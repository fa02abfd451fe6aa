"""CLI benchmark: start-up of `msprof-py`, and its import / info against Holistic Trace Analysis.

What it measures, all in one run, each a best-of-N wall time:

  start-up (whole process, `subprocess.run`, stdout to a pipe):
    python -c pass                     the interpreter alone (the floor)
    python -c 'import pandas'          what pandas alone costs (the issue's 1.0 s reference)
    msprof-py --help                   target <= 0.3 s
    msprof-py info TABLE.parquet       on a ~1 MB table (the real queue_16rank_rank0 trace imported):
                                       target <= 0.5 s
    the same info with pandas made unimportable in the child: what pyarrow's own import of
                                       pandas costs (pyarrow imports pandas, if installed, on the
                                       first conversion of a Python value: `pa.array(list)`, a
                                       compute call with a Python literal)

  against HTA, on each real Kineto trace (default queue_16rank_rank0 and ns_resolution_rank0 from
  ../shared/real_traces/kineto), side by side, each on two like-for-like bases:
    in process (the targets)
      HTA load               `TraceAnalysis(trace_dir=D)` in this process (D holds only that file),
                             after a warm-up load of the tiny trace: its modules are loaded
      ours import            `import_trace(T)` after a warm-up: the work without start-up
      ours reload + info     what `info` does after its imports: read the table's summary
                             columns, summarize, render the tables to text
      Targets: HTA load / ours import >= 10x; HTA load / (reload + info) >= 50x. HTA's load is an
      in-process figure (its imports are not in it), so ours are taken the same way, as the
      targets' own reference is (the typed msgspec decode alone, ~26x).
    whole process (no target)
      HTA                    a fresh `python -c` that imports HTA and loads the trace, as a user
                             runs it
      ours import / info     `msprof-py import T -o T.parquet`, `msprof-py info T.parquet`
      Whole processes pay the interpreter and the imports (pyarrow and its numpy for us, about
      0.2 s; pandas and more for HTA), which no work of the command can take out.
    For continuity with earlier figures it also prints our whole process minus `msprof-py --help`
    (and minus the command's own imports: a process that only imports the modules the command
    loads) against HTA's in-process load: a mixed basis, so no target.

Figures are best of --repeat runs; the machine may be shared, so compare ratios over several
runs. The exit code is 0 whatever the figures: this is a measurement, not a test.

    python benchmarks/bench_cli.py
    python benchmarks/bench_cli.py --repeat 7 --json bench_cli.json

It prints which JSON import ran (the native scanner, or the msgspec decoder when the scanner is
not built or MSPROF_PY_PURE_IMPORT=1 is set: run it both ways to compare the two).
"""

from __future__ import annotations

import argparse
import gc
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
INFO_TABLE_SOURCE = "kineto/queue_16rank_rank0.json.gz"  # imports to a ~1 MB Parquet table
WARMUP_FILE = "kineto/tiny_base.json.gz"

TARGET_HELP_S = 0.3
TARGET_INFO_S = 0.5
TARGET_HTA_OVER_IMPORT = 10.0
TARGET_HTA_OVER_INFO = 50.0

# Runs the CLI in a child where `import pandas` fails, as in an environment without pandas.
_NO_PANDAS = r"""
import sys
class _NoPandas:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas blocked for the measurement")
sys.meta_path.insert(0, _NoPandas())
sys.argv = ["msprof-py", *sys.argv[1:]]
from msprof_py.cli import main
main()
"""


def msprof_py() -> str:
    exe = Path(sys.executable).with_name("msprof-py")
    return str(exe) if exe.exists() else shutil.which("msprof-py") or "msprof-py"


def process_best(argv: list[str], repeat: int) -> float:
    """Best wall time of a whole process (stdout and stderr to pipes); it must exit 0."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO_ROOT))
        best = min(best, time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return best


def in_process_best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
        del result
    gc.collect()
    return best


def silence_hta() -> None:
    """HTA logs each parse step, several at WARNING: keep only errors."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore", module=r"hta(\.|$)")


#: HTA as a user runs it: one fresh process that imports it and loads the trace in D.
HTA_PROCESS = """
import logging, sys, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


def hta_load(trace_dir: Path):
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=str(trace_dir))


def single_file_dir(path: Path, parent: Path) -> Path:
    d = Path(tempfile.mkdtemp(prefix="hta_", dir=parent))
    shutil.copy2(path, d / path.name)
    return d


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def startup(repeat: int, work: Path, traces_dir: Path) -> dict:
    cli, py = msprof_py(), sys.executable
    table = work / "info_table.parquet"
    subprocess.run([cli, "import", str(traces_dir / INFO_TABLE_SOURCE), "-o", str(table)], check=True,
                   stdout=subprocess.DEVNULL)
    out = {
        "table_bytes": table.stat().st_size,
        "python_s": process_best([py, "-c", "pass"], repeat),
        "python_pandas_s": process_best([py, "-c", "import pandas"], repeat),
        "help_s": process_best([cli, "--help"], repeat),
        "info_s": process_best([cli, "info", str(table)], repeat),
        "info_without_pandas_s": process_best([py, "-c", _NO_PANDAS, "info", str(table)], repeat),
    }
    print(f"start-up (whole process, best of {repeat}):")
    print(f"  python -c pass                      {out['python_s']:.3f} s")
    print(f"  python -c 'import pandas'           {out['python_pandas_s']:.3f} s")
    print(f"  msprof-py --help                    {out['help_s']:.3f} s   target <= {TARGET_HELP_S} s: "
          f"{verdict(out['help_s'] <= TARGET_HELP_S)}")
    print(f"  msprof-py info ({out['table_bytes'] / 2**20:.2f} MiB Parquet)     {out['info_s']:.3f} s   "
          f"target <= {TARGET_INFO_S} s: {verdict(out['info_s'] <= TARGET_INFO_S)}")
    print(f"  the same, pandas unimportable       {out['info_without_pandas_s']:.3f} s   "
          f"(pyarrow imports pandas on its first Python-value conversion)")
    return out


#: What `msprof-py import` and `msprof-py info` import before their work starts.
IMPORT_MODULES = "import msprof_py.cli, msprof_py.loading, msprof_py.trace.importers"
INFO_MODULES = "import msprof_py.cli, msprof_py.loading, msprof_py.summary, rich.console, rich.measure"


def against_hta(path: Path, repeat: int, help_s: float, work: Path) -> dict:
    from msprof_py.trace import import_trace

    cli = msprof_py()
    hta_dir = single_file_dir(path, work)
    hta_s = in_process_best(lambda: hta_load(hta_dir), repeat)
    hta_process_s = process_best([sys.executable, "-c", HTA_PROCESS, str(hta_dir)], repeat)
    table = work / f"{path.name}.parquet"
    import_process_s = process_best([cli, "import", str(path), "-o", str(table)], repeat)
    import_in_process_s = in_process_best(lambda: import_trace(path), repeat)
    info_process_s = process_best([cli, "info", str(table)], repeat)
    info_in_process_s = in_process_best(lambda: info_text(table), repeat)
    import_s = max(import_process_s - help_s, 1e-9)
    info_s = max(info_process_s - help_s, 1e-9)
    import_modules_s = process_best([sys.executable, "-c", IMPORT_MODULES], repeat)
    info_modules_s = process_best([sys.executable, "-c", INFO_MODULES], repeat)
    import_work_s = import_process_s - import_modules_s
    info_work_s = info_process_s - info_modules_s
    out = {
        "name": path.name,
        "hta_load_s": hta_s,
        "hta_process_s": hta_process_s,
        "import_process_s": import_process_s,
        "import_minus_startup_s": import_s,
        "import_in_process_s": import_in_process_s,
        "info_process_s": info_process_s,
        "info_minus_startup_s": info_s,
        "ratio_hta_over_import": hta_s / import_s,
        "ratio_hta_over_import_in_process": hta_s / import_in_process_s,
        "ratio_hta_process_over_import_process": hta_process_s / import_process_s,
        "info_in_process_s": info_in_process_s,
        "import_modules_s": import_modules_s,
        "info_modules_s": info_modules_s,
        "ratio_hta_over_import_minus_imports": _ratio(hta_s, import_work_s),
        "ratio_hta_over_info_minus_imports": _ratio(hta_s, info_work_s),
        "ratio_hta_over_info": hta_s / info_s,
        "ratio_hta_over_info_in_process": hta_s / info_in_process_s,
        "ratio_hta_process_over_info_process": hta_process_s / info_process_s,
    }
    imp_ok = out["ratio_hta_over_import_in_process"] >= TARGET_HTA_OVER_IMPORT
    info_ok = out["ratio_hta_over_info_in_process"] >= TARGET_HTA_OVER_INFO
    print(f"{path.name}:")
    print("  in process (the targets):")
    print(f"    HTA load                              {hta_s:.3f} s")
    print(f"    import_trace                          {import_in_process_s:.3f} s: "
          f"HTA/ours {out['ratio_hta_over_import_in_process']:.1f}x  target >= {TARGET_HTA_OVER_IMPORT:.0f}x: "
          f"{verdict(imp_ok)}")
    print(f"    reload + info                         {info_in_process_s:.3f} s: "
          f"HTA/ours {out['ratio_hta_over_info_in_process']:.1f}x  target >= {TARGET_HTA_OVER_INFO:.0f}x: "
          f"{verdict(info_ok)}")
    print("  whole process (no target):")
    print(f"    HTA import + load                     {hta_process_s:.3f} s")
    print(f"    msprof-py import                      {import_process_s:.3f} s: "
          f"HTA/ours {out['ratio_hta_process_over_import_process']:.1f}x")
    print(f"    msprof-py info on its Parquet         {info_process_s:.3f} s: "
          f"HTA/ours {out['ratio_hta_process_over_info_process']:.1f}x")
    print("  mixed: our whole process against HTA's in-process load (no target):")
    print(f"    msprof-py import minus start-up       {import_s:.3f} s: HTA/ours {out['ratio_hta_over_import']:.1f}x; "
          f"minus its imports ({import_modules_s:.3f} s) {import_work_s:.3f} s: "
          f"{_ratio_text(out['ratio_hta_over_import_minus_imports'])}")
    print(f"    msprof-py info minus start-up         {info_s:.3f} s: HTA/ours {out['ratio_hta_over_info']:.1f}x; "
          f"minus its imports ({info_modules_s:.3f} s) {info_work_s:.3f} s: "
          f"{_ratio_text(out['ratio_hta_over_info_minus_imports'])}")
    return out


#: A difference of two whole-process times below this is noise on a shared machine, not a figure.
NOISE_S = 0.02


def _ratio(hta_s: float, ours_s: float) -> float | None:
    return hta_s / ours_s if ours_s >= NOISE_S else None


def _ratio_text(ratio: float | None) -> str:
    return f"{ratio:.1f}x" if ratio is not None else f"n/a (difference under {NOISE_S} s: noise)"


def info_text(table: Path) -> str:
    """What `msprof-py info TABLE` does once its modules are imported."""
    import io

    from rich.console import Console

    from msprof_py import loading
    from msprof_py.summary import SUMMARY_COLUMNS, render, summarize

    trace = loading.load_any(table, columns=SUMMARY_COLUMNS)
    sink = io.StringIO()
    Console(file=sink, width=200).print(render(summarize(trace), title=str(table)))
    return sink.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; the best counts (default 5)")
    ap.add_argument("--traces-dir", type=Path, default=DEFAULT_TRACES_DIR)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    silence_hta()
    from msprof_py.trace import import_trace

    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        work = Path(tmp)
        warm = args.traces_dir / WARMUP_FILE
        import_trace(warm)  # first-call costs out of the in-process figures, for both sides
        hta_load(single_file_dir(warm, work))
        from msprof_py.trace import native

        print(f"JSON import: {native.state()}")
        start = startup(args.repeat, work, args.traces_dir)
        files = [against_hta(args.traces_dir / f, args.repeat, start["help_s"], work) for f in DEFAULT_FILES]
    if args.json:
        save_json(args.json, {"environment": environment(hta="HolisticTraceAnalysis", pyarrow="pyarrow",
                                                         pandas="pandas", typer="typer"),
                              "startup": start, "files": files})


if __name__ == "__main__":
    main()
