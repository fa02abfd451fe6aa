"""The trace event table: one row per Chrome trace event, plus typed columns analyzers read.

Raw columns (`ph` .. `extra`) map one-to-one to a Chrome JSON event, so a row exports to the
event it came from. Typed columns (`kind` .. `step`) are filled by the producer (emulator or
importer); analyzers read only those and never parse `args`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.errors import TraceFormatError
from msprof_py.trace.fields import string_id

SCHEMA_VERSION = 1
META_KEY = b"msprof_py"

_DICT = pa.dictionary(pa.int32(), pa.string())

#: (name, type, nullable). Order is the on-disk column order.
COLUMNS: tuple[tuple[str, pa.DataType, bool], ...] = (
    ("rank", pa.int32(), False),
    ("ph", _DICT, False),
    ("name", _DICT, True),
    ("cat", _DICT, True),
    ("ts", pa.int64(), False),  # ns since the trace origin
    ("dur", pa.int64(), True),  # ns
    ("pid", pa.int64(), False),
    ("tid", pa.int64(), False),
    ("id", pa.string(), True),  # flow / async id, text: real ids exceed 2**53
    ("args", pa.string(), True),  # the event's "args" object, verbatim JSON
    ("extra", pa.string(), True),  # other top-level keys (bp, s, cname, string pid/tid...), JSON
    ("kind", _DICT, False),
    ("device", pa.int32(), True),
    ("stream", pa.int32(), True),
    ("corr", pa.int64(), True),
    ("bytes", pa.int64(), True),
    ("addr", pa.int64(), True),
    ("value", pa.float64(), True),
    ("step", pa.int32(), True),
)
COLUMN_NAMES = tuple(c[0] for c in COLUMNS)
RAW_COLUMNS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args", "extra")
TYPED_COLUMNS = ("rank", "kind", "device", "stream", "corr", "bytes", "addr", "value", "step")

#: The normalized meanings shared by every source. New kinds go at the end: importers code
#: kinds by position, and a file written before a kind existed stays readable.
#: host_work: host computation the device waits on (pre/postprocessing, NMS, CPU ops that are
#: not runtime calls); data_load: data loading (a DataLoader's `__next__`); mem_read / mem_write:
#: a device task's access to a buffer (addr = buffer, corr = the task); alloc_fail: an allocation
#: that failed (bytes = request, value = largest free block when known); host_idle: a host
#: thread waiting with nothing to do (for a request, a lock, a queue), not computing;
#: op_compile: a host call compiling an operator before it runs (single-op mode's
#: aclopCompileAndExecute), with `corr` of the task it launched when it launched one.
#: A kernel row's value is the blocks it launched, its addr the cores of its kind on its device.
KINDS = (
    "kernel", "memcpy", "memset", "collective", "api", "launch", "sync", "wait",
    "alloc", "free", "counter", "marker", "step", "flow", "meta",
    "host_work", "data_load", "mem_read", "mem_write", "alloc_fail", "host_idle", "op_compile",
)
DEVICE_KINDS = ("kernel", "memcpy", "memset", "collective")


def communicator_id(label: str) -> int:
    """The `addr` of a collective row: its communicator (process group) as an int64, the same on
    every rank -- the label's number when it is one ("0", "586"), else a stable hash of it. With the
    row's `value`, its call's sequence number in that communicator, it matches a rank's part of a
    collective with its peers' parts."""
    return string_id(label)


#: The JSON types of TraceMeta's fields, as a file's metadata or an export's block holds them.
META_TYPES: dict[str, tuple[type, ...]] = {
    "origin_ns": (int,), "source_format": (str,), "producer": (str,), "world_size": (int, type(None)),
    "schema_version": (int,), "source_meta": (dict,), "extra": (dict,),
}


def meta_from_dict(data: Any, *, where: str, what: str = "msprof-py metadata") -> "TraceMeta":
    """A TraceMeta from its JSON object, or a TraceFormatError naming the first mistyped field."""
    if not isinstance(data, dict):
        raise TraceFormatError(f"{where}: {what} is not a JSON object")
    for key, types in META_TYPES.items():
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool)):
            raise TraceFormatError(f"{where}: {what}: {key!r} has the wrong type ({type(data[key]).__name__})")
    if not -(2**63) <= data.get("origin_ns", 0) < 2**63:
        raise TraceFormatError(f"{where}: {what}: 'origin_ns' is out of range (int64 nanoseconds)")
    return TraceMeta(**{k: data[k] for k in TraceMeta.__dataclass_fields__ if k in data})


def arrow_schema(meta: "TraceMeta | None" = None) -> pa.Schema:
    """The Arrow schema of the table, with `meta` in the schema metadata when given."""
    fields = [pa.field(n, t, nullable=nullable) for n, t, nullable in COLUMNS]
    md = {META_KEY: meta.to_json().encode()} if meta is not None else None
    return pa.schema(fields, metadata=md)


@dataclass
class TraceMeta:
    """File-level facts: where time 0 is, where the trace came from, what it ran on."""

    origin_ns: int = 0  # absolute epoch (or source clock) ns of ts == 0
    source_format: str = "unknown"  # chrome | kineto | ascend | emulator
    producer: str = "msprof-py"
    world_size: int | None = None
    schema_version: int = SCHEMA_VERSION
    #: Top-level keys of the source JSON other than its events (deviceProperties,
    #: distributedInfo, ...), kept so an export carries them again.
    source_meta: dict[str, Any] = field(default_factory=dict)
    #: Anything else a producer wants to say (device presets, topology, ground-truth path).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "TraceMeta":
        data = json.loads(text)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class Trace:
    """A trace event table and its metadata: the single interface of msprof-py."""

    table: pa.Table
    meta: TraceMeta

    def __len__(self) -> int:
        return self.table.num_rows

    def to_pandas(self):
        """The table as a pandas DataFrame (categoricals for dictionary columns)."""
        return self.table.to_pandas()

    def equals(self, other: "Trace") -> bool:
        return self.meta == other.meta and self.table.equals(other.table)


def empty_columns(n: int) -> dict[str, Any]:
    """All-null typed columns of length n, for producers to fill."""
    return {
        "rank": np.zeros(n, dtype=np.int32),
        "device": pa.nulls(n, pa.int32()),
        "stream": pa.nulls(n, pa.int32()),
        "corr": pa.nulls(n, pa.int64()),
        "bytes": pa.nulls(n, pa.int64()),
        "addr": pa.nulls(n, pa.int64()),
        "value": pa.nulls(n, pa.float64()),
        "step": pa.nulls(n, pa.int32()),
    }


def build_table(columns: dict[str, Any], meta: TraceMeta, *, sort: bool = True) -> Trace:
    """Assemble columns (arrays, lists or numpy) into a schema-conformant, sorted Trace.

    Consumes `columns`: each input column is dropped as soon as its sorted copy exists, so a
    large import holds one unsorted column at a time, not a whole second table.
    """
    missing = [c for c in COLUMN_NAMES if c not in columns]
    if missing:
        raise TraceFormatError(f"cannot build trace table: missing column(s) {', '.join(missing)}")
    order = None
    if sort:
        ts = np.asarray(_to_arrow(columns["ts"], pa.int64(), "ts").to_numpy(zero_copy_only=False))
        rank = np.asarray(_to_arrow(columns["rank"], pa.int32(), "rank").to_numpy(zero_copy_only=False))
        # Stable sort: ties keep producer order, so export -> import is idempotent.
        perm = np.lexsort((ts, rank))
        if not np.array_equal(perm, np.arange(len(perm))):
            order = pa.array(perm)
    arrays = []
    for name, typ, _nullable in COLUMNS:
        arr = _to_arrow(columns.pop(name), typ, name)
        if order is not None:
            arr = arr.take(order)  # on dictionary columns this moves indices, not strings
        if pa.types.is_dictionary(typ):
            arr = canonical_dictionary(arr)
        arrays.append(arr)
    table = pa.Table.from_arrays(arrays, schema=arrow_schema(meta))
    return Trace(table=table, meta=meta)


def _to_arrow(values: Any, typ: pa.DataType, name: str) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        arr = values
    elif pa.types.is_dictionary(typ):
        arr = pa.array(values, type=pa.string())
    else:
        arr = pa.array(values, type=typ)
    if pa.types.is_dictionary(typ):
        if not pa.types.is_dictionary(arr.type):
            arr = arr.cast(pa.string()).dictionary_encode()
        if arr.type != typ:
            arr = arr.cast(typ)
    elif arr.type != typ:
        try:
            arr = arr.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TraceFormatError(f"column {name!r}: cannot convert {arr.type} to {typ}: {exc}") from None
    return arr


def canonical_dictionaries(table: pa.Table) -> pa.Table:
    """Dictionary columns in canonical form (see canonical_dictionary), one chunk each."""
    cols = []
    for i, (_name, typ, _n) in enumerate(COLUMNS):
        col = table.column(i)
        if pa.types.is_dictionary(typ):
            col = pa.chunked_array([canonical_dictionary(col.combine_chunks()
                                                         if col.num_chunks != 1 else col.chunk(0))])
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=table.schema)


def canonical_dictionary(arr: pa.Array) -> pa.DictionaryArray:
    """The dictionary holds exactly the values used, in order of first use, so two equal
    columns compare equal whatever dictionary they were built or read with."""
    if not pa.types.is_dictionary(arr.type):
        arr = arr.cast(pa.string()).dictionary_encode()
    k = len(arr.dictionary)
    # Arrow's unique keeps the order of first occurrence: the dictionary entries used, in
    # order of first use, in one hash pass over the indices.
    order = pc.unique(arr.indices).drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
    valid = None if not arr.null_count else arr.indices.is_valid().to_numpy(zero_copy_only=False)
    if not len(order):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(arr), np.int32), mask=np.ones(len(arr), bool)),
                                              pa.array([], pa.string()))
    if len(order) == k and np.array_equal(order, np.arange(k)) and arr.dictionary.type == pa.string():
        return arr.cast(pa.dictionary(pa.int32(), pa.string()))  # already canonical
    remap = np.zeros(k, dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
    new_idx = pa.array(remap[idx], mask=None if valid is None else ~valid, type=pa.int32())
    dictionary = arr.dictionary.take(pa.array(order, type=pa.int64())).cast(pa.string())
    return pa.DictionaryArray.from_arrays(new_idx, dictionary)


def validate(table: pa.Table, *, where: str = "trace") -> None:
    """Check columns, types and per-row invariants; raise TraceFormatError naming the culprit."""
    names = set(table.column_names)
    missing = [c for c in COLUMN_NAMES if c not in names]
    if missing:
        raise TraceFormatError(
            f"{where}: missing column(s) {', '.join(missing)}",
            hint="is this an msprof-py trace table? import JSON traces with 'msprof-py import'",
        )
    for name, typ, nullable in COLUMNS:
        col = table.column(name)
        if col.type != typ and not (pa.types.is_dictionary(typ) and pa.types.is_dictionary(col.type)):
            raise TraceFormatError(f"{where}: column {name!r} has type {col.type}, expected {typ}")
        if not nullable and col.null_count:
            row = _first_null(col)
            raise TraceFormatError(f"{where}: column {name!r} is null at row {row}")
    dur = table.column("dur").to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(np.nan_to_num(dur.astype(np.float64), nan=0.0) < 0)
    if len(bad):
        raise TraceFormatError(f"{where}: negative 'dur' ({int(dur[bad[0]])} ns) at row {int(bad[0])}")
    kinds = table.column("kind").combine_chunks()
    unknown = set(kinds.dictionary.to_pylist()) - set(KINDS)
    if unknown:  # an error only when a row uses one: a dictionary may hold more than its rows use
        unknown = set(kinds.dictionary.take(pc.unique(kinds.indices)).to_pylist()) - set(KINDS)
    if unknown:
        raise TraceFormatError(f"{where}: unknown kind(s) {sorted(unknown)}; expected one of {', '.join(KINDS)}")


def _first_null(col: pa.ChunkedArray) -> int:
    mask = col.is_null().to_numpy(zero_copy_only=False)
    return int(np.flatnonzero(mask)[0])
