"""Fuzz the trace readers by the thousand: mutated real traces through the JSON importers, the
Parquet reader and (a share of them) the CLI.

    python -m fuzz.fuzz_importers --cases 10000 [--seed 0] [--cli-every 20] [--without SEED]

Cases run in rounds of Hypothesis examples, each round with its own seed; a failing round is
shrunk to a minimal case, reported and saved in the run's temporary directory, and the next
round goes on.
Prints the cases run and the failures; exits 1 when there was any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zlib
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.configuration import set_hypothesis_home_dir
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fuzz.checks import check_cli, check_json, check_parquet
from fuzz.json_cases import JsonCase, Seeds, json_cases, json_seeds, write_case
from fuzz.parquet_cases import ParquetCase, parquet_cases, parquet_seeds

REAL_TRACES = Path(__file__).resolve().parents[2] / "shared" / "real_traces"
ROUND = 250
#: Of every 10 cases: 7 JSON, 3 Parquet.
PARQUET_SHARE = 0.3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases to run in all")
    ap.add_argument("--seed", type=int, default=0, help="seed of the first round (rounds count up)")
    ap.add_argument("--cli-every", type=int, default=20, help="run the CLI on one case in this many")
    ap.add_argument("--real-traces", type=Path, default=REAL_TRACES)
    ap.add_argument("--without", action="append", default=[], metavar="SEED",
                    help="leave out the JSON seed of this name (repeatable), e.g. msprof-py-export")
    args = ap.parse_args(argv)
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "msprof-py-hypothesis")
    console = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="msprof-fuzz-"))
    seeds = Seeds((k, v) for k, v in json_seeds(args.real_traces).items() if k not in args.without)
    tables = parquet_seeds(seeds, ("kineto-event-sync", "torch-npu", "kineto-tiny"))
    counts = {"json": 0, "parquet": 0, "cli": 0, "ok": 0, "error": 0}
    failures: list[str] = []
    parquet_cases_total = int(args.cases * PARQUET_SHARE)
    plan = [("json", args.cases - parquet_cases_total), ("parquet", parquet_cases_total)]
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("failures {task.fields[failures]}"), console=console) as bar:
        task = bar.add_task("fuzz", total=args.cases, failures=0)

        def tick(kind: str, result: str) -> None:
            counts[kind] += 1
            counts[result] += 1
            bar.update(task, advance=1, failures=len(failures))

        round_no = args.seed
        for kind, total in plan:
            done = 0
            while done < total:
                n = min(ROUND, total - done)
                before = counts[kind]
                try:
                    _round(kind, n, round_no, seeds, tables, work, args.cli_every, tick, counts)
                except Exception as exc:  # noqa: BLE001 - a failing round is reported, then fuzzing goes on
                    failures.append(_report(kind, round_no, exc, console, work))
                    bar.update(task, failures=len(failures))
                ran = counts[kind] - before
                done += max(ran, 1)
                if ran < n:  # a failing round stopped early: count what it skipped as not run
                    bar.update(task, total=bar.tasks[0].total - (n - ran))
                round_no += 1
    took = time.monotonic() - started
    run = counts["json"] + counts["parquet"]
    print(f"cases run: {run} (JSON {counts['json']}, Parquet {counts['parquet']}; CLI on {counts['cli']}) "
          f"in {took:.0f} s; imported {counts['ok']}, rejected with the one-line error {counts['error']}; "
          f"failures: {len(failures)}")
    for f in failures:
        print(f"  {f}")
    return 1 if failures else 0


def _round(kind: str, n: int, round_no: int, seeds: dict, tables: dict, work: Path, cli_every: int,
           tick, counts: dict) -> None:
    fuzz = settings(max_examples=n, database=None, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck),
                    phases=(Phase.generate, Phase.shrink))
    if kind == "json":
        @seed(round_no)
        @fuzz
        @given(case=json_cases(seeds))
        def run(case: JsonCase) -> None:
            file = write_case(case, work) if case.as_file != "bytes" else None
            result = check_json(case.data, file=file)
            if _cli_share(case.data, cli_every):
                check_cli(write_case(case, work), work)
                counts["cli"] += 1
            tick("json", result)
    else:
        @seed(round_no)
        @fuzz
        @given(case=parquet_cases(tables, work / "seed"))
        def run(case: ParquetCase) -> None:
            path = case.write(work / "case", tables[case.seed])
            result = check_parquet(path, case.columns)
            if _cli_share(path.read_bytes() if path.is_file() else repr(case).encode(), cli_every):
                check_cli(path, work)
                counts["cli"] += 1
            tick("parquet", result)
    run()


def _cli_share(data: bytes, every: int) -> bool:
    """One case in `every` also goes through the CLI, chosen by its content: a replay of the
    case (as Hypothesis does to shrink it) makes the same choice."""
    return zlib.crc32(data) % every == 0


def _report(kind: str, round_no: int, exc: Exception, console: Console, work: Path) -> str:
    """Print the shrunk failure and save it; returns its one-line summary."""
    parts = getattr(exc, "exceptions", None) or [exc]  # Hypothesis groups distinct failures
    text = "\n\n".join("\n".join(str(a) for a in (e, *getattr(e, "__notes__", ()))) for e in parts)
    out = work / f"failure-{kind}-round{round_no}.txt"
    out.write_text(f"{type(exc).__name__}: {text}\n")
    first = " | ".join(" ".join(str(e).split())[:200] for e in parts)
    console.print(f"[red]failure[/red] ({kind}, round {round_no}): {first} -> {out}")
    return f"{kind} round {round_no}: {first}"


if __name__ == "__main__":
    sys.exit(main())
