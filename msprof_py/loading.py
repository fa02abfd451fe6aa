"""The CLI's I/O edge: open any trace (Parquet or Chrome JSON), vet output paths, show progress.

The format is decided by content, never by file name: a directory is a rank-partitioned Parquet
table, a file starting with the Parquet magic is one Parquet table, anything else goes to the
JSON importers (which detect gzip, Kineto, torch_npu, ... themselves).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from msprof_py.errors import MsprofError, TraceFormatError
from msprof_py.trace.parquet import read_trace

if TYPE_CHECKING:
    from rich.console import Console

    from msprof_py.trace.schema import Trace

ProgressCallback = Callable[[str, int, int], None]

PARQUET_MAGIC = b"PAR1"
#: Below this input size a load takes well under a second: a bar would only flicker.
LARGE_INPUT_BYTES = 16 * 1024 * 1024
JSON_SUFFIXES = (".json", ".json.gz")
#: A sample or scenario directory keeps its table here, next to ground_truth.json.
TABLE_SUBDIR = "trace"


def load_any(path: str | Path, *, lenient: bool = False, progress: ProgressCallback | None = None,
             analysis_only: bool = False, columns: tuple[str, ...] | None = None) -> Trace:
    """Read a trace table (Parquet file or partitioned directory) or import a JSON trace.

    `analysis_only` reads from Parquet only the columns analyzers use (no args / extra / id):
    on a 10M-event trace that is a third of the memory; a JSON import then skips building the
    verbatim args / extra text columns. `columns` reads only those from Parquet (a JSON import
    builds every column), each checked for its schema type.
    """
    path = table_path(Path(path))
    if not path.exists():
        raise MsprofError(f"{path}: no such file or directory")
    if path.is_dir() or is_parquet(path):
        if columns is None and analysis_only:
            from analyzers.frames import ANALYSIS_COLUMNS

            columns = ANALYSIS_COLUMNS
        if columns is None:
            return read_trace(path)
        try:
            return _checked(read_trace(path, columns=list(columns)), path)
        except KeyError:
            # A column is missing: the whole-table read's validation names every missing one.
            read_trace(path)
            raise
    from msprof_py.trace.importers import import_trace  # JSON only: a table read never loads the importers

    trace = import_trace(path, lenient=lenient, progress=progress, analysis_only=analysis_only)
    skipped = skipped_events(trace)
    if skipped and len(trace) == 0:
        # Leniency is for a few bad events in a real trace, not for turning any JSON
        # array into an empty trace.
        raise TraceFormatError(f"{path}: not a trace: all {skipped} events are malformed")
    return trace


def _checked(trace: Trace, path: Path) -> Trace:
    """A partly read table, its columns checked as `validate` checks a whole one (types, nulls)."""
    import pyarrow as pa

    from msprof_py.trace.schema import COLUMNS

    for name, typ, nullable in COLUMNS:
        if name not in trace.table.column_names:
            continue
        col = trace.table.column(name)
        if col.type != typ and not (pa.types.is_dictionary(typ) and pa.types.is_dictionary(col.type)):
            raise TraceFormatError(f"{path}: column {name!r} has type {col.type}, expected {typ}")
        if not nullable and col.null_count:
            raise TraceFormatError(f"{path}: column {name!r} has {col.null_count} null values")
    return trace


def table_path(path: Path) -> Path:
    """Where the table of `path` is: a directory holding no partitions or Parquet files of its own
    but a `trace/` table (a sample such as sample_traces/emulated/bert-train-dp) means that table;
    a torch_npu output folder (`rank0_ascend_pt/`, or its ASCEND_PROFILER_OUTPUT/) means the
    trace_view.json in it."""
    if not path.is_dir() or any(p.name.startswith("rank=") or p.suffix == ".parquet" for p in path.iterdir()):
        return path
    if (path / TABLE_SUBDIR).is_dir():
        return path / TABLE_SUBDIR
    from msprof_py.trace.importers.ascend import timeline_path  # only for a directory that is no table

    return timeline_path(path)


def is_parquet(path: Path) -> bool:
    """True when the file starts with the Parquet magic bytes."""
    with open(path, "rb") as fh:
        return fh.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC


def skipped_events(trace: Trace) -> int:
    """How many malformed events a lenient import left out."""
    return int(trace.meta.extra.get("skipped_events", 0))


def input_bytes(path: str | Path) -> int:
    """Size of a trace file, or of all files under a partitioned directory (0 if missing)."""
    path = table_path(Path(path))
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0


def check_table_output(path: str | Path) -> Path:
    """Vet an `import` output (`.parquet` file or directory) before any input is read."""
    path = Path(path)
    if path.name.endswith(JSON_SUFFIXES) or path.suffix == ".gz":
        raise MsprofError(f"{path}: import writes a Parquet table, not JSON",
                          hint="use OUT.parquet or a directory; 'msprof-py export' writes Chrome JSON")
    return check_parent(path)


def check_json_output(path: str | Path) -> Path:
    """Vet an `export` output (`.json` or `.json.gz`) before any input is read."""
    path = Path(path)
    if not path.name.endswith(JSON_SUFFIXES):
        raise MsprofError(f"{path}: export writes Chrome JSON; name the output .json or .json.gz")
    if path.is_dir():
        raise MsprofError(f"{path}: is a directory; expected a file name ending in .json or .json.gz")
    return check_parent(path)


def check_parent(path: str | Path) -> Path:
    """Fail before any work when the output directory is missing or not writable."""
    path = Path(path)
    # Failing here, before a possibly long import, also guarantees nothing was written.
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MsprofError(f"{path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MsprofError(f"{path}: directory {parent} is not writable")
    return path


@contextlib.contextmanager
def progress_reporter(input_size_bytes: int, *, force: bool | None = None,
                      console: Console | None = None) -> Iterator[ProgressCallback]:
    """Yield a (stage, done, total) callback that drives a rich progress bar on stderr.

    The bar shows when `force` is True, or when `force` is None, stderr is a terminal and the
    input is large; otherwise the callback does nothing (so tests and pipes stay silent).
    """
    if force is None and (input_size_bytes < LARGE_INPUT_BYTES or (console is None and not _stderr_is_terminal())):
        force = False  # decided without importing rich: it costs start-up time
    if force is False:
        yield _ignore
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    if force is None and not console.is_terminal:
        yield _ignore
        return
    # Percent, not counts: stages count different things (bytes, events).
    columns = (TextColumn("{task.description:<10}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


def _stderr_is_terminal() -> bool:
    import sys

    return sys.stderr is not None and sys.stderr.isatty()


def _ignore(stage: str, done: int, total: int) -> None:
    return None
