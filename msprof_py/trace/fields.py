"""Column converters for decoded Chrome events: exact numbers, verbatim JSON, extras.

Each takes one field's values for a batch of events (as msgspec gives them: ints, float
literal text, strings, Raw) and returns an Arrow or numpy column, or raises TraceFormatError
naming the event.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.errors import TraceFormatError

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: What a Raw field of a decoded event holds when the event lacks the key (see chrome.py).
ABSENT = msgspec.Raw()
#: Integer microseconds at or beyond this (either sign) do not fit int64 nanoseconds.
_MAX_US = 2**63 // 1000


def event_text(v: Any) -> str:
    return bytes(v).decode("utf-8", "replace") if isinstance(v, msgspec.Raw) else str(v)


def bad_utf8_offset(data: bytes) -> int:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return -1


def synthetic_id(text: str) -> int:
    """A stable negative int64 standing in for a string pid/tid such as "Spans"."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    return -(h + 1)


def string_id(v: str) -> int:
    """A string pid/tid as int64: its number when it is one ("123"), else a synthetic id."""
    body = v[1:] if v.startswith("-") else v
    numeric = body.isascii() and body.isdigit() and len(body) <= 19
    return int(v) if numeric and -INT64_MAX <= int(v) <= INT64_MAX else synthetic_id(v)


def ids_to_int(values: list[Any], key: str, where: str) -> tuple[np.ndarray, dict[int, str]]:
    """Integer pids/tids as int64; strings get a synthetic id and are remembered for `extra`."""
    try:
        # All ints, the usual case: array('q') takes ints only (no None, no str, no float, and
        # the decoder gives no bool for `int | str | None`), in half the time of pa.array.
        return np.frombuffer(array("q", values), dtype=np.int64), {}
    except (TypeError, OverflowError):
        pass
    try:
        return pa.array(values, type=pa.int64()).fill_null(0).to_numpy(), {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass  # strings ("Spans") or out-of-range ints: the slow path tells which
    strings: dict[int, str] = {i: v for i, v in enumerate(values) if v.__class__ is str}
    if strings:
        values = list(values)
        for i, v in strings.items():
            values[i] = string_id(v)
    try:
        return pa.array(values, type=pa.int64()).fill_null(0).to_numpy(), strings
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        i = next(i for i, v in enumerate(values) if v is not None and not -INT64_MAX - 1 <= v <= INT64_MAX)
        raise out_of_range(where, i, key, values[i]) from None


def _raw_buffers(raws: Sequence[Any]) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Raw JSON values as one Arrow binary array, null where absent (an empty Raw, ABSENT),
    the presence mask, and the concatenated bytes as numpy (the array's data buffer).

    Built straight from the concatenated bytes and their offsets: no per-value Python objects.
    """
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    data = b"".join(raws)
    big = len(data) >= 2**31
    offsets = np.zeros(n + 1, dtype=np.int64 if big else np.int32)
    np.cumsum(lens, out=offsets[1:])
    present = lens > 0
    absent = n - int(np.count_nonzero(present))
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if absent else None
    arr = pa.Array.from_buffers(pa.large_binary() if big else pa.binary(), n,
                                [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=absent)
    return arr, present, np.frombuffer(data, dtype=np.uint8)


def times_ns(values: list[Any], key: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond values (ints, float literal text, numeric strings) -> exact int64 ns."""
    try:
        # Fast path: all integers (most Kineto traces) or absent. Without an absent one,
        # array('q') takes them in half the time of pa.array; it also takes bools (ints in
        # Python), which compare equal to 1 and 0: with either value about, pa.array decides.
        if not (values.count(True) or values.count(False)):
            try:
                us_np = np.frombuffer(array("q", values), dtype=np.int64)
                present = np.ones(len(us_np), dtype=bool)
            except (TypeError, OverflowError):  # None, str or a big int: the way below
                us_np = None
        else:
            us_np = None
        if us_np is None:
            us = pa.array(values, type=pa.int64())
            present = us.is_valid().to_numpy(zero_copy_only=False)
            us_np = us.fill_null(0).to_numpy()
        # Compared on both sides, not through abs(): abs(INT64_MIN) wraps round to itself.
        wide = (us_np >= _MAX_US) | (us_np <= -_MAX_US)
        if wide.any():
            i = int(np.flatnonzero(wide)[0])
            raise out_of_range(where, i, key, values[i])
        return us_np * 1000, present
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    try:
        arr = pa.array(values, type=pa.string())  # all float literals / numeric strings
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        arr = pa.array(as_text(values, key, "a number", where), type=pa.string())
    present = arr.is_valid().to_numpy(zero_copy_only=False)
    ns = _plain_decimals_to_ns(arr, present)
    if ns is None:
        ns = decimal_text_to_ns(arr.fill_null("0"), key, where)
    ns[~present] = 0
    return ns, present


def _plain_decimals_to_ns(text: pa.Array, present: np.ndarray) -> np.ndarray | None:
    """Microsecond text made only of digits, '.' and '-' (float literals as JSON writes them,
    1712195495519689.047) -> int64 ns in one decimal128(38, 3) cast; None when that cannot
    say (other characters, more than 3 decimals, out of range, not a number): then
    decimal_text_to_ns decides, and words the error. Null slots come back as garbage."""
    data = text.buffers()[2]
    if data is None:
        return None
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[text.offset: text.offset + len(text) + 1]
    # '-' '.' '/' '0'...'9' are bytes 45 to 57: all of them but '/' (no exponent, '+', space, hex).
    above = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]] - np.uint8(ord("-"))
    if not (above <= 12).all() or (above == 2).any():
        return None
    if np.diff(offsets).max(initial=0) > _DECIMAL_CAST_CHARS:
        return None  # see _DECIMAL_CAST_CHARS
    try:
        dec = text.cast(pa.decimal128(38, 3))  # refuses more decimals rather than round
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset: 2 * (dec.offset + len(dec))]
    lo, hi = words[0::2].copy(), words[1::2]
    if not (((hi == 0) & (lo >= 0)) | ((hi == -1) & (lo < 0)) | ~present).all():
        return None
    return lo


def decimal_text_to_ns(text: pa.Array, key: str, where: str) -> np.ndarray:
    """Decimal microsecond text -> int64 ns, exact; more than 3 decimals round half-to-even."""
    # Common case, plain decimals with at most 3 fraction digits: drop the point, read the
    # digits as an integer and scale by the number of fraction digits. No decimal maths.
    point = pc.find_substring(text, ".").to_numpy()
    length = pc.utf8_length(text).to_numpy()
    frac_digits = np.where(point < 0, 0, length - point - 1).astype(np.int64)
    # Arrow's integer parse also takes hex ("0x10"), which is no decimal: those go the slow way.
    if (frac_digits <= 3).all() and not _has_x(text):
        try:
            digits = pc.replace_substring(text, ".", "", max_replacements=1).cast(pa.int64()).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            digits = None  # exponents, spaces, junk: the decimal path sorts them out
        if digits is not None:
            scale = 10 ** (3 - frac_digits)
            big = (digits > INT64_MAX // scale) | (digits < -(INT64_MAX // scale) - (scale == 1))
            if big.any():
                i = int(np.flatnonzero(big)[0])
                raise out_of_range(where, i, key, text[i].as_py())
            return digits * scale
    text = pc.utf8_trim_whitespace(text)
    try:
        if not pc.all(pc.match_substring_regex(text, _DECIMAL_ANCHORED)).as_py():
            raise pa.ArrowInvalid("not decimal text")  # what Arrow's cast would let through (".0")
        if length.max(initial=0) > _DECIMAL_CAST_CHARS:
            raise pa.ArrowInvalid("too long for decimal128")  # Arrow's cast wraps round beyond 38 digits
        if pc.any(pc.match_substring_regex(text, _LONG_EXPONENT)).as_py():
            raise pa.ArrowInvalid("exponent too long")  # Arrow's cast crashes on 1e-9999999
        dec = text.cast(pa.decimal128(38, 18))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # Beyond decimal128(38, 18) (1e300, 1e-300, 25 decimals) or not a number at all: one
        # value at a time, exactly, so the error names the first bad event and says which it is.
        return np.array([_us_text_to_ns_or_raise(t, i, key, where) for i, t in enumerate(text.to_pylist())],
                        dtype=np.int64)
    scaled = pc.round(dec, 3, round_mode="half_to_even").cast(pa.decimal128(38, 3))
    n = len(text)
    words = np.frombuffer(scaled.buffers()[1], dtype=np.int64)[2 * scaled.offset: 2 * (scaled.offset + n)]
    lo, hi = words[0::2].copy(), words[1::2]
    fits = ((hi == 0) & (lo >= 0)) | ((hi == -1) & (lo < 0))
    if not fits.all():
        i = int(np.flatnonzero(~fits)[0])
        raise out_of_range(where, i, key, text[i].as_py())
    return lo


def _has_x(text: pa.Array) -> bool:
    """Whether any byte of the strings' data is 'x' or 'X' (a scan of the raw buffer: a false
    positive from bytes outside a slice only sends the column down the exact slow path)."""
    data = text.buffers()[2]
    if data is None:
        return False
    return bool(((np.frombuffer(data, dtype=np.uint8) | 0x20) == ord("x")).any())


def kind_of(v: Any) -> str:
    if isinstance(v, bytes):
        return {b"[": "a list", b"{": "an object", b"t": "a boolean", b"f": "a boolean", b'"': "a string",
                b"n": "null"}.get(v, "a number")
    return {list: "a list", dict: "an object", bool: "a boolean"}.get(type(v), type(v).__name__)


#: A JSON number, or a numeric string as torch_npu writes ts ("1700000000123.456"): nothing
#: else (no "0x10", "1_000", "nan", non-ASCII digits) is a time.
_DECIMAL_TEXT = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_DECIMAL = re.compile(_DECIMAL_TEXT)
_DECIMAL_ANCHORED = f"^{_DECIMAL_TEXT}$"
_NS_PER_US = Decimal(1000)
#: Longest text sent through Arrow's decimal128(38, 18) cast, which for 39 digits and more can
#: return a wrapped-round value instead of an error ("9" * 39 -> -26596012780397245730.2).
_DECIMAL_CAST_CHARS = 32
#: An exponent of 5 digits or more: Arrow's decimal cast of 1e-9999999 crashes the process
#: (pyarrow 26), so such text is read one value at a time.
_LONG_EXPONENT = r"[eE][+-]?[0-9]{5}"


def us_text_to_ns(text: str) -> int | str:
    """Microsecond decimal text -> exact int ns (half-to-even beyond 3 decimals), or the
    reason it is none: "not a number" or "out of range"."""
    t = text.strip()
    if not _DECIMAL.fullmatch(t):
        return "not a number"
    try:
        d = Decimal(t)
    except InvalidOperation:  # an exponent beyond Decimal's own (over 18 digits)
        mantissa, _, exponent = t.lower().partition("e")
        if not mantissa.strip("+-.0") or exponent.startswith("-"):
            return 0
        return "out of range"
    # Exponents far outside int64 ns are settled before any Decimal arithmetic (1e999999999).
    if d.is_zero() or d.adjusted() < -30:
        return 0
    if d.adjusted() > 30:
        return "out of range"
    ns = int((d * _NS_PER_US).to_integral_value(rounding=ROUND_HALF_EVEN))
    return ns if -INT64_MAX - 1 <= ns <= INT64_MAX else "out of range"


def us_to_ns(v: Any) -> int | str:
    """A decoded ts/dur value (int µs, float literal text, numeric string) -> int ns or the reason."""
    if v.__class__ is int:
        return v * 1000 if -_MAX_US < v < _MAX_US else "out of range"
    if v.__class__ is str:
        return us_text_to_ns(v)
    return "not a number"


def _us_text_to_ns_or_raise(text: str, i: int, key: str, where: str) -> int:
    ns = us_text_to_ns(text)
    if ns.__class__ is int:
        return ns
    if ns == "out of range":
        raise out_of_range(where, i, key, text)
    raise TraceFormatError(f"{where}: event {i}: '{key}' is not a number: {shown(text)}")


def out_of_range(where: str, i: int, key: str, value: Any) -> TraceFormatError:
    """The error for a number outside its column: int64 ns for times, 64 bits for ids."""
    what = "int64 nanoseconds" if key in ("ts", "dur") else "64-bit integers"
    return TraceFormatError(f"{where}: event {i}: '{key}' {shown(value, quote=False)} is out of range ({what})")


def shown(value: Any, *, quote: bool = True, limit: int = 40) -> str:
    """A value for an error message: repr (or plain text), cut short, so the message stays one line."""
    if isinstance(value, int) and value.bit_length() > 14_000:  # str() refuses ints over 4300 digits
        return f"(a {value.bit_length()}-bit integer)"
    text = repr(value) if quote else str(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[:limit - 3] + "..."


def flow_ids(values: list[Any], where: str) -> pa.Array:
    """Flow/async ids as text: integers exactly, of any size (torch_npu's HostToDevice ids pass
    2**64; a producer that writes them as bare numbers must not lose its trace), strings as they are."""
    try:
        ints = pa.array(values, type=pa.int64())
        return ints.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    return pa.array(as_text(values, "id", "a number or string", where, max_int=None), type=pa.string())


def as_text(values: list[Any], key: str, expected: str, where: str, *,
             max_int: int | None = INT64_MAX) -> list[str | None]:
    """Ints as decimal text, strings (float literals, numeric strings) as they are; ints outside
    -2**63 .. `max_int` are out of range (None: no bound, for ids)."""
    out: list[str | None] = list(values)
    for i, v in enumerate(values):
        c = v.__class__
        if c is str or v is None:
            continue
        if c is not int:
            raise TraceFormatError(f"{where}: event {i}: '{key}' must be {expected}, got {kind_of(v)}")
        if max_int is not None and not -(2**63) <= v <= max_int:
            raise out_of_range(where, i, key, v)
        out[i] = str(v)
    return out


def object_texts(raws: list[Any], key: str, where: str) -> pa.Array:
    """Raw JSON objects (an event's `args`) as strings; null where absent or JSON null.

    Anything but an object is an error naming the event: every reader of `args` expects keys.
    The values are valid JSON already (the decoder checked them), so each one's kind is its
    first byte, read from the joined buffer: no per-value comparison of strings.
    """
    arr, present, data = _raw_buffers(raws)
    text = _utf8(arr, raws, f"'{key}' is not valid UTF-8", where, data)
    rows = np.flatnonzero(present)
    if not len(rows):
        return text
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if arr.type == pa.large_binary() else np.int32)
    first = data[offsets[rows]]
    # A 4-byte JSON value that starts with 'n' can only be `null`.
    null = (first == ord("n")) & (offsets[rows + 1] - offsets[rows] == 4)
    not_object = ~null & (first != ord("{"))
    if not_object.any():
        i = int(rows[np.argmax(not_object)])
        raise TraceFormatError(f"{where}: event {i}: '{key}' must be an object, got {kind_of(bytes(raws[i])[:1])}")
    if null.any():
        present[rows[null]] = False
        return pc.if_else(pa.array(present), text, pa.scalar(None, pa.string()))
    return text


def _utf8(arr: pa.Array, raws: list[Any], problem: str, where: str, data: np.ndarray | None = None) -> pa.Array:
    """Raw JSON text (binary) as strings; the decoder does not check a Raw value's UTF-8, so
    this does, naming the first event whose text is not valid. `data`: the array's bytes."""
    if _ascii(arr, data):
        return arr.view(pa.string())
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        i = next(i for i, r in enumerate(raws) if bad_utf8_offset(bytes(r)) >= 0)
        raise TraceFormatError(f"{where}: event {i}: {problem}") from None


def _ascii(arr: pa.Array, data: np.ndarray | None) -> bool:
    """Whether a binary array's bytes `data` are all ASCII, hence valid UTF-8: then the
    array is a string array as it is (a view), without the cast's validation pass."""
    return data is not None and arr.type == pa.binary() and arr.offset == 0 and not (data >= 0x80).any()


def is_object_or_null(raw: Any) -> bool:
    """For --lenient: would object_texts accept this raw value?"""
    return not len(raw) or bytes(raw)[:1] == b"{" or bytes(raw) == b"null"


def extras(columns: list[tuple[str, Sequence[Any]]], n: int, pid_str: dict[int, str], tid_str: dict[int, str],
           where: str) -> pa.Array:
    """The events' other top-level keys, given as (JSON key, raw values) columns, as one JSON
    object text per event (values verbatim), or null where it has none of them.

    The texts are laid out in one numpy buffer, key by key, rather than joined string by
    string: Arrow's element-wise joins cost more than the rest of the batch's extras.
    """
    keys = [(key, raws) for key, raws in columns if raws.count(ABSENT) != n]  # identity tests: cheap
    for key, strs in (("pid", pid_str), ("tid", tid_str)):
        if strs:
            raws = [ABSENT] * n
            for i, v in strs.items():
                raws[i] = msgspec.json.encode(v)
            keys.append((key, raws))
    if not keys:
        return pa.nulls(n, pa.string())
    parts = []
    size = np.zeros(n, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    for key, raws in keys:
        prefix = np.frombuffer(msgspec.json.encode(key) + b":", dtype=np.uint8)
        lens, data = _lengths_and_bytes(raws)
        has = lens > 0
        size += np.where(has, len(prefix) + lens, 0)
        count += has
        parts.append((prefix, lens, data))
    rows = count > 0
    size += np.where(rows, count + 1, 0)  # '{', '}' and a comma between two keys
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(size, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    at = offsets[:-1] + rows  # the write position of each row, past its '{'
    out[at[rows] - 1] = ord("{")
    written = np.zeros(n, dtype=bool)
    for prefix, lens, data in parts:
        has = lens > 0
        comma = has & written
        out[at[comma]] = ord(",")
        at += comma
        r = np.flatnonzero(has)
        out[at[r, None] + np.arange(len(prefix))] = prefix
        at[r] += len(prefix)
        vl = lens[r]
        # Each value's bytes, from their place in `data` to their row's write position.
        out[np.repeat(at[r] - (np.cumsum(vl) - vl), vl) + np.arange(len(data))] = data
        at[r] += vl
        written |= has
    out[at[rows]] = ord("}")
    big = len(out) >= 2**31
    text = pa.Array.from_buffers(pa.large_binary() if big else pa.binary(), n,
                                 [pa.py_buffer(np.packbits(rows, bitorder="little")),
                                  pa.py_buffer(offsets if big else offsets.astype(np.int32)), pa.py_buffer(out)],
                                 null_count=n - int(np.count_nonzero(rows)))
    if _ascii(text, out):
        return text.view(pa.string())
    try:
        return text.cast(pa.string())
    except pa.ArrowInvalid:
        i = next(i for i, v in enumerate(text.to_pylist()) if v is not None and bad_utf8_offset(v) >= 0)
        raise TraceFormatError(f"{where}: event {i}: a field is not valid UTF-8") from None


def _lengths_and_bytes(raws: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each raw value's length (0: absent) and all of them joined, as numpy.

    Joined with NUL in between, which no JSON text holds (the decoder rejects raw control
    characters), the lengths come from where the NULs are: cheaper than len() per value.
    """
    n = len(raws)
    joined = np.frombuffer(b"\0".join(raws), dtype=np.uint8)
    seps = np.flatnonzero(joined == 0)
    if len(seps) != n - 1:
        return np.fromiter(map(len, raws), dtype=np.int64, count=n), np.frombuffer(b"".join(raws), dtype=np.uint8)
    lens = np.diff(seps, prepend=-1, append=len(joined)) - 1
    return lens, joined[joined != 0]


# ---------------------------------------------------------------- encoding

def format_us(ns: np.ndarray) -> list[str]:
    """int64 ns -> microsecond decimal text with exactly 3 decimals (exact, no float)."""
    ns = np.asarray(ns, dtype=np.int64)
    neg = ns < 0
    a = np.abs(ns)
    whole = (a // 1000).tolist()
    frac = (a % 1000).tolist()
    return [f"{'-' if s else ''}{w}.{f:03d}" for s, w, f in zip(neg.tolist(), whole, frac)]
