"""PyTorch profiler / Kineto traces (`*.pt.trace.json[.gz]`): CUDA, ROCm, MTIA, HPU, XPU,
PrivateUse1 backends, and accelerators Kineto does not know by name but whose plugin lays
the trace out as Kineto does.

Kineto names each event's category after its activity type (libkineto's `ActivityType`).
Those categories fall in three groups, and so do unknown ones (see `_classify`):
- host runtime calls (`*_runtime`, `*_driver`, `hpu_op`, ...): api, launch, sync, wait;
- device work and device-side records, written with pid = device and tid = stream (or queue),
  usually with "device" / "stream" args: kernel, memcpy, memset, collective, sync, marker;
- other host activity (CPU ops, annotations, Python functions, overhead): api or marker.
A launch is tied to its device work by the "correlation" arg both carry or, where a plugin
writes no such arg, by the `ac2g` flow Kineto draws between them (id = correlation id).
"""

from __future__ import annotations

import re
from functools import cached_property
from operator import attrgetter
from typing import Annotated, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.trace.importers import common
from msprof_py.trace.importers.common import CODE, Typed, contains, kind_codes, mask_of, matches, to_int
from msprof_py.trace.raw import RawEvents

FORMAT = "kineto"

#: Host runtime / driver calls: the calls that put work on a device, wait for it, or manage it.
#: ("Runtime" is what the first layout and older ROCm builds of Kineto wrote.)
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "mtia_runtime", "glow_runtime", "hpu_op", "xpu_runtime",
                "xpu_driver", "privateuse1_runtime", "privateuse1_driver", "Runtime")
#: Any other category named like a runtime or a driver is one too: a new backend's plugin.
_RUNTIME_NAME = re.compile(r"_(runtime|driver)$")
#: Device categories -> kind; None: by the event's name (copies, fills and collectives that a
#: backend writes as generic device events).
DEVICE_CATS: dict[str, str | None] = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "mtia_ccp_events": None,
    "collective_comm": "collective", "cuda_sync": "sync", "xpu_sync": "sync",
    "gpu_user_annotation": "marker", "cuda_event": "marker", "mtia_insight": "marker",
    # The first layout's (see LEGACY_DEVICE_CATS).
    "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset",
}
#: Host activity that is not a runtime call: CPU ops, annotations, Python frames ("Operator":
#: the first layout and older ROCm builds) are api; the rest (instants, profiler overhead and
#: ranges, counters, the profiler's own spans) stay markers.
HOST_API_CATS = ("cpu_op", "user_annotation", "python_function", "cpu_instant_event", "Operator")
HOST_MARKER_CATS = ("external_correlation", "overhead", "cuda_profiler_range", "xpu_scope_profiler",
                    "mtia_counters", "Trace", "ac2g", "fwdbwd", "async_task")
#: The first layout (PyTorch 1.8): a bare JSON array, no schemaVersion nor deviceProperties,
#: host calls as "Operator" and "Runtime", device work as "Kernel", "Memcpy", "Memset" with
#: tid "stream N" and the same args as later (device, stream, correlation, bytes).
LEGACY_DEVICE_CATS = ("Kernel", "Memcpy", "Memset")
LEGACY_HOST_CATS = ("Operator", "Runtime")
#: Every category libkineto writes (ActivityType names), for format detection; the capitalised
#: ones of the first layout are common words, so they count only together (see looks_like).
KINETO_CATS = (frozenset((*RUNTIME_CATS, *DEVICE_CATS, *HOST_API_CATS, *HOST_MARKER_CATS))
               - {"Trace", *LEGACY_DEVICE_CATS, *LEGACY_HOST_CATS})

#: The categories this importer gives a meaning to ("async": the first layout's launch flows).
#: Device work in a category it does not know is read too when laid out as Kineto lays device
#: work out (see `_classify`); what stays a marker and is in none of these was not understood.
KNOWN_CATS = frozenset((*RUNTIME_CATS, *DEVICE_CATS, *HOST_API_CATS, *HOST_MARKER_CATS, "async"))
#: The phases of its categories' events it reads: complete slices, and instants (markers by nature:
#: Kineto's "Iteration Start", cpu_instant_event). Others (a "B"/"E" pair, async "b"/"e") are not.
READ_PHASES = ("X", "i", "I")


def unread(cat: str | None, ph: str | None) -> str | None:
    """Why a marker row of category `cat` and phase `ph` in a Kineto table is one only because
    the importer did not understand it: "category" (a category it does not know, or a slice with
    none), "phase" (a known category in a phase it does not read); None: a marker it means.
    Works on any stored table: cat and ph are kept as the producer wrote them."""
    if cat is not None and cat not in KNOWN_CATS:
        return "category"
    if ph not in READ_PHASES:
        return "phase"
    return "category" if cat is None and ph == "X" else None


_COLLECTIVE = r"nccl|rccl|hccl|ncclDevKernel|ncclKernel"
#: Generic device events whose name says they move or fill memory (MTIA DMA, "Memcpy ...").
_COPY = r"memcpy|^dma"
_FILL = r"memset"
#: CUDA / HIP calls that put exactly one task on a stream: only these count as launches there,
#: as in Holistic Trace Analysis (graph launches enqueue many tasks and stay "api").
_SINGLE_TASK_LAUNCHES = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
    "cudaMemsetAsync", "cudaMemcpy2DAsync", "cudaMemcpyPeerAsync", "cudaMemsetD32Async", "hipLaunchKernel",
    "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream",
)
_NAMED_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "Runtime")
_WORK_KINDS = ("kernel", "memcpy", "memset", "collective")


def looks_like(raw: RawEvents) -> bool:
    """Kineto writes deviceProperties / distributedInfo / schemaVersion and its own categories;
    its first layout, device work ("Kernel", "Memcpy", "Memset") beside host calls ("Operator",
    "Runtime")."""
    if {"deviceProperties", "distributedInfo", "schemaVersion"} & raw.top.keys():
        return True
    cats = set(raw.cat.slice(0, 5000).to_pylist())
    if cats & KINETO_CATS:
        return True
    # The first layout wrote the host's events before the device's: look at every category.
    every = set(raw.encoded("cat").dictionary.to_pylist())
    return bool(every & set(LEGACY_DEVICE_CATS)) and bool(every & set(LEGACY_HOST_CATS))


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
    flows = _Ac2g(raw)
    runtime_cats, device_cats = _classify(raw, is_x, flows)

    dev = np.flatnonzero(is_x & raw.is_in("cat", tuple(device_cats)))
    dargs, grids = _device_args(raw, dev)
    # Kineto writes device rows with pid = device and tid = stream (or queue); args win when present.
    t.set("device", dev, pc.coalesce(dargs["device"], pa.array(raw.pid[dev])))
    t.set("stream", dev, pc.coalesce(dargs["stream"], pa.array(raw.tid[dev])))
    t.set("corr", dev, dargs["corr"])
    t.kind[dev] = _device_kinds(raw, dev, device_cats)
    _collective_parts(raw, t, dev)
    # A task without a correlation arg takes its launch's id from the flow that ends on it.
    linked = dev[t.kind.codes[dev] != CODE["marker"]]
    corr, ok = t.get("corr")
    t.set("corr", linked, flows.fill(linked, pa.array(corr[linked], mask=~ok[linked]), "f"))
    t.set("bytes", dev, dargs["bytes"])
    # Kineto computes a copy's bandwidth from its exact duration; the event's `dur` may be
    # rounded to microseconds, so keep the profiler's figure as the row's value (every copy and
    # fill, whatever its category: gpu_memcpy, the first layout's Memcpy, a plugin's DMA).
    copies = dev[np.isin(t.kind.codes[dev], (CODE["memcpy"], CODE["memset"]))]
    t.set("value", copies, common.float_args(raw, copies, "memory bandwidth (GB/s)"))

    rt = np.flatnonzero(is_x & raw.is_in("cat", tuple(runtime_cats)))
    rt_corr = flows.fill(rt, common.int_args(raw, rt, {"corr": "correlation"})["corr"], "s")
    t.set("corr", rt, rt_corr)
    host_api = np.flatnonzero(is_x & raw.is_in("cat", HOST_API_CATS))
    t.kind[host_api] = "api"
    common.data_loading(raw, t, host_api)
    t.kind[rt] = _runtime_kinds(raw, t, rt, rt_corr)
    _event_links(raw, t, dev, rt)

    # The first layout drew the same flows as cat "async", name "launch".
    ac2g = np.flatnonzero((t.kind == "flow") & (raw.is_in("cat", ("ac2g",))
                                                | (raw.is_in("cat", ("async",)) & raw.is_in("name", ("launch",)))))
    t.set("corr", ac2g, common.flow_ids_as_int(raw, ac2g))
    _kernel_shape(raw, t, dev, rt, grids)

    common.memory_events(raw, t, ph, name)
    device_rows = np.zeros(len(raw), dtype=bool)
    device_rows[dev] = True
    common.steps(raw, t, name, ~device_rows, device_rows)
    return t


#: HIP launches whose "grid" Kineto records in work items (threads), not blocks: roctracer
#: reads their global work size where hipModuleLaunchKernel has its grid.
_WORK_ITEM_LAUNCHES = ("hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel")
#: Top-level keys only Kineto's ROCm builds write (besides HIP runtime call names).
ROCM_KEYS = frozenset(("roctracer_version", "hip_runtime_version", "hip_driver_version"))
#: "blocks per SM" is the grid's blocks / the device's SMs, a float32 that Kineto prints either
#: exactly or with six decimals: it is off that quotient by at most half the sixth decimal plus
#: float32 rounding.
_PER_SM_ABS, _PER_SM_REL = 5e-7, 2.0**-23


#: A grid or block dimension (CUDA and HIP hold them in 32 bits): larger is no launch's.
_Dim = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]


class _GridArg(msgspec.Struct, gc=False):
    dims: tuple[_Dim, _Dim, _Dim] | None = msgspec.field(default=None, name="grid")


class _BlockArg(msgspec.Struct, gc=False):
    dims: tuple[_Dim, _Dim, _Dim] | None = msgspec.field(default=None, name="block")


class _DeviceArgs(msgspec.Struct, gc=False):
    device: int | None = None
    stream: int | None = None
    corr: int | None = msgspec.field(default=None, name="correlation")
    bytes: int | None = None
    grid: tuple[_Dim, _Dim, _Dim] | None = None


_DEVICE_ARGS = msgspec.json.Decoder(list[_DeviceArgs])


def _device_args(raw: RawEvents, dev: np.ndarray) -> tuple[dict[str, pa.Array], pa.Array | None]:
    """The device rows' device, stream, corr and bytes (as common.int_args gives them) and their
    "grid", in one pass over their args; when a row holds something odd, int_args and no grid
    (`_kernel_shape` then decodes the kernels' grids on their own)."""
    if len(dev):
        try:
            rows = _DEVICE_ARGS.decode(raw.args_array_json(dev))
            out = {k: pa.array(map(attrgetter(k), rows), type=pa.int64(), size=len(rows))
                   for k in ("device", "stream", "corr", "bytes")}
            return out, pa.array(map(attrgetter("grid"), rows), type=pa.list_(pa.int64()), size=len(rows))
        except (msgspec.ValidationError, OverflowError):
            pass
    return common.int_args(raw, dev, {"device": "device", "stream": "stream", "corr": "correlation", "bytes": "bytes"}), None


class _PerSmArg(msgspec.Struct, gc=False):
    per_sm: float | None = msgspec.field(default=None, name="blocks per SM")


def _kernel_shape(raw: RawEvents, t: Typed, dev: np.ndarray, rt: np.ndarray, grids: pa.Array | None) -> None:
    """A kernel row's blocks (`value`: the product of its "grid") and its device's cores (`addr`:
    the SMs / CUs, "numSms" of the device's `deviceProperties` entry).

    Blocks: CUDA's grid is in blocks. ROCm's is in blocks for hipLaunchKernel and its kin, in
    work items for `_WORK_ITEM_LAUNCHES` (blocks: the grid over the block, rounded up, per
    dimension); a ROCm kernel whose launch call is not in the trace has no block count.
    Cores: when every device in `deviceProperties` has the same count, every kernel ran on one
    of them; else the entry whose id is the kernel's device, on CUDA only (ROCm numbers a
    kernel's device among all HSA agents, CPUs first, not as deviceProperties does). Without
    one (HTA-style traces drop deviceProperties), a CUDA device's count is the one its kernels'
    "blocks per SM" (grid blocks / SMs) imply, when all of them agree on one whole number within
    the figure's printed precision; else null.
    """
    is_kern = t.kind.codes[dev] == CODE["kernel"]
    kern = dev[is_kern]
    if not len(kern):
        return
    # The grid comes with the device args' pass; block and blocks per SM only where they are needed.
    grid, has_grid = _dims(raw, kern, _GridArg, None if grids is None else grids.filter(pa.array(is_kern)))
    grid_blocks = np.prod(grid.astype(np.float64), axis=1)

    corr, corr_ok = t.get("corr")
    rt_names = common.distinct(raw.take("name", rt))
    rocm = bool(matches(rt_names, r"^hip", ignore_case=False).any()) or bool(ROCM_KEYS & raw.top.keys())
    blocks = np.where(has_grid, grid_blocks, np.nan)
    if rocm:
        launched = rt[corr_ok[rt]]
        by_items = np.isin(corr[kern], corr[rt[mask_of(rt_names, _WORK_ITEM_LAUNCHES) & corr_ok[rt]]]) & corr_ok[kern]
        known = np.isin(corr[kern], corr[launched]) & corr_ok[kern]
        items = np.flatnonzero(by_items & has_grid)
        block, has_block = _dims(raw, kern[items], _BlockArg)
        has_block &= (block > 0).all(axis=1)
        blocks[by_items] = np.nan
        blocks[items[has_block]] = np.prod(np.ceil(grid[items[has_block]] / block[has_block]), axis=1)
        blocks[~known] = np.nan
    t.set("value", kern, blocks)

    device, device_ok = t.get("device")
    kdev = np.where(device_ok[kern], device[kern].astype(np.int64), -1)
    cores = np.full(len(kern), -1, dtype=np.int64)
    props = _sm_counts(raw.top.get("deviceProperties"))
    if props is not None:
        counts = set(props.values())
        if len(counts) == 1 and None not in counts:
            cores[:] = counts.pop()
        elif not rocm:
            for dev_id, n in props.items():
                if n is not None:
                    cores[kdev == dev_id] = n
    rest = (cores < 0) & (kdev >= 0)
    if rest.any():
        per_sm = np.full(len(kern), np.nan)
        said = np.flatnonzero(rest & has_grid)
        per_sm[said] = pa.array(map(attrgetter("per_sm"), common.decode_args(raw, kern[said], _PerSmArg)),
                                type=pa.float64(), size=len(said)).fill_null(np.nan).to_numpy(zero_copy_only=False)
        cores[rest] = _cores_from_per_sm(grid_blocks, per_sm, has_grid & rest, kdev, rest)
    has = cores > 0
    t.set("addr", kern[has], cores[has])


def _cores_from_per_sm(blocks: np.ndarray, per_sm: np.ndarray, usable: np.ndarray, device: np.ndarray,
                       wanted: np.ndarray) -> np.ndarray:
    """The SMs of each `wanted` kernel's device as its kernels' "blocks per SM" say (-1: unsaid).

    A kernel pins its device's count n when the printed figure's error bounds leave one whole n
    with blocks / n within them; a device has a count when its kernels that pin one all pin the
    same, and every kernel's figure is blocks / that count within the bounds.
    """
    out = np.full(int(wanted.sum()), -1, dtype=np.int64)
    said = usable & (per_sm > 0)
    if not said.any():
        return out
    bps = np.where(said, per_sm, 1.0)
    n = np.rint(blocks / bps)
    slack = _PER_SM_ABS + _PER_SM_REL * bps
    fits = said & (n >= 1) & (np.abs(blocks / np.maximum(n, 1) - bps) <= slack)
    pins = fits & (n * slack / bps < 0.5)
    for d in np.unique(device[wanted]).tolist():
        on = device == d
        found = np.unique(n[pins & on])
        if len(found) == 1 and found[0] < 2**31 and not (said & on & ~fits).any() \
                and (np.abs(blocks / found[0] - bps) <= slack)[said & on].all():
            out[(device == d)[wanted]] = int(found[0])
    return out


def _dims(raw: RawEvents, rows: np.ndarray, struct: type, lists: pa.Array | None = None) -> tuple[np.ndarray, np.ndarray]:
    """An [x, y, z] arg of `rows` (`lists`, when decoded already) as an (n, 3) int64 array (1s
    where a row has none), and which rows have one."""
    if lists is None:
        lists = pa.array(map(attrgetter("dims"), common.decode_args(raw, rows, struct)), type=pa.list_(pa.int64()),
                         size=len(rows))
    ok = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False) == 3
    out = np.ones((len(lists), 3), dtype=np.int64)
    if ok.any():
        out[ok] = pc.list_flatten(lists.filter(pa.array(ok))).to_numpy(zero_copy_only=False).reshape(-1, 3)
    ok &= (out >= 0).all(axis=1)
    return out, ok


def _sm_counts(props: Any) -> dict[int, int | None] | None:
    """Device id -> "numSms" of Kineto's `deviceProperties` (None: the entry has no count)."""
    if not isinstance(props, list) or not props:
        return None
    out: dict[int, int | None] = {}
    for p in props:
        if not isinstance(p, dict) or to_int(p.get("id")) is None:
            return None
        n = to_int(p.get("numSms"))
        out[to_int(p.get("id"))] = n if n is not None and n > 0 else None  # type: ignore[index]
    return out


class _CommArgs(msgspec.Struct):
    group: Any = msgspec.field(default=None, name="Process Group Name")


def _collective_parts(raw: RawEvents, t: Typed, dev: np.ndarray) -> None:
    """A collective kernel's communicator and its sequence number in it (its place among the rank's
    calls on it). ProcessGroupNCCL runs each communicator on a stream of its own, so a stream is
    one communicator: named by the "Process Group Name" its kernels carry (PyTorch 2.x writes it,
    though not on every kernel), else by the stream (older traces name no group)."""
    rows = dev[t.kind.codes[dev] == CODE["collective"]]
    if not len(rows):
        return
    stream, ok = t.get("stream")
    groups = [a.group for a in common.decode_args(raw, rows, _CommArgs)]
    named: dict[int, set[str]] = {}
    for g, i in zip(groups, rows.tolist()):
        if ok[i] and g not in (None, ""):
            named.setdefault(int(stream[i]), set()).add(str(g))
    labels = []
    for i in rows.tolist():
        if not ok[i]:
            labels.append(None)
            continue
        names = named.get(int(stream[i]), set())
        labels.append(next(iter(names)) if len(names) == 1 else f"stream {int(stream[i])}")
    common.collective_parts(raw, t, rows, labels)


def _classify(raw: RawEvents, is_x: np.ndarray, flows: "_Ac2g") -> tuple[list[str], dict[str, str | None]]:
    """The runtime categories and the device categories (-> kind) of this trace.

    A category libkineto does not name is a runtime when named like one (`*_runtime`,
    `*_driver`), and device work when laid out as Kineto lays device work out: its events
    carry both "device" and "stream" args, or they end `ac2g` flows that start on a runtime
    call. The rest is host activity left as markers.
    """
    present = [c for c in pc.unique(raw.take("cat", np.flatnonzero(is_x))).to_pylist() if c is not None]
    runtime = [c for c in present if c in RUNTIME_CATS or (c not in DEVICE_CATS and _RUNTIME_NAME.search(c))]
    device = {c: k for c, k in DEVICE_CATS.items() if c in present}
    known = set(runtime) | set(device) | set(HOST_API_CATS) | set(HOST_MARKER_CATS)
    unknown = [c for c in present if c not in known]
    if not unknown:
        return runtime, device
    rows = np.flatnonzero(is_x & raw.is_in("cat", tuple(unknown)))
    args = common.int_args(raw, rows, {"device": "device", "stream": "stream"})
    placed = (args["device"].is_valid().to_numpy(zero_copy_only=False)
              & args["stream"].is_valid().to_numpy(zero_copy_only=False))
    found = set(raw.take("cat", rows[placed]).to_pylist())
    rest = rows[~np.isin(raw.take("cat", rows).to_numpy(zero_copy_only=False), list(found))]
    if len(rest):
        ends = flows.ends_launched_flow(rest, raw.is_in("cat", tuple(runtime)))
        found |= set(raw.take("cat", rest[ends]).to_pylist())
    device.update({c: None for c in found})
    return runtime, device


def _device_kinds(raw: RawEvents, dev: np.ndarray, device_cats: dict[str, str | None]) -> np.ndarray:
    cats = raw.is_in
    names = common.distinct(raw.take("name", dev))
    kinds = kind_codes(len(dev), "kernel")
    for kind in set(device_cats.values()) - {None, "kernel"}:
        kinds[cats("cat", tuple(c for c, k in device_cats.items() if k == kind))[dev]] = CODE[kind]
    by_name = cats("cat", tuple(c for c, k in device_cats.items() if k is None))[dev]
    if by_name.any():
        kinds[by_name & matches(names, _COPY)] = CODE["memcpy"]
        kinds[by_name & matches(names, _FILL)] = CODE["memset"]
    # CUPTI's Stream Wait Event is a stream waiting for an event on the device (written for the
    # cudaStreamWaitEvent call); Event Sync, Stream Sync and Context Sync are the host waiting.
    kinds[(kinds == CODE["sync"]) & mask_of(names, ("Stream Wait Event",))] = CODE["wait"]
    kinds[(kinds == CODE["kernel"]) & matches(names, _COLLECTIVE)] = CODE["collective"]
    return kinds


#: CUPTI's synchronization records that name the event waited for (args wait_on_*): Stream Wait
#: Event (a stream waits for it on the device) and Event Sync (the host waits for it).
_EVENT_SYNCS = ("Stream Wait Event", "Event Sync")


def _event_links(raw: RawEvents, t: Typed, dev: np.ndarray, rt: np.ndarray) -> None:
    """The event a Stream Wait Event / Event Sync record waits for, in typed columns: the record's
    `addr` = the event ("wait_on_cuda_event_id"), `value` = the correlation id of the
    cudaEventRecord call that recorded it ("wait_on_cuda_event_record_corr_id", -1: CUPTI did
    not see it); and that record call's `stream` / `device` = the stream it recorded the event on
    ("wait_on_stream") and `addr` = the event, as the other producers' launch calls name the
    stream they act on. A record call no such record names keeps none of them."""
    rows = dev[np.isin(t.kind.codes[dev], (CODE["wait"], CODE["sync"])) & raw.is_in("name", _EVENT_SYNCS)[dev]]
    if not len(rows):
        return
    args = common.int_args(raw, rows, {"on_stream": "wait_on_stream", "record": "wait_on_cuda_event_record_corr_id",
                                       "event": "wait_on_cuda_event_id"})
    ints = {k: (a.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64),
                a.is_valid().to_numpy(zero_copy_only=False)) for k, a in args.items()}
    event, has_event = ints["event"][0], ints["event"][1] & (ints["event"][0] >= 0)
    record, has_record = ints["record"]
    t.set("addr", rows[has_event], event[has_event])
    t.set("value", rows[has_record], np.maximum(record[has_record], -1))
    on_stream = ints["on_stream"][0]
    device, device_ok = t.get("device")
    named = has_record & (record >= 0) & ints["on_stream"][1] & (on_stream >= 0) & device_ok[rows]
    corr, corr_ok = t.get("corr")
    calls = rt[corr_ok[rt]]
    if not named.any() or not len(calls):
        return
    # The first record naming each record call (they all say the same of it).
    ids, first = np.unique(record[named], return_index=True)
    src = np.flatnonzero(named)[first]
    call_corr = corr[calls]
    at = np.minimum(np.searchsorted(ids, call_corr), len(ids) - 1)
    hit = ids[at] == call_corr
    calls, k = calls[hit], src[at[hit]]
    t.set("stream", calls, on_stream[k])
    t.set("device", calls, device[rows[k]].astype(np.int64))
    ok = has_event[k]
    t.set("addr", calls[ok], event[k[ok]])


def _runtime_kinds(raw: RawEvents, t: Typed, rt: np.ndarray, rt_corr: pa.Array) -> np.ndarray:
    """api, launch, sync or wait for each runtime call `rt`."""
    corr, ok = t.get("corr")
    ids, tasks = np.unique(corr[t.kind.isin(_WORK_KINDS) & ok], return_counts=True)
    mine = rt_corr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    at = np.minimum(np.searchsorted(ids, mine), max(len(ids) - 1, 0))
    found = rt_corr.is_valid().to_numpy(zero_copy_only=False) & (ids[at] == mine if len(ids) else False)
    n_tasks = np.where(found, tasks[at] if len(ids) else 0, 0)
    names = common.distinct(raw.take("name", rt))
    named = raw.is_in("cat", _NAMED_LAUNCH_CATS)[rt]
    # CUDA / HIP: a launch is one of the calls known to enqueue exactly one task. Other
    # backends' call names are not known in advance: a call is a launch when it is the first
    # call carrying the correlation id of exactly one device task.
    launch = named & (n_tasks > 0) & mask_of(names, _SINGLE_TASK_LAUNCHES)
    cand = np.flatnonzero(~named & (n_tasks == 1))
    if len(cand):
        cand = cand[np.argsort(raw.ts_ns[rt[cand]], kind="stable")]
        _, first = np.unique(mine[cand], return_index=True)
        launch[cand[first]] = True
    kinds = np.where(launch, CODE["launch"], CODE["api"]).astype(np.int8)
    kinds[matches(names, r"synchroni[sz]e")] = CODE["sync"]
    # cudaMemcpy / cudaMemset without Async return only when the copy is done: the host waits.
    blocking_copy = (matches(names, r"^(cuda|hip)Mem(cpy|set)", ignore_case=False)
                     & ~contains(names, "Async") & ~contains(names, "WithStream"))
    kinds[blocking_copy] = CODE["sync"]
    # CUPTI writes a synchronization record (cuda_sync) for the calls that waited on the device:
    # Event Sync for cudaEventSynchronize and cudaEventQuery, Stream / Context Sync for the
    # synchronize calls. A call paired with one (its correlation id) is a sync, whatever its name.
    sync_rows = raw.is_in("cat", ("cuda_sync", "xpu_sync")) & ~raw.is_in("name", ("Stream Wait Event",)) & ok
    synced = np.isin(mine, corr[sync_rows]) & rt_corr.is_valid().to_numpy(zero_copy_only=False)
    kinds[synced & (kinds == CODE["api"])] = CODE["sync"]
    kinds[matches(names, r"StreamWaitEvent|WaitEvent$")] = CODE["wait"]
    return kinds


class _Ac2g:
    """Kineto's `ac2g` flows: "s" on the launching call, "f" (bound to the enclosing slice)
    on the device task, both with id = the correlation id. Bound to slices only on demand:
    traces whose events carry correlation args never need it."""

    def __init__(self, raw: RawEvents) -> None:
        self.raw = raw
        self._bindings: dict[str, np.ndarray] = {}

    @cached_property
    def _ends(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """"s" / "f" -> (rows, ids) of the flows that have both ends."""
        raw = self.raw
        rows = np.flatnonzero(raw.is_in("ph", ("s", "f")) & raw.is_in("cat", ("ac2g",)))
        ids = common.flow_ids_as_int(raw, rows)
        ok = ids.is_valid().to_numpy(zero_copy_only=False)
        rows, ids = rows[ok], ids.fill_null(0).to_numpy(zero_copy_only=False)[ok]
        is_start = raw.is_in("ph", ("s",))[rows]
        # Only flows with both ends link a launch to its task; a lone "f" marks a call that
        # enqueued nothing (a synchronize, an event query).
        keep = np.isin(ids, np.intersect1d(ids[is_start], ids[~is_start]))
        return {"s": (rows[keep & is_start], ids[keep & is_start]), "f": (rows[keep & ~is_start], ids[keep & ~is_start])}

    def bound(self, end: str, slices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slice rows, flow ids) for the flows of `end` ("s" / "f") bound to one of `slices`."""
        points, point_ids = self._ends[end]
        if not len(points) or not len(slices):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if end not in self._bindings:
            self._bindings[end] = self._binding(end)
        hit = self._bindings[end]
        ok = np.isin(hit, slices)
        return hit[ok], point_ids[ok]

    def _binding(self, end: str) -> np.ndarray:
        """The slice each flow of `end` binds to (-1: none): the innermost X slice of its
        track enclosing its ts, whatever that slice is (a device annotation spans the kernels
        under it, and must not take their flows)."""
        raw = self.raw
        points = self._ends[end][0]
        x = np.flatnonzero(raw.is_in("ph", ("X",)))
        # Tracks as dense ids: pid and tid each made dense, then paired without collisions.
        _, pid = np.unique(np.concatenate([raw.pid[x], raw.pid[points]]), return_inverse=True)
        tids, tid = np.unique(np.concatenate([raw.tid[x], raw.tid[points]]), return_inverse=True)
        _, track = np.unique(pid.reshape(-1).astype(np.int64) * len(tids) + tid.reshape(-1), return_inverse=True)
        track = track.reshape(-1)
        x_track, p_track = track[:len(x)], track[len(x):]
        x = x[np.isin(x_track, p_track)]
        x_track = x_track[np.isin(x_track, p_track)]
        hit = np.full(len(points), -1, dtype=np.int64)
        ts = raw.ts_ns
        span = int(ts.max() - ts.min()) + 1 if len(ts) else 1
        if len(x) and (int(track.max()) + 1) * span < 2**62:
            # Kineto writes each flow end at the start of its slice: match (track, ts) exactly,
            # the shortest slice first among those starting together (the innermost).
            dur = np.nan_to_num(raw.dur_ns.to_numpy(zero_copy_only=False)).astype(np.int64)
            x_key = x_track.astype(np.int64) * span + (ts[x] - ts.min())
            order = np.lexsort((dur[x], x_key))
            keys = x_key[order]
            p_key = p_track.astype(np.int64) * span + (ts[points] - ts.min())
            at = np.minimum(np.searchsorted(keys, p_key), len(keys) - 1)
            exact = keys[at] == p_key
            hit[exact] = x[order][at[exact]]
        rest = np.flatnonzero(hit < 0)
        if len(rest):  # a flow inside its slice rather than at its start
            hit[rest] = common.enclosing_slices(raw, points[rest], x)
        return hit

    def ends_launched_flow(self, rows: np.ndarray, runtime_mask: np.ndarray) -> np.ndarray:
        """Which of `rows` end a flow whose start is on a runtime call (mask over rows)."""
        starts, start_ids = self.bound("s", np.flatnonzero(runtime_mask & self.raw.is_in("ph", ("X",))))
        ends, end_ids = self.bound("f", rows)
        return np.isin(rows, ends[np.isin(end_ids, start_ids)])

    def fill(self, rows: np.ndarray, corr: pa.Array, end: str) -> pa.Array:
        """`corr` of `rows` (ascending), with the bound flow's id where the event carries no
        correlation arg."""
        missing = corr.is_null().to_numpy(zero_copy_only=False)
        if not missing.any():
            return corr
        hit, ids = self.bound(end, rows[missing])
        if not len(hit):
            return corr
        values = corr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        valid = ~missing
        at = np.searchsorted(rows, hit)
        values[at] = ids
        valid[at] = True
        return pa.array(values, mask=~valid)
