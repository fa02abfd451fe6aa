"""What a trace holds at a glance: span, ranks, devices, streams, event kinds, top time consumers.

`summarize` is a pure function of a Trace (vectorised over the Arrow table); `render` turns its
result into rich renderables. Neither prints nor touches files: the CLI decides where text goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from msprof_py.trace import KINDS, Trace
from msprof_py.trace.importers import ascend, kineto
from msprof_py.trace.units import MiB, ms, sig

#: Kinds of rows that ran on a device (their `stream` column is a device stream).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "collective")
#: Kinds of rows that are host-side runtime/framework calls.
HOST_API_KINDS = ("api", "launch", "sync", "op_compile")
UNNAMED = "(unnamed)"
#: The columns `summarize` reads: `info` loads only these from a Parquet table.
SUMMARY_COLUMNS = ("rank", "ph", "name", "cat", "ts", "dur", "kind", "device", "stream", "bytes", "value", "step")
#: How `info` and the report head the listing of `unmapped`.
UNMAPPED_TITLE = "not understood, kept only as generic markers (no figure counts them)"
#: Kernel names run to hundreds of characters; this keeps a top table within 80 columns.
NAME_CHARS = 40


@dataclass(frozen=True)
class NameTime:
    """Total time of one event name: how often it ran and its share of the trace span.

    Totals are inclusive: a host API nested in another counts in both.
    """

    name: str
    count: int
    total_ns: int
    share_of_span: float  # total_ns / span_ns; can exceed 1 when streams overlap


@dataclass(frozen=True)
class StreamSet:
    """The device streams seen on one (rank, device)."""

    rank: int
    device: int | None
    streams: tuple[int, ...]


@dataclass(frozen=True)
class Unmapped:
    """Events an importer kept only as generic markers because it did not understand them: those
    of one category it does not know (`phases`: their phases), or of one shape (phase family) of
    a category it knows that it does not read."""

    count: int
    category: str | None
    phases: tuple[str, ...]
    reason: str  # "category" | "phase"
    message: str


@dataclass(frozen=True)
class Summary:
    """The facts `msprof-py info` shows; times in ns relative to the trace origin."""

    source_format: str
    events: int
    start_ns: int
    end_ns: int
    span_ns: int
    world_size: int | None
    skipped_events: int
    ranks: tuple[int, ...]
    devices: tuple[int, ...]
    streams: tuple[StreamSet, ...]
    kinds: dict[str, int]
    top_device: tuple[NameTime, ...]
    top_host: tuple[NameTime, ...]
    #: The most device memory held at once (see `peak_memory_bytes`); None: the trace records none.
    peak_memory_bytes: int | None = None
    #: What the importer kept only as generic rows (see `unmapped`), most events first.
    unmapped: tuple[Unmapped, ...] = ()
    #: The job's steps (one step number across ranks) and their mean time, from the first rank's
    #: start of a step to the last rank's end of it; `rank_steps` counts (rank, step) pairs. None:
    #: the trace records no steps.
    steps: int | None = None
    rank_steps: int | None = None
    step_time_ns_mean: float | None = None

    def to_dict(self) -> dict:
        """Plain JSON-ready data (tuples become lists)."""
        return asdict(self)


def summarize(trace: Trace, top: int = 10) -> Summary:
    """Summarize a trace; `top` limits each of the two top-name lists."""
    table = trace.table
    kind, kind_names = _codes(table.column("kind"))
    kind_code = {name: i for i, name in enumerate(kind_names)}

    def of_kinds(kinds: tuple[str, ...]) -> np.ndarray:
        # A lookup table indexed by code (np.isin sorts the whole column); the extra last slot
        # is where a null's -1 lands.
        wanted = np.zeros(len(kind_names) + 1, dtype=bool)
        wanted[[kind_code[k] for k in kinds if k in kind_code]] = True
        return wanted[kind]

    ts, dur = _ints(table.column("ts")), _ints(table.column("dur"))
    # Metadata rows (process names, sort indices) carry no time of their own; Kineto stamps
    # them with arbitrary ts, which would stretch the span.
    timed = ~of_kinds(("meta",))
    start_ns, end_ns = (int(ts[timed].min()), int((ts + dur)[timed].max())) if timed.any() else (0, 0)
    span_ns = end_ns - start_ns
    rank = _ints(table.column("rank"))
    device, has_device = _ints(table.column("device")), _valid(table.column("device"))
    stream, has_stream = _ints(table.column("stream")), _valid(table.column("stream"))
    names, name_list = _codes(table.column("name"))
    ph, ph_names = _codes(table.column("ph"))
    complete = ph == (ph_names.index("X") if "X" in ph_names else -2)

    def top_names(kinds: tuple[str, ...]) -> tuple[NameTime, ...]:
        return _top_names(names, name_list, dur, of_kinds(kinds) & complete, top, span_ns)

    on_device = of_kinds(DEVICE_KINDS) & has_stream
    return Summary(
        source_format=trace.meta.source_format,
        events=table.num_rows,
        start_ns=start_ns,
        end_ns=end_ns,
        span_ns=span_ns,
        world_size=trace.meta.world_size,
        skipped_events=int(trace.meta.extra.get("skipped_events", 0)),
        ranks=_distinct(rank),
        devices=_distinct(device[has_device]),
        streams=_streams(rank[on_device], device[on_device], has_device[on_device], stream[on_device]),
        kinds=_kind_counts(kind, kind_names),
        top_device=top_names(DEVICE_KINDS),
        top_host=top_names(HOST_API_KINDS),
        peak_memory_bytes=peak_memory_bytes(table),
        unmapped=unmapped(table, trace.meta.source_format),
        **job_steps(table, of_kinds(("step",)) & complete, rank, ts, ts + dur),
    )


def job_steps(table: pa.Table, rows: np.ndarray, rank: np.ndarray, ts: np.ndarray, end: np.ndarray) -> dict:
    """`steps`, `rank_steps` and `step_time_ns_mean` of the step `rows` (as msprof_py.summaries'
    rank_steps / job_steps count them): one (rank, step) from its first row's start to its last
    row's end; a job step from the first rank's start to the last rank's end. A row without a step
    number takes its order on its rank. Empty when there are no steps."""
    if not rows.any():
        return {}
    if "step" in table.column_names:
        step, has_step = _ints(table.column("step"))[rows], _valid(table.column("step"))[rows]
    else:
        step, has_step = np.zeros(int(rows.sum()), np.int64), np.zeros(int(rows.sum()), bool)
    rank, ts, end = rank[rows], ts[rows], end[rows]
    if not has_step.all():
        order = np.lexsort((ts, rank))
        first = np.ones(len(order), dtype=bool)
        first[1:] = rank[order][1:] != rank[order][:-1]
        start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        ordinal = np.empty(len(order), np.int64)
        ordinal[order] = np.arange(len(order)) - start
        step = np.where(has_step, step, ordinal)

    def reduce(keys: list[np.ndarray], lo: np.ndarray, hi: np.ndarray):
        order = np.lexsort(keys[::-1])
        ks = [k[order] for k in keys]
        new = np.zeros(len(order), dtype=bool)
        new[:1] = True
        for k in ks:
            new[1:] |= k[1:] != k[:-1]
        at = np.flatnonzero(new)
        return [k[at] for k in ks], np.minimum.reduceat(lo[order], at), np.maximum.reduceat(hi[order], at)

    (pair_rank, pair_step), lo, hi = reduce([rank, step], ts, end)
    _, job_lo, job_hi = reduce([pair_step], lo, hi)
    return {"steps": len(job_lo), "rank_steps": len(pair_rank), "step_time_ns_mean": float((job_hi - job_lo).mean())}


# ---------------------------------------------------------------- what was not understood

#: Phase families of the Trace Event Format, as a listing names them.
_PHASE_FAMILIES = {"B": "begin/end", "E": "begin/end", "b": "async", "e": "async", "n": "async",
                   "S": "legacy async", "T": "legacy async", "p": "legacy async", "F": "legacy async",
                   "N": "object", "O": "object", "D": "object", "P": "sample", "R": "mark", "c": "clock sync",
                   "(": "context", ")": "context", "V": "memory dump", "v": "memory dump", "X": "complete",
                   "i": "instant", "I": "instant"}


def _unread_rule(source_format: str):
    """The importer's own rule for its markers (cat, ph) -> "category" | "phase" | None; None
    for tables no importer of a foreign format made (the emulator's, msprof's own), whose kinds
    are all meant."""
    if source_format == kineto.FORMAT:
        return kineto.unread
    if source_format == ascend.FORMAT:
        return ascend.unread
    if source_format == "chrome":
        # A plain Chrome trace: the importer reads phases only (meta, flow, counter), PyTorch-style
        # memory instants and ProfilerStep slices; any category it keeps as a marker it did not understand.
        return lambda cat, ph: "category"
    return None


def unmapped(table: pa.Table, source_format: str) -> tuple[Unmapped, ...]:
    """The events the importer of `source_format` kept only as generic rows (kind marker, the kind
    a row has when the importer gave it none) because it did not understand them, grouped by
    their category as the producer wrote it (and, in a category it knows, by their phase's
    family), most events first: "12,345 events of unknown category 'foo'". Read from the table
    alone (kind, cat and ph survive Parquet), so it holds for any stored table; empty when every
    marker is one the importer means (Kineto's profiler spans, GPU annotations, instants,
    torch_npu's Overlap Analysis...)."""
    rule = _unread_rule(source_format)
    if rule is None or not table.num_rows or "cat" not in table.column_names:
        return ()
    kind, kind_names = _codes(table.column("kind"))
    if "marker" not in kind_names:
        return ()
    marker = kind == kind_names.index("marker")
    cat, cat_names = _codes(table.column("cat"))
    ph, ph_names = _codes(table.column("ph"))
    # One count per (cat, ph) pair of the markers; the slot after each list is null's.
    key = (np.where(cat[marker] < 0, len(cat_names), cat[marker]) * (len(ph_names) + 1)
           + np.where(ph[marker] < 0, len(ph_names), ph[marker]))
    counts = np.bincount(key, minlength=(len(cat_names) + 1) * (len(ph_names) + 1))
    groups: dict[tuple, list] = {}
    for k in np.flatnonzero(counts).tolist():
        c = cat_names[k // (len(ph_names) + 1)] if k // (len(ph_names) + 1) < len(cat_names) else None
        p = ph_names[k % (len(ph_names) + 1)] if k % (len(ph_names) + 1) < len(ph_names) else None
        reason = rule(c, p)
        if reason is None:
            continue
        family = None if reason == "category" else _PHASE_FAMILIES.get(p or "", f"phase {p!r}")
        acc = groups.setdefault((reason, c, family), [0, set()])
        acc[0] += int(counts[k])
        acc[1].add("" if p is None else p)
    out = [Unmapped(n, c, tuple(sorted(phases)), reason, _unmapped_message(n, c, tuple(sorted(phases)), reason, family))
           for (reason, c, family), (n, phases) in groups.items()]
    return tuple(sorted(out, key=lambda u: (-u.count, u.category or "", u.phases)))


def merge_unmapped(parts: list[tuple[Unmapped, ...]]) -> tuple[Unmapped, ...]:
    """`unmapped` of a trace from that of its partitions: the same groups (reason, category, phase
    family), their counts added and their phases pooled."""
    groups: dict[tuple, list] = {}
    for items in parts:
        for u in items:
            ph = u.phases[0] or None  # unmapped keeps a null phase as ""
            family = None if u.reason == "category" else _PHASE_FAMILIES.get(ph or "", f"phase {ph!r}")
            acc = groups.setdefault((u.reason, u.category, family), [0, set()])
            acc[0] += u.count
            acc[1].update(u.phases)
    out = [Unmapped(n, c, tuple(sorted(phases)), reason, _unmapped_message(n, c, tuple(sorted(phases)), reason, family))
           for (reason, c, family), (n, phases) in groups.items()]
    return tuple(sorted(out, key=lambda u: (-u.count, u.category or "", u.phases)))


def _unmapped_message(n: int, cat: str | None, phases: tuple[str, ...], reason: str, family: str | None) -> str:
    events = "event" if n == 1 else "events"
    of = "with no category" if cat is None else f"of category {cat!r}"
    if reason == "category":
        return f"{n:,} {events} {of}" if cat is None else f"{n:,} {events} of unknown category {cat!r}"
    return f"{n:,} {family} {events} ({', '.join(map(repr, phases))}) {of}, a shape the importer does not read"


# ---------------------------------------------------------------- peak memory

#: Counters of the device memory an application holds, by preference, with the bytes per unit of
#: their value: the emulator's driver use and caching-allocator total (bytes), and the "APP/Memory"
#: counter of torch_npu's / msprof's NPU MEM process (the application's HBM plus DDR, in KB as
#: both write it: {"KB": ...}).
MEMORY_COUNTERS = (("Device memory used", 1), ("Device memory allocated", 1), ("APP/Memory", 1024))


def peak_memory_bytes(table: pa.Table) -> int | None:
    """The most device memory held at once: the first of `MEMORY_COUNTERS` the table has (its
    largest sample, over every device and rank), else the largest allocator total its alloc /
    free rows carry (PyTorch's `[memory]` "Total Allocated"), else the peak of their running sum
    (in rank, ts order); None when the table records no memory."""
    kind, kind_names = _codes(table.column("kind"))
    if not len(kind):
        return None
    value, has_value = _floats(table.column("value"))
    if "counter" in kind_names:
        counter = kind == kind_names.index("counter")
        names, name_list = _codes(table.column("name"))
        for name, scale in MEMORY_COUNTERS:
            if name in name_list:
                rows = counter & (names == name_list.index(name)) & has_value
                if rows.any():
                    return int(value[rows].max() * scale)
    mem = np.isin(kind, [kind_names.index(k) for k in ("alloc", "free") if k in kind_names])
    if not mem.any():
        return None
    if (mem & has_value).any():
        return int(value[mem & has_value].max())
    rank, ts, size = _ints(table.column("rank"))[mem], _ints(table.column("ts"))[mem], _ints(table.column("bytes"))[mem]
    order = np.lexsort((ts, rank))
    alloc = kind_names.index("alloc") if "alloc" in kind_names else -2
    delta = np.where(kind[mem] == alloc, size, -size)[order]
    return int(np.cumsum(delta).max())


# The columns become numpy arrays read straight from their Arrow buffers. pyarrow's to_numpy,
# and any Arrow scalar or array made from a Python value (a compute call with a literal), import
# pandas when it is installed: most of `info`'s start-up, for nothing `info` needs. Grouping is
# numpy's too: Table.group_by loads Arrow's query engine (acero, datasets, substrait).

def _valid(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Which slots of a column hold a value (not null)."""
    if isinstance(col, pa.ChunkedArray):
        return np.concatenate([_valid(c) for c in col.chunks]) if col.num_chunks else np.zeros(0, bool)
    bitmap = col.buffers()[0]
    if bitmap is None or col.null_count == 0:
        return np.ones(len(col), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[col.offset: col.offset + len(col)].astype(bool)


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as int64, 0 where null."""
    if isinstance(col, pa.ChunkedArray):
        return np.concatenate([_ints(c) for c in col.chunks]) if col.num_chunks else np.zeros(0, np.int64)
    typ = col.type
    dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(typ) else 'u'}{typ.bit_width // 8}")
    values = np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col), offset=col.offset * dtype.itemsize)
    values = values.astype(np.int64, copy=False)
    return np.where(_valid(col), values, 0) if col.null_count else values


def _floats(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A float64 column as numpy (0 where null), and which slots hold a number (not null, not NaN)."""
    if isinstance(col, pa.ChunkedArray):
        parts = [_floats(c) for c in col.chunks]
        if not parts:
            return np.zeros(0), np.zeros(0, dtype=bool)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    values = np.frombuffer(col.buffers()[1], dtype=np.float64, count=len(col), offset=col.offset * 8)
    ok = _valid(col) & ~np.isnan(values)
    return np.where(ok, values, 0.0), ok


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """A dictionary column as codes into one list of its values (chunks may each have their own
    dictionary); -1 where null."""
    if col.num_chunks == 1 and col.chunks[0].indices.null_count == 0:
        # One dictionary, no nulls (the usual Parquet read): the indices are the codes.
        chunk = col.chunks[0]
        return _ints(chunk.indices), chunk.dictionary.to_pylist()
    values: dict = {}
    parts = []
    for chunk in col.chunks:
        remap = np.array([values.setdefault(v, len(values)) for v in chunk.dictionary.to_pylist()] + [-1],
                         dtype=np.int64)
        local = np.where(_valid(chunk.indices), _ints(chunk.indices), -1)
        parts.append(remap[local])  # -1 picks the trailing -1: null stays null
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), list(values)


def _distinct(values: np.ndarray) -> tuple[int, ...]:
    """The distinct values, ascending."""
    return tuple(_distinct_array(values).tolist())


def _distinct_array(values: np.ndarray) -> np.ndarray:
    """np.unique without its first-call import of numpy.ma."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _streams(rank: np.ndarray, device: np.ndarray, has_device: np.ndarray, stream: np.ndarray) -> tuple[StreamSet, ...]:
    # Distinct (rank, no device, device, stream), sorted by rank, then rows with a device before
    # those without (the odd ones out), then device, then stream.
    parts = [rank, (~has_device).astype(np.int64), device, stream]
    lows = [int(p.min()) if len(p) else 0 for p in parts]
    spans = [int(p.max()) - low + 1 if len(p) else 1 for p, low in zip(parts, lows)]
    if np.prod(np.array(spans, dtype=np.float64)) < 2.0 ** 62:
        # One int64 key per row in mixed radix (column order kept): a single-key sort.
        packed = np.zeros(len(rank), dtype=np.int64)
        for p, low, span in zip(parts, lows, spans):
            packed = packed * span + (p - low)
        total = int(np.prod(spans))
        # Few possible keys (the usual case): a count per key, no sort.
        packed = np.flatnonzero(np.bincount(packed, minlength=total)) if total <= max(4 * len(packed), 1 << 16) \
            else _distinct_array(packed)
        rows = []
        for span in reversed(spans):
            rows.append(packed % span)
            packed = packed // span
        keys = np.stack([r + low for r, low in zip(reversed(rows), lows)], axis=1)
    else:
        keys = np.stack(parts, axis=1)
        keys = keys[np.lexsort(keys.T[::-1])]
        first = np.ones(len(keys), dtype=bool)
        first[1:] = (keys[1:] != keys[:-1]).any(axis=1)
        keys = keys[first]
    by_place: dict[tuple[int, int | None], list[int]] = {}
    for r, none, d, st in keys.tolist():
        by_place.setdefault((r, None if none else d), []).append(st)
    return tuple(StreamSet(r, d, tuple(streams)) for (r, d), streams in by_place.items())


def _kind_counts(kind: np.ndarray, kind_names: list) -> dict[str, int]:
    counts = np.bincount(kind[kind >= 0], minlength=len(kind_names)).tolist()
    order = {k: i for i, k in enumerate(KINDS)}
    present = [(name, n) for name, n in zip(kind_names, counts) if n]
    return dict(sorted(present, key=lambda kv: (-kv[1], order.get(kv[0], len(order)), kv[0])))


def _top_names(names: np.ndarray, name_list: list, dur: np.ndarray, rows: np.ndarray, top: int,
               span_ns: int) -> tuple[NameTime, ...]:
    """Names ranked by summed dur over the `rows`; ties by name. Sums are exact integers."""
    if not rows.any() or top <= 0:
        return ()
    codes = names[rows]
    codes = np.where(codes < 0, len(name_list), codes)  # null names get the slot after the last
    totals = np.zeros(len(name_list) + 1, dtype=np.int64)
    np.add.at(totals, codes, dur[rows])
    counts = np.bincount(codes, minlength=len(name_list) + 1)
    merged: dict[str, list[int]] = {}  # a real "(unnamed)" and the null names are one name
    for name, total, count in zip([*name_list, UNNAMED], totals.tolist(), counts.tolist()):
        if count:
            acc = merged.setdefault(name, [0, 0])
            acc[0] += total
            acc[1] += count
    ranked = sorted(merged.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return tuple(NameTime(name, count, total, total / span_ns if span_ns else 0.0)
                 for name, (total, count) in ranked)


# ---------------------------------------------------------------- rendering

def format_ns(ns: int) -> str:
    """A duration for people: in ms (the one time unit of text output), 3 significant digits."""
    return ms(ns)


def format_bytes(n_bytes: int) -> str:
    """A size for people: in MiB (the one memory unit of text output), 3 significant digits."""
    return f"{sig(n_bytes / MiB)} MiB"


def render(summary: Summary, title: str | None = None, name_chars: int | None = NAME_CHARS) -> RenderableType:
    """The summary as rich tables (overview, kinds, streams, top device work, top host APIs);
    names longer than `name_chars` are clipped (None: never, for output that is not a terminal)."""
    overview = Table.grid(padding=(0, 2))
    overview.add_column(style="bold")
    overview.add_column()
    rows = [
        ("source format", summary.source_format),
        ("events", f"{summary.events:,}"),
        ("span", f"{format_ns(summary.span_ns)} ({summary.span_ns:,} ns)"),
        ("ranks", _counted(summary.ranks)),
        ("world size", "-" if summary.world_size is None else str(summary.world_size)),
        ("devices", _counted(summary.devices)),
    ]
    if summary.steps is not None:
        many = (summary.rank_steps or 0) > summary.steps
        rows.append(("steps", f"{summary.steps}{(' job step' + 's' * (summary.steps != 1)) if many else ''}, "
                              f"mean {format_ns(int(summary.step_time_ns_mean or 0))}"
                              + (f" (first rank's start to last rank's end; {summary.rank_steps} rank steps)"
                                 if many else "")))
    if summary.skipped_events:
        rows.append(("skipped events", f"{summary.skipped_events:,}"))
    if summary.peak_memory_bytes is not None:
        rows.append(("peak memory", format_bytes(summary.peak_memory_bytes)))
    # Every cell as Text: plain strings would each be parsed as rich markup and emoji codes
    # (about a tenth of `info`'s work) for text that holds neither, or must not be read as such.
    for key, value in rows:
        overview.add_row(Text(f"{key}:"), Text(value))

    kinds = Table(title="events per kind", title_justify="left")
    kinds.add_column("kind")
    kinds.add_column("events", justify="right")
    for k, n in summary.kinds.items():
        kinds.add_row(Text(k), Text(f"{n:,}"))

    streams = Table(title="device streams", title_justify="left")
    streams.add_column("rank", justify="right")
    streams.add_column("device", justify="right")
    streams.add_column("streams")
    for s in summary.streams:
        streams.add_row(Text(str(s.rank)), Text("-" if s.device is None else str(s.device)), Text(_int_list(s.streams)))

    parts: list[RenderableType] = [overview, kinds]
    if summary.unmapped:
        parts.append(Text("\n".join([UNMAPPED_TITLE + ":", *(f"  {u.message}" for u in summary.unmapped)])))
    if summary.streams:
        parts.append(streams)
    parts.append(_name_table("top device work (kernel, memcpy, memset, collective)", summary.top_device, name_chars))
    parts.append(_name_table("top host APIs (api, launch, sync)", summary.top_host, name_chars))
    if title:
        parts.insert(0, Text(title, style="bold"))
    return Group(*parts)


def _name_table(title: str, names: tuple[NameTime, ...], name_chars: int | None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("total (ms)", justify="right", no_wrap=True)
    table.add_column("% of span", justify="right", no_wrap=True)
    for n in names:
        share = sig(100 * n.share_of_span)
        # Text, not str: names such as "[memory]" must not be read as rich markup.
        table.add_row(Text(_clip(n.name, name_chars)), Text(f"{n.count:,}"), Text(sig(n.total_ns / 1e6)), Text(share))
    if not names:
        table.add_row("(none)", "", "", "")
    return table


def _clip(name: str, name_chars: int | None) -> str:
    # Clipped here, not by rich: rich shrinks every no-wrap column alike, numbers included.
    return name if name_chars is None or len(name) <= name_chars else name[: name_chars - 1] + "…"


def _counted(values: tuple[int, ...]) -> str:
    """How many, then which: '1 (0)', '4 (0, 1, 2, 3)'; '0' when none."""
    return f"{len(values)} ({_int_list(values)})" if values else "0"


def _int_list(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values)) if values else "-"
