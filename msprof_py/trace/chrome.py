"""Chrome Trace Event Format: decode to raw columns without precision loss, and encode back.

Decoding is typed (msgspec structs) with every numeric field kept as its raw JSON text, so
string timestamps, 16-digit microsecond floats and ids above 2**53 are parsed exactly, and
`args` is kept byte for byte.
"""

from __future__ import annotations

import hashlib
import re
from itertools import repeat
from operator import attrgetter, is_not
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.errors import TraceFormatError

#: Event keys that have a column of their own; everything else goes to `extra`, verbatim.
_COLUMN_KEYS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args")
#: Keys seen in most real traces, declared up front; others are added on first sight (a re-parse).
_COMMON_EXTRA = ("bp", "s")
_UNKNOWN_FIELD = re.compile(r"unknown field `(.+?)`")
_PATH_INDEX = re.compile(r"\$(?:\.traceEvents)?\[(\d+)\](?:\.(\w+))?")
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1


def _event_struct(extra_keys: tuple[str, ...]) -> type:
    fields: list[tuple[str, Any, Any]] = [
        ("ph", str | None, None),
        ("name", str | None, None),
        ("cat", str | None, None),
        ("pid", int | str | None, None),
        ("tid", int | str | None, None),
    ]
    # ts, dur and id decode untyped: ints come back exact and float literals come back as
    # their text (the decoder's float_hook), so no precision is lost and no Raw object is made.
    for key in ("ts", "dur", "id"):
        fields.append((key, Any, None))
    raw = msgspec.Raw | msgspec.UnsetType
    for key in ("args", *extra_keys):
        fields.append((key, raw, msgspec.UNSET))
    return msgspec.defstruct("ChromeEvent", fields, forbid_unknown_fields=True, gc=False)


@dataclass
class RawEvents:
    """The raw columns of a decoded Chrome trace (timestamps in absolute ns of the source clock)."""

    ph: pa.Array | pa.ChunkedArray  # string
    name: pa.Array | pa.ChunkedArray  # string
    cat: pa.Array | pa.ChunkedArray  # string
    pid: np.ndarray  # int64
    tid: np.ndarray  # int64
    ts_ns: np.ndarray  # int64, 0 where the event has no ts
    has_ts: np.ndarray  # bool
    dur_ns: pa.Array  # int64 with nulls
    id: pa.Array  # string
    args: pa.Array  # string (verbatim JSON)
    extra: pa.Array  # string (JSON object)
    #: Top-level keys of an object-form trace other than traceEvents, parsed.
    top: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.ph)

    @classmethod
    def concat(cls, pieces: list["RawEvents"]) -> "RawEvents":
        if len(pieces) == 1:
            return pieces[0]
        arrow = ("ph", "name", "cat", "dur_ns", "id", "args", "extra")
        numpy = ("pid", "tid", "ts_ns", "has_ts")
        # The bulky verbatim columns stay chunked (a copy would briefly double them); the
        # small ones the importers scan are made contiguous, which makes their scans cheaper.
        out = {k: pa.chunked_array([getattr(p, k) for p in pieces]) for k in ("args", "extra")}
        out.update({k: pa.concat_arrays([getattr(p, k) for p in pieces])
                    for k in arrow if k not in ("args", "extra")})
        out.update({k: np.concatenate([getattr(p, k) for p in pieces]) for k in numpy})
        return cls(**out, skipped=sum(p.skipped for p in pieces))

    def is_in(self, column: str, allowed: tuple[str, ...]) -> np.ndarray:
        """Boolean mask of rows whose `column` (ph, name, cat) is one of `allowed`.

        Each column is dictionary-encoded once and cached: masks are then numpy lookups on
        small integer codes instead of string comparisons over every row.
        """
        codes, values = self._codes(column)
        hit = np.array([v in allowed for v in values] + [False], dtype=bool)
        return hit[codes]

    def _codes(self, column: str) -> tuple[np.ndarray, list[Any]]:
        cache = self.__dict__.setdefault("_code_cache", {})
        if column not in cache:
            enc = pc.dictionary_encode(getattr(self, column))
            if isinstance(enc, pa.ChunkedArray):
                enc = enc.unify_dictionaries().combine_chunks()
            values = enc.dictionary.to_pylist()
            # Nulls point past the dictionary, at the trailing False of every mask.
            cache[column] = (enc.indices.fill_null(len(values)).to_numpy().astype(np.int64), values)
        return cache[column]

    def release(self) -> None:
        """Drop the columns (the table now owns them), so their memory can go early."""
        for k in ("ph", "name", "cat", "dur_ns", "id", "args", "extra", "pid", "tid", "ts_ns", "has_ts"):
            setattr(self, k, None)
        self.__dict__.pop("_code_cache", None)

    def take(self, column: str, idx: np.ndarray | list[int]) -> pa.Array:
        """Rows `idx` of an Arrow-backed column (ph, name, cat, id, args, extra)."""
        return getattr(self, column).take(pa.array(np.asarray(idx, dtype=np.int64)))

    def args_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        """The verbatim `args` JSON text of rows `idx`."""
        return self.args.take(pa.array(np.asarray(idx, dtype=np.int64))).to_pylist()

    def args_array_json(self, idx: np.ndarray | list[int]) -> bytes:
        """The `args` of rows `idx` as one JSON array text (`{}` for rows without args), built
        in Arrow without a Python string per row: msgspec then decodes all of them at once."""
        idx = np.asarray(idx, dtype=np.int64)
        if not len(idx):
            return b"[]"
        chunks = self.args.chunks if isinstance(self.args, pa.ChunkedArray) else [self.args]
        bounds = np.cumsum([0] + [len(c) for c in chunks])
        parts = []
        # Per chunk, so the verbatim args never need one contiguous copy.
        for c, lo, hi in zip(chunks, bounds[:-1], bounds[1:]):
            sel = idx[(idx >= lo) & (idx < hi)] - lo
            if len(sel):
                parts.append(_joined(c.take(pa.array(sel)).fill_null("{}")))
        return b"[" + b",".join(parts) + b"]"

    def ids_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        return self.id.take(pa.array(np.asarray(idx, dtype=np.int64))).to_pylist()


#: Events decoded per batch: bounds the per-event Python objects alive at once, which
#: would otherwise be several times the size of the JSON.
CHUNK_EVENTS = 8192


class _Top(msgspec.Struct):
    """An object-form trace: only the event list is decoded (as raw values) in the first pass."""

    traceEvents: list[msgspec.Raw] | None = None


def decode(data: bytes | bytearray, *, where: str, lenient: bool = False) -> RawEvents:
    """Decode a Chrome trace (object with traceEvents, or a bare array) into raw columns."""
    stripped = bytes(data[:64]).lstrip()
    if not stripped:
        if not bytes(data).strip():
            raise TraceFormatError(f"{where}: empty file", hint="expected Chrome trace JSON")
        stripped = bytes(data).lstrip()
    top: dict[str, Any] = {}
    try:
        if stripped[:1] == b"{":
            items = msgspec.json.decode(data, type=_Top).traceEvents
            if items is None:
                raise TraceFormatError(
                    f"{where}: not a trace: JSON object has no 'traceEvents' key",
                    hint="expected a Chrome/Kineto trace object or a bare array of events",
                )
            top = _other_keys(data, items, where)
        elif stripped[:1] == b"[":
            items = msgspec.json.decode(data, type=list[msgspec.Raw])
        else:
            raise TraceFormatError(
                f"{where}: not a trace: expected a JSON object or array, found {stripped[:12]!r}",
                hint="expected Chrome trace JSON (.json or .json.gz)",
            )
    except msgspec.ValidationError:
        raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
    except msgspec.DecodeError as exc:
        raise _json_error(where, bytes(data), exc) from None
    pieces: list[RawEvents] = []
    extra_keys: tuple[str, ...] = _COMMON_EXTRA
    base = 0
    batches = _batches(data, items)
    del items  # the batch generator owns the event list now and drops it once split
    for blob, count in batches:
        try:
            events, skipped, extra_keys = _decode_events(blob, where, lenient, extra_keys)
            del blob
            piece = _columns(events, where, lenient)
        except TraceFormatError as exc:
            raise _shifted(exc, base) from None
        piece.skipped += skipped
        pieces.append(piece)
        base += count
        del events
    raw = RawEvents.concat(pieces) if pieces else _columns([], where, lenient)
    raw.top = top
    return raw


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


def _joined(texts: pa.Array) -> bytes:
    """Non-null strings joined with ',' into one bytes object, via Arrow buffers."""
    with_sep = pc.binary_join_element_wise(texts, pa.scalar(","), "").cast(pa.large_binary())
    offsets = np.frombuffer(with_sep.buffers()[1], dtype=np.int64)
    first, last = int(offsets[with_sep.offset]), int(offsets[with_sep.offset + len(with_sep)])
    return with_sep.buffers()[2].to_pybytes()[first:last - 1]


def _address(buf: Any) -> int:
    """Memory address of a buffer's first byte (Raw values are views into the input)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def _shifted(exc: TraceFormatError, base: int) -> TraceFormatError:
    """Re-number 'event N' in a batch's error to the event's index in the whole file."""
    if not base:
        return exc
    text = re.sub(r"\bevent (\d+)", lambda m: f"event {int(m.group(1)) + base}", str(exc), count=1)
    return TraceFormatError(text, hint=exc.hint)


def _decode_events(data: Any, where: str, lenient: bool,
                   extra: tuple[str, ...]) -> tuple[list[Any], int, tuple[str, ...]]:
    for _ in range(256):
        struct = _event_struct(extra)
        try:
            return msgspec.json.Decoder(list[struct], float_hook=str).decode(data), 0, extra
        except msgspec.ValidationError as exc:
            m = _UNKNOWN_FIELD.search(str(exc))
            if m:
                extra = (*extra, m.group(1))
                continue
            if lenient:
                events, skipped = _decode_leniently(data, struct, where)
                return events, skipped, extra
            raise _validation_error(where, exc) from None
        except msgspec.DecodeError as exc:
            if "Expected `array`" in str(exc):
                raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
            raise _json_error(where, bytes(data), exc) from None
    raise TraceFormatError(f"{where}: events carry too many distinct keys (over 256)")


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
        pos = _bad_utf8_offset(data)
        return TraceFormatError(f"{where}: invalid JSON: text is not valid UTF-8 (byte {pos})")
    return TraceFormatError(f"{where}: invalid JSON: {msg}")


def _bad_utf8_offset(data: bytes) -> int:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return -1


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

def _columns(events: list[Any], where: str, lenient: bool) -> RawEvents:
    n = len(events)
    skipped = 0
    if lenient:
        events = [e for e in events if _well_formed(e)]
        skipped = n - len(events)
        n = len(events)
    ph_list = list(map(attrgetter("ph"), events))
    if None in ph_list:
        i = ph_list.index(None)
        raise TraceFormatError(f"{where}: event {i}: missing 'ph' (event phase)")
    struct_fields = type(events[0]).__struct_fields__ if n else ()
    extra_keys = [f for f in struct_fields if f not in _COLUMN_KEYS]
    col = lambda key: list(map(attrgetter(key), events))  # noqa: E731
    pid, pid_str = _ids_to_int(col("pid"), "pid", where)
    tid, tid_str = _ids_to_int(col("tid"), "tid", where)
    ts_ns, has_ts = _times_ns(col("ts"), "ts", where)
    dur_raw = col("dur")
    dur_ns, has_dur = _times_ns(dur_raw, "dur", where)
    if (dur_ns < 0).any():
        i = int(np.flatnonzero(dur_ns < 0)[0])
        raise TraceFormatError(f"{where}: event {i}: negative 'dur' ({_text(dur_raw[i])})")
    return RawEvents(
        ph=pa.array(ph_list, type=pa.string()),
        name=pa.array(col("name"), type=pa.string()),
        cat=pa.array(col("cat"), type=pa.string()),
        pid=pid,
        tid=tid,
        ts_ns=ts_ns,
        has_ts=has_ts,
        dur_ns=pa.array(dur_ns, mask=~has_dur),
        id=_flow_ids(col("id"), where),
        args=_raw_texts(col("args"), "args", where),
        extra=_extras(events, extra_keys, pid_str, tid_str, where),
        skipped=skipped,
    )


def _well_formed(e: Any) -> bool:
    """The checks _columns would fail on, per event, for --lenient imports."""
    if e.ph is None:
        return False
    for v in (e.ts, e.dur):
        if v is None:
            continue
        if v.__class__ is int:
            if abs(v) >= 2**63 // 1000:
                return False
        elif v.__class__ is str:
            try:
                if not abs(float(v)) < 2**63 / 1000:
                    return False
            except ValueError:
                return False
        else:
            return False
    if e.dur is not None and float(e.dur) < 0:
        return False
    if e.id is not None and not (e.id.__class__ is str or (e.id.__class__ is int and -(2**63) <= e.id <= _UINT64_MAX)):
        return False
    for v in (e.pid, e.tid):
        if v.__class__ is int and not -(2**63) <= v <= _INT64_MAX:
            return False
    if e.args is not msgspec.UNSET:
        try:
            bytes(e.args).decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


def _text(v: Any) -> str:
    return bytes(v).decode("utf-8", "replace") if isinstance(v, msgspec.Raw) else str(v)


def synthetic_id(text: str) -> int:
    """A stable negative int64 standing in for a string pid/tid such as "Spans"."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    return -(h + 1)


def _ids_to_int(values: list[Any], key: str, where: str) -> tuple[np.ndarray, dict[int, str]]:
    """Integer pids/tids as int64; strings get a synthetic id and are remembered for `extra`."""
    try:
        return pa.array(values, type=pa.int64()).fill_null(0).to_numpy(), {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass  # strings ("Spans") or out-of-range ints: the slow path tells which
    strings: dict[int, str] = {i: v for i, v in enumerate(values) if v.__class__ is str}
    if strings:
        values = list(values)
        for i, v in strings.items():
            body = v[1:] if v.startswith("-") else v
            values[i] = int(v) if body.isdigit() and -_INT64_MAX <= int(v) <= _INT64_MAX else synthetic_id(v)
    try:
        return pa.array(values, type=pa.int64()).fill_null(0).to_numpy(), strings
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        i = next(i for i, v in enumerate(values) if v is not None and not -_INT64_MAX - 1 <= v <= _INT64_MAX)
        raise TraceFormatError(f"{where}: event {i}: '{key}' {values[i]} is wider than 64 bits") from None


def _raw_strings(raws: list[Any]) -> tuple[pa.Array, np.ndarray]:
    """Raw JSON values as one Arrow binary array (empty where absent) and the presence mask.

    Built straight from the concatenated bytes and their offsets: no per-value Python objects.
    """
    unset = msgspec.UNSET
    vals = [r if r is not unset else b"" for r in raws] if unset in raws else raws
    lens = np.fromiter(map(len, vals), dtype=np.int64, count=len(vals))
    offsets = np.zeros(len(vals) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(vals)
    arr = pa.Array.from_buffers(pa.large_binary(), len(vals), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return arr.cast(pa.binary()) if len(data) < 2**31 else arr, lens > 0


def _times_ns(values: list[Any], key: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond values (ints, float literal text, numeric strings) -> exact int64 ns."""
    n = len(values)
    try:
        # Fast path: all integers (most Kineto traces) or absent.
        us = pa.array(values, type=pa.int64())
        present = us.is_valid().to_numpy(zero_copy_only=False)
        us_np = us.fill_null(0).to_numpy()
        if np.abs(us_np).max(initial=0) >= 2**63 // 1000:
            i = int(np.flatnonzero(np.abs(us_np) >= 2**63 // 1000)[0])
            raise TraceFormatError(f"{where}: event {i}: '{key}' {values[i]} is out of range")
        return us_np * 1000, present
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    try:
        arr = pa.array(values, type=pa.string())  # all float literals / numeric strings
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        texts: list[str | None] = list(values)
        for i, v in enumerate(values):
            c = v.__class__
            if c is str or v is None:
                continue
            if c is int:
                texts[i] = str(v)
            else:
                raise TraceFormatError(f"{where}: event {i}: '{key}' must be a number, got {_kind_of(v)}")
        arr = pa.array(texts, type=pa.string())
    present = arr.is_valid().to_numpy(zero_copy_only=False)
    ns = _decimal_text_to_ns(arr.fill_null("0"), key, where)
    ns[~present] = 0
    return ns, present


def _decimal_text_to_ns(text: pa.Array, key: str, where: str) -> np.ndarray:
    """Decimal microsecond text -> int64 ns, exact; more than 3 decimals round half-to-even."""
    # Common case, plain decimals with at most 3 fraction digits: drop the point, read the
    # digits as an integer and scale by the number of fraction digits. No decimal maths.
    point = pc.find_substring(text, ".").to_numpy()
    length = pc.utf8_length(text).to_numpy()
    frac_digits = np.where(point < 0, 0, length - point - 1).astype(np.int64)
    if (frac_digits <= 3).all():
        try:
            digits = pc.replace_substring(text, ".", "", max_replacements=1).cast(pa.int64()).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            digits = None  # exponents, spaces, junk: the decimal path sorts them out
        if digits is not None:
            scale = 10 ** (3 - frac_digits)
            big = np.abs(digits) > (2**63 - 1) // scale
            if big.any():
                i = int(np.flatnonzero(big)[0])
                raise TraceFormatError(f"{where}: event {i}: '{key}' {text[i].as_py()!r} is out of range")
            return digits * scale
    text = pc.utf8_trim_whitespace(text)
    text = pc.if_else(pc.ends_with(text, "."), pc.binary_join_element_wise(text, pa.scalar("0"), ""), text)
    try:
        dec = text.cast(pa.decimal128(38, 18))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        texts = text.to_pylist()
        i = _first_bad_number(texts)
        raise TraceFormatError(f"{where}: event {i}: '{key}' is not a number: {texts[i]!r}") from None
    scaled = pc.round(dec, 3, round_mode="half_to_even").cast(pa.decimal128(38, 3))
    n = len(text)
    words = np.frombuffer(scaled.buffers()[1], dtype=np.int64)[2 * scaled.offset: 2 * (scaled.offset + n)]
    lo, hi = words[0::2].copy(), words[1::2]
    fits = ((hi == 0) & (lo >= 0)) | ((hi == -1) & (lo < 0))
    if not fits.all():
        i = int(np.flatnonzero(~fits)[0])
        raise TraceFormatError(f"{where}: event {i}: '{key}' {text[i].as_py()!r} is out of range")
    return lo


def _kind_of(v: Any) -> str:
    if isinstance(v, bytes):
        return {b"[": "a list", b"{": "an object", b"t": "a boolean", b"f": "a boolean"}.get(v, "a value")
    return {list: "a list", dict: "an object", bool: "a boolean"}.get(type(v), type(v).__name__)


def _first_bad_number(texts: list[str | None]) -> int:
    from decimal import Decimal, InvalidOperation

    for i, t in enumerate(texts):
        if t is None:
            continue
        try:
            d = Decimal(t)
            if not d.is_finite() or abs(d) >= Decimal(10) ** 20:
                return i
        except InvalidOperation:
            return i
    return 0


def _flow_ids(values: list[Any], where: str) -> pa.Array:
    """Flow/async ids as text: integers exactly (beyond 2**53 too), strings as they are."""
    try:
        ints = pa.array(values, type=pa.int64())
        return ints.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    out: list[str | None] = list(values)
    for i, v in enumerate(values):
        c = v.__class__
        if c is str or v is None:
            continue
        if c is int:
            if not -(2**63) <= v <= _UINT64_MAX:
                raise TraceFormatError(f"{where}: event {i}: 'id' {v} is wider than 64 bits")
            out[i] = str(v)
        else:
            raise TraceFormatError(f"{where}: event {i}: 'id' must be a number or string, got {_kind_of(v)}")
    return pa.array(out, type=pa.string())


def _raw_texts(raws: list[Any], key: str, where: str) -> pa.Array:
    arr, present = _raw_strings(raws)
    try:
        text = arr.cast(pa.string())
    except pa.ArrowInvalid:
        i = next(i for i, r in enumerate(raws) if r is not msgspec.UNSET and _bad_utf8_offset(bytes(r)) >= 0)
        raise TraceFormatError(f"{where}: event {i}: '{key}' is not valid UTF-8") from None
    return pc.if_else(pa.array(present), text, pa.scalar(None, pa.string()))


def _extras(events: list[Any], keys: list[str], pid_str: dict[int, str], tid_str: dict[int, str],
            where: str) -> pa.Array:
    """The event's other top-level keys as one JSON object text (values verbatim), or null."""
    n = len(events)
    unset = msgspec.UNSET
    parts: list[pa.Array] = []
    for key in keys:
        vals = list(map(attrgetter(key), events))
        if vals.count(unset) == len(vals):
            continue
        rows = np.flatnonzero(np.fromiter(map(is_not, vals, repeat(unset)), dtype=bool, count=len(vals))).tolist()
        if rows:
            parts.append(_keyed(key, [vals[i] for i in rows], rows, n))
    for key, strs in (("pid", pid_str), ("tid", tid_str)):
        if strs:
            parts.append(_keyed(key, [msgspec.json.encode(v) for v in strs.values()], list(strs), n))
    if not parts:
        return pa.nulls(n, pa.string())
    body = parts[0]
    for p in parts[1:]:
        both = pc.binary_join_element_wise(body, p, b",")  # null where either is null
        body = pc.coalesce(both, body, p)
    anyp = pc.is_valid(body)
    text = pc.binary_join_element_wise(pa.scalar(b"{"), body, pa.scalar(b"}"), b"")
    try:
        text = text.cast(pa.string())
    except pa.ArrowInvalid:
        raise TraceFormatError(f"{where}: an event field is not valid UTF-8") from None
    return pc.if_else(anyp, text, pa.scalar(None, pa.string()))


def _keyed(key: str, values: list[Any], rows: list[int], n: int) -> pa.Array:
    """A length-n binary array: '"key":value' at `rows`, null elsewhere."""
    prefix = msgspec.json.encode(key) + b":"
    subset, _ = _raw_strings(values)
    joined = pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), subset, b"")
    where = np.full(n, -1, dtype=np.int64)
    where[rows] = np.arange(len(rows))
    return joined.take(pa.array(where, mask=where < 0))


# ---------------------------------------------------------------- encoding

def format_us(ns: np.ndarray) -> list[str]:
    """int64 ns -> microsecond decimal text with exactly 3 decimals (exact, no float)."""
    ns = np.asarray(ns, dtype=np.int64)
    neg = ns < 0
    a = np.abs(ns)
    whole = (a // 1000).tolist()
    frac = (a % 1000).tolist()
    return [f"{'-' if s else ''}{w}.{f:03d}" for s, w, f in zip(neg.tolist(), whole, frac)]
