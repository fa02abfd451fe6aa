"""PyTorch profiler / Kineto traces (`*.pt.trace.json[.gz]`, CUDA and ROCm)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.trace.importers import common
from msprof_py.trace.importers.common import CODE, Typed, contains, kind_codes, mask_of, matches, to_int
from msprof_py.trace.raw import RawEvents

FORMAT = "kineto"

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_HOST_API_CATS = ("cpu_op", "python_function", "cuda_runtime", "cuda_driver", "user_annotation",
                  "cpu_instant_event", "Runtime", "Operator")
_COLLECTIVE = r"nccl|rccl|hccl|ncclDevKernel|ncclKernel"
_SINGLE_TASK_LAUNCHES = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
    "cudaMemsetAsync", "cudaMemcpy2DAsync", "cudaMemcpyPeerAsync", "cudaMemsetD32Async", "hipLaunchKernel",
    "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream",
)


def looks_like(raw: RawEvents) -> bool:
    """Kineto writes deviceProperties / distributedInfo / schemaVersion and its own categories."""
    if {"deviceProperties", "distributedInfo", "schemaVersion"} & raw.top.keys():
        return True
    cats = set(raw.cat.slice(0, 5000).to_pylist())
    return bool(cats & {"cpu_op", "cuda_runtime", "kernel", "ac2g", "gpu_memcpy", "python_function"})


def rank_of(top: dict[str, Any]) -> tuple[int, int | None]:
    info = top.get("distributedInfo") or {}
    rank = to_int(info.get("rank")) if isinstance(info, dict) else None
    world = to_int(info.get("world_size")) if isinstance(info, dict) else None
    return (rank if rank is not None else 0), world


def derive(raw: RawEvents) -> Typed:
    """Fill kind, device, stream, corr, bytes, addr, value and step from Kineto conventions."""
    t = Typed(raw)
    ph, name, cat = common.base_kinds(raw, t)
    rank, _world = rank_of(raw.top)
    t.rank[:] = rank
    is_x = raw.is_in("ph", ("X",))

    dev = np.flatnonzero(is_x & raw.is_in("cat", _DEVICE_CATS))
    dargs = common.int_args(raw, dev, {"device": "device", "stream": "stream", "corr": "correlation", "bytes": "bytes"})
    # Kineto puts the device in pid and the stream in tid too; args win when present.
    t.set("device", dev, pc.coalesce(dargs["device"], pa.array(raw.pid[dev])))
    t.set("stream", dev, pc.coalesce(dargs["stream"], pa.array(raw.tid[dev])))
    t.set("corr", dev, dargs["corr"])
    t.set("bytes", dev, dargs["bytes"])
    # Kineto computes a copy's bandwidth from its exact duration; the event's `dur` may be
    # rounded to microseconds, so keep the profiler's figure as the row's value.
    copies = dev[raw.is_in("cat", ("gpu_memcpy", "gpu_memset"))[dev]]
    t.set("value", copies, common.float_args(raw, copies, "memory bandwidth (GB/s)"))
    cat_dev = raw.take("cat", dev).to_numpy(zero_copy_only=False).astype(object)
    kinds = kind_codes(len(dev), "marker")
    kinds[cat_dev == "kernel"] = CODE["kernel"]
    kinds[cat_dev == "gpu_memcpy"] = CODE["memcpy"]
    kinds[cat_dev == "gpu_memset"] = CODE["memset"]
    kinds[cat_dev == "cuda_sync"] = CODE["sync"]
    names_dev = raw.take("name", dev)
    kinds[(cat_dev == "cuda_sync") & mask_of(names_dev, ("Event Sync",))] = CODE["wait"]
    t.kind[dev] = kinds
    coll = dev[(cat_dev == "kernel") & matches(names_dev, _COLLECTIVE)]
    t.kind[coll] = "collective"

    rt = np.flatnonzero(is_x & raw.is_in("cat", _RUNTIME_CATS))
    rt_corr_arr = common.int_args(raw, rt, {"corr": "correlation"})["corr"]
    t.set("corr", rt, rt_corr_arr)
    host_api = np.flatnonzero(is_x & raw.is_in("cat", _HOST_API_CATS))
    t.kind[host_api] = "api"
    common.data_loading(raw, t, host_api)
    launched = _launched_corrs(t)
    rt_names = raw.take("name", rt)
    # A launch is a call that puts exactly one task on a stream. Graph launches enqueue many
    # (and Holistic Trace Analysis leaves them out of queue lengths too): they stay "api".
    single = mask_of(rt_names, _SINGLE_TASK_LAUNCHES)
    rt_kind = np.where(pc.is_in(rt_corr_arr, value_set=pa.array(launched, type=pa.int64())).fill_null(False)
                       .to_numpy(zero_copy_only=False) & single, CODE["launch"], CODE["api"]).astype(np.int8)
    rt_kind[contains(rt_names, "Synchronize")] = CODE["sync"]
    # cudaMemcpy / cudaMemset without Async return only when the copy is done: the host waits.
    blocking_copy = (matches(rt_names, r"^(cuda|hip)Mem(cpy|set)", ignore_case=False)
                     & ~contains(rt_names, "Async") & ~contains(rt_names, "WithStream"))
    rt_kind[blocking_copy] = CODE["sync"]
    rt_kind[contains(rt_names, "StreamWaitEvent")] = CODE["wait"]
    t.kind[rt] = rt_kind

    flows = np.flatnonzero(t.kind == "flow")
    ac2g = flows[mask_of(raw.take("cat", flows), ("ac2g",))]
    t.set("corr", ac2g, common.flow_ids_as_int(raw, ac2g))

    common.memory_events(raw, t, ph, name)
    host = np.ones(raw.__len__(), dtype=bool)
    device_rows = np.zeros(len(raw), dtype=bool)
    device_rows[dev] = True
    host &= ~device_rows
    common.steps(raw, t, name, host, device_rows)
    return t


def _launched_corrs(t: Typed) -> np.ndarray:
    corr, ok = t.get("corr")
    devk = t.kind.isin(("kernel", "memcpy", "memset", "collective")) & ok
    return np.unique(corr[devk])
