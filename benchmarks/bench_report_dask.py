"""`msprof-py report --engine dask` on a large multi-rank trace, as a user runs it: the command in a
fresh process, its wall time and the driver's peak RSS (the workers run in their own processes),
beside the same report in one process (`msprof-py report` without an engine) when asked.

    msprof-py emulate llm-train --ranks 64 --param servers=8 --steps 620 \\
        --stream --export off --ground-truth off --output /tmp/cluster
    python benchmarks/bench_report_dask.py --trace /tmp/cluster/PROF_... [--workers 2] [--whole]

Without --trace it emulates a small one (--ranks, --steps) into a temporary directory first.
`--whole` also runs the plain report (it loads the whole trace: skip it where that does not fit)
and says whether the two JSON reports are the same (they are while the trace has at most the
driver's 2M rows; above that the fixes are replayed on a window of steps and the reports differ
in what it says).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import resource, sys, time
t0 = time.perf_counter()
from msprof_py.cli import app
try:
    app({argv!r}, standalone_mode=False)
finally:
    print("WALL", time.perf_counter() - t0, "RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def run(argv: list[str]) -> tuple[float, int]:
    # A script, not `-c`: Dask's worker processes re-import the parent's main module.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write("if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in _RUN.format(argv=argv).splitlines()))
    out = subprocess.run([sys.executable, f.name], capture_output=True, text=True, cwd=ROOT)
    Path(f.name).unlink()
    line = [x for x in out.stdout.splitlines() if x.startswith("WALL")]
    if out.returncode != 0 or not line:
        sys.exit(f"report failed: {out.stderr[-2000:]}")
    _, wall, _, rss = line[-1].split()
    return float(wall), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", help="a PROF dir or rank-partitioned table (default: emulate one)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--whole", action="store_true", help="also run the report in one process")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            subprocess.run([str(Path(sys.executable).parent / "msprof-py"), "emulate", "bert-train-dp", "--ranks", str(args.ranks),
                            "--steps", str(args.steps), "-s", "slow-rank", "--export", "off", "--output", tmp],
                           check=True, capture_output=True)
            trace = str(next(Path(tmp).glob("PROF_*")))
        dask_json = Path(tmp) / "dask.json"
        wall, rss = run(["report", trace, "-o", str(dask_json), "--engine", "dask", "--workers", str(args.workers)])
        rep = json.loads(dask_json.read_text())
        print(f"trace: {trace} ({rep['summary']['events']:,} rows, {rep['summary']['ranks']} ranks, "
              f"{rep['summary'].get('steps')} steps)")
        print(f"report --engine dask --workers {args.workers}: {wall:.1f} s wall, driver peak RSS {rss / 2**30:.2f} GiB")
        print(f"  fixes: {rep['skipped'].get('what_if') or 'replayed on the whole trace'}")
        if args.whole:
            whole_json = Path(tmp) / "whole.json"
            w_wall, w_rss = run(["report", trace, "-o", str(whole_json)])
            same = json.loads(whole_json.read_text()) == rep
            print(f"report (one process): {w_wall:.1f} s wall, peak RSS {w_rss / 2**30:.2f} GiB; "
                  f"dask / one process: {wall / w_wall:.2f}x time, {rss / w_rss:.2f}x driver memory; "
                  f"reports {'SAME' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
