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
import pyarrow.compute as pc

from msprof_py.trace.schema import COLUMN_NAMES, Trace, TraceMeta, build_table

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

    def to_trace(self, meta: TraceMeta) -> Trace:
        """The rows as one sorted, typed trace table."""
        strings = pa.array(self.strings, pa.string())
        # Column-major: each field a contiguous array, which Arrow takes without a strided copy.
        b = {name: None if rows is None else np.asfortranarray(rows) for name, rows in self.buffers.items()}
        # Full rows first: metadata (process / thread names) then leads each time group.
        parts = [t for t in (_rows_table(self.rows), _tasks_table(b["tasks"], strings),
                             _apis_table(b["apis"], strings), _flows_table(b["flows"]),
                             _counters_table(b["counters"], strings)) if t is not None]
        self.rows, self.buffers = [], {}
        table = pa.concat_tables(parts) if parts else _table(0, {})
        cols = {name: table.column(name) for name in COLUMN_NAMES}
        del table, parts
        return build_table(cols, meta)


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


def _text(values) -> pa.Array:
    """Numbers as decimal text (ints stay ints: no '.0')."""
    arr = values if isinstance(values, pa.Array) else pa.array(values)
    return arr.cast(pa.string())


def _join(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _ints(col: np.ndarray, typ: pa.DataType | None = None) -> pa.Array:
    """A numeric buffer column as Arrow, NULL (-1) as null."""
    null = col == NULL
    return pa.array(col, mask=null if null.any() else None).cast(typ or pa.int64())


def _decode(col: np.ndarray, strings: pa.Array) -> pa.Array:
    """String codes as a dictionary column over all the recorder's strings."""
    return pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int32)), strings)


def _text_of(col: np.ndarray, strings: pa.Array) -> pa.Array:
    """String codes as plain text (for building args)."""
    return strings.take(pa.array(col))


def _tasks_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    n = len(g)
    kind_np = g[:, 7].astype(np.int8)
    stream_a, corr_a = _ints(g[:, 3], pa.int32()), _ints(g[:, 9])
    head = _join('{"Task Type":"', _text_of(g[:, 8], strings), '","Stream Id":', _text(stream_a),
                 ',"Task Id":', _text(corr_a))
    bytes_a = _ints(g[:, 12])
    tail_kernel = _join(',"Block Dim":', _text(pa.array(g[:, 10])), ',"Waves":', _text(pa.array(g[:, 11])), "}")
    copy_code = np.maximum(g[:, 13], 0)
    tail_copy = _join(',"size(Byte)":', _text(pa.array(g[:, 12])), ',"Copy Kind":"', _text_of(copy_code, strings),
                      '"}')
    tail_set = _join(',"size(Byte)":', _text(pa.array(g[:, 12])), "}")
    tail_event = _join(',"Event Id":', _text(pa.array(g[:, 14])), "}")
    tail = pc.if_else(pa.array(kind_np == K_KERNEL), tail_kernel,
                      pc.if_else(pa.array(kind_np == K_MEMCPY), tail_copy,
                                 pc.if_else(pa.array(kind_np == K_MEMSET), tail_set, tail_event)))
    kinds = pa.DictionaryArray.from_arrays(pa.array(kind_np.astype(np.int32)), pa.array(_TASK_KINDS, pa.string()))
    return _table(n, {"rank": g[:, 0], "ph": "X", "name": _decode(g[:, 6], strings), "ts": g[:, 4], "dur": g[:, 5],
                      "pid": g[:, 2], "tid": stream_a, "args": _join(head, tail), "kind": kinds,
                      "device": _ints(g[:, 1], pa.int32()), "stream": stream_a, "corr": corr_a, "bytes": bytes_a,
                      "step": _ints(g[:, 15], pa.int32())})


def _apis_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    n = len(g)
    tid_a, stream_a, blocks_a = _ints(g[:, 2]), _ints(g[:, 8], pa.int32()), _ints(g[:, 12])
    stream_part = pc.if_else(pc.is_valid(stream_a), _join(',"Stream Id":', _text(stream_a.fill_null(0))), "")
    blocks_part = pc.if_else(pc.is_valid(blocks_a), _join(',"Block Dim":', _text(blocks_a.fill_null(0))), "")
    args = _join('{"Thread Id":', _text(tid_a), stream_part, blocks_part, "}")
    return _table(n, {"rank": g[:, 0], "ph": "X", "name": _decode(g[:, 3], strings), "cat": "AscendCL",
                      "ts": g[:, 4], "dur": g[:, 5], "pid": g[:, 1], "tid": tid_a, "args": args,
                      "kind": _decode(g[:, 6], strings), "device": _ints(g[:, 7], pa.int32()), "stream": stream_a,
                      "corr": _ints(g[:, 9]), "bytes": _ints(g[:, 10]), "step": _ints(g[:, 11], pa.int32())})


def _flows_table(g: np.ndarray | None) -> pa.Table | None:
    if g is None:
        return None
    n = len(g)
    finish = g[:, 1] == 1
    corr_a = _ints(g[:, 5])
    return _table(n, {"rank": g[:, 0], "ph": pa.DictionaryArray.from_arrays(pa.array(finish.astype(np.int32)),
                                                                          pa.array(["s", "f"])),
                      "name": "HostToDevice", "cat": "HostToDevice", "ts": g[:, 2], "pid": g[:, 3], "tid": g[:, 4],
                      "id": _text(corr_a), "extra": pc.if_else(pa.array(finish), '{"bp":"e"}', pa.scalar(None, pa.string())),
                      "kind": "flow", "device": _ints(g[:, 6], pa.int32()), "stream": _ints(g[:, 7], pa.int32()),
                      "corr": corr_a, "step": _ints(g[:, 8], pa.int32())})


def _counters_table(g: np.ndarray | None, strings: pa.Array) -> pa.Table | None:
    if g is None:
        return None
    n = len(g)
    keys = pa.array(['{"%s":' % u for u in _UNITS], pa.string()).take(pa.array(g[:, 5]))
    return _table(n, {"rank": g[:, 0], "ph": "C", "name": _decode(g[:, 2], strings), "ts": g[:, 3], "pid": g[:, 1],
                      "tid": 0, "args": _join(keys, _text(pa.array(g[:, 4])), "}"), "kind": "counter",
                      "device": _ints(g[:, 6], pa.int32()), "stream": _ints(g[:, 7], pa.int32()),
                      "value": g[:, 4].astype(np.float64), "step": _ints(g[:, 8], pa.int32())})


def _rows_table(rows: list[tuple]) -> pa.Table | None:
    if not rows:
        return None
    cols = dict(zip(COLUMN_NAMES, map(list, zip(*rows))))
    return _table(len(rows), cols)
