"""SQL over a trace: DuckDB reads the trace's Parquet files in place, through documented views.

    con = msprof_py.sql("sample_traces/emulated/bert-train-dp")      # a connection with the views
    con.sql("SELECT kind, count(*) FROM events GROUP BY kind").show()
    rel = msprof_py.sql("run.parquet", "SELECT * FROM tasks WHERE queue_delay > 1e6")  # a relation
    rel.df()

The views are in the spirit of Perfetto's trace processor (its `slice`, `counter`, `flow` tables),
over the columns the trace table really holds (`msprof_py.trace.schema`). Nothing is copied: every
view is SQL over `read_parquet` of the table's files, so DuckDB reads only the columns and row
groups a query needs, and a query over a 10M-event trace runs in the memory of its result.
Times are integer nanoseconds since the trace origin, as in the table.

DuckDB rather than pandas: the joins these views need (a device task with the host call that
launched it, flow starts with their finishes) and per-stream window functions are what an
embedded SQL engine plans and runs in parallel over the Parquet columns, without loading the
table; pandas would read every column into memory first.

Views and columns
-----------------
events
    The raw table, one row per Chrome trace event, every column of the schema: rank, ph, name,
    cat, ts, dur, pid, tid, id, args, extra, kind, device, stream, corr, bytes, addr, value, step.
slices
    Complete events (ph 'X') of every kind: rank, device, stream, pid, tid, ts, dur (0 when the
    event has none), end (ts + dur), name, cat, kind, corr, step, bytes, value, args (JSON text;
    query it with json_extract_string(args, '$."OP Type"')).
counters
    Counter samples (ph 'C'): rank, device, stream, pid, tid, ts, name, value, step.
flows
    Flow arrows: each flow start (ph 's') with its finish (ph 'f') of the same rank, category and
    id (starts or finishes without their other end are left out; they stay in `events`): rank,
    cat, name, id, corr (the start's, else the finish's), start_ts, start_pid, start_tid,
    start_stream, finish_ts, finish_pid, finish_tid, finish_stream, latency (finish_ts - start_ts).
tasks
    Device work on a stream: slices of kind kernel, memcpy, memset or collective with a stream,
    and the device's own wait / sync / marker tasks (those carry a correlation id: a Notify_Wait,
    an EVENT_RECORD, a CUDA "Stream Sync"; stream annotations, which have none, are not tasks).
    Columns: rank, device, stream, pid, tid, ts, dur, end, name, cat, kind, corr, step, bytes,
    value (a copy's GB/s when the trace records it), args, and the host call that launched the
    task, joined by (rank, corr) among the host's api / launch / sync / wait slices (a `launch`
    preferred, then the latest): launch_name, launch_kind, launch_ts, launch_dur, launch_end,
    launch_pid, launch_tid, queue_delay (ts - launch_end: how long the launched task waited
    before it started). The launch columns are NULL for a task with no host call in the trace.
memory
    Memory events and memory counters, by time: rank, device, pid, tid, ts, kind, name, addr,
    bytes, delta, live, value, step. kind is alloc / free (bytes: the block's size, always
    positive; delta: +bytes / -bytes; live: the running sum of delta per (rank, device) in time
    order, so bytes allocated during the trace and not yet freed; value: the allocator's own
    total after the event when the trace records it, as PyTorch's "Total Allocated"),
    alloc_fail (bytes: the request; value: the largest free block when known), or counter (a
    memory counter such as "Device memory used" / "allocated" / "reserved": value is its bytes).
    addr, delta and live are NULL where they do not apply.
steps
    Profiler steps (slices of kind step, such as ProfilerStep#3): rank, step (the step number;
    from the name's '#N' when the column is empty), name, pid, tid, ts, dur, end.

`_rows` (internal) is `events` with DuckDB's `filename` and `file_row_number` of each row: the
order of rows with equal ts, for `memory.live`.

Errors (bad SQL, an unknown view, a file that is no trace table) are MsprofError, one line.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msprof_py.errors import MsprofError

if TYPE_CHECKING:
    import duckdb

#: The views, in the order `.tables` lists them.
VIEWS = ("events", "slices", "counters", "flows", "tasks", "memory", "steps")

#: The task kinds: device work, and the device-side kinds that are tasks when they carry a corr.
TASK_KINDS = ("kernel", "memcpy", "memset", "collective")
DEVICE_SIDE_KINDS = ("wait", "sync", "marker")
#: Host slices that put work on a stream (frames.host_calls' kinds, and op_compile: a call that
#: compiles an operator and then launches it carries its task's corr).
HOST_CALL_KINDS = ("api", "launch", "sync", "wait", "op_compile")
#: A memory counter, by name: allocated / reserved (caching allocator), memory ... used (driver);
#: the dashboard's MEMORY_COUNTER, in RE2 syntax.
MEMORY_COUNTER = r"(?i)\b(allocated|reserved)\b|\bmemory\b.*\bused\b"


def _in(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


_IS_TASK = (f"(ph = 'X' AND stream IS NOT NULL AND (kind IN {_in(TASK_KINDS)} OR "
            f"(kind IN {_in(DEVICE_SIDE_KINDS)} AND corr IS NOT NULL)))")

#: name -> SQL of each view over `_rows` (the files, with each row's file name and position).
VIEW_SQL: dict[str, str] = {
    "events": "SELECT * EXCLUDE (filename, file_row_number) FROM _rows",
    "slices": """
        SELECT rank, device, stream, pid, tid, ts, coalesce(dur, 0) AS dur, ts + coalesce(dur, 0) AS "end",
               name, cat, kind, corr, step, bytes, value, args
        FROM _rows WHERE ph = 'X'""",
    "counters": """
        SELECT rank, device, stream, pid, tid, ts, name, value, step
        FROM _rows WHERE ph = 'C'""",
    "flows": """
        SELECT s.rank, s.cat, s.name, s.id, coalesce(s.corr, f.corr) AS corr,
               s.ts AS start_ts, s.pid AS start_pid, s.tid AS start_tid, s.stream AS start_stream,
               f.ts AS finish_ts, f.pid AS finish_pid, f.tid AS finish_tid, f.stream AS finish_stream,
               f.ts - s.ts AS latency
        FROM (SELECT rank, cat, name, id, corr, ts, pid, tid, stream FROM _rows WHERE ph = 's') AS s
        JOIN (SELECT rank, cat, id, corr, ts, pid, tid, stream FROM _rows WHERE ph = 'f') AS f
          ON s.rank = f.rank AND s.id = f.id AND s.cat IS NOT DISTINCT FROM f.cat""",
    "tasks": f"""
        WITH t AS (
            SELECT rank, device, stream, pid, tid, ts, coalesce(dur, 0) AS dur, ts + coalesce(dur, 0) AS "end",
                   name, cat, kind, corr, step, bytes, value, args
            FROM _rows WHERE {_IS_TASK}),
        h AS (
            SELECT rank, corr, name, kind, ts, coalesce(dur, 0) AS dur, pid, tid
            FROM _rows
            WHERE ph = 'X' AND corr IS NOT NULL AND kind IN {_in(HOST_CALL_KINDS)} AND NOT {_IS_TASK}
            QUALIFY row_number() OVER (PARTITION BY rank, corr ORDER BY kind = 'launch' DESC, ts DESC) = 1)
        SELECT t.*, h.name AS launch_name, h.kind AS launch_kind, h.ts AS launch_ts, h.dur AS launch_dur,
               h.ts + h.dur AS launch_end, h.pid AS launch_pid, h.tid AS launch_tid,
               t.ts - (h.ts + h.dur) AS queue_delay
        FROM t LEFT JOIN h ON t.rank = h.rank AND t.corr = h.corr""",
    "memory": f"""
        SELECT rank, device, pid, tid, ts, kind, name, addr, bytes,
               CASE kind WHEN 'alloc' THEN bytes ELSE -bytes END AS delta,
               CAST(sum(CASE kind WHEN 'alloc' THEN bytes ELSE -bytes END) OVER (
                   PARTITION BY rank, device ORDER BY ts, filename, file_row_number
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) AS live,
               value, step
        FROM _rows WHERE kind IN ('alloc', 'free')
        UNION ALL BY NAME
        SELECT rank, device, pid, tid, ts, kind, name, NULL AS addr, bytes, value, step
        FROM _rows WHERE kind = 'alloc_fail'
        UNION ALL BY NAME
        SELECT rank, device, pid, tid, ts, 'counter' AS kind, name, value, step
        FROM _rows WHERE ph = 'C' AND regexp_matches(name, '{MEMORY_COUNTER}')""",
    "steps": r"""
        SELECT rank, coalesce(step, try_cast(regexp_extract(name, '#(\d+)$', 1) AS INTEGER)) AS step,
               name, pid, tid, ts, coalesce(dur, 0) AS dur, ts + coalesce(dur, 0) AS "end"
        FROM _rows WHERE kind = 'step' AND ph = 'X'""",
}


def sql(trace: str | Path, query: str | None = None) -> duckdb.DuckDBPyConnection | duckdb.DuckDBPyRelation:
    """The trace's views in DuckDB: a relation of `query` when given, else a connection.

    `trace` is a Parquet table (file or rank-partitioned directory), a sample directory holding
    one in `trace/`, or a PROF_* directory. The connection is a fresh in-memory database with the
    views of this module's doc (events, slices, counters, flows, tasks, memory, steps); run more
    queries on it with `.sql(...)` / `.execute(...)`. A relation is lazy: DuckDB runs it when
    fetched (`.df()`, `.fetchall()`, `.show()`), and it keeps its connection alive.
    Raises MsprofError for a missing or non-Parquet trace, or a query DuckDB rejects.
    """
    con = connect(trace)
    if query is None:
        return con
    return relation(con, query)


def connect(trace: str | Path) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the trace's views (only the files' footers read yet)."""
    import duckdb

    files = parquet_files(Path(trace))
    con = duckdb.connect(":memory:")
    listed = "[" + ", ".join(_literal(str(f)) for f in files) + "]"
    try:
        # Not hive_partitioning (DuckDB would detect it from `rank=R/`): every file holds its rank
        # column (int32, as the schema says; the path would make it int64), and a `key=value`
        # directory anywhere up the path would become an extra column. Row-group statistics of
        # `rank` still let DuckDB skip other ranks' data.
        # union_by_name only when the files' columns differ: with it DuckDB reads every file's
        # footer again each time a view is bound (2.3 s of a query's time on a 128-file trace).
        by_name = "true" if _columns_differ(files) else "false"
        con.execute(f"CREATE VIEW _rows AS SELECT * FROM read_parquet({listed}, union_by_name = {by_name}, "
                    "hive_partitioning = false, filename = true, file_row_number = true)")
        have = {row[0] for row in con.execute("DESCRIBE _rows").fetchall()}
    except duckdb.Error as exc:
        con.close()
        raise MsprofError(f"{trace}: {one_line(exc)}") from None
    from msprof_py.trace.schema import COLUMN_NAMES

    missing = [c for c in COLUMN_NAMES if c not in have]
    if missing:
        con.close()
        raise MsprofError(f"{trace}: not an msprof-py trace table (no column {', '.join(missing)})",
                          hint="import the trace first: msprof-py import TRACE -o OUT.parquet")
    for name in VIEWS:
        con.execute(f"CREATE VIEW {name} AS {VIEW_SQL[name]}")
    return con


def _columns_differ(files: list[Path]) -> bool:
    """Whether the files' column names (in order) are not all the same (their footers only)."""
    import pyarrow.parquet as pq

    try:
        first = None
        for f in files:
            names = pq.read_schema(f).names
            if first is None:
                first = names
            elif names != first:
                return True
    except (OSError, ValueError):
        return True  # DuckDB reads them and says what is wrong
    return False


def relation(con: duckdb.DuckDBPyConnection, query: str) -> duckdb.DuckDBPyRelation:
    """`con.sql(query)`, with DuckDB's errors as one-line MsprofErrors."""
    import duckdb

    try:
        rel = con.sql(query)
    except duckdb.Error as exc:
        raise MsprofError(one_line(exc)) from None
    return rel


def parquet_files(path: Path) -> list[Path]:
    """The Parquet files of a trace: the file itself, a table directory's part files (in rank
    order), or a PROF directory's host and device parts."""
    from msprof_py.loading import is_parquet, table_path, trace_inputs

    if not path.exists():
        raise MsprofError(f"{path}: no such file or directory")
    inputs = trace_inputs(path)
    if len(inputs) > 1:  # a job's folder of per-rank traces: SQL runs over one table
        raise MsprofError(f"{path}: sql reads Parquet trace tables; this folder holds {len(inputs)} per-rank traces",
                          hint=f"import them first: msprof-py import {path} -o JOB/")
    path = table_path(path)
    if path.is_file():
        if not is_parquet(path):
            raise MsprofError(f"{path}: sql reads Parquet trace tables, and this is not one",
                              hint=f"import it first: msprof-py import {path} -o OUT.parquet")
        return [path]
    roots = [path]
    if _PROF_RE.match(path.name):
        roots = [d for d in [path / "host" / "data", *sorted(path.glob("device_*/data"))] if d.is_dir()]
    # A table directory holds `rank=R/part-N.parquet` (or its files at the top): no deeper search,
    # so a directory that is no table fails fast instead of reading whatever lies below it.
    files = sorted((f for root in roots for pattern in ("*.parquet", "*/*.parquet") for f in root.glob(pattern)
                    if f.is_file()), key=_natural)
    if not files:
        raise MsprofError(f"{path}: no Parquet files in this directory",
                          hint="give a trace table, a PROF_* directory or a sample directory")
    return files


#: prof_dir.PROF_RE, repeated: importing prof_dir would load numpy and pyarrow for one name.
_PROF_RE = re.compile(r"^PROF_(\d{6})_(\d{17})_([A-Z]{16})$")


def _natural(path: Path) -> tuple:
    """rank=2 before rank=10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path)))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class _CallableModule(types.ModuleType):
    """This module, callable: `msprof_py.sql(trace, query)` is `msprof_py.sql.sql(trace, query)`.

    The package attribute `msprof_py.sql` is this module as soon as anything imports it (Python
    binds a submodule to its package), so the module itself is the function users call."""

    def __call__(self, trace: str | Path, query: str | None = None) -> Any:
        return sql(trace, query)


sys.modules[__name__].__class__ = _CallableModule


def one_line(exc: BaseException) -> str:
    """DuckDB's message without its LINE / caret pointer, on one line."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    kept = []
    for line in lines:
        if line.startswith("LINE "):
            break
        kept.append(line.strip())
    return " ".join(" ".join(kept).split()) or type(exc).__name__


def describe(con: duckdb.DuckDBPyConnection, view: str) -> list[tuple[str, str]]:
    """(column, type) of a view."""
    return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {view}").fetchall()]


def statements(con: duckdb.DuckDBPyConnection, text: str) -> list[Any]:
    """The statements of `text`, parsed by DuckDB (MsprofError when it cannot)."""
    import duckdb

    try:
        return list(con.extract_statements(text))
    except duckdb.Error as exc:
        raise MsprofError(one_line(exc)) from None
