"""Recording: a compact row per trace event while the emulation runs, one table at the end.

The frequent rows (device tasks, host API slices, launch->task flows, counters) are packed as
int64s (strings replaced by codes) into byte buffers of their own, with only the fields that
vary; constant fields and the `args` JSON are made in Arrow, column-wise, when the table is
built. Rare rows (metadata, memory instants, steps) are full rows in the table's column order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from msprof_py.trace.schema import COLUMN_NAMES, Trace, TraceMeta, arrow_schema, canonical_dictionaries

#: Process ids: one host process per rank, one device process per (rank, device), one for links.
HOST_PID_BASE: Final = 1_000_000
DEVICE_PID_BASE: Final = 2_000_000
LINKS_PID: Final = 3_000_000

# Task buffer kinds (index into _TASK_KINDS).
K_KERNEL: Final = 0
K_MEMCPY: Final = 1
K_MEMSET: Final = 2
K_WAIT: Final = 3
K_RECORD: Final = 4
_TASK_KINDS = ("kernel", "memcpy", "memset", "wait", "marker")
# Counter units (index into _UNITS): the args key of the counter's one series.
U_DEPTH: Final = 0
U_BYTES: Final = 1
U_GBPS: Final = 2
_UNITS = ("depth", "bytes", "GB/s")


def host_pid(rank: int) -> int:
    return HOST_PID_BASE + rank


def device_pid(rank: int, device: int) -> int:
    return DEVICE_PID_BASE + rank * 1000 + device


class StringCodes(dict):
    """text -> code; a text seen for the first time gets the next code. Hot paths subscript it
    directly (`strings[name]`), which costs less than a call to Recorder.code."""

    def __missing__(self, text: str) -> int:
        code = self[text] = len(self)
        return code


@dataclass
class Switches:
    """What is recorded, in msprof's terms (`--task-time`, `--runtime-api`, ...)."""

    task_time: bool = True  # device tasks, launch->task flows, queue-depth counters
    runtime_api: bool = True  # host API slices
    memory: bool = True  # alloc/free instants and memory counters
    hccl: bool = True  # collective tasks
    sys_hardware_mem: bool = True  # link bandwidth counters


#: Widths of the packed numeric buffers (int64 fields per row).
TASK_W: Final = 16
API_W: Final = 13
FLOW_W: Final = 9
COUNTER_W: Final = 9
NULL: Final = -1  # stands for a missing value in the numeric buffers (all real values are >= 0)
#: One row of each buffer as bytes (native int64s): `buf += TASK_ROW(*fields)`. Packing costs
#: less than a tuple appended to a list and converted at the end, the buffer is one flat block
#: the garbage collector never walks, and it becomes a numpy array without a copy.
TASK_ROW: Final = struct.Struct(f"{TASK_W}q").pack
API_ROW: Final = struct.Struct(f"{API_W}q").pack
FLOW_ROW: Final = struct.Struct(f"{FLOW_W}q").pack
COUNTER_ROW: Final = struct.Struct(f"{COUNTER_W}q").pack


@dataclass
class Recorder:
    """Row buffers. The frequent row types are packed int64 rows (`buf += TASK_ROW(...)`),
    strings replaced by codes from `code()`; each buffer becomes a column block without a copy."""

    switches: Switches = field(default_factory=Switches)
    #: rank, device, pid, stream, ts, dur, name, kind, task_type, corr, blocks, waves, bytes, copy_kind,
    #: event_id, step
    tasks: bytearray = field(default_factory=bytearray)
    #: rank, pid, tid, name, ts, dur, kind, device, stream, corr, bytes, step, blocks
    apis: bytearray = field(default_factory=bytearray)
    #: rank, is_finish, ts, pid, tid, corr, device, stream, step
    flows: bytearray = field(default_factory=bytearray)
    #: rank, pid, name, ts, value, unit, device, stream, step (integer-valued counters)
    counters: bytearray = field(default_factory=bytearray)
    #: Full rows in COLUMN_NAMES order (metadata, memory instants, steps, float counters...).
    rows: list[tuple] = field(default_factory=list)
    strings: "StringCodes" = field(default_factory=lambda: StringCodes())
    _named: set = field(default_factory=set)

    def _buffer(self, name: str, width: int) -> np.ndarray | None:
        """A buffer's rows as an (n, width) int64 array; the recorder starts a new buffer."""
        packed = getattr(self, name)
        setattr(self, name, bytearray())  # the array shares the old buffer's memory
        if not packed:
            return None
        return np.frombuffer(packed, dtype=np.int64).reshape(-1, width)

    def take(self) -> "Chunk":
        """All rows recorded so far (the buffers are emptied)."""
        chunk = Chunk(self.rows, {name: self._buffer(name, width) for name, width, _ in _BUFFERS},
                      list(self.strings))
        self.rows = []
        return chunk

    def cut(self, before: int, floor: int) -> "Chunk | None":
        """Remove and return the rows with ts < `before`, for writing while recording goes on.

        Rows before an earlier cut were written already, so every row still buffered must have
        ts >= `floor` (that cut's `before`); when one does not (a row recorded late, such as
        a thread name given after the first cut), nothing is removed and None is returned."""
        if any(row[4] < floor for row in self.rows):
            return None
        views = {}
        for name, width, ts_col in _BUFFERS:
            packed = getattr(self, name)
            rows = np.frombuffer(packed, dtype=np.int64).reshape(-1, width) if packed else None
            if rows is not None and rows[:, ts_col].min() < floor:
                return None
            views[name] = rows
        out: dict[str, np.ndarray | None] = {}
        for name, _width, ts_col in _BUFFERS:
            rows = views[name]
            if rows is None:
                out[name] = None
                continue
            early = rows[:, ts_col] < before
            out[name] = rows[early] if early.any() else None
            setattr(self, name, bytearray(rows[~early].tobytes()))  # the rest, in recording order
        full = [row for row in self.rows if row[4] < before]
        self.rows = [row for row in self.rows if row[4] >= before]
        return Chunk(full, out, list(self.strings))

    def code(self, text: str) -> int:
        """A small integer standing for `text` in the numeric buffers (`strings[text]` is the same)."""
        return self.strings[text]

    def __len__(self) -> int:
        return (len(self.tasks) // (8 * TASK_W) + len(self.apis) // (8 * API_W) + len(self.flows) // (8 * FLOW_W)
                + len(self.counters) // (8 * COUNTER_W) + len(self.rows))

    # ------------------------------------------------------------------ metadata
    def name_process(self, rank: int, pid: int, name: str, label: str | None = None, sort: int | None = None) -> None:
        if ("p", pid) in self._named:
            return
        self._named.add(("p", pid))
        add = self.rows.append
        add(_meta(rank, pid, 0, "process_name", '{"name":%s}' % _q(name)))
        if label:
            add(_meta(rank, pid, 0, "process_labels", '{"labels":%s}' % _q(label)))
        if sort is not None:
            add(_meta(rank, pid, 0, "process_sort_index", '{"sort_index":%d}' % sort))

    def name_thread(self, rank: int, pid: int, tid: int, name: str) -> None:
        if ("t", pid, tid) in self._named:
            return
        self._named.add(("t", pid, tid))
        self.rows.append(_meta(rank, pid, tid, "thread_name", '{"name":%s}' % _q(name)))
        self.rows.append(_meta(rank, pid, tid, "thread_sort_index", '{"sort_index":%d}' % tid))

    # ------------------------------------------------------------------ finishing
    def to_trace(self, meta: TraceMeta) -> Trace:
        """All rows as one sorted, typed trace table (the buffers are emptied)."""
        return self.take().to_trace(meta)


#: The packed buffers: name, int64 fields per row, index of the ts field.
_BUFFERS = (("tasks", TASK_W, 4), ("apis", API_W, 4), ("flows", FLOW_W, 2), ("counters", COUNTER_W, 3))


class Chunk:
    """Rows taken out of a recorder: full rows, the packed buffers as arrays, the string table."""

    def __init__(self, rows: list[tuple], buffers: dict[str, np.ndarray | None], strings: list[str]) -> None:
        self.rows = rows
        self.buffers = buffers
        self.strings = strings

    def __len__(self) -> int:
        return len(self.rows) + sum(len(b) for b in self.buffers.values() if b is not None)

    def to_trace(self, meta: TraceMeta, *, canonical: bool = True) -> Trace:
        """The rows as one sorted, typed trace table. `canonical=False` leaves the dictionary
        columns as built (for a Parquet file: read_trace makes them canonical when it reads)."""
        strings = pa.array(self.strings, pa.string())
        # Column-major: each field a contiguous array, which Arrow takes without a strided copy.
        b = {name: None if rows is None else np.asfortranarray(rows) for name, rows in self.buffers.items()}
        # Full rows first: metadata (process / thread names) then leads each time group.
        parts = [t for t in (_rows_table(self.rows), _tasks_table(b["tasks"], strings),
                             _apis_table(b["apis"], strings), _flows_table(b["flows"]),
                             _counters_table(b["counters"], strings)) if t is not None]
        self.rows, self.buffers = [], {}
        table = pa.concat_tables(parts) if parts else _table(0, {})
        del parts
        # build_table's stable (rank, ts) sort and canonical dictionaries, the sort applied to
        # the whole table in one take (the parts already have the table's column types).
        order = np.lexsort((table.column("ts").to_numpy(), table.column("rank").to_numpy()))
        if not np.array_equal(order, np.arange(len(order))):
            table = table.take(order)
        table = table.combine_chunks()
        if canonical:
            table = canonical_dictionaries(table)
        return Trace(table=pa.Table.from_arrays(table.columns, schema=arrow_schema(meta)), meta=meta)


def _meta(rank: int, pid: int, tid: int, name: str, args: str) -> tuple:
    return (rank, "M", name, None, 0, None, pid, tid, None, args, None, "meta", None, None, None, None, None, None, None)


def _q(text: str) -> str:
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


# ---------------------------------------------------------------------- column builders
_DICT = pa.dictionary(pa.int32(), pa.string())
# The string columns the table stores dictionary-encoded are made so here, from the recorder's
# string codes: no per-row strings to build and hash again.
_PLAIN = {"rank": pa.int32(), "ph": _DICT, "name": _DICT, "cat": _DICT, "ts": pa.int64(),
          "dur": pa.int64(), "pid": pa.int64(), "tid": pa.int64(), "id": pa.string(), "args": pa.string(),
          "extra": pa.string(), "kind": _DICT, "device": pa.int32(), "stream": pa.int32(),
          "corr": pa.int64(), "bytes": pa.int64(), "addr": pa.int64(), "value": pa.float64(), "step": pa.int32()}
_SCHEMA = pa.schema([(c, _PLAIN[c]) for c in COLUMN_NAMES])


def _table(n: int, cols: dict) -> pa.Table:
    arrays = []
    for name in COLUMN_NAMES:
        typ = _PLAIN[name]
        v = cols.get(name)
        if v is None:
            arrays.append(pa.nulls(n, typ))
        elif isinstance(v, str) and typ == _DICT:
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([v], pa.string())))
        elif isinstance(v, (str, int, float)):
            arrays.append(pa.array(np.full(n, v) if not isinstance(v, str) else [v] * n, type=typ))
        elif isinstance(v, (pa.Array, pa.ChunkedArray)):
            arrays.append(v.cast(typ) if v.type != typ else v)
        elif isinstance(v, np.ndarray):
            arrays.append(pa.array(v).cast(typ))
        else:
            arrays.append(pa.array(v, type=typ))
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def _decode(col: np.ndarray, strings: pa.Array) -> pa.Array:
    """String codes as a dictionary column over all the recorder's strings."""
    return pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int32)), strings)


# A buffer's columns are computed by one Arrow (Acero) projection per buffer: the expressions
# below run batch by batch in C++, in a single call that does not hold the GIL, so a cut built
# in the writer thread barely competes with the emulation for it.
def _field(i: int) -> pc.Expression:
    return pc.field(f"c{i}")


def _num(i: int, typ: pa.DataType | None = None) -> pc.Expression:
    """Buffer field i as `typ` (int64 by default), NULL (-1) as null."""
    typ = typ or pa.int64()
    return pc.if_else(pc.equal(_field(i), NULL), pc.scalar(pa.scalar(None, typ)), _field(i).cast(typ))


def _str(e: pc.Expression) -> pc.Expression:
    return e.cast(pa.string())


def _cat(*parts: "pc.Expression | str") -> pc.Expression:
    """Text parts (expressions or literal strings) joined; null if any part is null."""
    return pc.binary_join_element_wise(*[p if isinstance(p, pc.Expression) else pc.scalar(p) for p in parts],
                                       pc.scalar(""))


def _project(g: np.ndarray, outputs: dict[str, pc.Expression], **inputs: pa.Array) -> dict[str, pa.ChunkedArray]:
    """Evaluate `outputs` over the buffer rows `g` (fields c0, c1, ...) and extra `inputs`."""
    # The fields as slices of one array: one numpy-to-Arrow conversion rather than one per
    # field, each of which lets go of the GIL and must win it back from the emulation (in the
    # writer thread that wait, not the work, was most of a cut's build time).
    n, width = g.shape
    flat = pa.array(g.ravel(order="F"))
    source = pa.table({**{f"c{i}": flat.slice(i * n, n) for i in range(width)}, **inputs})
    plan = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(source)),
        acero.Declaration("project", acero.ProjectNodeOptions(list(outputs.values()), list(outputs)))])
    out = plan.to_table(use_threads=False)
    return {name: out.column(name) for name in outputs}


# The projections, made once: an expression is immutable, and building one is Python work the
# writer thread would otherwise do (holding the GIL the emulation needs) at every cut.
_T_STREAM = _num(3, pa.int32())
_TASK_COLUMNS = {
    "rank": _field(0).cast(pa.int32()), "ts": _field(4), "dur": _field(5), "pid": _field(2),
    "tid": _T_STREAM.cast(pa.int64()), "device": _num(1, pa.int32()), "stream": _T_STREAM, "corr": _num(9),
    "bytes": _num(12), "step": _num(15, pa.int32()),
}
_TASK_HEAD = ('{"Task Type":"', pc.field("task_type"), '","Stream Id":', _str(_T_STREAM), ',"Task Id":',
              _str(_num(9)))
_EVENT_ARGS = _cat(*_TASK_HEAD, ',"Event Id":', _str(_field(14)), "}")
#: The `args` of each task kind's rows; each is evaluated over that kind's rows only.
_TASK_ARGS = {
    K_KERNEL: _cat(*_TASK_HEAD, ',"Block Dim":', _str(_field(10)), ',"Waves":', _str(_field(11)), "}"),
    K_MEMCPY: _cat(*_TASK_HEAD, ',"size(Byte)":', _str(_field(12)), ',"Copy Kind":"', pc.field("copy_kind"), '"}'),
    K_MEMSET: _cat(*_TASK_HEAD, ',"size(Byte)":', _str(_field(12)), "}"),
    K_WAIT: _EVENT_ARGS,
    K_RECORD: _EVENT_ARGS,
}
_TASK_KIND_NAMES = pa.array(_TASK_KINDS, pa.string())

_API_TID = _num(2)
_API_COLUMNS = {
    "rank": _field(0).cast(pa.int32()), "ts": _field(4), "dur": _field(5), "pid": _field(1), "tid": _API_TID,
    "args": _cat('{"Thread Id":', _str(_API_TID),
                 pc.if_else(pc.equal(_field(8), NULL), pc.scalar(""), _cat(',"Stream Id":', _str(_field(8)))),
                 pc.if_else(pc.equal(_field(12), NULL), pc.scalar(""), _cat(',"Block Dim":', _str(_field(12)))),
                 "}"),
    "device": _num(7, pa.int32()), "stream": _num(8, pa.int32()), "corr": _num(9), "bytes": _num(10),
    "step": _num(11, pa.int32()),
}

_FLOW_COLUMNS = {
    "rank": _field(0).cast(pa.int32()), "ts": _field(2), "pid": _field(3), "tid": _field(4), "id": _str(_num(5)),
    "extra": pc.if_else(pc.equal(_field(1), 1), pc.scalar('{"bp":"e"}'), pc.scalar(pa.scalar(None, pa.string()))),
    "device": _num(6, pa.int32()), "stream": _num(7, pa.int32()), "corr": _num(5), "step": _num(8, pa.int32()),
}
_FLOW_PH = pa.array(["s", "f"])

_C_UNIT = _field(5)
_COUNTER_COLUMNS = {
    "rank": _field(0).cast(pa.int32()), "ts": _field(3), "pid": _field(1),
    "args": _cat(pc.if_else(pc.equal(_C_UNIT, U_DEPTH), pc.scalar('{"%s":' % _UNITS[U_DEPTH]),
                 pc.if_else(pc.equal(_C_UNIT, U_BYTES), pc.scalar('{"%s":' % _UNITS[U_BYTES]),
                            pc.scalar('{"%s":' % _UNITS[U_GBPS]))),
                 _str(_field(4)), "}"),
    "device": _num(6, pa.int32()), "stream": _num(7, pa.int32()),
    "value": _field(4).cast(pa.float64(), safe=False), "step": _num(8, pa.int32()),
}


def _task_inputs(g: np.ndarray, strings: pa.Array) -> dict[str, pa.Array]:
    """The string fields a task row's args quote, decoded."""
    return {"task_type": strings.take(pa.array(g[:, 8])),
            "copy_kind": strings.take(pa.array(np.maximum(g[:, 13], 0)))}


def _tasks_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    kind_codes = g[:, 7]
    present = np.unique(kind_codes).tolist()
    if len(present) == 1:  # one kind (often all kernels): one projection does it all
        cols = _project(g, {**_TASK_COLUMNS, "args": _TASK_ARGS[present[0]]}, **_task_inputs(g, strings))
    else:
        # Each kind's args over its own rows, put back in place: an if_else over the kinds
        # would format every row once per kind.
        cols = _project(g, _TASK_COLUMNS)
        args: pa.Array = pa.nulls(len(g), pa.string())
        for code in present:
            mask = kind_codes == code
            sub = g[mask]
            part = _project(sub, {"args": _TASK_ARGS[code]}, **_task_inputs(sub, strings))["args"]
            args = pc.replace_with_mask(args, pa.array(mask), part.combine_chunks())
        cols["args"] = args
    kinds = pa.DictionaryArray.from_arrays(pa.array(kind_codes.astype(np.int32)), _TASK_KIND_NAMES)
    return _table(len(g), {**cols, "ph": "X", "name": _decode(g[:, 6], strings), "kind": kinds})


def _apis_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    cols = _project(g, _API_COLUMNS)
    return _table(len(g), {**cols, "ph": "X", "name": _decode(g[:, 3], strings), "cat": "AscendCL",
                           "kind": _decode(g[:, 6], strings)})


def _flows_table(g: np.ndarray | None) -> pa.Table | None:
    if g is None:
        return None
    cols = _project(g, _FLOW_COLUMNS)
    ph = pa.DictionaryArray.from_arrays(pa.array((g[:, 1] == 1).astype(np.int32)), _FLOW_PH)
    return _table(len(g), {**cols, "ph": ph, "name": "HostToDevice", "cat": "HostToDevice", "kind": "flow"})


def _counters_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    cols = _project(g, _COUNTER_COLUMNS)
    return _table(len(g), {**cols, "ph": "C", "name": _decode(g[:, 2], strings), "tid": 0, "kind": "counter"})


def _rows_table(rows: list[tuple]) -> pa.Table | None:
    if not rows:
        return None
    cols = dict(zip(COLUMN_NAMES, map(list, zip(*rows))))
    return _table(len(rows), cols)
