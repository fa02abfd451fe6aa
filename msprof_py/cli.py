"""The `msprof-py` command line: commands only; the work happens in plain modules.

Every domain error (MsprofError) and I/O error (OSError) becomes one line on stderr,
`msprof-py: error: <message>`, and exit code 2, in `_App.invoke`: the one place where errors
turn into exit codes, so commands added later (analyze, report, diff, emulate, and the
msprof-style top-level `--application=...` callback) get the same treatment for free. Usage
errors (an unknown option, a value none of an option's choices) are one line with exit code 2
too, in `_App.main`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from msprof_py import __version__
from msprof_py.choices import Engine, FailOn, OnOff, OutputFormat, ReportFormat, Window
from msprof_py.errors import MsprofError

if TYPE_CHECKING:
    from msprof_py.trace import Trace

# Start-up: `--help` and a Parquet `info` must not pay for pandas, plotly, the analyzers or the
# JSON importers, so every module beyond typer is imported inside the command that uses it.

PROG = "msprof-py"
EXIT_USAGE = 2  # bad input or usage; the same code click uses for usage errors


class _App(TyperGroup):
    """The root command group; turns domain and I/O errors into one-line messages."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        from msprof_py import cli_params

        cli_params.install(self, ctx)
        rest = super().parse_args(ctx, args)
        # msprof's positional form, `msprof-py [options] app.py args...`: a first word that is no
        # command is the program to profile, and everything after it is the program's.
        if ctx._protected_args and ctx._protected_args[0] not in self.commands:
            ctx.args = [*ctx._protected_args, *ctx.args]
            ctx._protected_args = []
        return rest

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MsprofError as exc:
            _fail(exc.one_line())
        except OSError as exc:
            _fail(_os_message(exc))

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        # Usage errors (unknown option, a value not among an enum's choices) as one line too;
        # click and typer would print a usage block and a boxed message.
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _CLICK_EXCEPTION as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `msprof-py` alone: the help, as click shows it
                typer.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
                sys.exit(exc.exit_code)
            from msprof_py.cli_params import UnknownChoice

            ctx = getattr(exc, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None and not isinstance(exc, UnknownChoice) else ""
            typer.echo(f"{PROG}: error: {' '.join(exc.format_message().split()).rstrip('.')}{hint}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo(f"{PROG}: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


#: click's base of usage errors, wherever this Typer takes click from (vendored or installed).
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _fail(message: str) -> NoReturn:
    typer.echo(f"{PROG}: error: {message}", err=True)
    # typer.Exit, not click's: this Typer vendors its own click, whose main() knows only its own.
    raise typer.Exit(EXIT_USAGE)


def _os_message(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    where = exc.filename if exc.filename is not None else None
    return " ".join((f"{where}: {text}" if where else text).split())


app = typer.Typer(
    cls=_App,
    name=PROG,
    no_args_is_help=True,
    add_completion=False,
    # Domain errors never reach here; anything that does is a bug and should show plainly.
    pretty_exceptions_enable=False,
    # click's plain help: typer's rich help costs more start-up time than all of `--help` may take
    rich_markup_mode=None,
)


def _switch(name: str, what: str) -> Any:
    return typer.Option(f"--{name}", show_default=False, help=f"Record {what} (on / off; default on).")


TaskTimeOpt = Annotated[Optional[OnOff], _switch("task-time", "device tasks, launch-to-task flows, queue depth")]
RuntimeApiOpt = Annotated[Optional[OnOff], _switch("runtime-api", "host runtime API calls (AscendCL)")]
HcclOpt = Annotated[Optional[OnOff], _switch("hccl", "HCCL collectives")]
MemoryOpt = Annotated[Optional[OnOff], _switch("memory", "allocations, frees and memory counters")]
SysHardwareMemOpt = Annotated[Optional[OnOff], _switch("sys-hardware-mem", "link bandwidth (PCIe, HBM, HCCS, RoCE)")]


def _switches(task_time: OnOff | None, runtime_api: OnOff | None, hccl: OnOff | None, memory: OnOff | None,
              sys_hardware_mem: OnOff | None):
    from runtime_emu.recorder import Switches

    given = {"task_time": task_time, "runtime_api": runtime_api, "hccl": hccl, "memory": memory,
             "sys_hardware_mem": sys_hardware_mem}
    return Switches(**{k: v is not OnOff.off for k, v in given.items()})


def version_line() -> str:
    """`msprof-py --version`: the package version, which emulator core runs, whether the C core
    runs its engine and kernels, which build makes its trace table and what scans JSON, since a pure-Python core (no C compiler at install, or a
    source edited since) makes every emulated run slower, the Arrow table build takes about three
    times as long as the native one, and an import without the native scanner twice as long."""
    import warnings

    with warnings.catch_warnings():  # a stale core's import warning: the line below says it
        warnings.simplefilter("ignore")
        import runtime_emu
        from runtime_emu import engine, tables
        from simcore import _loader

    from msprof_py.trace import native

    core = "compiled" if runtime_emu.COMPILED else f"pure Python; {_loader.pure_reason}"
    return (f"{PROG} {__version__} (emulator core: {core}; engine and kernels: {engine.state()}; "
            f"trace build: {tables.state()}; JSON import: {native.state()})")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback(invoke_without_command=True, context_settings={"allow_extra_args": True})
def _root(
    ctx: typer.Context,
    version: Annotated[Optional[bool], typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version, whether the emulator core is compiled or pure Python and whether "
             "JSON imports use the native scanner, then exit.")] = None,
    application: Annotated[Optional[str], typer.Option(
        "--application", show_default=False,
        help='Program to profile, e.g. "python app.py --lr 0.1" (or give it after the options: '
             'msprof-py OPTIONS app.py ARGS). A bare python runs under msprof-py\'s interpreter.')] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", show_default=False,
        help="Directory for PROF_* runs (capture, query), or a PROF dir / its parent (export).")] = None,
    export_mode: Annotated[Optional[OnOff], typer.Option(
        "--export", show_default=False,
        help="on: regenerate mindstudio_profiler_output/ of the PROF dir(s) in --output from the raw data.")] = None,
    query_mode: Annotated[Optional[OnOff], typer.Option(
        "--query", show_default=False, help="on: list the runs in --output.")] = None,
    task_time: TaskTimeOpt = None,
    runtime_api: RuntimeApiOpt = None,
    hccl: HcclOpt = None,
    memory: MemoryOpt = None,
    sys_hardware_mem: SysHardwareMemOpt = None,
) -> None:
    """Profile programs msprof-style and analyze AI-accelerator traces (Kineto, torch_npu/msprof,
    msprof-py tables)."""
    program = ([application] if application is not None else []) + list(ctx.args)
    modes = [m for m, on in (("--application", bool(program)), ("--export=on", export_mode is OnOff.on),
                             ("--query=on", query_mode is OnOff.on)) if on]
    if ctx.invoked_subcommand is not None:
        if modes or output is not None:
            raise MsprofError(f"{' '.join(modes) or '--output'} cannot be combined with the "
                              f"'{ctx.invoked_subcommand}' command")
        return
    if len(modes) > 1:
        raise MsprofError(f"choose one of {', '.join(modes)}")
    if not modes:
        raise MsprofError("nothing to do", hint="give --application=..., --export=on or --query=on with --output, "
                                                "or a command (msprof-py --help)")
    if output is None:
        raise MsprofError(f"{modes[0]} needs --output", hint="e.g. --output=profiling")
    if modes[0] == "--query=on":
        _print_runs(output)
        return
    from msprof_py import capture, prof_dir

    if modes[0] == "--export=on":
        for prof in capture.export(output):
            typer.echo(f"exported {prof / prof_dir.EXPORT_DIR}")
        return
    if application is not None and ctx.args:
        raise MsprofError("give the program either as --application or after the options, not both")
    argv = capture.parse_application(application if application is not None else ctx.args)
    result = capture.capture(argv, output, _switches(task_time, runtime_api, hccl, memory, sys_hardware_mem))
    for prof in result.runs:
        _report_run(prof)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _report_run(prof: Path) -> None:
    from msprof_py import prof_dir

    st = prof_dir.read_status(prof)
    line = f"{PROG}: profile data in {prof} ({st.get('status', 'unknown')}"
    reasons = st.get("reasons") or []
    typer.echo(line + (": " + "; ".join(reasons) if reasons else "") + ")", err=True)
    timeline = next((prof / prof_dir.EXPORT_DIR).glob("msprof_*.json"), None)
    if timeline is not None:
        typer.echo(f"{PROG}: timeline {timeline} (open it in https://ui.perfetto.dev or chrome://tracing)", err=True)
    elif st.get("status") == prof_dir.COMPLETE:
        typer.echo(f"{PROG}: no timeline or summaries written (--export off); {PROG} --export=on --output={prof} "
                   "writes them", err=True)


def _print_runs(output: Path) -> None:
    from rich.table import Table

    from msprof_py import prof_dir
    from msprof_py.summary import format_bytes
    from msprof_py.trace.units import NS_PER_MS, ms

    rows = prof_dir.query(output)
    t = Table(title=f"profiled runs in {output}")
    for col in ("job", "status", "devices", "ranks", "steps", "duration", "size"):
        t.add_column(col, justify="left" if col in ("job", "status") else "right", no_wrap=col == "job")
    for r in rows:
        t.add_row(r["job"], r["status"], *("-" if r[k] is None else str(r[k]) for k in ("devices", "ranks", "steps")),
                  "-" if r["duration_ms"] is None else ms(r["duration_ms"] * NS_PER_MS),
                  format_bytes(r["size_bytes"]))
    _show(t)
    if not rows:
        typer.echo(f"no PROF_* runs in {output}")


def _fit_titles(renderable: Any) -> None:
    """Make each table at least as wide as its title: rich wraps a longer title (a path, say)
    to the table's width, which splits it where a pipe reader does not expect a break."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.table import Table

    if isinstance(renderable, Group):
        for part in renderable.renderables:
            _fit_titles(part)
    elif isinstance(renderable, Table) and renderable.title is not None:
        title = renderable.title if isinstance(renderable.title, str) else renderable.title.plain
        renderable.min_width = max(renderable.min_width or 0, cell_len(title))


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _show(renderable: Any) -> None:
    """Print rich output on stdout. On a terminal it wraps to the window; piped or redirected it
    is as wide as its widest line (rich would cut it to 80 columns) and plain, without colour."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        _fit_titles(renderable)
        # Tables take their natural width (they do not expand), so a console far wider than any
        # line renders everything unwrapped; the padding it leaves is stripped below.
        console = Console(width=1 << 16, no_color=True, highlight=False, emoji=False)
        with console.capture() as captured:
            console.print(renderable)
        # rich pads every line to the table's width: trailing blanks only get in the way of grep and diff
        typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))
        return
    console.print(renderable)


TraceArg = Annotated[Path, typer.Argument(
    metavar="TRACE", show_default=False,
    help="Trace to read: Chrome/Kineto/torch_npu JSON (.json, .json.gz), an msprof-py Parquet "
         "table (file or rank-partitioned directory) or a PROF_* directory. The format is detected "
         "from the content.")]
LenientOpt = Annotated[bool, typer.Option(
    "--lenient", help="Skip malformed events of a JSON input (and count them) instead of failing.")]
ProgressOpt = Annotated[Optional[bool], typer.Option(
    "--progress/--no-progress", show_default=False,
    help="Show a progress bar on stderr (default: only for large inputs on a terminal).")]


@app.command("import", short_help="Import traces into the trace event table (Parquet).")
def import_(
    trace_paths: Annotated[list[Path], typer.Argument(
        metavar="TRACE...", show_default=False,
        help="Trace(s) to read: Chrome/Kineto/torch_npu JSON (.json, .json.gz), a torch_npu *_ascend_pt "
             "folder, an msprof-py Parquet table or a PROF_* directory; several (one per rank, e.g. "
             "rank0.json rank1.json), or a folder of them, make one job's table. Each trace's rank is read "
             "from the trace itself.")],
    output: Annotated[Path, typer.Option(
        "-o", "--output", show_default=False,
        help="Where to write the table: OUT.parquet (one file) or a directory (rank=R/part-0.parquet).")],
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Import traces into the msprof-py trace event table (Parquet): one trace, or one job from
    per-rank traces (two that hold the same rank are refused)."""
    from msprof_py import loading
    from msprof_py.trace import write_trace

    loading.check_table_output(output)
    inputs = [p for given in trace_paths for p in loading.trace_inputs(given)]
    if len(inputs) == 1:
        trace = _load(trace_paths[0], lenient, progress)
        write_trace(trace, output)
        typer.echo(f"wrote {len(trace)} events to {output}")
        if lenient:
            typer.echo(f"skipped {loading.skipped_events(trace)} malformed events")
        return
    # One input in memory at a time: each is imported and set aside, then the table assembled.
    with loading.progress_reporter(sum(map(loading.input_bytes, inputs)), force=progress) as report:
        job = loading.import_job(inputs, output, lenient=lenient, progress=report)
    typer.echo(f"wrote {job.events} events of {len(job.ranks)} ranks ({_ranks_text(job.ranks)}) from "
               f"{job.inputs} traces to {output}")
    if lenient:
        typer.echo(f"skipped {job.skipped} malformed events")


def _ranks_text(ranks: list[int]) -> str:
    """0..7 for consecutive ranks, else the list."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


@app.command("export", short_help='Export a trace to Chrome JSON (Perfetto, chrome://tracing).')
def export(
    trace_path: TraceArg,
    output: Annotated[Path, typer.Option(
        "-o", "--output", show_default=False,
        help="Chrome JSON to write (OUT.json, or OUT.json.gz for gzip); opens in Perfetto.")],
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Export a trace to Chrome Trace Event JSON (Perfetto, chrome://tracing)."""
    from msprof_py import loading
    from msprof_py.trace import export_chrome

    loading.check_json_output(output)
    trace = _load(trace_path, lenient, progress)
    with loading.progress_reporter(loading.input_bytes(trace_path), force=progress) as report:
        export_chrome(trace, output, progress=report)
    typer.echo(f"wrote {len(trace)} events to {output}")


@app.command("info", short_help='Summarize a trace: span, ranks, devices, streams, top names.')
def info(
    trace_path: TraceArg,
    top: Annotated[int, typer.Option(
        "--top", min=0, help="How many names to list in each top-time table.")] = 10,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the summary as machine-readable JSON instead of tables.")] = False,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Summarize a trace: span, ranks, devices, streams, events per kind, peak memory, top time
    consumers, and the events the importer did not understand (kept only as generic markers)."""
    from msprof_py.summary import NAME_CHARS, SUMMARY_COLUMNS, render, summarize

    # Only the typed columns the summary reads: a JSON import skips the verbatim args text.
    trace = _load(trace_path, lenient, progress, analysis_only=True, columns=SUMMARY_COLUMNS)
    summary = summarize(trace, top=top)
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        _show(render(summary, title=str(trace_path), name_chars=NAME_CHARS if _stdout_is_terminal() else None))


@app.command("critical-path", short_help="What set the time: the critical path per rank, by cause.")
def critical_path_cmd(
    trace_path: TraceArg,
    rank: Annotated[Optional[list[int]], typer.Option(
        "--rank", "-r", show_default=False, help="Only this rank (repeatable); default: every rank.")] = None,
    step: Annotated[Optional[int], typer.Option(
        "--step", show_default=False, help="Only this step (ProfilerStep#N / the step number); default: the "
                                           "whole trace.")] = None,
    per_step: Annotated[bool, typer.Option(
        "--per-step", help="One row per step: the rank whose path over it is longest, the path's length, its "
                           "costliest cause and op.")] = False,
    top: Annotated[int, typer.Option("--top", min=0, help="How many ops on the path to list per rank.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")] = False,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Critical path per rank: the longest chain of recorded activity (host calls, launches, device tasks,
    event and sync waits), its time per cause and the ops on it; the region's time off the path is untraced."""
    from msprof_py.critical import per_step as steps_of
    from msprof_py.critical import render, render_steps, summarize

    if per_step and step is not None:
        raise MsprofError("--per-step contradicts --step; give one of them")
    trace = _load(trace_path, lenient, progress, analysis_only=True)
    summary = steps_of(trace, rank) if per_step else summarize(trace, rank, step, top)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _show((render_steps if per_step else render)(summary, str(trace_path)))


@app.command("replay", short_help="What-if: re-time a trace with remedies applied.")
def replay_cmd(
    trace_path: TraceArg,
    remedy: Annotated[Optional[list[str]], typer.Option(
        "--remedy", show_default=False,
        help="A remedy to apply (repeatable): NAME[=ARG][@RANK,...], NAME one of launch[=NS] (launch calls cost "
             "at most NS, default 2000), compile[=NS], data (prefetch), sync (defer synchronizes), pipeline, "
             "pinned, copy (double buffer), queue, straggler, link, spread, priority[=STREAM], stagger, overlap "
             "(reduce gradients under the backward); the README's replay table says what each edits. None: the "
             "trace re-timed as recorded.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", show_default=False,
        help="Write the re-timed trace here: OUT.parquet or a directory, as `import` does.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")] = False,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Replay a trace through its dependency graph (the critical path's): host calls keep their cost and
    order, device tasks their duration, and a remedy edits the graph; print the span before and after."""
    from analyzers import Frames
    from analyzers.causality.replay import Remedy, replay
    from msprof_py import loading
    from msprof_py.trace import write_trace

    try:
        remedies = [Remedy.parse(r) for r in remedy or []]
    except ValueError as exc:
        raise MsprofError(str(exc)) from None
    if output is not None:
        loading.check_table_output(output)
    trace = _load(trace_path, lenient, progress)
    result = replay(Frames(trace), remedies)
    if output is not None:
        write_trace(result.trace, output)
    names = [str(r) for r in result.remedies]
    summary = {"trace": str(trace_path), "remedies": names, "span_ns": result.span_ns,
               "new_span_ns": result.new_span_ns, "saving_ns": result.saving_ns,
               "saving_share": round(result.saving_ns / result.span_ns, 6) if result.span_ns else 0.0,
               "nodes_moved": result.moved, "output": str(output) if output is not None else None}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    share = f" ({100 * summary['saving_share']:.1f}%)" if result.span_ns else ""
    typer.echo(f"remedies: {', '.join(names) or 'none (the trace as recorded)'}")
    typer.echo(f"span: {result.span_ns / 1e6:.3f} ms -> {result.new_span_ns / 1e6:.3f} ms, "
               f"saves {result.saving_ns / 1e6:.3f} ms{share}; {result.moved} node(s) moved")
    if output is not None:
        typer.echo(f"wrote {len(result.trace)} events to {output}")


@app.command("whatif", short_help="What-if: the step table before and after remedies.")
def whatif_cmd(
    trace_path: TraceArg,
    remedy: Annotated[list[str], typer.Option(
        "--remedy", show_default=False,
        help="A remedy to apply (repeatable, at least one): NAME[=NS][@RANK,...]; `msprof-py replay --help` and "
             "the README list them.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of text.")] = False,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Replay a trace with remedies applied and print each step's time before and after (the job's
    step: earliest rank's start to latest rank's end) and the run's span."""
    from analyzers import Frames
    from analyzers.causality.replay import Remedy, replay
    from analyzers.whatif import step_table

    try:
        remedies = [Remedy.parse(r) for r in remedy]
    except ValueError as exc:
        raise MsprofError(str(exc)) from None
    trace = _load(trace_path, lenient, progress)
    frames = Frames(trace)
    try:
        result = replay(frames, remedies)
    except ValueError as exc:
        raise MsprofError(f"{trace_path}: cannot replay this trace: {exc}") from None
    rows = step_table(frames, result)
    names = [str(r) for r in result.remedies]
    if as_json:
        typer.echo(json.dumps({"trace": str(trace_path), "remedies": names, "steps": rows}, indent=2))
        return
    from rich.table import Table

    from msprof_py.trace.units import ms, pct

    t = Table(title=f"{trace_path}: what-if {', '.join(names)}")
    for col in ("step", "before", "after", "saves", "share"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row("run span" if r["step"] is None else str(r["step"]), ms(r["before_ns"]), ms(r["after_ns"]),
                  ms(r["saving_ns"]), pct(r["saving_share"]))
    _show(t)


WindowOpt = Annotated[Window, typer.Option(
    "--window", help="Which events to analyze: 'all', or 'complete_steps' (drop the last, usually cut-short "
                     "profiler step, as Holistic Trace Analysis does).")]
EngineOpt = Annotated[Engine, typer.Option(
    "--engine", help="local: analyze the rank partitions in this process (consecutive small ranks together, up "
                     "to 1M rows); dask: one task per rank partition on a Dask cluster (pip install "
                     "'msprof-py[dask]').")]
SchedulerOpt = Annotated[Optional[str], typer.Option(
    "--scheduler", metavar="ADDRESS", show_default=False,
    help="With --engine dask: the scheduler to use (tcp://HOST:PORT); default: a local cluster started for this "
         "run.")]
WorkersOpt = Annotated[Optional[int], typer.Option(
    "--workers", min=1, show_default=False,
    help="With --engine dask and no --scheduler: worker processes of the local cluster (1 thread each; default: "
         "one per core, at most one per rank).")]
WhatIfOpt = Annotated[bool, typer.Option(
    "--what-if/--no-what-if",
    help="Replay each time finding's fix on the trace and rank findings by what it saves (fix: REMEDY -> saves "
         "X ms); --no-what-if: rank by the time measured lost.")]
AnalyzerOpt = Annotated[Optional[list[str]], typer.Option(
    "--analyzer", "-a", show_default=False, help="Run only this analyzer (repeatable); default: all.")]


@app.command("cluster", short_help="Cluster analyses: job steps, slow ranks, slow links.")
def cluster_cmd(
    trace_path: TraceArg,
    fmt: Annotated[Optional[OutputFormat], typer.Option(
        "--format", "-f", show_default=False,
        help="table (default; time in ms, 3 significant digits) or json (the same as objects, full precision).")] = None,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
    engine: EngineOpt = Engine.local,
    scheduler: SchedulerOpt = None,
    workers: WorkersOpt = None,
) -> None:
    """msprof-analyze's cluster analyses of a multi-rank job: the step table per rank
    (cluster_step_trace_time), the slow ranks (the last to arrive at a collective, an outlier among
    its members' arrivals by Dixon's Q test, or 3 sigma beyond 100 members), the slow links
    (transit time more than 3 sigma above their transport's mean) and the communication time per
    op. A rank-partitioned trace is read partition by partition (--engine dask: one task per rank)."""
    from msprof_py import cluster, loading, report

    fmt = fmt or OutputFormat.table
    if fmt is OutputFormat.csv:
        raise MsprofError("cluster prints a table or json; --format csv is not supported")
    parts = report.rank_partitions(trace_path)
    if parts is None:
        parts = report.split_by_rank(_load(trace_path, lenient, progress, analysis_only=False))
    result = cluster.analyze(parts, engine=engine.value, scheduler=scheduler, workers=workers, progress=progress,
                             input_bytes=loading.input_bytes(trace_path))
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        _show(_render_cluster(result, str(trace_path)))


def _render_cluster(result: dict[str, Any], title: str) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from msprof_py import communication
    from msprof_py.trace.units import sig

    parts: list[Any] = []
    if result["steps"]:
        t = Table(title=f"step time per rank of {title} (us)", title_justify="left")
        cols = [c for c in result["steps"][0] if c not in ("Type", "Bubble")]
        for c in cols:
            t.add_column(c, justify="right")
        for row in result["steps"]:
            t.add_row(*(Text(str(row[c]) if c in ("Step", "Index") else sig(float(row[c]))) for c in cols))
        parts.append(t)
    from analyzers.cluster import SLOW_RANK_P

    t = Table(title="slow ranks (last to arrive, an outlier among the members' arrivals)", title_justify="left")
    for c, just in (("rank", "right"), ("outlier", "right"), ("of collectives", "right"), ("by chance", "right"),
                    ("lateness ms", "right"), ("ops", "left")):
        t.add_column(c, justify=just)  # type: ignore[arg-type]
    for r in sorted(result["rank_stats"], key=lambda r: (-r["lateness_ns"], r["rank"])):
        t.add_row(Text(str(r["rank"])), Text(str(r["outlier_count"])), Text(str(r["collectives"])),
                  Text(f"{r['chance']:.2g}"), Text(sig(r["lateness_ns"] / 1e6)),
                  Text(", ".join(o[:60] for o in r["ops"][:3]) or "-"))
    parts.append(t)
    slow = result["slow_ranks"]
    parts.append(Text(f"slow ranks (an outlier more often than chance, p < {SLOW_RANK_P:g}): " + (", ".join(f"{r['rank']} ({r['outlier_count']}x, {sig(r['lateness_ns'] / 1e6)} ms, "
                                                  f"{(r['top_op'] or '-')[:60]})" for r in slow) or "none")))
    t = Table(title="links per transport (transit time)", title_justify="left")
    for c in ("transport", "links", "mean ms", "std ms", "judged", "slow", "from"):
        t.add_column(c, justify="left" if c in ("transport", "from") else "right")
    for r in result["transports"]:
        t.add_row(Text(r["transport"]), Text(str(r["links"])), Text(sig(r["mean_ms"])), Text(sig(r["std_ms"])),
                  Text("yes" if r["judged"] else "no"), Text(str(r["slow"])), Text(r["source"]))
    parts.append(t)
    if result["slow_links"]:
        t = Table(title="slow links (transit time > mean + 3 sigma of their transport)", title_justify="left")
        for c in ("op", "src", "dst", "transport", "MB", "transit ms", "GB/s", "z"):
            t.add_column(c, justify="left" if c in ("op", "transport") else "right")
        for r in result["slow_links"]:
            t.add_row(Text(r["op"][:60]), Text(str(r["src"])), Text(str(r["dst"])), Text(r["transport"]),
                      Text(sig(r["size_mb"])), Text(sig(r["transit_ms"])), Text(sig(r["bandwidth_gbps"])),
                      Text(sig(r["z"])))
        parts.append(t)
    else:
        parts.append(Text("slow links: none"))
    if result.get("communication_time"):
        t = Table(title="communication time per op, all ranks and steps (ms; elapse = transit + wait + idle, "
                        "synchronization is the wait before the first transfer)", title_justify="left")
        for c in ("op", "count", "elapse", "transit", "wait", "synchronization", "idle"):
            t.add_column(c, justify="left" if c == "op" else "right")
        for r in result["communication_time"]:
            t.add_row(Text(r["op"][:60]), Text(str(r["count"])),
                      *(Text(sig(r[k])) for k in communication.SPLIT))
        parts.append(t)
    if result.get("pipeline"):
        parts.append(_pipeline_table(result["pipeline"]))
    return Group(*parts)


#: The micro-batches the pipeline table shows as columns (the rest are summed into one).
PIPELINE_COLUMNS = 16


def _pipeline_table(cells: list[dict[str, Any]]) -> Any:
    """Stage x micro-batch: each stage's wait for its peer's hand-over (mean over steps, ms)."""
    from rich.table import Table
    from rich.text import Text

    from msprof_py.trace.units import sig

    m = max(c["micro_batch"] for c in cells) + 1
    shown = min(m, PIPELINE_COLUMNS)
    t = Table(title="pipeline: each stage's wait for its neighbour's hand-over, per micro-batch (mean over steps, ms; "
                    "the fill and drain are the bubble)", title_justify="left")
    t.add_column("stage")
    t.add_column("rank", justify="right")
    t.add_column("from")
    for j in range(shown):
        t.add_column(str(j), justify="right")
    if m > shown:
        t.add_column(f"{shown}-{m - 1}", justify="right")
    t.add_column("total", justify="right")
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        rows.setdefault((c["stage"], c["rank"], c["direction"], c["peer"]), []).append(c)
    for (stage, rank, direction, peer), cs in rows.items():
        waits = {c["micro_batch"]: c["waited_ns"] / 1e6 for c in cs}
        cols = [Text(sig(waits[j]) if j in waits else "-") for j in range(shown)]
        if m > shown:
            cols.append(Text(sig(sum(v for j, v in waits.items() if j >= shown))))
        t.add_row(Text(str(stage)), Text(str(rank)), Text(f"{direction} (r{peer})"), *cols,
                  Text(sig(sum(waits.values()))))
    return t


@app.command("analyze", short_help='Find bottlenecks, ranked by the time or memory they cost.')
def analyze(
    trace_path: TraceArg,
    analyzer: AnalyzerOpt = None,
    window: WindowOpt = Window.all,
    fmt: Annotated[Optional[OutputFormat], typer.Option(
        "--format", "-f", show_default=False,
        help="table (default; for reading: time in ms, memory in MiB, 3 significant digits), json (findings and "
             "skipped analyzers) or csv (one row per finding); json and csv keep full precision.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
    engine: EngineOpt = Engine.local,
    scheduler: SchedulerOpt = None,
    workers: WorkersOpt = None,
    what_if: WhatIfOpt = True,
) -> None:
    """Find bottlenecks: print findings ranked by the time or memory they cost, with remedies."""
    from msprof_py import loading, report
    from msprof_py.compare import render_findings

    if as_json and fmt not in (None, OutputFormat.json):
        raise MsprofError(f"--json contradicts --format {fmt.value}; give one of them")
    fmt = OutputFormat.json if as_json else fmt or OutputFormat.table
    _check_analyzers(analyzer)
    # A rank-partitioned table or PROF directory is read partition by partition by the engine; any
    # other input is loaded whole and split by rank.
    parts = report.rank_partitions(trace_path)
    whole = None
    if parts is None:
        whole = _load(trace_path, lenient, progress, analysis_only=True)
        parts = report.split_by_rank(whole)
    result = report.analyze(parts, analyzer, window=window.value, engine=engine.value, scheduler=scheduler,
                            workers=workers, progress=progress, input_bytes=loading.input_bytes(trace_path))
    if what_if and any(f.cost_unit == "ns" for f in result.findings):
        from analyzers import Frames

        whole = whole if whole is not None else _load(trace_path, lenient, progress, analysis_only=True)
        report.predict_fixes(result, Frames(whole))
    rep = report.findings_report(result)
    if fmt is OutputFormat.json:
        typer.echo(json.dumps({"findings": rep["findings"], "skipped": rep["skipped"]}, indent=2, default=str))
    elif fmt is OutputFormat.csv:
        report.write_findings_csv(rep["findings"], sys.stdout)
        for name, why in rep["skipped"].items():  # not findings: beside the CSV, as the table shows them
            typer.echo(f"{PROG}: skipped analyzer {name}: {why}", err=True)
    else:
        _show(render_findings(rep, title=str(trace_path)))


@app.command("report", short_help='Write a bottleneck report (Markdown, HTML or JSON).')
def report_cmd(
    trace_path: TraceArg,
    output: Annotated[Path, typer.Option(
        "-o", "--output", show_default=False,
        help="Report file to write; its extension picks the format (.md / .markdown, .html / .htm, .json).")],
    fmt: Annotated[Optional[ReportFormat], typer.Option(
        "--format", "-f", show_default=False,
        help="md, html (self-contained, works offline) or json; only needed when the file name's extension "
             "is none of these, and must agree with it otherwise.")] = None,
    fail_on: Annotated[Optional[FailOn], typer.Option(
        "--fail-on", show_default=False,
        help="Exit 1 when a finding is at least this severe (warning or critical): for CI gating.")] = None,
    analyzer: AnalyzerOpt = None,
    window: WindowOpt = Window.all,
    lenient: LenientOpt = False,
    progress: ProgressOpt = None,
    engine: EngineOpt = Engine.local,
    scheduler: SchedulerOpt = None,
    workers: WorkersOpt = None,
    what_if: WhatIfOpt = True,
) -> None:
    """Write a bottleneck report: summary metrics, ranked findings with lookup entries, plots."""
    from msprof_py import loading, report

    fmt_name = report.format_for(output, fmt)
    loading.check_parent(output)
    _check_analyzers(analyzer)
    if engine is not Engine.local:
        # The analyzers on the cluster, partition by partition, and the report's figures with them:
        # the driver holds small pieces (msprof_py.report_parts), not the trace.
        from msprof_py import report_parts

        parts = report.rank_partitions(trace_path)
        if parts is None:  # one file: loaded here whole, then split by rank
            parts = report.split_by_rank(_load(trace_path, lenient, progress, analysis_only=True))
        rep = report_parts.build(parts, analyzer, window=window.value, engine=engine.value, scheduler=scheduler,
                                 workers=workers, progress=progress, input_bytes=loading.input_bytes(trace_path),
                                 what_if=what_if)
    elif scheduler or workers:
        raise MsprofError("--scheduler and --workers go with --engine dask")
    else:
        rep = report.build(_load(trace_path, lenient, progress, analysis_only=True), analyzer, window=window.value,
                           what_if=what_if)
    report.write(rep, output, fmt_name)
    worst = report.worst(rep)
    typer.echo(f"wrote {fmt_name} report with {len(rep['findings'])} findings to {output}")
    if fail_on is not None and worst is not None and worst >= _severity(fail_on):
        typer.echo(f"{PROG}: findings at or above {fail_on.value} (worst: {worst})", err=True)
        raise typer.Exit(1)


@app.command("diff", short_help='Compare two traces: throughput, step time, memory, findings.')
def diff_cmd(
    base: Annotated[Path, typer.Argument(metavar="BASE", help="The trace before the change.")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="The trace after the change.")],
    window: WindowOpt = Window.all,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    lenient: LenientOpt = False,
) -> None:
    """Compare two traces: throughput, step time, memory, bubble ratio, and per-finding change."""
    from msprof_py import report
    from msprof_py.compare import compare, render_diff

    a = report.build(_load(base, lenient, None, analysis_only=True), window=window.value, timelines=0)
    b = report.build(_load(new, lenient, None, analysis_only=True), window=window.value, timelines=0)
    table = compare(a, b)
    if as_json:
        typer.echo(json.dumps(table, indent=2, allow_nan=False))
    else:
        _show(render_diff(table, str(base), str(new)))


class _EvalCommand(TyperCommand):
    """`eval --help`: the command's help, then the evaluation's defaults (read where they are defined,
    and only when help is asked for: the module costs start-up time)."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        super().format_help(ctx, formatter)
        from msprof_py import evaluate

        formatter.write(f"\ndefaults: {evaluate.DEFAULT_SEEDS} seeds (0..{evaluate.DEFAULT_SEEDS - 1}); a problem kind "
                        f"injected fewer than {evaluate.MIN_INJECTIONS} times gets further seeds\n")


@app.command("eval", cls=_EvalCommand, short_help="Score the analyzers against the emulator's ground truth.")
def eval_cmd(
    scenario: Annotated[Optional[list[str]], typer.Option(
        "--scenario", "-s", show_default=False, help="Scenario to score (repeatable); default: all.")] = None,
    seeds: Annotated[Optional[str], typer.Option(
        "--seeds", show_default=False,
        help="Seeds of every case: a count (5: seeds 0..4), a range (10..14) or a list (0,3,7); the default "
             "is below (--quick: seed 0). Kinds injected too rarely get further seeds.")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="Only the small CI subset (seed 0 unless --seeds, no further seeds).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON.")] = False,
    what_if: Annotated[bool, typer.Option(
        "--what-if", help="Instead: check each finding's predicted saving against the program fixed for real "
                          "(scenario switches, 3 seeds, and the apps of tests/apps with a fixed twin; --quick: a "
                          "few pairs).")] = False,
) -> None:
    """Score the analyzers strictly: run scenarios healthy (also with non-default parameters) and
    with each problem switch over several seeds; a finding detects an injected problem only where
    its location and time agree with the ground truth, one finding (or listed occurrence) per
    problem. Prints precision / recall per problem kind and the false alarms on healthy runs."""
    import sys

    from msprof_py import evaluate, loading
    from runtime_emu import scenarios

    seed_list = None if seeds is None else evaluate.parse_seeds(seeds)
    if what_if:
        from msprof_py import whatif_eval

        if scenario:
            raise MsprofError("--what-if runs its own pairs of programs; drop --scenario")
        todo = whatif_eval.pairs(tuple(seed_list) if seed_list is not None else whatif_eval.SEEDS, quick=quick)
        with loading.progress_reporter(0, force=sys.stderr.isatty()) as report_progress:
            rows = whatif_eval.evaluate(todo, progress=lambda done, total: report_progress("what-if", done, total))
        if as_json:
            typer.echo(json.dumps({"tolerance": whatif_eval.TOLERANCE, "pairs": [r.to_dict() for r in rows]},
                                  indent=2, allow_nan=False))
            return
        _show(whatif_eval.render(rows))
        return
    cases = evaluate.plan(scenarios.SCENARIOS, scenario, seeds=seed_list, quick=quick)
    with loading.progress_reporter(0, force=sys.stderr.isatty()) as report_progress:
        scores = evaluate.evaluate(cases, progress=lambda done, total: report_progress("evaluate", done, total),
                                   min_injections=None if quick else evaluate.MIN_INJECTIONS)
    if as_json:
        typer.echo(json.dumps(scores.to_dict(), indent=2, allow_nan=False))
        return
    _show(evaluate.render(scores))


ScenarioArg = Annotated[Optional[str], typer.Argument(
    metavar="SCENARIO", show_default=False,
    help="Built-in scenario (msprof-py emulate --list shows them with their parameters and switches).")]


class _EmulateCommand(TyperCommand):
    """`emulate SCENARIO --help`: the command's help, then that scenario's parameters and switches."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        ctx.meta["emulate_args"] = list(args)  # --help is eager: it runs before SCENARIO is parsed
        return super().parse_args(ctx, args)

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        super().format_help(ctx, formatter)
        from runtime_emu import scenarios

        names = [a for a in ctx.meta.get("emulate_args", []) if a in scenarios.SCENARIOS or a in scenarios.ALIASES]
        if names:
            formatter.write("\n" + _describe_scenario(scenarios.get(names[0]), long=True))
        else:
            formatter.write(f"\nscenarios: {', '.join(sorted(scenarios.SCENARIOS))} "
                            f"({PROG} emulate SCENARIO --help shows one's parameters and switches)\n")


def _describe_scenario(spec: Any, *, long: bool = False) -> str:
    """A scenario's parameters (type, default, meaning) and switches, as `emulate --list` prints them."""
    import textwrap

    from runtime_emu import scenarios

    aliases = ", ".join(a for a, n in scenarios.ALIASES.items() if n == spec.name)
    ranks = f"{spec.ranks} ranks" if spec.multi_rank else "1 rank"
    lines = [f"{spec.name}{f' (also {aliases})' if aliases else ''}: {ranks}, {spec.default_steps} steps by default"]
    if long:
        lines += textwrap.wrap(" ".join(spec.description.split()), 100, initial_indent="  ", subsequent_indent="  ",
                               break_on_hyphens=False)
    params = scenarios.all_params(spec)
    lines.append("  parameters (--param NAME=VALUE; booleans: true/false, yes/no or 1/0):")
    width = max(map(len, params))
    types = {n: p.type_name() + ("|auto" if p.optional else "") for n, p in params.items()}
    twidth = max(map(len, types.values()))
    for name, p in params.items():
        lines.append(f"    {name:<{width}}  {types[name]:<{twidth}}  default {p.default_text():<6}  {p.help}")
    catalogue = {**scenarios.SWITCHES, **scenarios.MULTI_RANK_SWITCHES} if spec.multi_rank else scenarios.SWITCHES
    lines.append("  switches (--switch NAME, repeatable):")
    width = max(map(len, spec.switches))
    lines += [f"    {sw:<{width}}  {catalogue.get(sw, '')}" for sw in sorted(spec.switches)]
    return "\n".join(lines) + "\n"


@app.command("emulate", cls=_EmulateCommand, short_help='Run a built-in scenario on the emulated runtime.')
def emulate_cmd(
    scenario: ScenarioArg = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", show_default=False,
                                                   help="Directory for the PROF_* run (created if missing).")] = None,
    switch: Annotated[Optional[list[str]], typer.Option(
        "--switch", "-s", show_default=False, help="Problem to inject (repeatable), e.g. leak.")] = None,
    param: Annotated[Optional[list[str]], typer.Option(
        "--param", "-p", show_default=False,
        help="Scenario parameter NAME=VALUE (repeatable), e.g. triple_buffer=false; booleans take true/false, "
             "yes/no or 1/0 in any case, optional ones auto.")
    ] = None,
    ranks: Annotated[Optional[int], typer.Option("--ranks", min=1, show_default=False, help="World size.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, show_default=False, help="Steps to run.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the run (same seed, same trace).")] = 0,
    list_: Annotated[bool, typer.Option(
        "--list", help="List the scenarios (or SCENARIO) with their parameters and switches, and exit.")] = False,
    task_time: TaskTimeOpt = None,
    runtime_api: RuntimeApiOpt = None,
    hccl: HcclOpt = None,
    memory: MemoryOpt = None,
    sys_hardware_mem: SysHardwareMemOpt = None,
    stream: Annotated[bool, typer.Option(
        "--stream", help="Write the trace while the scenario runs and lay it out a row group at a time: "
                         "memory holds what is running, not the whole trace (large runs).")] = False,
    export_mode: Annotated[OnOff, typer.Option(
        "--export", help="Write mindstudio_profiler_output/ (timeline, summaries: they read the whole trace; "
                         "off for large runs, `--export=on --output=PROF` later).")] = OnOff.on,
    ground_truth: Annotated[OnOff, typer.Option(
        "--ground-truth", help="Keep and write ground_truth.json (what caused each delay, for scoring; off: "
                               "a large run's memory does not grow with its length).")] = OnOff.on,
) -> None:
    """Run a built-in scenario on the emulated runtime and write its PROF dir (with ground_truth.json)."""
    from msprof_py import capture
    from runtime_emu import scenarios

    spec = None
    if scenario is not None:
        try:
            spec = scenarios.get(scenario)
        except ValueError as exc:
            raise MsprofError(str(exc)) from None
    if list_:
        typer.echo("\n".join(_describe_scenario(s) for s in ([spec] if spec else scenarios.list_scenarios())), nl=False)
        return
    if spec is None:
        raise MsprofError("emulate needs a SCENARIO", hint=f"{PROG} emulate --list shows them")
    if output is None:
        raise MsprofError("emulate needs --output", hint="e.g. --output=profiling")
    try:
        params = scenarios.parse_params(spec, _params(param or []))
    except ValueError as exc:
        raise MsprofError(str(exc)) from None
    prof = capture.emulate(scenario, output, problems=switch or [], seed=seed, steps=steps, ranks=ranks,
                           params=params, switches=_switches(task_time, runtime_api, hccl, memory, sys_hardware_mem),
                           stream=stream, exports=export_mode is OnOff.on, ground_truth=ground_truth is OnOff.on)
    _report_run(prof)


def _params(items: list[str]) -> dict[str, str]:
    """`--param` items as texts by name; the scenario's declared types parse them."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise MsprofError(f"--param {item!r}: expected NAME=VALUE")
        if key in out:
            raise MsprofError(f"--param {key} given twice")
        out[key] = text
    return out


@app.command("demo", short_help='Profile a built-in YOLO pipeline that has two problems.')
def demo(
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory for the PROF_* run.")] = Path("profiling"),
    seed: Annotated[int, typer.Option("--seed", help="Seed of the run.")] = 0,
) -> None:
    """Profile a built-in YOLO pipeline that has two problems (no triple buffering, a memory
    leak), print what the analyzers find, and write an HTML report into its PROF dir."""
    from msprof_py import capture, prof_dir, report
    from msprof_py.compare import render_findings

    prof = capture.emulate("yolo-pipeline", output, problems=["leak"], params={"triple_buffer": False}, seed=seed)
    rep = report.build(prof_dir.read_raw(prof))
    html = report.write(rep, prof / "report.html", "html")
    prof_dir.write_readme(prof)
    _show(render_findings(rep, title="yolo-pipeline, no triple buffering, leaking"))
    timeline = next((prof / prof_dir.EXPORT_DIR).glob("msprof_*.json"))
    typer.echo(f"profile data: {prof}  (README.txt lists every file)")
    typer.echo(f"report:       {html}  (open it in a browser; it works offline)")
    typer.echo(f"timeline:     {timeline}  (open it in https://ui.perfetto.dev or chrome://tracing)")
    me = _self_command()
    typer.echo(f"more:         {me} analyze {prof}")
    typer.echo(f"dashboard:    {me} dashboard {prof}  (then open http://127.0.0.1:8050/)")


@app.command("dashboard", short_help='Serve the web dashboard over one or more traces.')
def dashboard_cmd(
    traces: Annotated[list[Path], typer.Argument(
        metavar="TRACE_OR_PROF_DIR...", show_default=False,
        help="Traces to show (JSON, Parquet table or PROF_* directory); several can be compared.")],
    host: Annotated[str, typer.Option("--host", help="Address to bind; other machines can connect only if you "
                                                     "give a non-loopback one.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to serve on.")] = 8050,
    debug: Annotated[bool, typer.Option("--debug", help="Dash debug mode (tracebacks in the browser): only for "
                                                         "developing the dashboard itself.")] = False,
) -> None:
    """Serve the web dashboard: timeline, findings, problem lookup, memory, communication, compare."""
    from dashboard.serve import serve

    serve(traces, host=host, port=port, debug=debug)


def _self_command() -> str:
    """How to run this command again: `msprof-py` when that name finds this program on PATH,
    else the path it was started by (`.venv/bin/msprof-py` from a venv that is not activated)."""
    import os
    import shutil
    import sys

    started = sys.argv[0]
    if os.path.basename(started) != PROG:
        return PROG
    found = shutil.which(PROG)
    if found and os.path.realpath(found) == os.path.realpath(started):
        return PROG
    return started


def _severity(level: FailOn):
    from analyzers import Severity

    return Severity[level.name.upper()]


def _check_analyzers(names: list[str] | None) -> None:
    """Fail before any loading when `--analyzer` names one that does not exist."""
    from analyzers.finding import analyzer_names

    known = analyzer_names()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise MsprofError(f"unknown analyzer {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")


def _load(trace_path: Path, lenient: bool, progress: bool | None, *, analysis_only: bool = False,
          columns: tuple[str, ...] | None = None) -> Trace:
    from msprof_py import loading, prof_dir

    if prof_dir.is_prof_dir(trace_path):
        return prof_dir.read_raw(trace_path)
    with loading.progress_reporter(loading.input_bytes(trace_path), force=progress) as report:
        return loading.load_any(trace_path, lenient=lenient, progress=report, analysis_only=analysis_only,
                                columns=columns)


# `sql` lives in its own module (DuckDB views over the trace's Parquet files).
from msprof_py.cli_sql import register as _register_sql  # noqa: E402

_register_sql(app)


def main() -> None:
    """Console-script entry point (`msprof-py`)."""
    import os

    if os.environ.get("MSPROF_PY_POOL_MB", "").strip():  # checked before any work, as an option would be
        from runtime_emu.tables import pool_limit_mb

        try:
            pool_limit_mb(os.environ["MSPROF_PY_POOL_MB"])
        except ValueError as exc:
            typer.echo(f"{PROG}: error: {exc}", err=True)
            sys.exit(2)
    app(prog_name=PROG)


if __name__ == "__main__":
    main()
