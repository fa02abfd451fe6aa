"""Chrome Trace Event Format: decode to raw columns without precision loss, and encode back.

Decoding is typed (msgspec structs) with every numeric field kept as its raw JSON text, so
string timestamps, 16-digit microsecond floats and ids above 2**53 are parsed exactly, and
`args` is kept byte for byte.
"""

from __future__ import annotations

import hashlib
import re
from operator import attrgetter
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
    raw = msgspec.Raw | msgspec.UnsetType
    for key in ("ts", "dur", "id", "args", *extra_keys):
        fields.append((key, raw, msgspec.UNSET))
    return msgspec.defstruct("ChromeEvent", fields, forbid_unknown_fields=True, gc=False)


@dataclass
class RawEvents:
    """The raw columns of a decoded Chrome trace (timestamps in absolute ns of the source clock)."""

    ph: pa.Array  # string
    name: pa.Array  # string
    cat: pa.Array  # string
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

    def take(self, column: str, idx: np.ndarray | list[int]) -> pa.Array:
        """Rows `idx` of an Arrow-backed column (ph, name, cat, id, args, extra)."""
        return getattr(self, column).take(pa.array(np.asarray(idx, dtype=np.int64)))

    def args_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        """The verbatim `args` JSON text of rows `idx`."""
        return self.args.take(pa.array(np.asarray(idx, dtype=np.int64))).to_pylist()

    def ids_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        return self.id.take(pa.array(np.asarray(idx, dtype=np.int64))).to_pylist()


def decode(data: bytes, *, where: str, lenient: bool = False) -> RawEvents:
    """Decode a Chrome trace (object with traceEvents, or a bare array) into raw columns."""
    stripped = data.lstrip()
    if not stripped:
        raise TraceFormatError(f"{where}: empty file", hint="expected Chrome trace JSON")
    top: dict[str, Any] = {}
    if stripped[:1] == b"{":
        try:
            parts = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        except msgspec.DecodeError as exc:
            raise _json_error(where, data, exc) from None
        if "traceEvents" not in parts:
            raise TraceFormatError(
                f"{where}: not a trace: JSON object has no 'traceEvents' key",
                hint="expected a Chrome/Kineto trace object or a bare array of events",
            )
        events_raw = bytes(parts.pop("traceEvents"))
        for key, raw in parts.items():
            top[key] = _loads(raw, where)
    elif stripped[:1] == b"[":
        events_raw = data
    else:
        raise TraceFormatError(
            f"{where}: not a trace: expected a JSON object or array, found {stripped[:12]!r}",
            hint="expected Chrome trace JSON (.json or .json.gz)",
        )
    events, skipped = _decode_events(events_raw, where, lenient)
    raw = _columns(events, where, lenient)
    raw.top = top
    raw.skipped += skipped
    return raw


def _decode_events(data: bytes, where: str, lenient: bool) -> tuple[list[Any], int]:
    extra: tuple[str, ...] = _COMMON_EXTRA
    for _ in range(256):
        struct = _event_struct(extra)
        try:
            return msgspec.json.decode(data, type=list[struct]), 0
        except msgspec.ValidationError as exc:
            m = _UNKNOWN_FIELD.search(str(exc))
            if m:
                extra = (*extra, m.group(1))
                continue
            if lenient:
                return _decode_leniently(data, struct, where)
            raise _validation_error(where, exc) from None
        except msgspec.DecodeError as exc:
            if "Expected `array`" in str(exc):
                raise TraceFormatError(f"{where}: not a trace: 'traceEvents' is not an array") from None
            raise _json_error(where, data, exc) from None
    raise TraceFormatError(f"{where}: events carry too many distinct keys (over 256)")


def _decode_leniently(data: bytes, struct: type, where: str) -> tuple[list[Any], int]:
    try:
        items = msgspec.json.decode(data, type=list[msgspec.Raw])
    except msgspec.DecodeError as exc:
        raise _json_error(where, data, exc) from None
    decoder = msgspec.json.Decoder(struct)
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
    ph_list = list(map(attrgetter("ph"), events))
    if None in ph_list:
        i = ph_list.index(None)
        if not lenient:
            raise TraceFormatError(f"{where}: event {i}: missing 'ph' (event phase)")
        keep = [j for j, p in enumerate(ph) if p is not None]
        events = [events[j] for j in keep]
        raw = _columns(events, where, lenient)
        raw.skipped += n - len(keep)
        return raw
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
    )


def _text(raw: Any) -> str:
    return bytes(raw).decode("utf-8", "replace")


def synthetic_id(text: str) -> int:
    """A stable negative int64 standing in for a string pid/tid such as "Spans"."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    return -(h + 1)


def _ids_to_int(values: list[Any], key: str, where: str) -> tuple[np.ndarray, dict[int, str]]:
    """Integer pids/tids as int64; strings get a synthetic id and are remembered for `extra`."""
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
    vals = [r if r is not unset else b"" for r in raws]
    lens = np.fromiter(map(len, vals), dtype=np.int64, count=len(vals))
    offsets = np.zeros(len(vals) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(vals)
    arr = pa.Array.from_buffers(pa.large_binary(), len(vals), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return arr.cast(pa.binary()) if len(data) < 2**31 else arr, lens > 0


def _times_ns(raws: list[Any], key: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw JSON numbers (or numeric strings) in microseconds -> exact int64 nanoseconds."""
    n = len(raws)
    arr, present = _raw_strings(raws)
    if not present.any():
        return np.zeros(n, dtype=np.int64), present
    first = pc.binary_slice(arr, 0, 1)
    first_np = first.cast(pa.string()).to_numpy(zero_copy_only=False)
    nulls = first_np == "n"
    present &= ~nulls
    bad = np.isin(first_np, ["[", "{", "t", "f"])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceFormatError(f"{where}: event {i}: '{key}' must be a number, got {_kind_of(first_np[i].encode())}")
    quoted = first_np == '"'
    text = arr
    if quoted.any():
        text = pc.if_else(pa.array(quoted), pc.binary_slice(arr, 1, -1), arr)
    text = pc.if_else(pa.array(present), text, pa.scalar(b"0", pa.binary()))
    try:
        dec = text.cast(pa.string()).cast(pa.decimal128(38, 18))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        texts = text.to_pylist()
        i = _first_bad_number(texts)
        raise TraceFormatError(f"{where}: event {i}: '{key}' is not a number: {texts[i]!r}") from None
    scaled = pc.round(dec, 3, round_mode="half_to_even").cast(pa.decimal128(38, 3))
    words = np.frombuffer(scaled.buffers()[1], dtype=np.int64)[2 * scaled.offset: 2 * (scaled.offset + n)]
    lo, hi = words[0::2].copy(), words[1::2]
    fits = ((hi == 0) & (lo >= 0)) | ((hi == -1) & (lo < 0))
    if not fits.all():
        i = int(np.flatnonzero(~fits)[0])
        raise TraceFormatError(f"{where}: event {i}: '{key}' {text[i].as_py()!r} is out of range")
    lo[~present] = 0
    return lo, present


def _kind_of(c: bytes) -> str:
    return {b"[": "a list", b"{": "an object", b"t": "a boolean", b"f": "a boolean"}.get(c, "a value")


def _first_bad_number(texts: list[bytes | None]) -> int:
    from decimal import Decimal, InvalidOperation

    for i, t in enumerate(texts):
        if t is None:
            continue
        try:
            d = Decimal(t.decode("utf-8", "replace"))
            if not d.is_finite() or abs(d) >= Decimal(10) ** 20:
                return i
        except InvalidOperation:
            return i
    return 0


def _flow_ids(raws: list[Any], where: str) -> pa.Array:
    """Flow/async ids as text: numbers verbatim (exact beyond 2**53), strings unquoted."""
    arr, present = _raw_strings(raws)
    if not present.any():
        return pa.nulls(len(raws), pa.string())
    text = arr.cast(pa.string())
    numeric = pc.match_substring_regex(text, r"^-?\d+$").to_numpy(zero_copy_only=False)
    odd = np.flatnonzero(present & ~numeric)
    if not len(odd):
        _check_width(text, present, where)
        return pc.if_else(pa.array(present), text, pa.scalar(None, pa.string()))
    out = text.to_pylist()
    for i in odd.tolist():
        t = out[i]
        c = t[:1]
        if c == '"':
            out[i] = _loads(t.encode(), where)
        elif c == "n":
            out[i] = None
        elif c in ("[", "{", "t", "f"):
            raise TraceFormatError(f"{where}: event {i}: 'id' must be a number or string, got {_kind_of(c.encode())}")
        else:
            raise TraceFormatError(f"{where}: event {i}: 'id' {t} is not an integer")
    _check_width(text, present & numeric, where)
    for i in np.flatnonzero(~present).tolist():
        out[i] = None
    return pa.array(out, type=pa.string())


def _check_width(text: pa.Array, numeric: np.ndarray, where: str) -> None:
    lengths = pc.utf8_length(text).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(numeric & (lengths >= 19)).tolist():
        v = text[i].as_py()
        if not -(2**63) <= int(v) <= _UINT64_MAX:
            raise TraceFormatError(f"{where}: event {i}: 'id' {v} is wider than 64 bits")


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
    parts: list[pa.Array] = []
    for key in keys:
        arr, present = _raw_strings(list(map(attrgetter(key), events)))
        if present.any():
            parts.append(_keyed(key, arr, present))
    for key, strs in (("pid", pid_str), ("tid", tid_str)):
        if strs:
            vals: list[Any] = [b""] * n
            for i, text in strs.items():
                vals[i] = msgspec.json.encode(text)
            arr, present = _raw_strings(vals)
            parts.append(_keyed(key, arr, present))
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


def _keyed(key: str, arr: pa.Array, present: np.ndarray) -> pa.Array:
    """'"key":value' where present, null elsewhere."""
    prefix = pa.scalar(msgspec.json.encode(key) + b":", pa.binary())
    joined = pc.binary_join_element_wise(prefix, arr, b"")
    return pc.if_else(pa.array(present), joined, pa.scalar(None, pa.binary()))


# ---------------------------------------------------------------- encoding

def format_us(ns: np.ndarray) -> list[str]:
    """int64 ns -> microsecond decimal text with exactly 3 decimals (exact, no float)."""
    ns = np.asarray(ns, dtype=np.int64)
    neg = ns < 0
    a = np.abs(ns)
    whole = (a // 1000).tolist()
    frac = (a % 1000).tolist()
    return [f"{'-' if s else ''}{w}.{f:03d}" for s, w, f in zip(neg.tolist(), whole, frac)]
