"""What a trace holds at a glance: span, ranks, devices, streams, event kinds, top time consumers.

`summarize` is a pure function of a Trace (vectorised over the Arrow table); `render` turns its
result into rich renderables. Neither prints nor touches files: the CLI decides where text goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from msprof_py.trace import KINDS, Trace
from msprof_py.trace.units import MiB, ms, sig

#: Kinds of rows that ran on a device (their `stream` column is a device stream).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "collective")
#: Kinds of rows that are host-side runtime/framework calls.
HOST_API_KINDS = ("api", "launch", "sync")
UNNAMED = "(unnamed)"
#: The columns `summarize` reads: `info` loads only these from a Parquet table.
SUMMARY_COLUMNS = ("rank", "ph", "name", "ts", "dur", "kind", "device", "stream")
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

    def to_dict(self) -> dict:
        """Plain JSON-ready data (tuples become lists)."""
        return asdict(self)


def summarize(trace: Trace, top: int = 10) -> Summary:
    """Summarize a trace; `top` limits each of the two top-name lists."""
    # Filters below copy every column they keep: the verbatim args would dominate the cost.
    table = trace.table.select(list(SUMMARY_COLUMNS))
    kind = table.column("kind").cast(pa.string())
    # Metadata rows (process names, sort indices) carry no time of their own; Kineto stamps
    # them with arbitrary ts, which would stretch the span.
    timed = table.filter(pc.not_equal(kind, "meta"))
    start_ns, end_ns = _extent_ns(timed)
    span_ns = end_ns - start_ns
    device_rows = table.filter(pc.is_in(kind, value_set=pa.array(DEVICE_KINDS)))
    return Summary(
        source_format=trace.meta.source_format,
        events=table.num_rows,
        start_ns=start_ns,
        end_ns=end_ns,
        span_ns=span_ns,
        world_size=trace.meta.world_size,
        skipped_events=int(trace.meta.extra.get("skipped_events", 0)),
        ranks=_distinct_ints(table.column("rank")),
        devices=_distinct_ints(table.column("device")),
        streams=_streams(device_rows),
        kinds=_kind_counts(kind),
        top_device=_top_names(table, kind, DEVICE_KINDS, top, span_ns),
        top_host=_top_names(table, kind, HOST_API_KINDS, top, span_ns),
    )


def _extent_ns(table: pa.Table) -> tuple[int, int]:
    """First start and last end (ts + dur, dur 0 when absent) of the rows."""
    if table.num_rows == 0:
        return 0, 0
    ts = table.column("ts")
    end = pc.add(ts, pc.fill_null(table.column("dur"), 0))
    return int(pc.min(ts).as_py()), int(pc.max(end).as_py())


def _distinct_ints(col: pa.ChunkedArray) -> tuple[int, ...]:
    values = pc.unique(col.drop_null()).to_pylist()
    return tuple(sorted(values))


# Grouping is done with numpy below, not Table.group_by: that loads Arrow's query engine
# (acero, datasets, substrait), a start-up cost `info` pays for nothing else.

def _ints(col: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(col, 0).combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)


def _streams(device_rows: pa.Table) -> tuple[StreamSet, ...]:
    rows = device_rows.filter(pc.is_valid(device_rows.column("stream")))
    if rows.num_rows == 0:
        return ()
    no_device = rows.column("device").is_null().combine_chunks().to_numpy(zero_copy_only=False)
    keys = np.stack([_ints(rows.column("rank")), no_device.astype(np.int64), _ints(rows.column("device")),
                     _ints(rows.column("stream"))], axis=1)
    by_place: dict[tuple[int, int | None], list[int]] = {}
    # np.unique sorts by rank, then devices before no device, then device, then stream.
    for rank, none, device, stream in np.unique(keys, axis=0).tolist():
        by_place.setdefault((rank, None if none else device), []).append(stream)
    return tuple(StreamSet(rank, device, tuple(streams)) for (rank, device), streams in by_place.items())


def _kind_counts(kind: pa.ChunkedArray) -> dict[str, int]:
    counts = {c["values"]: c["counts"] for c in pc.value_counts(kind).to_pylist()}
    order = {k: i for i, k in enumerate(KINDS)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order.get(kv[0], len(order)), kv[0])))


def _top_names(table: pa.Table, kind: pa.ChunkedArray, kinds: tuple[str, ...], top: int,
               span_ns: int) -> tuple[NameTime, ...]:
    """Names ranked by summed dur over complete (X) events of `kinds`; ties by name."""
    mask = pc.and_(pc.is_in(kind, value_set=pa.array(kinds)),
                   pc.equal(table.column("ph").cast(pa.string()), "X"))
    rows = table.filter(mask)
    if rows.num_rows == 0 or top <= 0:
        return ()
    names = pc.dictionary_encode(pc.fill_null(rows.column("name").cast(pa.string()), UNNAMED)).combine_chunks()
    index = names.indices.to_numpy(zero_copy_only=False).astype(np.intp)
    counts = np.bincount(index, minlength=len(names.dictionary))
    totals = np.zeros(len(names.dictionary), dtype=np.int64)
    np.add.at(totals, index, _ints(rows.column("dur")))  # exact integer sums
    ranked = sorted(zip(totals.tolist(), names.dictionary.to_pylist(), counts.tolist()),
                    key=lambda t: (-t[0], t[1]))[:top]
    return tuple(NameTime(name, count, total, total / span_ns if span_ns else 0.0)
                 for total, name, count in ranked)


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
        ("source format", Text(summary.source_format)),
        ("events", f"{summary.events:,}"),
        ("span", f"{format_ns(summary.span_ns)} ({summary.span_ns:,} ns)"),
        ("ranks", _counted(summary.ranks)),
        ("world size", "-" if summary.world_size is None else str(summary.world_size)),
        ("devices", _counted(summary.devices)),
    ]
    if summary.skipped_events:
        rows.append(("skipped events", f"{summary.skipped_events:,}"))
    for key, value in rows:
        overview.add_row(f"{key}:", value)

    kinds = Table(title="events per kind", title_justify="left")
    kinds.add_column("kind")
    kinds.add_column("events", justify="right")
    for k, n in summary.kinds.items():
        kinds.add_row(k, f"{n:,}")

    streams = Table(title="device streams", title_justify="left")
    streams.add_column("rank", justify="right")
    streams.add_column("device", justify="right")
    streams.add_column("streams")
    for s in summary.streams:
        streams.add_row(str(s.rank), "-" if s.device is None else str(s.device), _int_list(s.streams))

    parts: list[RenderableType] = [overview, kinds]
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
        table.add_row(Text(_clip(n.name, name_chars)), f"{n.count:,}", sig(n.total_ns / 1e6), share)
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
