"""A chunk of recorded rows as one sorted trace table.

Two builds give the same table. The native one (`_rowtable.c`, compiled at install when a C
compiler is there) sorts the rows and writes every column straight into Arrow buffers, on the
cores side by side, with no Python object per row; it covers what the recorder writes and
declines anything else (it returns None). The Arrow one below, interpreted (setup.py
compiles the recording, not this), is a few dozen Arrow and numpy calls per chunk, whoever
runs them: it builds what the native one declines, and everything when that one is not built
or `MSPROF_PY_PURE=1` runs the pure-Python emulator.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from msprof_py.trace.schema import COLUMN_NAMES, COLUMNS, canonical_dictionaries
from runtime_emu._loader import native
from runtime_emu.recorder import (
    _FIXED_CODES,
    _UNITS,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    K_RECORD,
    K_WAIT,
    NULL,
    U_BYTES,
    U_DEPTH,
    U_GBPS,
)

# A chunk becomes a table in one Acero projection per buffer, which maps the buffer's int64
# fields to the columns its rows have (the others are null), and one sort by (rank, ts), ties
# in recording order (the full rows, then tasks, API slices, flows, counters, each in the
# order recorded: build_table's stable sort). The text columns stored as dictionaries (ph,
# name, cat, kind) go through as codes into the recorder's strings and become dictionary
# columns at the end; the strings the build itself writes have fixed codes
# (recorder._FIXED_CODES), so the projections are made once, here. That matters in the
# streaming writer thread: each Arrow or numpy call a build makes lets go of the GIL and has
# to win it back from the emulation, and those waits, not the work, were most of a build's
# time there (a 98k-row cut: 228 such calls before, 86 now).
_I32 = pa.int32()
_I64 = pa.int64()
#: The columns' types inside the plan: the dictionary columns as int32 codes.
_PLAN_TYPES = {"rank": _I32, "ph": _I32, "name": _I32, "cat": _I32, "ts": _I64, "dur": _I64, "pid": _I64,
               "tid": _I64, "id": pa.string(), "args": pa.string(), "extra": pa.string(), "kind": _I32,
               "device": _I32, "stream": _I32, "corr": _I64, "bytes": _I64, "addr": _I64, "value": pa.float64(),
               "step": _I32}
_DICT_COLUMNS = ("ph", "name", "cat", "kind")


def _field(i: int) -> pc.Expression:
    return pc.field(f"c{i}")


def _num(i: int, typ: pa.DataType | None = None) -> pc.Expression:
    """Buffer field i as `typ` (int64 by default); a nullable field's NULL (-1) is null already
    (the source masks it: see _NULLABLE)."""
    return _field(i) if typ is None else _field(i).cast(typ)


def _str(e: pc.Expression) -> pc.Expression:
    return e.cast(pa.string())


def _cat(*parts: "pc.Expression | str") -> pc.Expression:
    """Text parts (expressions or literal strings) joined; null if any part is null."""
    return pc.binary_join_element_wise(*[p if isinstance(p, pc.Expression) else pc.scalar(p) for p in parts],
                                       pc.scalar(""))


def _present(*parts: pc.Expression) -> pc.Expression:
    """Text parts joined, a null part left out (as an empty text: Arrow's "skip" drops rows
    whose parts are all null). One kernel, where an if_else per part was three."""
    return pc.binary_join_element_wise(*parts, pc.scalar(""), null_handling="replace", null_replacement="")


def _code(text: str) -> pc.Expression:
    """The dictionary code of one of the recorder's fixed strings, as a literal."""
    return pc.scalar(pa.scalar(_FIXED_CODES[text], _I32))


def _projection(columns: dict[str, pc.Expression]) -> acero.ProjectNodeOptions:
    """The columns a buffer has, in the table's order (the others are added as nulls)."""
    names = [name for name in COLUMN_NAMES if name in columns]
    return acero.ProjectNodeOptions([columns[name] for name in names], names)


#: Per type, an all-null array sliced for the columns a part lacks (a slice allocates nothing,
#: where a null literal in a projection fills a buffer); grown as needed.
_NULLS: dict[pa.DataType, pa.Array] = {}


def _nulls(typ: pa.DataType, n: int) -> pa.Array:
    have = _NULLS.get(typ)
    if have is None or len(have) < n:
        have = _NULLS[typ] = pa.nulls(max(n, 1 << 16, 2 * len(have) if have is not None else 0), typ)
    return have.slice(0, n)


def _complete(part: pa.Table) -> pa.Table:
    """A part with all the table's columns, in order (nulls where it has none)."""
    n = part.num_rows
    return pa.Table.from_arrays([part.column(name) if name in part.column_names else _nulls(_PLAN_TYPES[name], n)
                                 for name in COLUMN_NAMES], names=list(COLUMN_NAMES))


_T_STREAM = _num(3, _I32)
_TASK_COLUMNS = {
    "rank": _field(0).cast(_I32), "ph": _code("X"), "name": _field(6).cast(_I32), "ts": _field(4),
    "dur": _field(5), "pid": _field(2), "tid": _T_STREAM.cast(_I64), "kind": _field(7).cast(_I32),
    "device": _num(1, _I32), "stream": _T_STREAM, "corr": _num(9), "bytes": _num(12), "step": _num(15, _I32),
}
_TASK_HEAD = ('{"Task Type":"', pc.field("task_type"), '","Stream Id":', _str(_T_STREAM), ',"Task Id":',
              _str(_num(9)))
#: A kernel's shape: value = its block dim, addr = the cores of its pool (a wait's event id field).
#: Field 14 is not a nullable field (a wait's event id is never NULL), so NULL (-1) is masked here.
_KERNEL_SHAPE = {"value": _field(10).cast(pa.float64()),
                 "addr": pc.if_else(pc.equal(_field(14), -1), pa.scalar(None, pa.int64()), _field(14))}
#: An event wait's or record's addr: its event (the wait and the record that releases it share it).
_EVENT_ID = {"addr": _field(14)}
_EVENT_ARGS = _cat(*_TASK_HEAD, ',"Event Id":', _str(_field(14)), "}")
#: Per task kind, the projection of its rows: each kind's args is evaluated over its own rows
#: only (an if_else over the kinds would format every row once per kind).
_TASK_PROJECTIONS = {
    kind: _projection({**_TASK_COLUMNS, **(_KERNEL_SHAPE if kind == K_KERNEL else _EVENT_ID if kind in (K_WAIT, K_RECORD)
                                           else {}), "args": args})
    for kind, args in (
        (K_KERNEL, _cat(*_TASK_HEAD, ',"Block Dim":', _str(_field(10)), ',"Waves":', _str(_field(11)),
                        ',"OP Type":"', pc.field("op_type"), '"}')),
        (K_MEMCPY, _cat(*_TASK_HEAD, ',"size(Byte)":', _str(_field(12)), ',"Copy Kind":"', pc.field("copy_kind"),
                        '"}')),
        (K_MEMSET, _cat(*_TASK_HEAD, ',"size(Byte)":', _str(_field(12)), "}")),
        (K_WAIT, _EVENT_ARGS),
        (K_RECORD, _EVENT_ARGS))
}

_API_TID = _num(2)
_API_PROJECTION = _projection({
    "rank": _field(0).cast(_I32), "ph": _code("X"), "name": _field(3).cast(_I32), "cat": _code("AscendCL"),
    "ts": _field(4), "dur": _field(5), "pid": _field(1), "tid": _API_TID,
    "args": _cat('{"Thread Id":', _str(_API_TID),
                 # The members only some calls have, each null (so left out) where its field is.
                 _present(_cat(',"Stream Id":', _str(_field(8))),
                          _cat(',"Block Dim":', _str(_field(12))),
                          # Why the call held its thread past its own overhead, and for how long.
                          _cat(',"Blocked":"', pc.field("blocked"), '","Blocked (ns)":', _str(_field(14))),
                          _cat(',"Src Addr":', _str(_field(15))),
                          _cat(',"Dst Addr":', _str(_field(16)))),
                 "}"),
    "kind": _field(6).cast(_I32), "device": _num(7, _I32), "stream": _num(8, _I32), "corr": _num(9),
    "bytes": _num(10), "addr": _num(16), "step": _num(11, _I32),
})

_FLOW_PROJECTION = _projection({
    "rank": _field(0).cast(_I32), "ph": pc.if_else(pc.equal(_field(1), 1), _code("f"), _code("s")),
    "name": _code("HostToDevice"), "cat": _code("HostToDevice"), "ts": _field(2), "pid": _field(3),
    "tid": _field(4), "id": _str(_num(5)),
    "extra": pc.if_else(pc.equal(_field(1), 1), pc.scalar('{"bp":"e"}'), pc.scalar(pa.scalar(None, pa.string()))),
    "kind": _code("flow"), "device": _num(6, _I32), "stream": _num(7, _I32), "corr": _num(5), "step": _num(8, _I32),
})

_C_UNIT = _field(5)
_COUNTER_PROJECTION = _projection({
    "rank": _field(0).cast(_I32), "ph": _code("C"), "name": _field(2).cast(_I32), "ts": _field(3), "pid": _field(1),
    "tid": pc.scalar(0),
    "args": _cat(pc.if_else(pc.equal(_C_UNIT, U_DEPTH), pc.scalar('{"%s":' % _UNITS[U_DEPTH]),
                 pc.if_else(pc.equal(_C_UNIT, U_BYTES), pc.scalar('{"%s":' % _UNITS[U_BYTES]),
                            pc.scalar('{"%s":' % _UNITS[U_GBPS]))),
                 _str(_field(4)), "}"),
    "kind": _code("counter"), "device": _num(6, _I32), "stream": _num(7, _I32),
    "value": _field(4).cast(pa.float64(), safe=False), "step": _num(8, _I32),
})



#: Per buffer, the fields that may hold NULL and are read as nullable (_num, _present): the
#: source gives them validity masks. The other fields are read as they are.
_NULLABLE: dict[str, tuple[int, ...]] = {"tasks": (1, 3, 9, 12, 15), "apis": (2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
                                         "flows": (5, 6, 7, 8), "counters": (6, 7, 8)}

#: Rows per block of the column-major copy (16k rows of <= 17 int64 fields: 2 MiB, cache-sized).
_BLOCK_ROWS = 1 << 14


def _column_major(g: np.ndarray) -> np.ndarray:
    """An (n, width) row-major buffer as the same array in column-major order, copied a block
    of rows at a time: np.asfortranarray's one pass writes `width` far-apart streams at once
    and took over twice as long (2.4M rows: 0.23 s against 0.10 s)."""
    n, width = g.shape
    out = np.empty((width, n), dtype=g.dtype)
    for start in range(0, n, _BLOCK_ROWS):
        out[:, start:start + _BLOCK_ROWS] = g[start:start + _BLOCK_ROWS].T
    return out.T


def _source(g: np.ndarray, nullable: tuple[int, ...], inputs: dict[str, pa.Array] | None = None) -> acero.Declaration:
    """A buffer's rows (fields c0, c1, ...) as a plan source: the fields are slices of one
    array, one numpy-to-Arrow conversion rather than one per field; each `nullable` field
    holding NULL gets a validity mask instead (numpy finds them faster than an Arrow
    comparison and selection per field in each projection)."""
    n, width = g.shape
    flat = pa.array(g.ravel(order="F"))
    cols = {f"c{i}": flat.slice(i * n, n) for i in range(width)}
    for i in nullable:
        field = g[:, i]
        missing = field == NULL
        if missing.any():
            cols[f"c{i}"] = pa.array(field, mask=missing)
    if inputs:
        cols.update(inputs)
    return acero.Declaration("table_source", acero.TableSourceNodeOptions(pa.table(cols)))


def _json_quoted(strings: pa.Array) -> pa.Array:
    """Each string as it stands between the quotes of a JSON string."""
    return pa.array([json.dumps(s, ensure_ascii=False)[1:-1] for s in strings.to_pylist()], pa.string())


def _task_inputs(g: np.ndarray, strings: pa.Array) -> dict[str, pa.Array]:
    """The string fields a task row's args quote, decoded."""
    text13 = pa.array(np.maximum(g[:, 13], 0))
    return {"task_type": strings.take(pa.array(g[:, 8])), "copy_kind": strings.take(text13),
            # a kernel's op type may be any name a program gave it: quoted for JSON (per distinct string)
            "op_type": _json_quoted(strings).take(text13)}


def _branches(buffers: dict[str, np.ndarray | None], strings: pa.Array,
              start: int) -> tuple[list[acero.Declaration], list[tuple[int, int, np.ndarray | None]]]:
    """One source-and-projection per buffer (per task kind, when a cut holds several), in
    recording order, and where each one's rows stand in it: (first position, row count,
    positions relative to the first when a task kind's rows were picked out, else None)."""
    out: list[Any] = []
    positions: list[tuple[int, int, np.ndarray | None]] = []
    g = buffers["tasks"]
    if g is not None:
        kinds = g[:, 7]
        present = np.unique(kinds).tolist()
        if len(present) == 1:
            out.append((_source(g, _NULLABLE["tasks"], _task_inputs(g, strings)), _TASK_PROJECTIONS[present[0]]))
            positions.append((start, len(g), None))
        else:
            for kind in present:
                where = np.flatnonzero(kinds == kind)
                sub = g[where]
                out.append((_source(sub, _NULLABLE["tasks"], _task_inputs(sub, strings)), _TASK_PROJECTIONS[kind]))
                positions.append((start, len(where), where))
        start += len(g)
    for name, projection in (("apis", _API_PROJECTION), ("flows", _FLOW_PROJECTION),
                             ("counters", _COUNTER_PROJECTION)):
        g = buffers[name]
        if g is not None:
            # An API slice's blocking reason is a string code, decoded for its args.
            inputs = {"blocked": strings.take(pa.array(np.maximum(g[:, 13], 0)))} if name == "apis" else None
            out.append((_source(g, _NULLABLE[name], inputs), projection))
            positions.append((start, len(g), None))
            start += len(g)
    return [acero.Declaration.from_sequence([src, acero.Declaration("project", proj)]) for src, proj in out], positions


def _rows_table(rows: list[tuple], strings: list[str]) -> pa.Table:
    """The full rows as a table of the plan's types, their dictionary text coded (new texts
    appended to `strings`)."""
    cols: dict[str, pa.Array] = {}
    codes = {text: i for i, text in enumerate(strings)}
    for name, values in zip(COLUMN_NAMES, zip(*rows)):
        if name in _DICT_COLUMNS:
            # Arrow dictionary-encodes the texts; the few distinct ones are looked up here.
            encoded = pa.array(values, pa.dictionary(_I32, pa.string()))
            remap = []
            for text in encoded.dictionary.to_pylist():
                code = codes.get(text)
                if code is None:
                    code = codes[text] = len(strings)
                    strings.append(text)
                remap.append(code)
            cols[name] = pa.array(remap, _I32).take(encoded.indices)
        else:
            cols[name] = pa.array(values, _PLAN_TYPES[name])
    return pa.table(cols)


_T = TypeVar("_T")
_R = TypeVar("_R")
#: Threads a build on the main thread uses (Arrow and numpy let go of the GIL in the work).
MAX_WORKERS = 4


def _workers() -> int:
    """How many threads a build may use: the cores (up to MAX_WORKERS) when it runs on the main
    thread, the program's own (finish() at the end of a run, when nothing else is running);
    one in any other thread, such as the streaming writer's, which shares the cores with the
    emulation."""
    if threading.current_thread() is not threading.main_thread():
        return 1
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def _map(fn: Callable[[_T], _R], items: Iterable[_T], workers: int) -> list[_R]:
    """[fn(item) for item in items], in order, on `workers` threads."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    try:
        with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="emu-table") as pool:
            return list(pool.map(fn, items))
    except RuntimeError as exc:
        # At interpreter exit (a profiled program's last flush) no new thread can start:
        # the same work, one item at a time.
        if "interpreter shutdown" not in str(exc):
            raise
        return [fn(item) for item in items]


def _run_plan(plan: acero.Declaration) -> pa.Table:
    return _complete(plan.to_table(use_threads=False))


#: The MiB of blocks the native build keeps for the next recording and build in the process when a
#: table or the recorder's row buffers let go of them (_rowtable.c, "a pool of big blocks";
#: _rowbuf.h): memory new from the kernel costs a page fault per 4 KiB, several microseconds each
#: on VMs that give freed memory back to their host.
POOL_ENV = "MSPROF_PY_POOL_MB"
POOL_DEFAULT_MB = 1024
_pool_configured = False


def native_module() -> Any:
    """The compiled table builder, or None when it is not built or MSPROF_PY_PURE=1."""
    module = native("_rowtable")
    if module is not None and not _pool_configured:
        _configure_pool(module)
    return module


def pool_limit_mb(text: str | None) -> int:
    """MSPROF_PY_POOL_MB's value as MiB (unset or empty: the default); ValueError when it is not
    a whole number >= 0."""
    if text is None or not text.strip():
        return POOL_DEFAULT_MB
    try:
        mb = int(text)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(f"{POOL_ENV}={text!r} is not a whole number of MiB >= 0: set it to the memory the trace "
                         f"build may keep for reuse (0 keeps none) or unset it ({POOL_DEFAULT_MB} MiB)")
    return mb


def _configure_pool(module: Any) -> None:
    global _pool_configured
    module.set_pool_limit(pool_limit_mb(os.environ.get(POOL_ENV)) << 20)
    _pool_configured = True


def release_memory() -> None:
    """Free the blocks the native build keeps for reuse (its pool); a no-op without it."""
    module = native_module()
    if module is not None:
        module.release_pool()


def state() -> str:
    """For `msprof-py --version`: which build makes the trace table."""
    if native_module() is not None:
        return "native"
    return "Arrow; MSPROF_PY_PURE=1" if os.environ.get("MSPROF_PY_PURE") == "1" else \
        "Arrow; native build not compiled, reinstall with a C compiler"


def build(chunk: Any, schema: pa.Schema, *, canonical: bool = True) -> pa.Table:
    """A recorder Chunk's rows as one table sorted by (rank, ts), ties in recording order, its
    dictionary columns canonical (schema.canonical_dictionary) unless `canonical` is False
    (then they may be as the Arrow build made them). The chunk is emptied."""
    native = native_module()
    if native is not None:
        table = build_native(native, chunk, schema)
        if table is not None:
            return table
    table = build_arrow(chunk, schema)
    return canonical_dictionaries(table) if canonical else table


#: The recorder's fixed codes the native build writes, in its order (FX_* in _rowtable.c).
_NATIVE_FIXED = tuple(_FIXED_CODES[text] for text in ("X", "s", "f", "C", "HostToDevice", "AscendCL", "flow",
                                                       "counter"))


def _rows_of(buffers: dict[str, np.ndarray | None], name: str) -> np.ndarray | None:
    g = buffers.get(name)
    return None if g is None else np.ascontiguousarray(g, dtype=np.int64)


def build_native(native: Any, chunk: Any, schema: pa.Schema) -> pa.Table | None:
    """The table from the native builder, its dictionary columns canonical; None (the chunk
    left as it was) when the builder declines the rows."""
    strings = list(chunk.strings)
    buffers = chunk.buffers
    quoted = [json.dumps(s, ensure_ascii=False)[1:-1] for s in strings]
    out = native.build(_rows_of(buffers, "tasks"), _rows_of(buffers, "apis"), _rows_of(buffers, "flows"),
                       _rows_of(buffers, "counters"), chunk.rows, strings, quoted, _NATIVE_FIXED, _UNITS, _workers())
    if out is None:
        return None
    chunk.rows, chunk.buffers = [], {}
    n, columns = out
    arrays = []
    for (_name, typ, _nullable), (valid, nulls, data, offsets, values) in zip(COLUMNS, columns):
        bitmap = None if valid is None else pa.py_buffer(valid)
        if values is not None:
            codes = pa.Array.from_buffers(_I32, n, [bitmap, pa.py_buffer(data)], null_count=nulls)
            arrays.append(pa.DictionaryArray.from_arrays(codes, pa.array(values, pa.string())))
        elif offsets is not None:
            arrays.append(pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                                null_count=nulls))
        else:
            arrays.append(pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(data)], null_count=nulls))
    return pa.Table.from_arrays(arrays, schema=schema)


def build_arrow(chunk: Any, schema: pa.Schema) -> pa.Table:
    """A recorder Chunk's rows as one table sorted by (rank, ts), ties in recording order, with
    Arrow compute (the dictionary columns as built, not canonical).
    The chunk is emptied as the build goes, so its buffers are freed as soon as they are copied.
    On the main thread the independent steps (a buffer's column-major copy, a buffer's
    projection, a column's sort) run on the cores side by side: the table comes out the same."""
    workers = _workers()
    rows, strings = chunk.rows, list(chunk.strings)
    # Column-major: each field a contiguous run of the flat array the source slices.
    names = list(chunk.buffers)
    copies = _map(lambda g: None if g is None else _column_major(g), [chunk.buffers[n] for n in names], workers)
    fortran = dict(zip(names, copies))
    del copies
    chunk.rows, chunk.buffers = [], {}
    parts = [_rows_table(rows, strings)] if rows else []  # adds the full rows' new texts
    positions: list[tuple[int, int, np.ndarray | None]] = [(0, len(rows), None)] if rows else []
    dictionary = pa.array(strings, pa.string())
    branches, more = _branches(fortran, dictionary, len(rows))
    positions += more
    del rows, fortran
    if workers > 1:
        parts += _map(_run_plan, branches, workers)
        branches = []
    while branches:  # one plan per branch, its source freed once it has run
        parts.append(_run_plan(branches.pop(0)))
    if not parts:
        return schema.empty_table()
    # Each branch is its own plan and the sort is numpy's: an Acero union and order_by, run
    # from the streaming writer thread, corrupted the interpreter's memory (a crash in a loop
    # of short streamed runs, with the compiled core only).
    out = pa.concat_tables(parts)
    del parts
    keys = [out.column("ts").to_numpy(), out.column("rank").to_numpy()]
    if any(where is not None for _start, _count, where in positions):
        # A task kind's rows were picked out: ties go by the position each row was recorded at.
        keys.insert(0, np.concatenate([np.arange(start, start + count) if where is None else start + where
                                       for start, count, where in positions]))
    order = np.lexsort(keys)  # stable: rows of one ts keep recording order
    del keys
    if np.array_equal(order, np.arange(len(order))):
        out = out.combine_chunks()
    else:
        # Column by column, each made one array first: a table's take over its chunked columns
        # took about twice as long (2.4M rows: 0.44-0.60 s against 0.24 s).
        index = pa.array(order)
        unsorted = out
        out = pa.Table.from_arrays(_map(lambda i: pa.concat_arrays(unsorted.column(i).chunks).take(index),
                                        range(unsorted.num_columns), workers), schema=unsorted.schema)
        del index, unsorted
    del order
    columns = [_dictionary_column(out.column(name).chunk(0), dictionary) if name in _DICT_COLUMNS
               else out.column(name) for name in COLUMN_NAMES]
    return pa.Table.from_arrays(columns, schema=schema)


#: Above this many strings a dictionary column keeps only the ones its rows use.
TRIM_ABOVE = 256


def _dictionary_column(codes: pa.Array, dictionary: pa.Array) -> pa.DictionaryArray:
    """Codes into the recorder's strings as a dictionary column. A job with many strings
    (a multi-rank one: every rank's kernel names) would otherwise write them all into every
    row group's dictionary pages, 8% of a 16-rank streamed trace."""
    if len(dictionary) <= TRIM_ABOVE:
        return pa.DictionaryArray.from_arrays(codes, dictionary)
    used = pc.unique(codes).drop_null()
    return pa.DictionaryArray.from_arrays(pc.index_in(codes, value_set=used).cast(_I32), dictionary.take(used))
