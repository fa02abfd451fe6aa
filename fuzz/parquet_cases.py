"""Damaged trace tables, made from tables imported from real traces (Hypothesis strategies).

Byte damage (truncation, overwritten bytes) reaches Arrow's Parquet decoder; table damage
(dropped or retyped columns, nulls, negative durations, unknown kinds, damaged metadata, stray
partitions) is written as valid Parquet and reaches the table checks behind it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import strategies as st

from fuzz.json_cases import Seeds
from msprof_py.trace import Trace, import_bytes, write_trace
from msprof_py.trace.schema import META_KEY

#: Columns a read of some columns asks for (as `info` and the analyzers do).
COLUMN_SUBSETS = (None, ["ts", "dur", "kind", "rank"], ["ph", "name", "ts", "dur", "pid", "tid", "kind", "stream"])

META_VALUES = (
    b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"origin_ns": "x"}', b'{"origin_ns": 1e300}',
    b'{"origin_ns": 100000000000000000000000}', b'{"origin_ns": true}', b'{"world_size": -3}',
    b'{"world_size": "8"}', b'{"source_meta": []}', b'{"extra": {"skipped_events": "x"}}', b'{"extra": 5}',
    b'{"schema_version": 999}', b'{"source_format": 7}',
)


def parquet_seeds(json_seeds: dict[str, bytes], names: tuple[str, ...]) -> Seeds:
    """Tables imported from some of the JSON seeds."""
    return Seeds((n, import_bytes(json_seeds[n], where=n)) for n in names)


@dataclass
class ParquetCase:
    seed: str
    steps: list[str]
    columns: list[str] | None
    table: pa.Table | None
    data: bytes | None
    partitioned: bool

    def write(self, directory: Path, trace: Trace) -> Path:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        if self.data is not None:
            path = directory / "case.parquet"
            path.write_bytes(self.data)
            return path
        path = directory / "case"
        part = path / "rank=0" / "part-0.parquet"
        part.parent.mkdir(parents=True)
        pq.write_table(self.table, part)
        if self.partitioned:  # a second partition: a healthy copy of the seed beside the damaged one
            (path / "rank=1").mkdir()
            write_trace(trace, path / "rank=1" / "part-0.parquet")
        return path if self.partitioned else part

    def __repr__(self) -> str:
        return f"ParquetCase(seed={self.seed!r}, columns={self.columns!r}, steps={self.steps!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis prints cases with this
        p.text(repr(self))


@st.composite
def parquet_cases(draw: st.DrawFn, seeds: dict[str, Trace], workdir: Path) -> ParquetCase:
    seed = draw(st.sampled_from(sorted(seeds)))
    trace = seeds[seed]
    columns = draw(st.sampled_from(COLUMN_SUBSETS))
    steps: list[str] = []
    if draw(st.booleans()):
        return ParquetCase(seed, steps, columns, None, draw(_damaged_bytes(trace, workdir, steps)), False)
    table = trace.table
    for _ in range(draw(st.integers(1, 2))):
        table = draw(_damaged_table(table, steps))
    partitioned = draw(st.booleans())
    if partitioned:
        steps.append("beside a healthy rank=1 partition")
    return ParquetCase(seed, steps, columns, table, None, partitioned)


@st.composite
def _damaged_bytes(draw: st.DrawFn, trace: Trace, workdir: Path, steps: list[str]) -> bytes:
    workdir.mkdir(parents=True, exist_ok=True)
    write_trace(trace, workdir / "seed.parquet")
    data = bytearray((workdir / "seed.parquet").read_bytes())
    # Half the damage lands in the footer (schema, metadata, row-group offsets), where a flip
    # changes structure rather than one value.
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for _ in range(draw(st.integers(1, 4))):
        lo = max(len(data) - footer, 0) if draw(st.booleans()) else 0
        at = draw(st.integers(lo, len(data) - 1))
        value = draw(st.integers(0, 255))
        data[at] = value
        steps.append(f"byte {at} = {value:#04x}")
    if draw(st.integers(0, 3)) == 0:
        cut = draw(st.integers(0, len(data)))
        steps.append(f"truncate at byte {cut}")
        data = data[:cut]
    return bytes(data)


RETYPES = (pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.dictionary(pa.int32(), pa.int64()))


@st.composite
def _damaged_table(draw: st.DrawFn, table: pa.Table, steps: list[str]) -> pa.Table:
    op = draw(st.sampled_from(("drop", "retype", "nulls", "negative_dur", "unknown_kind", "extra_column",
                               "empty", "metadata", "no_metadata", "reorder", "huge_values")))
    name = draw(st.sampled_from(table.column_names))
    at = table.schema.get_field_index(name)
    if op in ("negative_dur", "unknown_kind", "huge_values") and not {"dur", "kind", "ts", "corr", "bytes",
                                                                       "pid"} <= set(table.column_names):
        op = "extra_column"  # the column it damages is gone already
    if op == "drop":
        steps.append(f"drop column {name!r}")
        return table.drop_columns([name])
    if op == "retype":
        typ = draw(st.sampled_from(RETYPES))
        steps.append(f"column {name!r} as {typ}")
        return table.set_column(at, name, _retyped(table.column(name), typ, len(table)))
    if op == "nulls":
        steps.append(f"column {name!r} all null")
        return table.set_column(at, pa.field(name, table.schema.field(name).type), pa.nulls(len(table),
                                table.schema.field(name).type))
    if op == "negative_dur":
        steps.append("dur -1 in every row")
        return table.set_column(table.schema.get_field_index("dur"), "dur", pa.array([-1] * len(table), pa.int64()))
    if op == "unknown_kind":
        steps.append("kind 'bogus' in every row")
        kinds = pa.array(["bogus"] * len(table)).dictionary_encode()
        return table.set_column(table.schema.get_field_index("kind"), "kind", kinds)
    if op == "extra_column":
        steps.append("extra column 'zzz'")
        return table.append_column("zzz", pa.array(range(len(table)), pa.int64()))
    if op == "empty":
        steps.append("no rows")
        return table.slice(0, 0)
    if op == "reorder":
        steps.append("columns in reverse order")
        return table.select(list(reversed(table.column_names)))
    if op == "huge_values":
        col = draw(st.sampled_from(("ts", "dur", "corr", "bytes", "pid")))
        value = draw(st.sampled_from((2**63 - 1, -(2**63), 2**62)))
        steps.append(f"column {col!r} = {value} in every row")
        idx = table.schema.get_field_index(col)
        return table.set_column(idx, col, pa.array([value] * len(table), table.schema.field(col).type))
    key = META_KEY
    md = dict(table.schema.metadata or {})
    if op == "no_metadata":
        steps.append("no msprof-py metadata")
        return table.replace_schema_metadata({k: v for k, v in md.items() if k != key})
    value = draw(st.one_of(st.sampled_from(META_VALUES), _mistyped_meta(md.get(key, b"{}"))))
    steps.append(f"metadata = {value[:80]!r}")
    return table.replace_schema_metadata({**md, key: value})


@st.composite
def _mistyped_meta(draw: st.DrawFn, raw: bytes) -> bytes:
    """The seed's real metadata with one field given a value of another type."""
    try:
        meta: dict[str, Any] = json.loads(raw)
    except ValueError:  # damaged by an earlier step
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    key = draw(st.sampled_from(sorted(meta) or ["origin_ns"]))
    meta[key] = draw(st.sampled_from(("x", -1, 2**70, None, [], {}, 1.5, True)))
    return json.dumps(meta).encode()


def _retyped(col: pa.ChunkedArray, typ: pa.DataType, n: int) -> pa.Array:
    """The column as `typ` where Arrow can cast it, else a column of that type with made-up values."""
    try:
        return pc.cast(col, typ, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        if pa.types.is_dictionary(typ):
            return pa.array(range(n), pa.int64()).dictionary_encode()
        return pa.array([None] * n, typ) if typ != pa.string() else pa.array(["x"] * n)
