"""Ascend timelines: torch_npu `trace_view.json` and msprof `msprof_*.json`.

Tracks are recognised by process name ("Ascend Hardware", "CANN", "HCCL"/"Communication",
"Overlap Analysis", counters such as "NPU MEM"), never by pid arithmetic, which changed across
CANN versions.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from msprof_py.trace.importers import common
from msprof_py.trace.importers.common import CODE, Typed, contains, kind_codes, mask_of, matches, to_int
from msprof_py.trace.raw import RawEvents

FORMAT = "ascend"

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


class _TaskArgs(msgspec.Struct):
    task_type: Any = msgspec.field(default=None, name="Task Type")
    stream_id: Any = msgspec.field(default=None, name="Stream Id")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    size: Any = msgspec.field(default=None, name="size(Byte)")
    data_size: Any = msgspec.field(default=None, name="data size(B)")


def looks_like(raw: RawEvents) -> bool:
    names = set(common.process_names(raw).values())
    return bool({_HW, _CANN, _OVERLAP} & names) or any(_COMM.match(n) for n in names)


def derive(raw: RawEvents) -> Typed:
    """Fill typed columns from the Ascend conventions (tasks, AscendCL APIs, HCCL, flows)."""
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
    _collective_parts(raw, t, dev_rows[kinds == CODE["collective"]])

    # Flows: HostToDevice (CANN launch -> task) and async_npu (torch op -> task) carry the link.
    flows = np.flatnonzero(t.kind == "flow")
    t.set("corr", flows, common.flow_ids_as_int(raw, flows))
    _link_h2d(raw, t, flows, np.flatnonzero(is_x & cann), hw)
    # Single-op mode compiles an operator (or finds it compiled) in the call that then runs it:
    # the call is op_compile, and keeps the correlation of the task it launched.
    t.kind[cann_x[matches(cann_names, _OP_COMPILE)]] = "op_compile"

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


def _link_h2d(raw: RawEvents, t: Typed, flows: np.ndarray, cann_x: np.ndarray, hw: np.ndarray) -> None:
    """HostToDevice flows: the `s` end sits in the launching CANN slice, the `f` end (bp=e) in
    the device task. Both slices get the flow id as `corr`."""
    if not len(flows):
        return
    h2d = flows[mask_of(raw.take("cat", flows), ("HostToDevice",))]
    if not len(h2d):
        return
    h2d_ph = raw.take("ph", h2d)
    starts = h2d[mask_of(h2d_ph, ("s",))]
    finishes = h2d[mask_of(h2d_ph, ("f",))]
    corr, ok = t.get("corr")
    task = common.enclosing_slices(raw, finishes, hw)
    hit = task >= 0
    t.set("corr", task[hit], corr[finishes[hit]])
    launch = common.enclosing_slices(raw, starts, cann_x)
    hit = launch >= 0
    t.set("corr", launch[hit], corr[starts[hit]])
    t.kind[launch[hit]] = "launch"
