"""The CLI's I/O edge: open any trace (Parquet or Chrome JSON), vet output paths, show progress.

The format is decided by content, never by file name: a directory is a rank-partitioned Parquet
table, a file starting with the Parquet magic is one Parquet table, anything else goes to the
JSON importers (which detect gzip, Kineto, torch_npu, ... themselves).

What a path given on the command line stands for is decided here, once, for every command
(`trace_inputs`): besides a trace file or table, a torch_npu output folder means its timeline,
and a folder of per-rank traces (Kineto files, torch_npu `*_ascend_pt` folders) means one job,
each file's rank read from the file itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from msprof_py.errors import MsprofError, TraceFormatError
from msprof_py.trace.parquet import read_trace

if TYPE_CHECKING:
    from rich.console import Console

    from msprof_py.trace.schema import Trace, TraceMeta

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
    inputs = trace_inputs(Path(path))
    if len(inputs) > 1:
        return load_job(inputs, lenient=lenient, progress=progress, analysis_only=analysis_only)
    path = inputs[0]
    if not path.exists():
        raise MsprofError(f"{path}: no such file or directory")
    from msprof_py import prof_dir  # a PROF_* run: its host and device parts together

    if prof_dir.is_prof_dir(path):
        return prof_dir.read_raw(path)
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
    trace_view.json in it, as does a folder holding trace_view.json beside torch_npu's summaries.
    A folder of several per-rank traces (see trace_inputs) is returned as it is."""
    inputs = trace_inputs(path)
    return inputs[0] if len(inputs) == 1 else path


#: The JSON files torch_npu and msprof-analyze write beside a timeline, which are no timeline.
SIDE_FILES = re.compile(r"^(profiler_info(_\d+)?|profiler_metadata|(cluster_)?communication(_matrix)?)\.json$")


def trace_inputs(path: Path) -> list[Path]:
    """The traces a path given on the command line stands for, each readable on its own.

    One, most often: a file, a table (file or rank-partitioned directory), a PROF_* directory, a
    sample directory's `trace/`, a torch_npu output folder's timeline (`*_ascend_pt/`, its
    ASCEND_PROFILER_OUTPUT/, or any folder holding trace_view.json beside kernel_details.csv and
    the other summaries). Several for a job's folder: one timeline per `*_ascend_pt` folder in it
    (one per rank, as torch_npu writes them), else its JSON traces (`*.json`, `*.json.gz`; the
    summaries torch_npu and msprof-analyze write beside a timeline left out), in name order. A
    folder of summaries without their timeline is a MsprofError that says so."""
    path = Path(path)
    if not path.is_dir() or any(p.name.startswith("rank=") or p.suffix == ".parquet" for p in path.iterdir()):
        return [path]
    if (path / TABLE_SUBDIR).is_dir():
        return [path / TABLE_SUBDIR]
    from msprof_py import prof_dir
    from msprof_py.trace.importers import ascend  # only for a directory that is no table

    if prof_dir.is_prof_dir(path):
        return [path]
    if path.name.endswith("_ascend_pt") or path.name == ascend.OUTPUT_DIR or (path / ascend.OUTPUT_DIR).is_dir():
        return [ascend.timeline_path(path)]
    if (path / ascend.TIMELINE).is_file():
        return [path / ascend.TIMELINE]
    entries = sorted(path.iterdir(), key=_natural)
    folders = [p for p in entries if p.is_dir() and p.name.endswith("_ascend_pt")]
    if folders:
        return [ascend.timeline_path(p) for p in folders]
    files = [p for p in entries if p.is_file() and p.name.endswith(JSON_SUFFIXES) and not p.name.startswith(".")
             and not SIDE_FILES.match(p.name)]
    if files:
        return files
    summaries = [p.name for p in entries if p.is_file() and (p.suffix == ".csv" or SIDE_FILES.match(p.name))]
    if summaries:
        raise MsprofError(f"{path}: holds torch_npu / msprof-analyze summaries ({', '.join(summaries[:4])}"
                          f"{', ...' if len(summaries) > 4 else ''}) but no timeline beside them",
                          hint=f"msprof-py reads the timeline: put the {ascend.TIMELINE} torch_npu wrote with "
                               "them in this folder, or give the *_ascend_pt folder it is in")
    return [path]


def _natural(path: Path) -> tuple:
    """rank2 before rank10."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", path.name))


# ---------------------------------------------------------------------- jobs of per-rank traces
@dataclasses.dataclass
class JobImport:
    """What `import_job` wrote."""

    events: int
    ranks: list[int]
    inputs: int
    skipped: int


def load_job(inputs: list[Path], *, lenient: bool = False, progress: ProgressCallback | None = None,
             analysis_only: bool = False) -> Trace:
    """One trace of a job from its per-rank traces (see trace_inputs), each read on its own
    and with the rank it holds; two that hold the same rank are a MsprofError naming both."""
    traces: list[Trace] = []
    owners: dict[int, tuple[Path, TraceMeta]] = {}
    for path in _existing(inputs):
        trace = load_any(path, lenient=lenient, progress=progress, analysis_only=analysis_only)
        _claim(owners, _ranks(trace), path, trace.meta)
        traces.append(trace)
    return combine(traces)


def import_job(inputs: list[Path], output: Path, *, lenient: bool = False,
               progress: ProgressCallback | None = None) -> JobImport:
    """Import a job's per-rank traces into one table at `output` (a directory of rank=R/
    partitions, or one .parquet file), as load_job reads them. Memory holds one input at a time:
    each is imported, set aside as Parquet and freed, and the table is then assembled from those
    a row group at a time. Nothing is left at `output` (nor beside it) when an input fails or
    two hold the same rank; an old table there stays until the new one is complete."""
    from msprof_py.trace.atomic import parent_dir
    from msprof_py.trace.parquet import check_trace_directory, write_parquet_file, write_pieces

    output = Path(output)
    inputs = _existing(inputs)
    if output.suffix != ".parquet":
        check_trace_directory(output)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".inputs", dir=parent_dir(output)))
    try:
        owners: dict[int, tuple[Path, TraceMeta]] = {}
        pieces: list[tuple[Path, TraceMeta, list[int]]] = []
        events = 0
        for i, path in enumerate(inputs):
            trace = load_any(path, lenient=lenient, progress=progress)
            ranks = _ranks(trace)
            _claim(owners, ranks, path, trace.meta)
            piece = staging / f"input-{i}.parquet"
            write_parquet_file(trace.table, piece)
            pieces.append((piece, trace.meta, ranks))
            events += len(trace)
            del trace
        pieces.sort(key=lambda p: min(p[2], default=1 << 31))
        meta = job_meta([m for _f, m, _r in pieces])
        write_pieces([(f, m.origin_ns - meta.origin_ns, r) for f, m, r in pieces], output, meta)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return JobImport(events=events, ranks=sorted(owners), inputs=len(inputs),
                     skipped=int(meta.extra.get("skipped_events", 0)))


def _existing(inputs: list[Path]) -> list[Path]:
    """The inputs, checked to exist before any is read (a long import must not fail at the last)."""
    for path in inputs:
        if not Path(path).exists():
            raise MsprofError(f"{path}: no such file or directory")
    return [Path(p) for p in inputs]


def _ranks(trace: Trace) -> list[int]:
    import pyarrow.compute as pc

    return sorted(pc.unique(trace.table.column("rank")).to_pylist())


def _claim(owners: dict[int, tuple[Path, TraceMeta]], ranks: list[int], path: Path, meta: TraceMeta) -> None:
    """Record that `path` holds `ranks`, or fail when an earlier input holds one of them or
    states another world size (a trace of another job)."""
    for first, first_meta in owners.values():
        if None not in (meta.world_size, first_meta.world_size) and meta.world_size != first_meta.world_size:
            raise MsprofError(f"{first} states world size {first_meta.world_size} and {path} {meta.world_size}: "
                              "they are not one job", hint="give the per-rank traces of one job")
    for rank in ranks:
        if rank not in owners:
            continue
        first = owners[rank][0]
        if first.resolve() == path.resolve():
            raise MsprofError(f"{path}: given twice", hint="give each rank's trace once")
        raise MsprofError(f"{first} and {path} both hold rank {rank}",
                          hint="give one trace per rank: a trace's rank is read from the trace itself, from "
                               "Kineto's distributedInfo.rank, torch_npu's profiler_info_N.json or HCCL's src rank")
    owners.update(dict.fromkeys(ranks, (path, meta)))


def job_meta(metas: list[TraceMeta]) -> TraceMeta:
    """The TraceMeta of a job from its per-rank traces' (the lowest rank's first): time 0 is the
    earliest trace's, the world size the one they state (see _claim), malformed events skipped
    added up."""
    worlds = sorted({m.world_size for m in metas if m.world_size is not None})
    extra = {k: v for k, v in metas[0].extra.items() if k != "skipped_events"}
    skipped = sum(int(m.extra.get("skipped_events", 0)) for m in metas)
    if skipped:
        extra["skipped_events"] = skipped
    return dataclasses.replace(metas[0], origin_ns=min(m.origin_ns for m in metas),
                               world_size=worlds[-1] if worlds else None, extra=extra)


def combine(traces: list[Trace]) -> Trace:
    """One table of the traces of a job's ranks (no rank in two of them): each trace's ts moved to
    the job's time 0 (job_meta), rows by rank then ts as every table is."""
    if len(traces) == 1:
        return traces[0]
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from msprof_py.trace.schema import COLUMN_NAMES, Trace, arrow_schema, canonical_dictionaries

    traces = sorted(traces, key=lambda t: min(_ranks(t), default=1 << 31))
    meta = job_meta([t.meta for t in traces])
    schema = arrow_schema()
    tables = []
    for trace in traces:
        table = trace.table.select(list(COLUMN_NAMES))
        shift = trace.meta.origin_ns - meta.origin_ns
        if shift:
            ts = pc.add(table.column("ts"), pa.scalar(shift, pa.int64()))
            table = table.set_column(table.schema.get_field_index("ts"), "ts", ts)
        tables.append(table.cast(schema))
    table = pa.concat_tables(tables)
    del tables
    rank = table.column("rank").to_numpy()
    if len(rank) and (np.diff(rank) < 0).any():  # a trace of several ranks among the others
        table = table.take(pa.array(np.argsort(rank, kind="stable")))
    table = canonical_dictionaries(table).replace_schema_metadata(arrow_schema(meta).metadata)
    return Trace(table=table, meta=meta)


def is_parquet(path: Path) -> bool:
    """True when the file starts with the Parquet magic bytes."""
    with open(path, "rb") as fh:
        return fh.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC


def skipped_events(trace: Trace) -> int:
    """How many malformed events a lenient import left out."""
    return int(trace.meta.extra.get("skipped_events", 0))


def input_bytes(path: str | Path) -> int:
    """Size of a trace file, or of all files under a partitioned directory (0 if missing)."""
    inputs = trace_inputs(Path(path))
    if len(inputs) > 1:
        return sum(input_bytes(p) for p in inputs)
    path = inputs[0]
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
