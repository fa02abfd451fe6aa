"""Chrome Trace Event Format decoding: JSON text to raw columns, without precision loss.

Events are decoded by msgspec into structs, in batches straight out of the input buffer:
ts/dur/id come back as ints or as the text of their float literals (never through a float),
`args` and unknown keys as raw JSON bytes, so string timestamps, 16-digit microsecond floats
and ids above 2**53 are exact and `args` is kept byte for byte.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
from msgspec.structs import astuple

from msprof_py.errors import TraceFormatError
from msprof_py.trace import native
from msprof_py.trace.fields import (
    ABSENT,
    INT64_MAX,
    bad_utf8_offset,
    event_text,
    extras,
    flow_ids,
    ids_to_int,
    is_object_or_null,
    object_texts,
    shown,
    string_id,
    times_ns,
    us_to_ns,
)
from msprof_py.trace.raw import RawEvents

#: Event keys that have a column of their own; everything else goes to `extra`, verbatim.
_COLUMN_KEYS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args")
#: Keys seen in most real traces, declared up front; others are added on first sight (a re-parse).
_COMMON_EXTRA = ("bp", "s")
_UNKNOWN_FIELD = re.compile(r"unknown field `(.*)` - at `", re.S)
_PATH_INDEX = re.compile(r"\$(?:\.traceEvents)?\[(\d+)\](?:\.(\w+))?")


#: Every phase of the Trace Event Format, and the categories Kineto and torch_npu write: a
#: decode that knows them returns these very strings instead of a new string per event (a
#: tenth of a Kineto trace's decode). Any other value sends the decode to plain strings.
_PHASES = tuple("BEXiICbneSTpFstfPNODMVvRc()")
_CATEGORIES = (
    "cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation",
    "user_annotation", "python_function", "ac2g", "fwdbwd", "Trace", "cuda_sync", "cuda_event",
    "cpu_instant_event", "overhead", "cuda_profiler_range", "external_correlation", "async_task", "Runtime",
    "Operator", "collective_comm", "mtia_runtime", "mtia_ccp_events", "mtia_insight", "mtia_counters",
    "glow_runtime", "hpu_op", "xpu_runtime", "xpu_driver", "xpu_sync", "xpu_scope_profiler",
    "privateuse1_runtime", "privateuse1_driver", "HostToDevice", "async_npu", "async_task_queue", "enqueue",
    "dequeue",
)


class _Keys(NamedTuple):
    """What the event struct of a batch is made for: the extra keys seen so far, and whether
    ph and cat are decoded as known strings (see _PHASES) until a value is not one of them."""

    extra: tuple[str, ...] = _COMMON_EXTRA
    known: bool = True


def _event_struct(keys: _Keys) -> type:
    ph: Any = Literal[_PHASES] if keys.known else str  # type: ignore[valid-type]
    cat: Any = Literal[_CATEGORIES] if keys.known else str  # type: ignore[valid-type]
    fields: list[tuple[str, Any, Any]] = [
        ("ph", ph | None, None),
        ("name", str | None, None),
        ("cat", cat | None, None),
        ("pid", int | str | None, None),
        ("tid", int | str | None, None),
    ]
    # ts, dur and id decode untyped: ints come back exact and float literals come back as
    # their text (the decoder's float_hook), so no precision is lost and no Raw object is made.
    for key in ("ts", "dur", "id"):
        fields.append((key, Any, None))
    # A key the event lacks decodes as an empty Raw (no JSON value is empty): a batch's raw
    # values then join into one buffer as they are, without a per-event test for absence.
    fields.append(("args", msgspec.Raw, ABSENT))
    # Other keys may be any JSON string ("Trace name", "", "\u00e9"): each gets an attribute
    # name of its own, x0, x1, ..., decoded from the key as it is spelled.
    for i, key in enumerate(keys.extra):
        fields.append((f"x{i}", msgspec.Raw, msgspec.field(default=ABSENT, name=key)))
    return msgspec.defstruct("ChromeEvent", fields, forbid_unknown_fields=True, gc=False)


_BOM = b"\xef\xbb\xbf"

#: Events decoded per batch: bounds the per-event Python objects alive at once, which
#: would otherwise be several times the size of the JSON.
CHUNK_EVENTS = 8192


class _Top(msgspec.Struct):
    """An object-form trace: only the event list is decoded (as raw values) in the first pass."""

    traceEvents: list[msgspec.Raw] | None = None


#: First-line / first-bytes marks of the tables torch_npu and msprof-analyze write beside a
#: timeline: users pass them by mistake, so the error names what they are and what to pass.
_SUMMARIES = (
    (b"Accelerator Core", "torch_npu kernel_details.csv (per-task table)"),
    (b"Communication(Not Overlapped)", "msprof-analyze cluster_step_trace_time.csv / step_trace_time.csv"),
    (b"Communication Time Info", "msprof-analyze cluster_communication.json / communication.json"),
)


def _not_a_trace(where: str, data: bytes | bytearray, problem: str, hint: str) -> TraceFormatError:
    """The error for input that is not a trace; names the summary table when it is one of _SUMMARIES."""
    head = bytes(data[:4096])
    for mark, what in _SUMMARIES:
        if mark in head:
            return TraceFormatError(f"{where}: not a trace: it is a {what}, a summary table, not a timeline",
                                    hint="pass the trace_view.json or msprof_*.json timeline beside it")
    return TraceFormatError(f"{where}: not a trace: {problem}", hint=hint)


def decode(data: bytes | bytearray, *, where: str, lenient: bool = False, extras: bool = True) -> RawEvents:
    """Decode a Chrome trace (object with traceEvents, or a bare array) into raw columns.

    `extras=False` leaves the `extra` column null (an import for analysis only: no analyzer
    reads it, and collecting the uncommon keys of every event is a tenth of the decode).
    """
    try:
        return _decode(data, where=where, lenient=lenient, extras=extras)
    except RecursionError:
        # msgspec recurses once per nesting level, Raw values too: a hostile [[[[...]]]] would
        # otherwise escape as a RecursionError.
        raise TraceFormatError(f"{where}: invalid JSON: values nested too deeply",
                               hint="no trace nests lists or objects hundreds of levels deep") from None


def _decode(data: bytes | bytearray, *, where: str, lenient: bool, extras: bool) -> RawEvents:
    if data[:3] == _BOM:
        return _without_bom(data, where=where, lenient=lenient, extras=extras)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise TraceFormatError(f"{where}: not a trace: the text is UTF-16, not UTF-8",
                               hint="re-save the trace as UTF-8")
    stripped = bytes(data[:64]).lstrip()
    if not stripped:
        if not bytes(data).strip():
            raise TraceFormatError(f"{where}: empty file", hint="expected Chrome trace JSON")
        stripped = bytes(data).lstrip()
    fast = _decode_native(data, stripped[:1], extras)
    if fast is None:
        fast = _decode_plain(data, stripped[:1], where, lenient, extras)
    if fast is not None:
        _check_span(fast, where)
        return fast
    top: dict[str, Any] = {}
    try:
        if stripped[:1] == b"{":
            items = msgspec.json.decode(data, type=_Top).traceEvents
            if items is None:
                raise _not_a_trace(where, data, "JSON object has no 'traceEvents' key",
                                   "expected a Chrome/Kineto trace object or a bare array of events")
            top = _other_keys(data, items, where)
        elif stripped[:1] == b"[":
            items = msgspec.json.decode(data, type=list[msgspec.Raw])
        else:
            raise _not_a_trace(where, data, f"expected a JSON object or array, found {stripped[:12]!r}",
                               "expected Chrome trace JSON (.json or .json.gz)")
    except msgspec.ValidationError:
        raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
    except msgspec.DecodeError as exc:
        raise _json_error(where, bytes(data), exc) from None
    pieces: list[RawEvents] = []
    keys = _Keys()
    base = 0
    batches = _batches(data, items)
    del items  # the batch generator owns the event list now and drops it once split
    for blob, count in batches:
        try:
            events, skipped, keys = _decode_events(blob, where, lenient, keys)
            del blob
            piece = _columns(events, where, lenient, extras)
        except TraceFormatError as exc:
            raise _shifted(exc, base) from None
        piece.skipped += skipped
        pieces.append(piece)
        base += count
        del events
    raw = RawEvents.concat(pieces) if pieces else _columns([], where, lenient)
    _check_span(raw, where)
    raw.top = top
    return raw


# ---------------------------------------------------------------- native scan

#: The compiled scanner (see native.py), or None: then the msgspec paths decode everything.
_scan = native.load()
#: Event text at which the scan is split in two, each half on its own thread (the scanner lets
#: go of the GIL): below it, one thread.
SPLIT_BYTES = 4 << 20


class _Part(NamedTuple):
    """What _scan.scan returns for a run of events (see _scan.c): column buffers, the other
    keys it saw and where their values are, and where its string pids / tids are."""

    n: int
    ph_off: bytes
    ph_data: bytes
    name_bits: bytes
    name_nulls: int
    name_off: bytes
    name_data: bytes
    cat_bits: bytes
    cat_nulls: int
    cat_off: bytes
    cat_data: bytes
    pid: bytes
    tid: bytes
    ts: bytes
    has_ts: bytes
    dur: bytes
    dur_bits: bytes
    dur_nulls: int
    id_bits: bytes
    id_nulls: int
    id_off: bytes
    id_data: bytes
    args_bits: bytes
    args_nulls: int
    args_off: bytes
    args_data: bytes
    keys: list[bytes]
    entries: bytes
    strids: bytes


def _scan_parts(data: bytes | bytearray, start: int, end: int) -> list[_Part] | None:
    """The events of data[start:end] scanned, in two halves on two threads when large; None
    when the scanner declines them."""
    spans = [(start, end)]
    if end - start >= SPLIT_BYTES:
        # Two halves cut between two events (a '}, {' near the middle). A cut inside a string
        # or a nested value leaves a half that is no run of whole objects, which the scanner
        # refuses; two halves that each are one join into one (JSON has one parse), so the
        # halves' columns are the whole's.
        mid = _next_cut(data, (start + end) // 2, end)
        if start < mid < end:
            spans = [(start, mid), (mid + 1, end)]
    if len(spans) == 2:
        other: list[Any] = []
        worker = threading.Thread(target=lambda: other.append(_scan.scan(data, *spans[1])), daemon=True)
        worker.start()
        parts = [_scan.scan(data, *spans[0])]
        worker.join()
        parts += other
        if len(parts) == 2 and None not in parts:
            return [_Part._make(p) for p in parts]
        # the middle cut fell inside a value: one scan of the whole
    whole = _scan.scan(data, start, end)
    return None if whole is None else [_Part._make(whole)]


def _decode_native(data: bytes | bytearray, first: bytes, extras: bool) -> RawEvents | None:
    """The native path: the event array scanned in C into column buffers, no object per event.

    The scanner validates the text as JSON and takes only the events real profilers write
    (see _scan.c); None whenever anything is outside that (or the scanner is not built): the
    msgspec paths then decode, with their own error messages. Its columns equal theirs.
    """
    if _scan is None:
        return None
    layout = _plain_layout(data, first)
    if layout is None:
        return None
    top, start, end = layout
    parts = _scan_parts(data, start, end)
    n = sum(p.n for p in parts) if parts else 0
    if not n:
        return None
    # The other keys in order of first appearance (the order the msgspec paths lay out `extra`
    # in), then "pid" and "tid" for string ids; each part lists its own keys, "bp" and "s" first.
    index: dict[bytes, int] = {}
    for part in parts:
        for key in part.keys:
            index.setdefault(key, len(index))
    names = [*index, b"pid", b"tid"]
    pieces, entries = [], []
    first_event = 0
    for part in parts:
        piece = _native_columns(part)
        ent = np.frombuffer(part.entries, dtype=np.int64).reshape(-1, 4)
        key_map = [index[k] for k in part.keys]
        strids = np.frombuffer(part.strids, dtype=np.int64).reshape(-1, 4)
        if len(strids):
            # String pids / tids ("Spans", "Traces"): their ids as _columns makes them, and
            # their text in `extra` under "pid" / "tid" (part keys past its own: 0 pid, 1 tid).
            for event, which, lo, hi in strids.tolist():
                (piece.pid if which == 0 else piece.tid)[event] = string_id(msgspec.json.decode(data[lo:hi]))
            ids = strids.copy()
            ids[:, 1] += len(key_map)
            key_map += [len(index), len(index) + 1]
            ent = np.concatenate([ent, ids])
            ent = ent[np.argsort(ent[:, 0], kind="stable")]
        pieces.append(piece)
        entries.append((first_event, ent.tobytes(), np.array(key_map, dtype=np.int64).tobytes()))
        first_event += part.n
    raw = RawEvents.concat(pieces) if len(pieces) > 1 else pieces[0]
    if extras and any(ent for _, ent, _ in entries):
        got = _scan.extras(data, n, entries, names)
        if got is None:
            return None
        raw.extra = _text(n, *got)
    raw.top = top
    return raw


def _text(n: int, bits: bytes | None, nulls: int, off: bytes, data: bytes) -> pa.Array:
    """A string array from the scanner's buffers. The scanner checked the UTF-8, so a view is
    enough; a cast (which checks again) only where the bytes are not all ASCII, to keep
    Arrow's own guarantee."""
    arr = pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(bits) if nulls else None, pa.py_buffer(off),
                                                 pa.py_buffer(data)], null_count=nulls)
    return arr.view(pa.string()) if data.isascii() else arr.cast(pa.string())


def _native_columns(p: _Part) -> RawEvents:
    """One part's columns, as the msgspec paths' _columns lays them out (`extra` null: see
    _decode_native)."""
    return RawEvents(
        ph=_text(p.n, None, 0, p.ph_off, p.ph_data),
        name=_text(p.n, p.name_bits, p.name_nulls, p.name_off, p.name_data),
        cat=_text(p.n, p.cat_bits, p.cat_nulls, p.cat_off, p.cat_data),
        # writable copies, as the msgspec paths' arrays are
        pid=np.frombuffer(p.pid, dtype=np.int64).copy(),
        tid=np.frombuffer(p.tid, dtype=np.int64).copy(),
        ts_ns=np.frombuffer(p.ts, dtype=np.int64).copy(),
        has_ts=np.frombuffer(p.has_ts, dtype=np.bool_).copy(),
        dur_ns=pa.Array.from_buffers(pa.int64(), p.n, [pa.py_buffer(p.dur_bits) if p.dur_nulls else None,
                                                       pa.py_buffer(p.dur)], null_count=p.dur_nulls),
        id=_text(p.n, p.id_bits, p.id_nulls, p.id_off, p.id_data),
        args=_text(p.n, p.args_bits, p.args_nulls, p.args_off, p.args_data),
        extra=pa.nulls(p.n, pa.string()),
    )


#: The key of the event array in an object-form trace, as written when it is plain: unescaped.
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\n\r]*:[ \t\n\r]*\[')
#: What separates two events in the array: the end of one object, a comma, the start of the next.
_BETWEEN = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
#: The end of the event array: its last object's '}', whitespace, then ']'.
_CLOSING = re.compile(rb"[ \t\n\r]*\]")
#: Bytes of event text per batch on the fast path (about CHUNK_EVENTS events of a Kineto trace).
CHUNK_BYTES = 2 << 20
#: Places tried, from the end of the text, for the bracket that closes the event array.
_END_TRIES = 32
#: The most text before or after the event array the fast path takes on: each try at the
#: array's end decodes both, so the text around the array must be small next to the events.
_AROUND_BYTES = 1 << 20
#: Cuts tried for one batch: a '}, {' inside a string or a nested value is no place to cut.
_CUT_TRIES = 8


def _decode_plain(data: bytes | bytearray, first: bytes, where: str, lenient: bool,
                  extras: bool) -> RawEvents | None:
    """The fast path: split the event array into batches without parsing it first.

    The exact path parses the whole text once to find where each event starts, and then again
    event by event. Here the array's brackets are found in the text, and it is cut at byte
    offsets, each cut at the next '}', ',' '{' sequence. Each batch is then proven by its own
    typed decode: a cut inside a string or a nested value leaves the batch before it
    unterminated or unbalanced, which no JSON decoder accepts, and the text around the array
    (the trace's other keys) is proven by its own decode. None whenever anything is not as
    expected (an unusual layout, bad JSON, a bad event): the exact path then decides, with
    its own error messages.
    """
    layout = _plain_layout(data, first)
    if layout is None:
        return None
    top, start, end = layout
    pieces: list[RawEvents] = []
    keys = _Keys()
    lo = start
    try:
        while lo <= end:
            # The batch is data[lo:hi]: the separator before it becomes '[' and the one at hi
            # (a comma, or the array's own ']') becomes ']'.
            hi = _next_cut(data, lo + CHUNK_BYTES, end)
            for _ in range(_CUT_TRIES):
                try:
                    events, keys = _decode_span(data, lo, hi, where, keys)
                    break
                except TraceFormatError:
                    if hi == end:
                        raise
                    hi = _next_cut(data, hi + 1, end)  # the cut was inside a value: the next one
            else:
                return None
            pieces.append(_columns(events, where, lenient, extras))
            del events
            lo = hi + 1
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - any surprise: the exact path decides, and says why
        return None
    raw = RawEvents.concat(pieces)
    raw.top = top
    return raw


def _next_cut(data: bytes | bytearray, pos: int, end: int) -> int:
    """The first comma between two events at or after `pos`, or `end` when there is none."""
    m = _BETWEEN.search(data, pos, end) if pos < end else None
    return data.index(b",", m.start()) if m else end


def _decode_span(data: bytes | bytearray, lo: int, hi: int, where: str,
                 keys: _Keys) -> tuple[list[Any], _Keys]:
    """The events in data[lo:hi] (a run of comma-separated objects), decoded as one array."""
    if not isinstance(data, bytearray):
        events, _skipped, keys = _decode_events(b"[" + data[lo:hi] + b"]", where, False, keys)
        return events, keys
    saved = data[lo - 1], data[hi]
    data[lo - 1], data[hi] = 0x5B, 0x5D  # '[' and ']'
    view = memoryview(data)
    try:
        events, _skipped, keys = _decode_events(view[lo - 1:hi + 1], where, False, keys)
    finally:
        view.release()
        data[lo - 1], data[hi] = saved
    return events, keys


def _plain_layout(data: bytes | bytearray, first: bytes) -> tuple[dict[str, Any], int, int] | None:
    """(the trace's other top-level keys, start, end) of the event array's text data[start:end]
    between its brackets, when the text is laid out plainly; None otherwise.

    The key is found as written ("traceEvents", once, with no \\u escape in the text around
    the array: no other spelling can name it). The closing bracket is a ']' after a '}' where
    the text around the array, with the array emptied, decodes to the trace's other keys and
    an empty traceEvents. A bracket in a value after the array can pass that test too (its
    suffix of the text may close the object as well), but one inside the events cannot (what
    follows it closes more than the head opened), so the earliest one that passes is taken.
    Whichever is taken, the decode of the last batch proves it: text cut at any other place
    is no array of events.
    """
    if first == b"{":
        m = _EVENTS_KEY.search(data)
        if m is None:
            return None
        start = m.end()
    elif first == b"[":
        start = data.index(b"[") + 1
    else:
        return None
    if start > _AROUND_BYTES:
        return None
    head = bytes(data[:start])
    if b"\\u" in head or head.count(b'"traceEvents"') > (first == b"{"):
        return None
    found = None
    end = len(data)
    for _ in range(_END_TRIES):
        end = data.rfind(b"]", start, end)
        last = data.rfind(b"}", start, end) if end > 0 else -1
        if last < 0 or len(data) - end > _AROUND_BYTES:
            break
        if not _CLOSING.fullmatch(data, last + 1, end + 1):
            continue  # not right after an object
        tail = bytes(data[end:])
        if b"\\u" in tail or b'"traceEvents"' in tail:
            break
        try:
            doc = msgspec.json.decode(head + tail)
        except (msgspec.DecodeError, RecursionError):
            continue
        if first == b"[" and doc == []:
            found = {}, end
        elif first == b"{" and isinstance(doc, dict) and doc.get("traceEvents") == []:
            del doc["traceEvents"]
            found = doc, end
    return None if found is None else (found[0], start, found[1])


def _check_span(raw: RawEvents, where: str) -> None:
    """The table keeps ts relative to the earliest event, and ends (ts + dur) are computed
    downstream: both must fit int64 ns as well as each number on its own."""
    if not raw.has_ts.any():
        return
    ts = raw.ts_ns[raw.has_ts]
    lo, hi = int(ts.min()), int(ts.max())
    if hi - lo > INT64_MAX:
        i = int(np.flatnonzero(raw.has_ts & (raw.ts_ns == hi))[0])
        raise TraceFormatError(f"{where}: event {i}: 'ts' is out of range (the trace would span more than "
                               "int64 nanoseconds, about 292 years)")
    dur = raw.dur_ns.fill_null(0).to_numpy(zero_copy_only=False)
    rel = np.where(raw.has_ts, raw.ts_ns - lo, 0)  # no overflow: 0 <= rel <= hi - lo
    over = dur > INT64_MAX - rel
    if over.any():
        i = int(np.flatnonzero(over)[0])
        raise TraceFormatError(f"{where}: event {i}: 'dur' is out of range (ts + dur is beyond int64 nanoseconds)")


def _without_bom(data: bytes | bytearray, **kw: Any) -> RawEvents:
    """Decode text that starts with a UTF-8 byte-order mark (editors on Windows write one).

    A writable buffer gets the mark blanked to spaces (JSON whitespace) for the decode and put
    back afterwards: no copy of a large trace; other buffers are sliced.
    """
    if not isinstance(data, bytearray):
        return _decode(bytes(data[3:]), **kw)
    data[:3] = b"   "
    try:
        return _decode(data, **kw)
    finally:
        data[:3] = _BOM


def _other_keys(data: Any, items: list[msgspec.Raw], where: str) -> dict[str, Any]:
    """The top-level keys besides traceEvents, decoded from the text with the events cut out."""
    span = _span(data, items) if items else None
    if span is None:
        doc = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        return {k: _loads(v, where) for k, v in doc.items() if k != "traceEvents"}
    start, end = span
    doc = msgspec.json.decode(bytes(data[:start]) + bytes(data[end:]))
    doc.pop("traceEvents", None)
    return doc


def _span(data: Any, items: list[msgspec.Raw]) -> tuple[int, int] | None:
    """Byte offsets in `data` from the first item's start to the last item's end, if they are
    views into it (msgspec's Raw values are)."""
    base = _address(data)
    start = _address(items[0]) - base
    end = _address(items[-1]) - base + len(items[-1])
    return (start, end) if 0 < start < end < len(data) else None


def _batches(data: Any, items: list[msgspec.Raw]):
    """JSON arrays of at most CHUNK_EVENTS events each, with their event counts.

    When the input is a writable buffer the batches are zero-copy views of it: the separator
    just before a batch's first event becomes '[' and the one after its last event ']', and
    both bytes are put back once the batch is decoded.
    """
    ranges = [(i, min(i + CHUNK_EVENTS, len(items))) for i in range(0, len(items), CHUNK_EVENTS)]
    spans = [_span(data, items[a:b]) for a, b in ranges] if isinstance(data, bytearray) else []
    if not spans or None in spans:
        for a, b in ranges:
            yield b"[" + b",".join(items[a:b]) + b"]", b - a
        return
    del items
    view = memoryview(data)
    try:
        for (start, end), (a, b) in zip(spans, ranges):
            saved = data[start - 1], data[end]
            data[start - 1], data[end] = 0x5B, 0x5D  # '[' and ']'
            try:
                yield view[start - 1:end + 1], b - a
            finally:
                data[start - 1], data[end] = saved
    finally:
        view.release()


def _address(buf: Any) -> int:
    """Memory address of a buffer's first byte (Raw values are views into the input)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def _shifted(exc: TraceFormatError, base: int) -> TraceFormatError:
    """Re-number 'event N' in a batch's error to the event's index in the whole file."""
    if not base:
        return exc
    text = re.sub(r"\bevent (\d+)", lambda m: f"event {int(m.group(1)) + base}", str(exc), count=1)
    return TraceFormatError(text, hint=exc.hint)


@functools.lru_cache(maxsize=64)
def _decoder(keys: _Keys) -> tuple[type, msgspec.json.Decoder]:
    """The event struct for these keys and a decoder of a batch of them (made once)."""
    struct = _event_struct(keys)
    return struct, msgspec.json.Decoder(list[struct], float_hook=str)


def _decode_events(data: Any, where: str, lenient: bool, keys: _Keys) -> tuple[list[Any], int, _Keys]:
    tries = 256
    while tries:
        tries -= 1
        struct, decoder = _decoder(keys)
        try:
            return decoder.decode(data), 0, keys
        except msgspec.ValidationError as exc:
            m = _UNKNOWN_FIELD.search(str(exc))
            key = m.group(1) if m else None
            extra = keys.extra
            if key is not None and _nameable(key) and key not in extra and key not in _COLUMN_KEYS:
                keys = keys._replace(extra=(*extra, key))
                continue
            if keys.known:
                # A phase or category of its own, or a bad event: plain strings from here on
                # (the decode as it always was, which words any error).
                keys = keys._replace(known=False)
                tries += 1  # a retry that adds no key
                continue
            if lenient:
                events, skipped = _decode_leniently(data, struct, where)
                return events, skipped, keys
            if key is not None:
                at = _PATH_INDEX.search(str(exc))
                raise TraceFormatError(f"{where}: event {at.group(1) if at else '?'}: key {shown(key)} holds a "
                                       "backslash, quote or control character, which event keys cannot have here",
                                       hint="--lenient skips such events") from None
            raise _validation_error(where, exc) from None
        except msgspec.DecodeError as exc:
            if "Expected `array`" in str(exc):
                raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
            raise _json_error(where, bytes(data), exc) from None
    raise TraceFormatError(f"{where}: events carry too many distinct keys (over 256)")


def _nameable(key: str) -> bool:
    """Whether msgspec can decode a field spelled `key` (no backslash, quote or control character)."""
    return not any(c in '\\"' or c < " " for c in key)


def _decode_leniently(data: bytes, struct: type, where: str) -> tuple[list[Any], int]:
    try:
        items = msgspec.json.decode(data, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
    except msgspec.DecodeError as exc:
        raise _json_error(where, bytes(data), exc) from None
    decoder = msgspec.json.Decoder(struct, float_hook=str)
    out, skipped = [], 0
    for item in items:
        try:
            out.append(decoder.decode(item))
        except (msgspec.DecodeError, msgspec.ValidationError):
            skipped += 1
    return out, skipped


def _json_error(where: str, data: bytes, exc: Exception) -> TraceFormatError:
    msg = str(exc)
    m = re.search(r"\(byte (\d+)\)", msg)
    if m:
        pos = int(m.group(1))
        near = data[pos:pos + 9]
        if near[:3] in (b"NaN", b"Inf", b"-In") or near[:4] == b"-NaN":
            return TraceFormatError(
                f"{where}: invalid JSON at byte {pos}: NaN/Infinity is not a JSON number",
                hint="event fields must be finite numbers",
            )
    if "truncated" in msg:
        return TraceFormatError(f"{where}: invalid JSON: the file is truncated", hint="re-copy or re-export the trace")
    if "UTF-8" in msg:
        pos = bad_utf8_offset(data)
        return TraceFormatError(f"{where}: invalid JSON: text is not valid UTF-8 (byte {pos})")
    return TraceFormatError(f"{where}: invalid JSON: {msg}")


def _validation_error(where: str, exc: Exception) -> TraceFormatError:
    msg = str(exc)
    m = _PATH_INDEX.search(msg)
    base = msg.split(" - at ")[0].replace("`", "'")
    if m:
        if not m.group(2) and base.startswith("Expected 'object'"):
            return TraceFormatError(f"{where}: not a trace: event {m.group(1)} is not a JSON object ({base})")
        fld = f" field '{m.group(2)}'" if m.group(2) else ""
        return TraceFormatError(f"{where}: event {m.group(1)}{fld}: {base}")
    return TraceFormatError(f"{where}: not a trace: {base}")


def _loads(raw: bytes | msgspec.Raw, where: str) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise _json_error(where, bytes(raw), exc) from None


# ---------------------------------------------------------------- columns

def _columns(events: list[Any], where: str, lenient: bool, keep_extra: bool = True) -> RawEvents:
    n = len(events)
    skipped = 0
    if lenient:
        events = [e for e in events if _well_formed(e)]
        skipped = n - len(events)
        n = len(events)
    struct = type(events[0]) if n else None
    fields = struct.__struct_fields__ if struct else _COLUMN_KEYS
    # Every field as a column in one pass over the events: a tuple per event, transposed. (One
    # attribute pass per field takes twice the time.)
    columns = dict(zip(fields, zip(*map(astuple, events)))) if n else dict.fromkeys(fields, ())
    ph_list = columns["ph"]
    ph = _phases(ph_list)
    if ph.null_count:
        i = ph_list.index(None)
        raise TraceFormatError(f"{where}: event {i}: missing 'ph' (event phase)")
    pid, pid_str = ids_to_int(columns["pid"], "pid", where)
    tid, tid_str = ids_to_int(columns["tid"], "tid", where)
    ts_ns, has_ts = times_ns(columns["ts"], "ts", where)
    _check_timed(ph_list, has_ts, where)
    dur_raw = columns["dur"]
    dur_ns, has_dur = times_ns(dur_raw, "dur", where)
    if (dur_ns < 0).any():
        i = int(np.flatnonzero(dur_ns < 0)[0])
        raise TraceFormatError(f"{where}: event {i}: negative 'dur' ({event_text(dur_raw[i])})")
    other = [(key, columns[attr]) for attr, key in zip(fields, struct.__struct_encode_fields__)
             if attr not in _COLUMN_KEYS] if struct else []
    return RawEvents(
        ph=ph,
        name=pa.array(columns["name"], type=pa.string()),
        cat=pa.array(columns["cat"], type=pa.string()),
        pid=pid,
        tid=tid,
        ts_ns=ts_ns,
        has_ts=has_ts,
        dur_ns=pa.array(dur_ns, mask=~has_dur),
        id=flow_ids(columns["id"], where),
        args=object_texts(columns["args"], "args", where),
        extra=extras(other, n, pid_str, tid_str, where) if keep_extra else pa.nulls(n, pa.string()),
        skipped=skipped,
    )


def _phases(ph: Sequence[str | None]) -> pa.Array:
    """The ph column. Phases are one ASCII letter: joined into one string, that string's
    bytes are the column's data as they are (three times faster than converting each)."""
    try:
        joined = "".join(ph)  # type: ignore[arg-type]
    except TypeError:  # a missing ph (None): the caller names the event
        joined = ""
    # As long as the events, with none empty: then each is one character.
    if len(joined) != len(ph) or not joined.isascii() or "" in ph:
        return pa.array(ph, type=pa.string())
    return pa.Array.from_buffers(pa.string(), len(ph), [None, pa.py_buffer(np.arange(len(ph) + 1, dtype=np.int32)),
                                                         pa.py_buffer(joined.encode("ascii"))])


def _check_timed(ph: list[str], has_ts: np.ndarray, where: str) -> None:
    """Every event but metadata (ph M) needs a 'ts': without one it would silently sit at the origin."""
    for i in np.flatnonzero(~has_ts).tolist():
        if ph[i] != "M":
            raise TraceFormatError(f"{where}: event {i}: {shown(ph[i])} event has no 'ts'",
                                   hint="every event but metadata (ph 'M') needs one; --lenient skips such events")


def _well_formed(e: Any) -> bool:
    """The checks _columns would fail on, per event, for --lenient imports."""
    if e.ph is None or (e.ts is None and e.ph != "M"):
        return False
    for v in (e.ts, e.dur):
        if v is not None and us_to_ns(v).__class__ is not int:
            return False
    if e.dur is not None and us_to_ns(e.dur) < 0:
        return False
    if e.id is not None and e.id.__class__ not in (str, int):  # ids: any size (see flow_ids)
        return False
    for v in (e.pid, e.tid):
        if v.__class__ is int and not -(2**63) <= v <= INT64_MAX:
            return False
    if not is_object_or_null(e.args):
        return False
    # args and the other keys are kept as raw bytes, which msgspec does not check for UTF-8.
    for key in type(e).__struct_fields__[_COLUMN_KEYS.index("args"):]:
        if bad_utf8_offset(bytes(getattr(e, key))) >= 0:
            return False
    return True

