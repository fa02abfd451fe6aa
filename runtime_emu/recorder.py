"""Recording: a compact row per trace event while the emulation runs, one table at the end.

The frequent rows (device tasks, host API slices, launch->task flows, counters) are packed as
int64s (strings replaced by codes) into byte buffers of their own, with only the fields that
vary; constant fields and the `args` JSON are made in Arrow, column-wise, when the table is
built. Rare rows (metadata, memory instants, steps) are full rows in the table's column order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Final

import numpy as np

from msprof_py.trace.schema import Trace, TraceMeta, arrow_schema
from runtime_emu._loader import native

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
#: Strings every recorder codes the same way, from 0 (the task kinds first, so a task row's
#: kind field is its code): the table build uses these codes as literals.
_FIXED_CODES: Final = {text: code for code, text in enumerate(
    (*_TASK_KINDS, "X", "s", "f", "C", "HostToDevice", "AscendCL", "flow", "counter"))}
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
API_W: Final = 17
FLOW_W: Final = 9
COUNTER_W: Final = 9
NULL: Final = -1  # stands for a missing value in the numeric buffers (all real values are >= 0)
#: A row goes into its buffer as native int64s: `append_row(buf, TASK_W, *fields)`. That costs
#: less than a tuple appended to a list and converted at the end, the buffer is one flat block
#: the garbage collector never walks, and it becomes a numpy array without a copy.
_PACKERS: dict[int, Callable[..., bytes]] = {}


def _packed_append(buf: bytearray, width: int, *values: int) -> None:
    """append_row through struct (the native module's append_row writes the same bytes without
    the bytes object in between: a third of a kernel launch's instructions went to packing)."""
    pack = _PACKERS.get(width)
    if pack is None:
        pack = _PACKERS[width] = struct.Struct(f"{width}q").pack
    if len(values) != width:
        raise ValueError(f"append_row: a row of {width} fields needs {width} values, got {len(values)}")
    buf += pack(*values)


def _append_function() -> Callable[..., None]:
    module = native("_rowtable")
    return _packed_append if module is None else module.append_row  # type: ignore[no-any-return]


#: append_row(buf, width, *values): `width` int64 fields appended to the row buffer `buf`.
append_row: Final = _append_function()


#: What a row buffer holds, for RowBuffer's `role`: a new one starts with room for the most one of
#: its role held before in the process (the recorder's buffers by name, the ground truth's rows).
BUFFER_ROLES: Final = {"tasks": 0, "apis": 1, "flows": 2, "counters": 3, "truth": 4}


def new_buffer(name: str, data: bytes = b"") -> Any:
    """A row buffer for `name` (a BUFFER_ROLES key) holding a copy of `data`: the native build's
    RowBuffer, whose memory comes from its block pool and goes back to it
    (runtime_emu/_rowbuf.h), or, without it, a bytearray."""
    from runtime_emu.tables import native_module  # the pool's limit (MSPROF_PY_POOL_MB) set first

    module = native_module()
    return bytearray(data) if module is None else module.RowBuffer(data, BUFFER_ROLES[name])


@dataclass
class Recorder:
    """Row buffers. The frequent row types are packed int64 rows (`append_row(buf, TASK_W, ...)`),
    strings replaced by codes from `code()`; each buffer becomes a column block without a copy."""

    switches: Switches = field(default_factory=Switches)
    #: rank, device, pid, stream, ts, dur, name, kind, task_type, corr, blocks, waves, bytes, copy_kind
    #: (a kernel's op type), event_id, step
    tasks: Any = field(default_factory=lambda: new_buffer("tasks"))
    #: rank, pid, tid, name, ts, dur, kind, device, stream, corr, bytes, step, blocks, blocked (code of why
    #: the call held its thread past its own overhead), blocked_ns, src, dst (a copy's addresses)
    apis: Any = field(default_factory=lambda: new_buffer("apis"))
    #: rank, is_finish, ts, pid, tid, corr, device, stream, step
    flows: Any = field(default_factory=lambda: new_buffer("flows"))
    #: rank, pid, name, ts, value, unit, device, stream, step (integer-valued counters)
    counters: Any = field(default_factory=lambda: new_buffer("counters"))
    #: Full rows in COLUMN_NAMES order (metadata, memory instants, steps, float counters...).
    rows: list[tuple] = field(default_factory=list)
    strings: "StringCodes" = field(default_factory=lambda: StringCodes(_FIXED_CODES))
    _named: set = field(default_factory=set)

    def _buffer(self, name: str, width: int) -> np.ndarray | None:
        """A buffer's rows as an (n, width) int64 array; the recorder starts a new buffer."""
        packed = getattr(self, name)
        setattr(self, name, new_buffer(name))  # the array shares the old buffer's memory
        return _array(packed, width)

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
            setattr(self, name, new_buffer(name, rows[~early].tobytes()))  # the rest, in recording order
        full = [row for row in self.rows if row[4] < before]
        self.rows = [row for row in self.rows if row[4] >= before]
        return Chunk(full, out, list(self.strings))

    def snapshot(self) -> "Chunk":
        """A copy of every row recorded so far, the recorder left as it is. Another thread may take
        one while the program goes on recording: each buffer is copied in one step (every copied
        row is whole), and the strings after the buffers (every code in the copied rows is known)."""
        tasks, apis, flows, counters = bytes(self.tasks), bytes(self.apis), bytes(self.flows), bytes(self.counters)
        rows = self.rows[:]
        strings = list(self.strings)
        return Chunk(rows, {"tasks": _array(tasks, TASK_W), "apis": _array(apis, API_W), "flows": _array(flows, FLOW_W),
                            "counters": _array(counters, COUNTER_W)}, strings)

    def revision(self) -> tuple[int, ...]:
        """Changes whenever rows are recorded or taken out: two equal revisions, equal snapshots."""
        return (id(self.tasks), len(self.tasks), id(self.apis), len(self.apis), id(self.flows), len(self.flows),
                id(self.counters), len(self.counters), id(self.rows), len(self.rows))

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

    def name_thread(self, rank: int, pid: int, tid: int, name: str, attrs: str = "") -> None:
        """`attrs`: more members of the thread_name args, as JSON text starting with a comma
        (a stream's priority and queue depth, which its track has no other place for)."""
        if ("t", pid, tid) in self._named:
            return
        self._named.add(("t", pid, tid))
        self.rows.append(_meta(rank, pid, tid, "thread_name", '{"name":%s%s}' % (_q(name), attrs)))
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
        from runtime_emu.tables import build

        return Trace(table=build(self, arrow_schema(meta), canonical=canonical), meta=meta)  # empties this chunk


def _array(packed: Any, width: int) -> np.ndarray | None:
    """Packed rows as an (n, width) int64 array sharing their memory; None for no rows."""
    if not packed:
        return None
    return np.frombuffer(packed, dtype=np.int64).reshape(-1, width)


def _meta(rank: int, pid: int, tid: int, name: str, args: str) -> tuple:
    return (rank, "M", name, None, 0, None, pid, tid, None, args, None, "meta", None, None, None, None, None, None, None)


def _q(text: str) -> str:
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')
