"""Typed-column derivation shared by every importer: vectorised over the raw columns."""

from __future__ import annotations

import functools
import re
from operator import attrgetter
from typing import Any, Callable

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.trace.raw import RawEvents
from msprof_py.trace.schema import KINDS, communicator_id

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


#: Kind name -> small integer code; importers work on codes, the table stores names.
CODE = {k: i for i, k in enumerate(KINDS)}


class KindColumn:
    """The `kind` of every row as int8 codes: comparisons and assignments stay numeric."""

    def __init__(self, n: int) -> None:
        self.codes = np.full(n, CODE["marker"], dtype=np.int8)

    def __setitem__(self, idx: Any, value: Any) -> None:
        if isinstance(value, str):
            self.codes[idx] = CODE[value]
        else:
            self.codes[idx] = np.asarray(value, dtype=np.int8)

    def __eq__(self, name: object) -> np.ndarray:  # type: ignore[override]
        return self.codes == CODE[name]  # type: ignore[index]

    def __ne__(self, name: object) -> np.ndarray:  # type: ignore[override]
        return self.codes != CODE[name]  # type: ignore[index]

    def isin(self, names: tuple[str, ...]) -> np.ndarray:
        return np.isin(self.codes, [CODE[n] for n in names])

    def to_arrow(self) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(self.codes.astype(np.int32)), pa.array(KINDS))


def kind_codes(n: int, default: str) -> np.ndarray:
    """A code array for a subset of rows, to fill and then assign to `Typed.kind`."""
    return np.full(n, CODE[default], dtype=np.int8)


class Typed:
    """The typed columns being filled for one raw trace (numpy arrays + validity masks)."""

    def __init__(self, raw: RawEvents) -> None:
        n = len(raw)
        self.n = n
        self.kind = KindColumn(n)
        self.rank = np.zeros(n, dtype=np.int32)
        self._ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for col, dt in (("device", np.int32), ("stream", np.int32), ("corr", np.int64),
                        ("bytes", np.int64), ("addr", np.int64), ("step", np.int32)):
            self._ints[col] = (np.zeros(n, dtype=dt), np.zeros(n, dtype=bool))
        self.value = np.full(n, np.nan)
        self.value_set = np.zeros(n, dtype=bool)

    def set(self, col: str, idx: Any, values: Any) -> None:
        """Set column `col` at positions `idx` (index array or mask); None/NaN entries stay null."""
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            ok = values.is_valid().to_numpy(zero_copy_only=False)
            vals = values.fill_null(0).to_numpy(zero_copy_only=False)
            if col == "value":
                self.value[idx] = vals
                self.value_set[idx] = ok
            else:
                data, valid = self._ints[col]
                data[idx] = vals
                valid[idx] = ok
            return
        vals = np.asarray(values)
        if col == "value":
            v = vals.astype(np.float64)
            self.value[idx] = v
            self.value_set[idx] = ~np.isnan(v) if v.shape else not np.isnan(v)
            return
        data, valid = self._ints[col]
        if vals.dtype == object:
            ok = np.array([x is not None for x in vals.ravel()], dtype=bool).reshape(vals.shape)
            filled = np.where(ok, vals, 0).astype(np.int64)
        else:
            ok = np.ones(vals.shape, dtype=bool)
            filled = vals.astype(np.int64)
        data[idx] = filled
        valid[idx] = ok

    def get(self, col: str) -> tuple[np.ndarray, np.ndarray]:
        return self._ints[col]

    def columns(self, order: np.ndarray | None = None) -> dict[str, Any]:
        """The typed columns, in row order `order` (None: as they are)."""
        def rows(a: np.ndarray) -> np.ndarray:
            return a if order is None else a[order]

        kind = KindColumn(0)
        kind.codes = rows(self.kind.codes)
        out: dict[str, Any] = {"kind": kind.to_arrow(), "rank": rows(self.rank)}
        for col, (data, valid) in self._ints.items():
            out[col] = pa.array(rows(data), mask=~rows(valid))
        out["value"] = pa.array(rows(self.value), mask=~rows(self.value_set))
        return out


def strings(values: list[str | None]) -> pa.Array:
    return pa.array(values, type=pa.string())


def mask_of(values: pa.Array, allowed: tuple[str, ...]) -> np.ndarray:
    return _per_value(values, lambda v: pc.is_in(v, value_set=pa.array(allowed)))


def contains(values: pa.Array, literal: str) -> np.ndarray:
    """Rows whose text contains `literal` (plain substring: much cheaper than a regex)."""
    return _per_value(values, lambda v: pc.match_substring(v, literal))


def matches(values: pa.Array, pattern: str, ignore_case: bool = True) -> np.ndarray:
    """Rows whose text matches the regex `pattern`."""
    return _per_value(values, lambda v: pc.match_substring_regex(v, pattern, ignore_case=ignore_case))


def _per_value(values: pa.Array, test: Callable[[pa.Array], pa.Array]) -> np.ndarray:
    """`test` (a boolean Arrow kernel) per row, nulls False; a dictionary-encoded array (see
    `distinct`) is tested once per distinct value."""
    if isinstance(values, pa.DictionaryArray):
        hit = np.append(test(values.dictionary).fill_null(False).to_numpy(zero_copy_only=False), False)
        return hit[values.indices.fill_null(len(values.dictionary)).to_numpy()]
    return test(values).fill_null(False).to_numpy(zero_copy_only=False)


def distinct(values: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """`values` dictionary-encoded: names repeat (a trace has few distinct kernel and call
    names), so several regexes over one column are cheaper on its distinct values."""
    enc = pc.dictionary_encode(values)
    return enc.unify_dictionaries().combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc


def collective_parts(raw: RawEvents, t: Typed, rows: np.ndarray, labels: list[str | None],
                     seqs: list[int | None] | None = None) -> None:
    """Fill a collective row's communicator (`addr`, schema.communicator_id of its label) and
    its call's sequence number in it (`value`). Without `seqs`, a call's number is its place
    among the rank's calls on the communicator in time order: a communicator's ranks issue its
    collectives in one order (NCCL and HCCL require it), so the n-th call of each rank is one
    collective. Rows with no label stay null."""
    if not len(rows):
        return
    has = np.array([x is not None for x in labels], dtype=bool)
    rows, labels = rows[has], [x for x in labels if x is not None]
    if seqs is not None:
        seqs = [q for q, h in zip(seqs, has.tolist()) if h]
    if not len(rows):
        return
    ids = np.array([communicator_id(x) for x in labels], dtype=np.int64)
    if seqs is None:
        order = np.lexsort((raw.ts_ns[rows], ids, t.rank[rows]))
        key = np.stack([t.rank[rows][order].astype(np.int64), ids[order]])
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
        first = np.maximum.accumulate(np.where(new, np.arange(len(rows)), 0))
        seq = np.empty(len(rows), dtype=np.float64)
        seq[order] = np.arange(len(rows)) - first
    else:
        seq = np.array([np.nan if q is None else float(q) for q in seqs], dtype=np.float64)
    t.set("addr", rows, ids)
    t.set("value", rows, seq)


def decode_args(raw: RawEvents, idx: np.ndarray, struct: type) -> list[Any]:
    """Decode the `args` of the rows `idx` into `struct` in one msgspec pass."""
    if not len(idx):
        return []
    try:
        return msgspec.json.decode(raw.args_array_json(idx), type=list[struct])
    except msgspec.ValidationError:
        # One odd row (e.g. a string where a number is usual) must not sink the import.
        return decode_args_texts([t or "{}" for t in raw.args_of(idx)], struct)


def int_args(raw: RawEvents, idx: np.ndarray, keys: dict[str, str]) -> dict[str, pa.Array]:
    """Integer-valued args of rows `idx`: {out_name: int64 array with nulls} for {out_name: arg key}.

    One typed msgspec pass; when a row has an odd value (a hex string, a float) the rows are
    decoded loosely and converted one by one.
    """
    if not len(idx):
        return {k: pa.array([], type=pa.int64()) for k in keys}
    strict, loose = _int_structs(tuple(keys.values()))
    blob = raw.args_array_json(idx)
    try:
        rows = strict.decode(blob)
        # A column per key straight from the rows: no tuple per row (zip(*rows) builds one,
        # and unpacks every row into one call).
        return {out: pa.array(map(attrgetter(f"f{i}"), rows), type=pa.int64(), size=len(rows))
                for i, out in enumerate(keys)}
    except (msgspec.ValidationError, OverflowError):
        rows = decode_args_texts([t or "{}" for t in raw.args_of(idx)], loose)
        return {out: pa.array([to_int(getattr(r, f"f{i}")) for r in rows], type=pa.int64())
                for i, out in enumerate(keys)}


@functools.lru_cache(maxsize=32)
def _int_structs(keys: tuple[str, ...]) -> tuple[msgspec.json.Decoder, type]:
    """For int_args: a decoder of a list of the args as ints (made once per set of keys), and
    the same struct with untyped fields, for the rows that hold something else."""
    fields = [(f"f{i}", int | None, msgspec.field(default=None, name=key)) for i, key in enumerate(keys)]
    strict = msgspec.defstruct("IntArgs", fields, gc=False)
    loose = msgspec.defstruct("AnyArgs", [(f, Any, d) for f, _t, d in fields], gc=False)
    return msgspec.json.Decoder(list[strict]), loose


def float_args(raw: RawEvents, idx: np.ndarray, key: str) -> np.ndarray:
    """A numeric arg of rows `idx` as float64 (NaN where absent or not a number)."""
    if not len(idx):
        return np.zeros(0)
    struct = msgspec.defstruct("FloatArg", [("v", Any, msgspec.field(default=None, name=key))], gc=False)
    rows = msgspec.json.decode(raw.args_array_json(idx), type=list[struct])
    return np.array([r.v if isinstance(r.v, (int, float)) and not isinstance(r.v, bool) else np.nan for r in rows],
                    dtype=np.float64)


def decode_args_texts(texts: list[str], struct: type) -> list[Any]:
    dec = msgspec.json.Decoder(struct)
    out = []
    for t in texts:
        try:
            out.append(dec.decode(t))
        except (msgspec.ValidationError, msgspec.DecodeError):
            out.append(struct())
    return out


def to_int(v: Any) -> int | None:
    """A JSON arg as int64 where it is one (int, integral float, decimal or hex string)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if _INT64_MIN <= v <= _INT64_MAX else None
    if isinstance(v, float):
        return int(v) if v.is_integer() and abs(v) < 2**63 else None
    if isinstance(v, str):
        s = v.strip()
        try:
            x = int(s, 16) if s.lower().startswith(("0x", "-0x")) else int(s)
        except ValueError:
            return None
        return x if _INT64_MIN <= x <= _INT64_MAX else None
    return None


def flow_ids_as_int(raw: RawEvents, idx: np.ndarray) -> pa.Array:
    """Flow ids of rows `idx` as int64 where they are integers that fit, null else."""
    texts = raw.take("id", idx)
    try:
        return texts.cast(pa.int64())  # one Arrow cast; per id in Python only when one is odd
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([to_int(x) for x in texts.to_pylist()], type=pa.int64())


def base_kinds(raw: RawEvents, typed: Typed) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Kinds every Chrome trace has: meta, flow, counter, marker; returns (ph, name, cat) arrays."""
    ph, name, cat = raw.ph, raw.name, raw.cat
    typed.kind[raw.is_in("ph", ("M",))] = "meta"
    flows = raw.is_in("ph", ("s", "t", "f"))
    typed.kind[flows] = "flow"
    counters = np.flatnonzero(raw.is_in("ph", ("C",)))
    typed.kind[counters] = "counter"
    if len(counters):
        typed.set("value", counters, [_first_number(a) for a in raw.args_of(counters)])
    return ph, name, cat


def _first_number(args: str | None) -> float:
    if not args:
        return np.nan
    try:
        obj = msgspec.json.decode(args)
    except msgspec.DecodeError:
        return np.nan
    if isinstance(obj, dict):
        for v in obj.values():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return np.nan


class _MemArgs(msgspec.Struct):
    Addr: Any = None
    Bytes: Any = None
    TotalAllocated: Any = msgspec.field(default=None, name="Total Allocated")
    DeviceId: Any = msgspec.field(default=None, name="Device Id")
    DeviceType: Any = msgspec.field(default=None, name="Device Type")


def memory_events(raw: RawEvents, typed: Typed, ph: pa.Array, name: pa.Array) -> None:
    """PyTorch-style `[memory]` instants: alloc (Bytes > 0) / free (Bytes < 0) with addr and size;
    `[OutOfMemory]` instants (a caching-allocator request that failed): alloc_fail."""
    instants = np.flatnonzero(raw.is_in("ph", ("i", "I")))
    names = raw.take("name", instants)
    idx = instants[mask_of(names, ("[memory]",))]
    oom = instants[mask_of(names, ("[OutOfMemory]",))]
    if len(idx):
        args = decode_args(raw, idx, _MemArgs)
        size = np.array([to_int(a.Bytes) for a in args], dtype=object)
        signed = np.array([s if s is not None else 0 for s in size], dtype=np.int64)
        typed.kind[idx] = np.where(signed < 0, CODE["free"], CODE["alloc"])
        typed.set("bytes", idx, np.array([abs(s) if s is not None else None for s in size], dtype=object))
        typed.set("addr", idx, np.array([to_int(a.Addr) for a in args], dtype=object))
        typed.set("value", idx, np.array([a.TotalAllocated if isinstance(a.TotalAllocated, (int, float)) else np.nan
                                          for a in args], dtype=np.float64))
        typed.set("device", idx, _mem_devices(args))
    if len(oom):
        # PyTorch records the request and the allocator's totals, not the largest free block:
        # value stays null.
        args = decode_args(raw, oom, _MemArgs)
        typed.kind[oom] = "alloc_fail"
        typed.set("bytes", oom, np.array([to_int(a.Bytes) for a in args], dtype=object))
        typed.set("device", oom, _mem_devices(args))


def _mem_devices(args: list[_MemArgs]) -> np.ndarray:
    # Device Type 0 is the host (CPU) allocator; anything else is an accelerator.
    return np.array([to_int(a.DeviceId) if to_int(a.DeviceType) not in (None, 0) else None for a in args],
                    dtype=object)


#: Host spans that are data loading: PyTorch's `enumerate(DataLoader)#<iterator>.__next__`
#: (user_annotation / cpu_op), the DataLoader's own Python frames, and annotations named so.
DATA_LOAD_NAMES = r"dataloader|\bdata_?load(er|ing)?\b"


def data_loading(raw: RawEvents, typed: Typed, host_x: np.ndarray) -> None:
    """Mark the host slices `host_x` whose name says data loading as kind data_load."""
    if len(host_x):
        typed.kind[host_x[matches(raw.take("name", host_x), DATA_LOAD_NAMES)]] = "data_load"


def steps(raw: RawEvents, typed: Typed, name: pa.Array, host: np.ndarray, device: np.ndarray) -> None:
    """Mark the host's `ProfilerStep#N` slices as steps; give host rows the step they fall in,
    device rows the step of the launch that created them (time containment when no launch is
    known).

    A `ProfilerStep#N` slice off the host is the step's mirror on a device (PyTorch 2.x writes
    one per step on the GPU, as a gpu_user_annotation): it stays the annotation its importer
    made it, of step N, and is no step of its own (counted, it would double the steps and halve
    their length)."""
    maybe = np.flatnonzero(pc.starts_with(name, "ProfilerStep#").fill_null(False).to_numpy(zero_copy_only=False)
                           & raw.is_in("ph", ("X",)))
    named = maybe[matches(raw.take("name", maybe), r"^ProfilerStep#\d+$", ignore_case=False)]
    named_numbers = np.array([int(_STEP_NAME.match(s).group(1)) for s in raw.take("name", named).to_pylist()],
                             dtype=np.int64)
    on_host = host[named]
    mirrors = named[~on_host]
    typed.set("step", mirrors, named_numbers[~on_host])
    step_rows, numbers = named[on_host], named_numbers[on_host]
    if not len(step_rows):
        return
    typed.kind[step_rows] = "step"
    starts = raw.ts_ns[step_rows]
    dur = raw.dur_ns.to_numpy(zero_copy_only=False)
    ends = starts + np.nan_to_num(dur[step_rows]).astype(np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends, numbers = starts[order], ends[order], numbers[order]

    def containing(ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.searchsorted(starts, ts, side="right") - 1
        ok = (k >= 0) & (ts < ends[np.maximum(k, 0)])
        return numbers[np.maximum(k, 0)], ok

    eligible = typed.kind != "meta"
    host_idx = np.flatnonzero(host & eligible)
    num, ok = containing(raw.ts_ns[host_idx])
    typed.set("step", host_idx[ok], num[ok])
    typed.set("step", step_rows[order], numbers)

    dev_idx = np.flatnonzero(device & eligible)
    dev_idx = dev_idx[~np.isin(dev_idx, mirrors)]
    if not len(dev_idx):
        return
    corr, corr_ok = typed.get("corr")
    step_data, step_ok = typed.get("step")
    launch = np.flatnonzero(host & corr_ok & step_ok & typed.kind.isin(("launch", "op_compile")))
    # The step of the launch with the task's correlation id (the last such launch, in row order;
    # an op_compile call that launched the task is one).
    keys = corr[launch]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    last = np.append(keys[1:] != keys[:-1], True) if len(keys) else np.zeros(0, dtype=bool)
    keys, steps_of = keys[last], step_data[launch][order][last]
    at = np.minimum(np.searchsorted(keys, corr[dev_idx]), max(len(keys) - 1, 0))
    has = corr_ok[dev_idx] & (keys[at] == corr[dev_idx] if len(keys) else False)
    typed.set("step", dev_idx[has], steps_of[at[has]].astype(np.int64))
    rest = dev_idx[~has]
    num, ok = containing(raw.ts_ns[rest])
    typed.set("step", rest[ok], num[ok])


def process_names(raw: RawEvents) -> dict[int, str]:
    """pid -> process name from `process_name` metadata events."""
    out: dict[int, str] = {}
    rows = metadata_rows(raw, ("process_name",))
    for i, text in zip(rows.tolist(), raw.args_of(rows)):
        try:
            val = msgspec.json.decode(text or "{}").get("name")
        except (msgspec.DecodeError, AttributeError):
            continue
        if isinstance(val, str):
            out[int(raw.pid[i])] = val
    return out


def metadata_rows(raw: RawEvents, names: tuple[str, ...]) -> np.ndarray:
    """Rows of M events with one of `names` (process_name, thread_name, ...)."""
    meta = np.flatnonzero(raw.is_in("ph", ("M",)))
    return meta[mask_of(raw.take("name", meta), names)]


def enclosing_slices(raw: RawEvents, points: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """For each row in `points`, the row in `candidates` (X slices) on the same pid/tid whose
    [ts, ts+dur] contains the point's ts (innermost by latest start); -1 when none."""
    out = np.full(len(points), -1, dtype=np.int64)
    if not len(points) or not len(candidates):
        return out
    dur = np.nan_to_num(raw.dur_ns.to_numpy(zero_copy_only=False)).astype(np.int64)
    by_track: dict[tuple[int, int], list[int]] = {}
    for c in candidates.tolist():
        by_track.setdefault((int(raw.pid[c]), int(raw.tid[c])), []).append(c)
    tracks = {k: np.array(sorted(v, key=lambda r: (raw.ts_ns[r], -dur[r]))) for k, v in by_track.items()}
    for j, p in enumerate(points.tolist()):
        rows = tracks.get((int(raw.pid[p]), int(raw.tid[p])))
        if rows is None:
            continue
        starts = raw.ts_ns[rows]
        k = int(np.searchsorted(starts, raw.ts_ns[p], side="right")) - 1
        # Walk back over earlier-starting slices until one still covers the point.
        while k >= 0:
            r = rows[k]
            if raw.ts_ns[r] + dur[r] >= raw.ts_ns[p]:
                out[j] = r
                break
            k -= 1
            if k >= 0 and raw.ts_ns[p] - raw.ts_ns[rows[k]] > 10**10:
                break
    return out
