"""Parquet I/O of the trace table: one file, or a directory partitioned hive-style by rank."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msprof_py.errors import MsprofError, TraceFormatError
from msprof_py.trace.atomic import atomic_file, file_mode, parent_dir
from msprof_py.trace.schema import (
    COLUMN_NAMES,
    COLUMNS,
    META_KEY,
    Trace,
    TraceMeta,
    arrow_schema,
    canonical_dictionaries,
    meta_from_dict,
    validate,
)

ROW_GROUP_ROWS = 256 * 1024


def write_trace(trace: Trace, path: str | Path, *, partition_by_rank: bool | None = None) -> Path:
    """Write atomically: to a temporary sibling first, then rename, so no half-written output.

    A path ending in `.parquet` is one file; any other path is a directory with
    `rank=R/part-0.parquet` per rank (the unit of parallel work for multi-rank analyses).
    """
    path = Path(path)
    if partition_by_rank is None:
        partition_by_rank = path.suffix != ".parquet"
    parent = parent_dir(path)
    table = trace.table.replace_schema_metadata(arrow_schema(trace.meta).metadata)
    try:
        if not partition_by_rank:
            with atomic_file(path) as tmp:
                write_parquet_file(table, tmp)
            return path
        _write_rank_dirs(path, parent, sorted(pc.unique(table.column("rank")).to_pylist()),
                         lambda rank, f: write_parquet_file(table.filter(pc.equal(table.column("rank"), rank)), f))
        return path
    except PermissionError:
        raise MsprofError(f"{path}: permission denied", hint="choose a writable output location") from None


def _write_rank_dirs(path: Path, parent: Path, ranks: list[int], write: Callable[[int, Path], None]) -> None:
    """`path` as a rank-partitioned table (rank=R/part-0.parquet, `write(rank, file)` fills each),
    built in a directory beside it and moved into place at once: no half-written table."""
    check_trace_directory(path)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    try:
        for rank in ranks:
            (tmpdir / f"rank={rank}").mkdir()
            write(rank, tmpdir / f"rank={rank}" / "part-0.parquet")
        move_directory_into_place(tmpdir, path)
    finally:
        if tmpdir.exists():
            shutil.rmtree(tmpdir, ignore_errors=True)


def write_pieces(pieces: list[tuple[Path, int, list[int]]], path: str | Path, meta: TraceMeta, *,
                 partition_by_rank: bool | None = None) -> Path:
    """Write one trace table at `path` (as write_trace lays it out, and as atomically) from trace
    files written apart: `pieces` are (file, shift_ns, its ranks), each file sorted by rank and ts,
    no rank in two of them. Every row's ts moves by its piece's shift (from the piece's own origin
    to `meta`'s), and rows are copied a row group at a time: memory holds one row group, not the
    table."""
    path = Path(path)
    if partition_by_rank is None:
        partition_by_rank = path.suffix != ".parquet"
    parent = parent_dir(path)
    schema = arrow_schema(meta)
    by_rank = sorted((rank, f, shift, len(ranks) > 1) for f, shift, ranks in pieces for rank in ranks)

    def copy(writer: pq.ParquetWriter, rank: int, f: Path, shift: int, shared: bool) -> None:
        pf = pq.ParquetFile(f)
        for i in range(pf.num_row_groups):
            group = pf.read_row_group(i).select(list(COLUMN_NAMES))
            if shared:
                group = group.filter(pc.equal(group.column("rank"), rank))
            if shift:
                ts = pc.add(group.column("ts"), pa.scalar(shift, pa.int64()))
                group = group.set_column(group.schema.get_field_index("ts"), "ts", ts)
            writer.write_table(group.cast(schema), row_group_size=ROW_GROUP_ROWS)

    try:
        if not partition_by_rank:
            with atomic_file(path) as tmp:
                with parquet_writer(tmp, schema) as writer:
                    for rank, f, shift, shared in by_rank:
                        copy(writer, rank, f, shift, shared)
            return path
        source = {rank: (f, shift, shared) for rank, f, shift, shared in by_rank}

        def write_rank(rank: int, out: Path) -> None:
            with parquet_writer(out, schema) as writer:
                copy(writer, rank, *source[rank])

        _write_rank_dirs(path, parent, sorted(source), write_rank)
        return path
    except PermissionError:
        raise MsprofError(f"{path}: permission denied", hint="choose a writable output location") from None


def check_appendable_file(path: Path, world_size: int) -> None:
    """Refuse to append a multi-rank trace to one file as it is recorded: a file is sorted by
    (rank, ts), and rows arriving in time order only keep that order for one rank."""
    if world_size > 1:
        raise MsprofError(f"{path}: a {world_size}-rank trace is sorted by rank first and cannot be streamed "
                          "into one file", hint="give a directory (rank-partitioned output) instead")


def check_trace_directory(path: Path) -> None:
    """Refuse to replace anything but a rank-partitioned trace directory."""
    if path.exists() and (not path.is_dir() or any(p for p in path.iterdir() if not p.name.startswith("rank="))):
        raise MsprofError(f"{path}: exists and is not an msprof-py trace directory; choose another output")


def move_directory_into_place(tmpdir: Path, path: Path) -> None:
    """Give a finished temporary trace directory its modes and name (replacing an old trace)."""
    os.chmod(tmpdir, file_mode() | 0o111)
    for sub in tmpdir.iterdir():
        os.chmod(sub, file_mode() | 0o111)
        for f in sub.iterdir():
            os.chmod(f, file_mode())
    check_trace_directory(path)
    if path.exists():
        # A directory cannot be replaced in one rename: move the old one aside first, so a
        # crash leaves either the old or the new trace (the old under .old), never a mix.
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(tmpdir, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmpdir, path)


#: Columns with few distinct values, worth Parquet dictionary encoding. Timestamps, ids and
#: the JSON text are nearly all distinct: trying a dictionary on them first costs write time
#: and bytes (on a 600k-row emulator trace: 16% faster write, 12% smaller file, 8% faster read).
DICTIONARY_COLUMNS = ("rank", "ph", "name", "cat", "pid", "tid", "kind", "device", "stream", "step")


#: Columns without min/max statistics. JSON text and flow ids are never a predicate to push
#: down; computing them cost ~7% of the write. The dictionary text columns (ph, name, cat,
#: kind) are predicates, but their min/max prune nothing: rows are sorted by ts, so every row
#: group spans nearly all the kinds, phases and names ("counter".."marker", say) and any
#: value tested falls inside. Their statistics cost another 11% of the write (600k-row
#: emulator trace: 0.177 s -> 0.159 s). ts, rank, pid, tid, device, stream... keep theirs.
NO_STATISTICS_COLUMNS = ("id", "args", "extra", "ph", "name", "cat", "kind")


def parquet_options(columns: list[str]) -> dict:
    """The Parquet writer options of a trace table with these columns (write_table or ParquetWriter)."""
    return {"compression": "zstd", "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in columns],
            "write_statistics": [c for c in columns if c not in NO_STATISTICS_COLUMNS]}


def parquet_writer(path: str | Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A Parquet writer of trace rows (`schema`: arrow_schema(meta), the metadata with it) with
    the options write_trace uses, for a file written a part at a time."""
    return pq.ParquetWriter(path, schema, **parquet_options(schema.names))


def read_trace_meta(pf: pq.ParquetFile, *, where: str) -> TraceMeta:
    """The TraceMeta of an open trace file (footer metadata first: a streamed file gets it there
    when it is closed)."""
    md = (pf.metadata.metadata or {}).get(META_KEY) or (pf.schema_arrow.metadata or {}).get(META_KEY)
    if md is None:
        raise TraceFormatError(f"{where}: Parquet file has no msprof-py metadata",
                               hint="is this an msprof-py trace table?")
    return _meta_from(md, where=where)


def write_parquet_file(table: pa.Table, path: str | Path) -> None:
    """One trace table (or part of one) as one Parquet file, with the trace's writer options."""
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, **parquet_options(table.column_names))


def read_trace(path: str | Path, *, columns: list[str] | None = None) -> Trace:
    """Read a trace table written by `write_trace` (file or rank-partitioned directory)."""
    path = Path(path)
    if not path.exists():
        raise MsprofError(f"{path}: no such file or directory")
    files = sorted(path.glob("rank=*/*.parquet"), key=_rank_key) if path.is_dir() else [path]
    if not files:
        raise TraceFormatError(f"{path}: no rank=*/*.parquet partitions in this directory")
    tables, meta = [], None
    for f in files:
        try:
            pf = pq.ParquetFile(f)
            file_meta = read_trace_meta(pf, where=str(f))
            if columns is not None:
                _check_subset(pf.schema_arrow, None, where=str(f))  # before a read of a missing column
            t = pf.read(columns=columns)
            # Offsets, dictionary indices and UTF-8 as well as the pages' checksums: a corrupt
            # file that still decodes fails here, not later in an analyzer as an IndexError.
            t.validate(full=True)
        # UnicodeDecodeError: a column name in the footer that is not UTF-8.
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{f}: not a readable Parquet file ({_short(exc)})") from None
        if meta is None:
            meta = file_meta
        if columns is not None:
            _check_subset(pf.schema_arrow, t, where=str(f))
        tables.append(t)
    if columns is None:
        for f, t in zip(files, tables):
            validate(t, where=str(f))
    if len(tables) > 1:
        # Partitions written apart may differ in nullability or dictionary index width:
        # each is brought to the schema's types first, or concatenation refuses them.
        tables = [_conformed(t, where=str(f)) for f, t in zip(files, tables)]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if columns is None:
        table = canonical_dictionaries(table.select(list(COLUMN_NAMES)))
        table = table.replace_schema_metadata(arrow_schema(meta).metadata)
    return Trace(table=table, meta=meta)


#: TraceMeta's fields and the JSON types each may hold (bool is no int here).
def _meta_from(md: bytes, *, where: str) -> TraceMeta:
    """The file's TraceMeta, or a TraceFormatError when its JSON is damaged or mistyped."""
    try:
        data = json.loads(md)
    except ValueError:  # bad JSON or bad UTF-8
        raise TraceFormatError(f"{where}: msprof-py metadata is not valid JSON") from None
    return meta_from_dict(data, where=where)


def _check_subset(schema: pa.Schema, table: pa.Table | None, *, where: str) -> None:
    """A read of some columns checks what `validate` would, as far as those columns go: the file
    has every column of the schema, and the ones read have their types and no stray nulls."""
    missing = [c for c in COLUMN_NAMES if c not in schema.names]
    if missing:
        raise TraceFormatError(f"{where}: missing column(s) {', '.join(missing)}",
                               hint="is this an msprof-py trace table? import JSON traces with 'msprof-py import'")
    if table is None:
        return
    for name, typ, nullable in COLUMNS:
        if name not in table.column_names:
            continue
        col = table.column(name)
        if col.type != typ and not (pa.types.is_dictionary(typ) and pa.types.is_dictionary(col.type)):
            raise TraceFormatError(f"{where}: column {name!r} has type {col.type}, expected {typ}")
        if not nullable and col.null_count:
            raise TraceFormatError(f"{where}: column {name!r} has nulls")


def _conformed(table: pa.Table, *, where: str) -> pa.Table:
    """The table's schema columns (in schema order) cast to the schema's types."""
    schema = arrow_schema()
    fields = [schema.field(c) for c in COLUMN_NAMES if c in table.column_names]
    try:
        return table.select([f.name for f in fields]).cast(pa.schema(fields))
    except pa.ArrowException as exc:
        raise TraceFormatError(f"{where}: columns do not fit the trace schema ({_short(exc)})") from None


def _rank_key(p: Path) -> int:
    try:
        return int(p.parent.name.split("=", 1)[1])
    except (IndexError, ValueError):
        return 1 << 30


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]
