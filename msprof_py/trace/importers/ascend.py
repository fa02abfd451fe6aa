"""Ascend timelines: torch_npu `trace_view.json` and msprof `msprof_*.json`.

Tracks are recognised by process name ("Ascend Hardware", "CANN", "HCCL"/"Communication",
"Overlap Analysis", counters such as "NPU MEM"), never by pid arithmetic, which changed across
CANN versions.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv as pa_csv

from msprof_py.errors import MsprofError
from msprof_py.trace.fields import string_id
from msprof_py.trace.importers import common
from msprof_py.trace.importers.common import CODE, Typed, contains, kind_codes, mask_of, matches, to_int
from msprof_py.trace.raw import RawEvents

FORMAT = "ascend"
#: torch_npu's output folder per rank, `<name>_ascend_pt/`, keeps its text export here.
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TIMELINE = "trace_view.json"

_HW = "Ascend Hardware"
_CANN = "CANN"
_COMM = re.compile(r"^(HCCL|Communication)\b", re.I)
_OVERLAP = "Overlap Analysis"
#: A device number is at most 9 digits: the device column is int32 ("Rank 99999999999999999999" is no device).
_DEVICE_NO = re.compile(r"(?:NPU|Device|Rank)\s*:?\s*(\d{1,9})(?!\d)", re.I | re.A)
_MEMCPY_TASK = r"MEMCPY|Memcpy|SDMA"
_MEMSET_TASK = r"MEMSET|MemSet|Memset"
_WAIT_TASK = r"EVENT_WAIT|Notify[_ ]?Wait|NOTIFY_WAIT|StreamWait"
_COLLECTIVE = r"^hcom_|allreduce|allgather|reducescatter|reduce_scatter|broadcast|alltoall|hccl"
#: AscendCL's operator compile calls: aclopCompile, aclopCompileAndExecute(V2). (The
#: `AscendCL@opCompile` step inside aclopCompileAndExecute stays an api call under it.)
_OP_COMPILE = r"(^|@)aclopCompile"


#: The phases of an Ascend timeline this importer reads. Its slices all get a kind but those of
#: the Overlap Analysis process (msprof's own summary of the device's time), which stay markers as
#: meant; instants are markers by nature. Other phases (a "B"/"E" pair, async "b"/"e") are not read.
READ_PHASES = ("X", "i", "I")


def unread(cat: str | None, ph: str | None) -> str | None:
    """Why a marker row of phase `ph` in an Ascend table is one only because the importer did not
    understand it: "phase" (a phase it does not read); None: a marker it means. Tracks are
    known by process, not category: the category says nothing here (see kineto.unread)."""
    return None if ph in READ_PHASES else "phase"


class _TaskArgs(msgspec.Struct):
    task_type: Any = msgspec.field(default=None, name="Task Type")
    stream_id: Any = msgspec.field(default=None, name="Stream Id")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    size: Any = msgspec.field(default=None, name="size(Byte)")
    data_size: Any = msgspec.field(default=None, name="data size(B)")
    task_id: Any = msgspec.field(default=None, name="Task Id")
    block_dim: Any = msgspec.field(default=None, name="Block Dim")
    # HCCL's own rows: a task's stream and rank; an op's link to its hardware tasks.
    hccl_stream: Any = msgspec.field(default=None, name="stream id")
    src_rank: Any = msgspec.field(default=None, name="src rank")
    connection_id: Any = None


def looks_like(raw: RawEvents) -> bool:
    names = set(common.process_names(raw).values())
    return bool({_HW, _CANN, _OVERLAP} & names) or any(_COMM.match(n) for n in names)


def derive(raw: RawEvents, source: Path | None = None) -> Typed:
    """Fill typed columns from the Ascend conventions (tasks, AscendCL APIs, HCCL, flows).

    `source`: the trace file, when it sits in its profiler's output folder (torch_npu's
    `*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json`): the folder's kernel_details.csv and
    device info.json give kernels their block dim and core count (see `_kernel_shape`), its
    profiler_info_N.json the rank (see `rank_of`).
    """
    t = Typed(raw)
    ph, name, cat = common.base_kinds(raw, t)
    procs = common.process_names(raw)
    is_x = raw.is_in("ph", ("X",))
    pid_kind = np.array([_track_of(procs.get(int(p), "")) for p in raw.pid.tolist()], dtype=object) \
        if len(raw) else np.array([], dtype=object)

    # Host side: Python / CPU processes (cpu_op, enqueue, dequeue) and CANN (AscendCL APIs).
    host = pid_kind == "host"
    cann = pid_kind == "cann"
    t.kind[is_x & (host | cann)] = "api"
    # torch_npu's Python process carries the DataLoader's spans.
    common.data_loading(raw, t, np.flatnonzero(is_x & host))
    cann_x = np.flatnonzero(is_x & cann)
    cann_names = raw.take("name", cann_x)
    t.kind[cann_x[matches(cann_names, r"launch|ExecuteAsync|aclnn.*Launch")]] = "launch"
    t.kind[cann_x[contains(cann_names, "Synchronize")]] = "sync"
    t.kind[cann_x[contains(cann_names, "StreamWaitEvent")]] = "wait"

    # Device side: hardware tasks and communication.
    hw = np.flatnonzero(is_x & (pid_kind == "hw"))
    comm = np.flatnonzero(is_x & (pid_kind == "comm"))
    dev_rows = np.concatenate([hw, comm])
    targs = common.decode_args(raw, dev_rows, _TaskArgs)
    labels = _device_labels(raw)
    t.set("stream", dev_rows, np.array([_stream(a, raw, i, pid_kind[i]) for a, i in zip(targs, dev_rows.tolist())], dtype=object))
    t.set("device", dev_rows, np.array([_or(to_int(a.device_id), labels.get(int(raw.pid[i]), 0))
                                        for a, i in zip(targs, dev_rows.tolist())], dtype=object))
    t.set("bytes", dev_rows, np.array([to_int(a.size) if a.size is not None else to_int(a.data_size)
                                       for a in targs], dtype=object))
    task_text = common.strings([f"{nm} {a.task_type or ''}" for a, nm in zip(targs, raw.take("name", dev_rows).to_pylist())])
    kinds = kind_codes(len(dev_rows), "kernel")
    kinds[matches(task_text, _MEMCPY_TASK, ignore_case=False)] = CODE["memcpy"]
    kinds[matches(task_text, _MEMSET_TASK, ignore_case=False)] = CODE["memset"]
    kinds[matches(task_text, _WAIT_TASK)] = CODE["wait"]
    is_comm = np.zeros(len(dev_rows), dtype=bool)
    is_comm[len(hw):] = True
    coll = matches(task_text, _COLLECTIVE)
    kinds[(is_comm | coll) & ~np.isin(kinds, (CODE["wait"], CODE["memcpy"]))] = CODE["collective"]
    t.kind[dev_rows] = kinds
    rank = rank_of(source, targs[len(hw):])
    if rank is not None:
        t.rank[:] = rank
    _collective_parts(raw, t, dev_rows[kinds == CODE["collective"]])
    _hccl_op_streams(raw, t, dev_rows, targs, len(hw))

    # Flows: HostToDevice (CANN launch -> task) and async_npu (torch op -> task) carry the link.
    flows = np.flatnonzero(t.kind == "flow")
    t.set("corr", flows, _flow_corr(raw, flows))
    _link_h2d(raw, t, flows, np.flatnonzero(is_x & cann), hw)
    # Single-op mode compiles an operator (or finds it compiled) in the call that then runs it:
    # the call is op_compile, and keeps the correlation of the task it launched.
    t.kind[cann_x[matches(cann_names, _OP_COMPILE)]] = "op_compile"
    _kernel_shape(raw, t, dev_rows[kinds == CODE["kernel"]], targs, kinds == CODE["kernel"], source)

    common.memory_events(raw, t, ph, name)
    dev_mask = np.zeros(len(raw), dtype=bool)
    dev_mask[dev_rows] = True
    common.steps(raw, t, name, host | cann, dev_mask)
    return t


#: HCCL names a collective op `hcom_<op>__<communicator>_<call number>_<n>` (hcom_allReduce__586_3_1).
_HCOM_OP = re.compile(r"^hcom_[A-Za-z]+__(\d+)_(\d+)_\d+$")


def _collective_parts(raw: RawEvents, t: Typed, rows: np.ndarray) -> None:
    """An HCCL op's communicator and its call number in it, from the op's name."""
    found = [_HCOM_OP.match(n or "") for n in raw.take("name", rows).to_pylist()]
    common.collective_parts(raw, t, rows, [m.group(1) if m else None for m in found],
                            [int(m.group(2)) if m else None for m in found])


#: A kernel's core kind, by kernel_details.csv's "Accelerator Core" or the task's "Task Type":
#: cube (AI) cores or vector cores. A mix kernel's block dim counts the blocks of its main kind.
#: A task type of AI_CORE names the task queue, not the core: 910B runs vector kernels as AI_CORE
#: tasks, so alone it says cube cores only on a device without vector cores.
_CUBE = ("AI_CORE", "MIX_AIC")
_VECTOR = ("AI_VECTOR_CORE", "MIX_AIV", "AIV_SQE")
#: Output folders whose parent holds the device info (`[PROF_*/]device_N/info.json.N`):
#: torch_npu's, and msprof's own.
_OUTPUT_DIRS = (OUTPUT_DIR, "mindstudio_profiler_output")


def _kernel_shape(raw: RawEvents, t: Typed, kern: np.ndarray, targs: list[_TaskArgs], is_kern: np.ndarray,
                  source: Path | None) -> None:
    """A kernel's blocks (`value`) and the cores of its kind on its device (`addr`).

    Blocks: the task's "Block Dim" arg; torch_npu's timeline has none, and its kernel_details.csv
    (beside trace_view.json) has each task's Block Dim and Accelerator Core, found by the task's
    start, stream and task id (a Block Dim of 0, a DSA or HCCL task's, is none). Cores: the
    device's "ai_core_num" (cube) or "aiv_num" (vector) from its info.json, where the output
    folder keeps it (all devices alike: any kernel's; else the kernel's device's). Null where
    none of them says.
    """
    if not len(kern):
        return
    args = [targs[i] for i in np.flatnonzero(is_kern).tolist()]
    blocks = np.array([to_int(a.block_dim) for a in args], dtype=object)
    core_kind = np.array([a.task_type if isinstance(a.task_type, str) else None for a in args], dtype=object)
    from_details = np.zeros(len(kern), dtype=bool)
    details = _kernel_details(source)
    if details is not None:
        stream, stream_ok = t.get("stream")
        left = pa.table({"ts": pa.array(raw.ts_ns[kern]), "stream": pa.array(stream[kern].astype(np.int64), mask=~stream_ok[kern]),
                         "task": pa.array([to_int(a.task_id) for a in args], type=pa.int64()),
                         "row": pa.array(np.arange(len(kern)))})
        keys = [k for k in ("ts", "stream", "task") if k in details.column_names]
        hit = left.select([*keys, "row"]).join(details, keys=keys, join_type="inner")
        rows = hit.column("row").to_numpy()
        once = np.bincount(rows, minlength=len(kern))[rows] == 1  # a key twice in the file: ambiguous
        rows = rows[once]
        dims = hit.column("block_dim").to_numpy(zero_copy_only=False)[once]
        missing = np.array([b is None for b in blocks[rows]], dtype=bool) & ~np.isnan(dims.astype(np.float64))
        blocks[rows[missing]] = dims[missing].astype(np.int64)
        if "core" in hit.column_names:
            cores = np.array(hit.column("core").to_pylist(), dtype=object)[once]
            known = np.array([c is not None for c in cores], dtype=bool)
            core_kind[rows[known]] = cores[known]
            from_details[rows[known]] = True
    # Block Dim 0: a task that runs on no cores (DSA, HCCL): no block count.
    t.set("value", kern, np.array([float(b) if b is not None and b > 0 else np.nan for b in blocks]))
    counts = _core_counts(source)
    if not counts:
        return
    kinds = common.strings(core_kind.tolist())
    vector_task = mask_of(kinds, _VECTOR)
    cube_task = mask_of(kinds, _CUBE)
    ai_core_queue = mask_of(kinds, ("AI_CORE",)) & ~from_details
    # The device's counts: the one set when every device has the same, else the kernel's own.
    device, device_ok = t.get("device")
    cube, vector = np.zeros(len(kern), dtype=np.int64), np.zeros(len(kern), dtype=np.int64)
    no_vector = np.zeros(len(kern), dtype=bool)
    same = len(set(counts.values())) == 1
    for dev_id, (aic, aiv) in counts.items():
        on = np.ones(len(kern), dtype=bool) if same else device_ok[kern] & (device[kern] == dev_id)
        cube[on], vector[on], no_vector[on] = aic or 0, aiv or 0, aiv == 0
    addr = np.where(vector_task, vector, np.where(cube_task & ~(ai_core_queue & ~no_vector), cube, 0))
    t.set("addr", kern[addr > 0], addr[addr > 0])


_DETAIL_COLUMNS = {"Start Time(us)": "ts", "Stream ID": "stream", "Task ID": "task", "Block Dim": "block_dim",
                   "Accelerator Core": "core"}


def _kernel_details(source: Path | None) -> pa.Table | None:
    """torch_npu's kernel_details.csv beside the trace: ts (ns), stream, task, block_dim, core;
    None when there is none or it lacks a start time or a block dim."""
    if source is None or source.parent.name != OUTPUT_DIR:
        return None
    path = source.parent / "kernel_details.csv"
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader([fh.readline()]), [])
        wanted = [c for c in _DETAIL_COLUMNS if c in header]
        if not {"Start Time(us)", "Block Dim"} <= set(wanted):
            return None
        table = pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(
            include_columns=wanted, column_types={c: pa.string() for c in wanted}))
    except (OSError, UnicodeDecodeError, pa.ArrowInvalid):
        return None
    cols = {}
    for name in wanted:
        text = pc.utf8_trim_whitespace(table.column(name).combine_chunks())
        key = _DETAIL_COLUMNS[name]
        if key == "ts":
            cols[key] = _us_text_to_ns(text)
        elif key == "core":
            cols[key] = text
        else:
            cols[key] = pc.cast(pc.struct_field(pc.extract_regex(text, r"^(?P<v>\d{1,18})$"), "v"), pa.int64())
    return pa.table(cols)


def _us_text_to_ns(text: pa.Array) -> pa.Array:
    """Microseconds written with up to three decimals ("1736408883704643.212") as exact int64 ns;
    null where the text is something else."""
    parts = pc.extract_regex(text, r"^(?P<us>\d{1,16})(?:\.(?P<frac>\d{0,3}))?$")
    us = pc.cast(pc.struct_field(parts, "us"), pa.int64())
    us = pc.if_else(pc.less(us, (2**63 - 1) // 1000), us, pa.scalar(None, pa.int64()))  # int64 ns
    frac = pc.utf8_rpad(pc.fill_null(pc.struct_field(parts, "frac"), ""), width=3, padding="0")
    return pc.add(pc.multiply(us, 1000), pc.cast(frac, pa.int64()))


def _core_counts(source: Path | None) -> dict[int, tuple[int | None, int | None]]:
    """Device id -> (AI / cube cores, vector cores) from the device info.json files of the output
    folder the trace sits in ({"DeviceInfo": [{"id", "ai_core_num", "aiv_num", ...}]})."""
    if source is None or source.parent.name not in _OUTPUT_DIRS:
        return {}
    base = source.parent.parent
    out: dict[int, tuple[int | None, int | None]] = {}
    for path in sorted([*base.glob("PROF_*/device_*/info.json*"), *base.glob("device_*/info.json*")]):
        if path.name.endswith(".done") or not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        infos = doc.get("DeviceInfo") if isinstance(doc, dict) else None
        for info in infos if isinstance(infos, list) else []:
            if isinstance(info, dict) and to_int(info.get("id")) is not None:
                aic, aiv = to_int(info.get("ai_core_num")), to_int(info.get("aiv_num"))
                if aic is not None or aiv is not None:
                    out[to_int(info.get("id"))] = (aic, aiv)  # type: ignore[index]
    return out


def _track_of(proc: str) -> str:
    if proc == _HW:
        return "hw"
    if proc == _CANN:
        return "cann"
    if _COMM.match(proc):
        return "comm"
    if proc == _OVERLAP:
        return "overlap"
    return "host"


def _device_labels(raw: RawEvents) -> dict[int, int]:
    """pid -> device number from `process_labels` / `process_name` text like "NPU 3"."""
    out: dict[int, int] = {}
    rows = common.metadata_rows(raw, ("process_labels", "process_name"))
    for i, text in zip(rows.tolist(), raw.args_of(rows)):
        m = _DEVICE_NO.search(text or "")
        if m:
            out[int(raw.pid[i])] = int(m.group(1))
    return out


def _stream(a: _TaskArgs, raw: RawEvents, i: int, track: str) -> int | None:
    s = to_int(a.stream_id)
    if s is not None:
        return s
    return int(raw.tid[i]) if track == "hw" else None


def _or(v: int | None, fallback: int) -> int:
    return v if v is not None else fallback


def _flow_corr(raw: RawEvents, flows: np.ndarray) -> pa.Array:
    """Flow ids as correlation ids: an id that is no int64 (torch_npu's HostToDevice ids pass
    2**64) gets the stable synthetic int64 a string pid gets, so both ends of its flow still match;
    null where a flow has no id."""
    texts = raw.take("id", flows)
    try:
        return texts.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([None if x is None else string_id(x) for x in texts.to_pylist()], type=pa.int64())


def _link_h2d(raw: RawEvents, t: Typed, flows: np.ndarray, cann_x: np.ndarray, hw: np.ndarray) -> None:
    """HostToDevice flows: the `s` end sits in the launching CANN slice, the `f` end (bp=e) in
    the device task. Both slices get the flow id as `corr`."""
    if not len(flows):
        return
    h2d = flows[mask_of(raw.take("cat", flows), ("HostToDevice",))]
    if not len(h2d):
        return
    h2d_ph = raw.take("ph", h2d)
    corr, ok = t.get("corr")
    # A flow without an id links nothing (its corr is null, not 0).
    starts = h2d[mask_of(h2d_ph, ("s",)) & ok[h2d]]
    finishes = h2d[mask_of(h2d_ph, ("f",)) & ok[h2d]]
    task = common.enclosing_slices(raw, finishes, hw)
    hit = task >= 0
    t.set("corr", task[hit], corr[finishes[hit]])
    launch = common.enclosing_slices(raw, starts, cann_x)
    hit = launch >= 0
    t.set("corr", launch[hit], corr[starts[hit]])
    t.kind[launch[hit]] = "launch"


def _hccl_op_streams(raw: RawEvents, t: Typed, dev_rows: np.ndarray, targs: list[_TaskArgs], n_hw: int) -> None:
    """An HCCL op (hcom_*, on a "Group N Communication" thread) runs on the stream of its hardware
    tasks: the Ascend Hardware tasks that carry the op's `connection_id` (its SDMA, Notify Wait and
    Write Value tasks); failing that, the "stream id" most of the HCCL task rows in its span carry.
    The HCCL task rows (the "Plane N" threads) keep no stream: each is a second view of a task
    the Ascend Hardware stream already holds, and would count twice there."""
    stream, stream_ok = t.get("stream")
    by_conn: dict[int, int] = {}
    for i, a in zip(dev_rows[:n_hw].tolist(), targs[:n_hw]):
        c = to_int(a.connection_id)
        if c is not None and stream_ok[i]:
            by_conn.setdefault(c, int(stream[i]))
    comm_rows, comm_args = dev_rows[n_hw:], targs[n_hw:]
    task = np.array([to_int(a.hccl_stream) is not None for a in comm_args], dtype=bool)
    tasks = comm_rows[task]
    task_stream = np.array([to_int(a.hccl_stream) for a, is_task in zip(comm_args, task) if is_task], dtype=np.int64)
    order = np.argsort(raw.ts_ns[tasks], kind="stable")
    tasks, task_stream = tasks[order], task_stream[order]
    dur = raw.dur_ns.fill_null(0).to_numpy(zero_copy_only=False)
    for i, a, is_task in zip(comm_rows.tolist(), comm_args, task.tolist()):
        if is_task or t.kind.codes[i] != CODE["collective"]:
            continue
        s = by_conn.get(to_int(a.connection_id))  # type: ignore[arg-type]
        if s is None:
            lo, hi = np.searchsorted(raw.ts_ns[tasks], [raw.ts_ns[i], raw.ts_ns[i] + dur[i]], side="left")
            inside = task_stream[lo:hi][raw.pid[tasks[lo:hi]] == raw.pid[i]]
            if len(inside):
                values, counts = np.unique(inside, return_counts=True)
                s = int(values[np.argmax(counts)])
        if s is not None:
            t.set("stream", [i], [s])


#: torch_npu's `profiler_info_N.json` (one per rank; `profiler_info.json` when not distributed).
_PROFILER_INFO = re.compile(r"^profiler_info(?:_(\d{1,9}))?\.json$")

def rank_of(source: Path | None, comm_args: list[_TaskArgs]) -> int | None:
    """The rank a torch_npu timeline belongs to: `rank_id` of the profiler_info_N.json in the
    `*_ascend_pt` folder it sits in (else the N of its name), or failing that the "src rank" most
    of its HCCL task rows carry (a rank is the source of the tasks in its own timeline); None
    when neither says."""
    if source is not None and source.parent.name == OUTPUT_DIR:
        found = set()
        for path in source.parent.parent.glob("profiler_info*.json"):
            m = _PROFILER_INFO.match(path.name)
            if not m or not path.is_file():
                continue
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                doc = None
            rank = to_int(doc.get("rank_id")) if isinstance(doc, dict) else None
            if rank is None or not 0 <= rank < 2**31:  # -1: a run that was not distributed
                rank = int(m.group(1)) if m.group(1) else None
            if rank is not None:
                found.add(rank)
        if len(found) == 1:
            return found.pop()
    # (0xFFFFFFFF is HCCL's "no rank"; the rank column is int32.)
    ranks = [r for r in (to_int(a.src_rank) for a in comm_args) if r is not None and 0 <= r < 2**31]
    if not ranks:
        return None
    values, counts = np.unique(ranks, return_counts=True)
    return int(values[np.argmax(counts)])


def timeline_path(path: Path) -> Path:
    """The timeline a torch_npu output folder stands for: `<name>_ascend_pt/` (what torch_npu
    writes per rank, and msprof-analyze and MindStudio Insight take) or its ASCEND_PROFILER_OUTPUT/
    means the trace_view.json inside. Any other path is returned as it is. A torch_npu folder that
    holds no such timeline is a MsprofError that says what it holds instead."""
    if not path.is_dir():
        return path
    out = path if path.name == OUTPUT_DIR else path / OUTPUT_DIR
    if (out / TIMELINE).is_file():
        return out / TIMELINE
    if out.is_dir():
        dbs = sorted(p.name for p in out.glob("*.db"))
        if dbs:
            raise MsprofError(f"{path}: a torch_npu output folder exported as a database ({', '.join(dbs)}), "
                              f"with no {OUTPUT_DIR}/{TIMELINE}",
                              hint="msprof-py reads the text export, which torch_npu writes with export_type 'text', its default")
        raise MsprofError(f"{path}: a torch_npu output folder without {OUTPUT_DIR}/{TIMELINE}",
                          hint="profile with the CPU and NPU activities and export_type text")
    if path.name.endswith("_ascend_pt"):
        raise MsprofError(f"{path}: a torch_npu output folder not parsed yet (no {OUTPUT_DIR}/)",
                          hint="parse it first: torch_npu.profiler.profiler.analyse(<this folder>)")
    folders = sorted(p.name for p in path.glob("*_ascend_pt") if p.is_dir())
    if folders:
        raise MsprofError(f"{path}: holds {len(folders)} torch_npu output folders ({', '.join(folders[:4])}"
                          f"{', ...' if len(folders) > 4 else ''}), one per rank: give one of them")
    return path
