"""Typed views of a trace table that every analyzer starts from (pandas, vectorised).

Analyzers read only typed columns and `kind` (plus `name` for labels), never `args`, so they
work the same on emulated and imported traces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.trace.importers.kineto import ROCM_KEYS
from msprof_py.trace.schema import Trace

DEVICE_KINDS = ("kernel", "memcpy", "memset", "collective")
#: The columns analyzers read (a table loaded for analysis needs no more: args, extra and id stay on disk).
ANALYSIS_COLUMNS = ("rank", "ph", "name", "cat", "ts", "dur", "pid", "tid", "kind", "device", "stream", "corr", "bytes",
                    "addr", "value", "step")
_COLUMNS = ANALYSIS_COLUMNS


@dataclass
class Frames:
    """Lazily built, cached DataFrames of one trace: device ops, launches, memory events...

    `window="complete_steps"` keeps what Holistic Trace Analysis keeps by default when a trace
    has two or more `ProfilerStep#` slices: host events that start before the last step (which
    is usually cut short by the profiler), and the device ops those host events launched.
    """

    trace: Trace
    window: str = "all"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.window not in ("all", "complete_steps"):
            raise ValueError(f"window must be 'all' or 'complete_steps', got {self.window!r}")

    @cached_property
    def table(self) -> pa.Table:
        """The analyzed rows, with only the columns analyzers read (no args / extra / id)."""
        t = self.trace.table.select(list(_COLUMNS))
        if self.window == "all":
            return t
        codes, names = dictionary_codes(t.column("kind"))
        ph_codes, ph_names = dictionary_codes(t.column("ph"))
        step_mask = _code_mask(codes, names, ("step",)) & _code_mask(ph_codes, ph_names, ("X",))
        if step_mask.sum() < 2:
            return t
        keep = np.ones(t.num_rows, dtype=bool)
        rank = t.column("rank").to_numpy()
        ts = t.column("ts").to_numpy()
        corr = t.column("corr").to_numpy(zero_copy_only=False)
        device = _code_mask(codes, names, DEVICE_KINDS)
        host = ~device & ~_code_mask(codes, names, ("flow", "meta", "counter"))
        srank, sts = rank[step_mask], ts[step_mask]
        for r in np.unique(srank):
            cutoff = sts[srank == r].max()
            mine = rank == r
            keep[mine & host & (ts >= cutoff)] = False
            kept = corr[mine & host & keep]
            kept = kept[~np.isnan(kept)] if kept.dtype.kind == "f" else kept
            keep[mine & device] = np.isin(corr[mine & device], kept)
        return t.filter(pa.array(keep))

    @cached_property
    def _kind_codes(self) -> tuple[np.ndarray, list[str]]:
        return dictionary_codes(self.table.column("kind"))

    def kind_mask(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Rows of `table` whose kind is one of `kinds` (compared as dictionary codes)."""
        codes, names = self._kind_codes
        return _code_mask(codes, names, kinds)

    def _frame(self, mask: np.ndarray, columns: tuple[str, ...]) -> pd.DataFrame:
        sub = self.table.select(list(columns))
        if not mask.all():
            sub = sub.filter(pa.array(mask))
        return _to_pandas(sub)

    def _select(self, kinds: tuple[str, ...], columns: tuple[str, ...] = _COLUMNS) -> pd.DataFrame:
        return self._frame(self.kind_mask(kinds), columns)

    @cached_property
    def device_ops(self) -> pd.DataFrame:
        """Kernels, copies, memsets and collectives that ran on a stream, sorted per stream by ts."""
        t = self.table
        ph_codes, ph_names = dictionary_codes(t.column("ph"))
        mask = (self.kind_mask(DEVICE_KINDS) & t.column("stream").is_valid().to_numpy(zero_copy_only=False)
                & _code_mask(ph_codes, ph_names, ("X",)))
        sub = t.select(["rank", "ph", "name", "ts", "dur", "kind", "device", "stream", "corr", "bytes", "addr", "value",
                        "step"])
        sub = sub.filter(pa.array(mask))
        # Sorted per (rank, device, stream) by ts in Arrow, before the pandas conversion.
        rank = sub.column("rank").to_numpy()
        device = sub.column("device").fill_null(-1).to_numpy()
        stream = sub.column("stream").to_numpy()
        order = np.lexsort((sub.column("ts").to_numpy(), stream, device, rank))
        if len(order) and (np.diff(order) != 1).any():
            sub = sub.take(pa.array(order))
        df = _to_pandas(sub)
        df["dur"] = df["dur"].fillna(0).astype(np.int64)
        df["end"] = df["ts"] + df["dur"]
        df["stream"] = df["stream"].astype(np.int64)
        df["device"] = df["device"].fillna(-1).astype(np.int64)
        return df

    @cached_property
    def launches(self) -> pd.DataFrame:
        """Host calls that put work on a stream (kind launch, or op_compile: a call that compiled an
        operator and then launched it), with the device op they created."""
        mask = self.kind_mask(("launch", "op_compile")) & self.table.column("corr").is_valid().to_numpy(zero_copy_only=False)
        return self._frame(mask, ("rank", "ph", "name", "ts", "dur", "pid", "tid", "corr", "kind"))

    @cached_property
    def host_calls(self) -> pd.DataFrame:
        df = self._select(("api", "launch", "sync", "wait"), ("rank", "ph", "name", "cat", "ts", "dur", "pid", "tid",
                                                            "kind"))
        return df[df["ph"] == "X"].reset_index(drop=True)

    @cached_property
    def memory(self) -> pd.DataFrame:
        df = self._select(("alloc", "free"), ("rank", "name", "ts", "kind", "device", "bytes", "addr", "value", "step"))
        return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)

    @cached_property
    def counters(self) -> pd.DataFrame:
        return self._select(("counter",), ("rank", "name", "ts", "value", "device", "stream"))

    @cached_property
    def steps(self) -> pd.DataFrame:
        df = self._select(("step",), ("rank", "ph", "name", "ts", "dur", "step"))
        df = df[df["ph"] == "X"].copy()
        df["end"] = df["ts"] + df["dur"].fillna(0).astype(np.int64)
        return df.sort_values(["rank", "ts"]).reset_index(drop=True)

    @cached_property
    def host_work(self) -> pd.DataFrame:
        """Host computation the device waits on (kinds host_work and data_load), per thread by ts."""
        df = self._select(("host_work", "data_load"), ("rank", "ph", "pid", "tid", "name", "kind", "ts", "dur"))
        df = df[df["ph"] == "X"].drop(columns="ph")
        df["dur"] = df["dur"].fillna(0).astype(np.int64)
        df["end"] = df["ts"] + df["dur"]
        return df.sort_values(["rank", "pid", "tid", "ts"], kind="stable").reset_index(drop=True)

    @cached_property
    def accesses(self) -> pd.DataFrame:
        """Device tasks' buffer accesses (kinds mem_read / mem_write): addr is the buffer, corr the task."""
        df = self._select(("mem_read", "mem_write"), ("rank", "ts", "kind", "addr", "corr"))
        return df[df["addr"].notna() & df["corr"].notna()].reset_index(drop=True)

    @cached_property
    def alloc_failures(self) -> pd.DataFrame:
        """Failed allocations (kind alloc_fail): bytes requested, value the largest free block if known."""
        df = self._select(("alloc_fail",), ("rank", "device", "ts", "bytes", "value"))
        return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)

    @cached_property
    def platform(self) -> str:
        """What the trace ran on: "ascend" (emulator, msprof, torch_npu), "cuda", "rocm", or
        "unknown", from the trace's source format, device properties, profiler versions and
        runtime calls."""
        return platform_of(self.trace.meta, self._runtime_call_names())

    def _runtime_call_names(self) -> list[str]:
        """The distinct names of the host's runtime calls (kinds launch, sync, wait)."""
        mask = self.kind_mask(("launch", "sync", "wait"))
        if not mask.any():
            return []
        return pc.unique(self.table.column("name").filter(pa.array(mask))).to_pylist()

    @cached_property
    def span(self) -> tuple[int, int]:
        t = self.table
        real = t.filter(pc.not_equal(t.column("kind").cast(pa.string()), "meta"))
        if real.num_rows == 0:
            return 0, 0
        ts = real.column("ts").to_numpy()
        dur = real.column("dur").fill_null(0).to_numpy()
        return int(ts.min()), int((ts + dur).max())


#: A HIP runtime call (hipLaunchKernel, hipMemcpyAsync, hipStreamSynchronize, ...).
_HIP_CALL = re.compile(r"^hip[A-Z]")


def platform_of(meta, runtime_calls: Iterable[str] = ()) -> str:
    """"ascend", "cuda", "rocm" or "unknown" for a TraceMeta and the names of the trace's host
    runtime calls (see Frames.platform). ROCm: AMD device names, or, where a build writes the
    names empty, the roctracer / HIP versions Kineto writes on ROCm or HIP runtime calls."""
    if meta.source_format in ("emulator", "ascend") or (meta.extra or {}).get("preset"):
        return "ascend"
    top = meta.source_meta or {}
    props = top.get("deviceProperties")
    names = " ".join(str(p.get("name", "")) for p in props if isinstance(p, dict)) if isinstance(props, list) else ""
    if any(w in names for w in ("AMD", "Radeon", "Instinct", "MI2", "MI3")):
        return "rocm"
    if ROCM_KEYS & top.keys() or any(_HIP_CALL.match(n) for n in runtime_calls if isinstance(n, str)):
        return "rocm"
    if names or meta.source_format == "kineto":
        return "cuda"  # Kineto traces come from GPU jobs; without device names, CUDA is the common case
    return "unknown"


def gaps(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Idle gaps before each interval (sorted by ts): start minus the latest end so far (>= 0)."""
    if len(ts) == 0:
        return np.zeros(0, dtype=np.int64)
    prev_end = np.maximum.accumulate(end)
    out = np.zeros(len(ts), dtype=np.int64)
    out[1:] = np.maximum(ts[1:] - prev_end[:-1], 0)
    return out


def union_ns(ts: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals (sorted by ts)."""
    if len(ts) == 0:
        return 0
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    return int((end.max() - ts[0]) - gaps(ts, end).sum())


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (starts, ends)."""
    if len(ts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(ts, kind="stable")
    ts, end = np.asarray(ts)[order].astype(np.int64), np.asarray(end)[order].astype(np.int64)
    run_end = np.maximum.accumulate(end)
    new = np.ones(len(ts), dtype=bool)
    new[1:] = ts[1:] > run_end[:-1]
    return ts[new], np.maximum.reduceat(run_end, np.flatnonzero(new))


def intersect_intervals(x: tuple[np.ndarray, np.ndarray],
                        y: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two unions of disjoint sorted intervals (as `merge_intervals` gives)."""
    out_a, out_b = [], []
    i = j = 0
    (xa, xb), (ya, yb) = x, y
    while i < len(xa) and j < len(ya):
        lo, hi = max(xa[i], ya[j]), min(xb[i], yb[j])
        if hi > lo:
            out_a.append(lo)
            out_b.append(hi)
        if xb[i] < yb[j]:
            i += 1
        else:
            j += 1
    return np.array(out_a, np.int64), np.array(out_b, np.int64)


class Cover:
    """Cumulative union length of a set of intervals: cover(t) = covered time before t, so
    cover.between(a, b) is the covered time in [a, b) (vectorised over a and b)."""

    def __init__(self, ts: np.ndarray, end: np.ndarray) -> None:
        self.starts, self.ends = merge_intervals(np.asarray(ts), np.asarray(end))
        lengths = self.ends - self.starts
        self.before = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths

    def __call__(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        if len(self.starts) == 0:
            return np.zeros(t.shape, dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        j = np.clip(i, 0, None)
        inside = np.clip(t - self.starts[j], 0, self.ends[j] - self.starts[j])
        return np.where(i >= 0, self.before[j] + inside, 0)

    def between(self, a, b) -> np.ndarray:
        return self(b) - self(a)


def cover(rows: pd.DataFrame) -> Cover:
    """The Cover of rows with `ts` and `dur` (a missing dur is an instant; no rows: nothing)."""
    if rows.empty:
        return Cover(np.zeros(0, np.int64), np.zeros(0, np.int64))
    ts = rows["ts"].to_numpy(dtype=np.int64)
    return Cover(ts, ts + rows["dur"].fillna(0).to_numpy(dtype=np.int64))


def dictionary_codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """A dictionary column's codes (null as -1) and its dictionary as a list."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    return np.asarray(col.indices.fill_null(-1).to_numpy(zero_copy_only=False)), col.dictionary.to_pylist()


def _code_mask(codes: np.ndarray, names: list[str], wanted: tuple[str, ...]) -> np.ndarray:
    hits = [i for i, k in enumerate(names) if k in wanted]
    if not hits:
        return np.zeros(len(codes), dtype=bool)
    if len(hits) == 1:
        return codes == hits[0]
    return np.isin(codes, hits)


def _to_pandas(t: pa.Table) -> pd.DataFrame:
    """A table as a DataFrame; dictionary columns become categoricals of the values present."""
    df = t.to_pandas()
    for c in ("kind", "ph", "name", "cat"):
        if c in df and isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].cat.remove_unused_categories()
    return df
