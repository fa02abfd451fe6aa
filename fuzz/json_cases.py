"""Hostile Chrome / Kineto / torch_npu JSON, made by mutating real traces (Hypothesis strategies).

A trace is parsed into a small model that can say what `json` cannot: objects with repeated
keys (`Obj`), numbers as exact text (`Num`: 1e300, 30 digits), bytes written verbatim (`Raw`:
invalid UTF-8, NaN) and nesting deeper than any recursive writer (`Deep`). Mutations then
truncate, splice bytes, swap types, drop and add fields, repeat keys and nest, one to three
at a time; each case says what was done, so a failure reads as a recipe.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from msprof_py.trace import import_bytes, to_chrome_bytes


class Num(str):
    """A JSON number written as exactly this text."""


class Raw(bytes):
    """Bytes written verbatim where a value goes (invalid UTF-8, NaN, broken tokens)."""


class Obj(list):
    """A JSON object as (key, value) pairs, so a key may appear twice."""


@dataclass(frozen=True)
class Deep:
    """`depth` nested lists (or objects) around a 1: no recursion needed to write it."""

    depth: int
    objects: bool = False

    def text(self) -> bytes:
        if self.objects:
            return b'{"a":' * self.depth + b"1" + b"}" * self.depth
        return b"[" * self.depth + b"1" + b"]" * self.depth


def parse(data: bytes) -> Any:
    return json.loads(data, object_pairs_hook=Obj, parse_float=Num)


def dumps(v: Any) -> bytes:
    """The model as JSON text (compact)."""
    out: list[bytes] = []
    _write(v, out)
    return b"".join(out)


def _write(v: Any, out: list[bytes]) -> None:
    if isinstance(v, Raw):
        out.append(bytes(v))
    elif isinstance(v, Num):
        out.append(str(v).encode())
    elif isinstance(v, Deep):
        out.append(v.text())
    elif isinstance(v, Obj):
        out.append(b"{")
        for i, (k, x) in enumerate(v):
            out.append(b"," if i else b"")
            out.append(json.dumps(k, ensure_ascii=False).encode("utf-8", "surrogatepass") + b":")
            _write(x, out)
        out.append(b"}")
    elif isinstance(v, list):
        out.append(b"[")
        for i, x in enumerate(v):
            out.append(b"," if i else b"")
            _write(x, out)
        out.append(b"]")
    else:  # None, bool, int, str
        out.append(json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------- seeds

#: Real traces to mutate, cut to a few hundred events so a case imports in milliseconds.
SEED_FILES = {
    "kineto-tiny": "kineto/tiny_base.json.gz",
    "kineto-event-sync": "kineto/event_sync_multi_stream.json.gz",
    "rocm": "kineto/amd_mi250_rocm.json.gz",
    "kineto-nccl": "kineto/nccl_2rank_rank0.json.gz",
    "torch-npu": "ascend/torch_npu_trace_view.json.gz",
}
SEED_EVENTS = 80


class Seeds(dict):
    """Seed name -> seed; printed by name only (Hypothesis prints a strategy's arguments)."""

    def __repr__(self) -> str:
        return f"Seeds({', '.join(self)})"


def json_seeds(real_traces: Path) -> Seeds:
    """Seed name -> JSON text: each real trace with its metadata events and its first events."""
    out = Seeds()
    for name, rel in SEED_FILES.items():
        doc = parse(gzip.decompress((real_traces / rel).read_bytes()))
        events = dict(doc)["traceEvents"] if isinstance(doc, Obj) else doc
        meta = [e for e in events if dict(e).get("ph") == "M"]
        rest = [e for e in events if dict(e).get("ph") != "M"][:SEED_EVENTS]
        cut = meta + rest
        if isinstance(doc, Obj):
            out[name] = dumps(Obj((k, cut if k == "traceEvents" else v) for k, v in doc))
        else:
            out[name] = dumps(cut)
    # msprof-py's own export: typed columns and metadata ride in a top-level block.
    out["msprof-py-export"] = to_chrome_bytes(import_bytes(out["kineto-tiny"], where="kineto-tiny"))
    return out


# ---------------------------------------------------------------- hostile values

INTS = (0, -1, 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64,
        10**30, -(10**30), int("9" * 400))
NUMBERS = tuple(Num(t) for t in (
    "1e300", "-1e300", "1e-300", "-0.0", "0.5", "1E+2", "2.0005", "9223372036854775.807", "-9223372036854775.808",
    "9223372036854775.808", "1e16", "123456789012345678901234567890.5", "1e999999999", "0.0000000000000000000001",
    "9" * 39, "9" * 5000 + ".5", "1" * 30 + "e-20"))
STRINGS = (
    "", "abc", "1e300", "-5", " 7 ", "0x10", "1_000", "nan", "Infinity", "\uff11\uff12", "\u0662", "\x00", "\ud800",
    "X", "M", "B", "E", "i", "C", "s", "f", "kernel", "gpu_memcpy", "cuda_runtime", "ac2g", "HostToDevice",
    "Ascend Hardware", "CANN", "HCCL", "Overlap Analysis", "NPU 3", "Rank 99999999999999999999", "[memory]",
    "ProfilerStep#1", "ProfilerStep#99999999999999999999", "ProfilerStep#\u0663", "a" * 5000,
    "1700000000000000.123", "-9223372036854775.808", "9" * 39, "9" * 5000, "-" + "9" * 5000 + ".5",
    "1" * 30 + "e-20",
)
RAWS = tuple(Raw(b) for b in (
    b'"\xff\xfe"', b'"\xc3\x28"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b"NaN", b"-Infinity", b"Infinity",
    b'"\\ud800"', b'"\\udc00x"', b"1.", b"01", b"-", b"1e", b'"\x01"', b"tru", b"nul", b"+1"))

leaves = st.one_of(
    st.sampled_from(STRINGS), st.sampled_from(NUMBERS), st.sampled_from(INTS), st.integers(),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: Num(repr(f))),
    st.text(max_size=12), st.sampled_from(RAWS), st.none(), st.booleans(),
    st.builds(Deep, st.sampled_from((10, 120, 600, 5_000)), st.booleans()),
)
hostile = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.lists(st.tuples(st.sampled_from(("name", "a", "")), inner), max_size=3).map(Obj)),
    max_leaves=6,
)

#: Keys whose values the importers read: top-level event fields, then args the importers decode.
EVENT_KEYS = ("ts", "dur", "name", "cat", "ph", "pid", "tid", "id", "args", "bp", "s", "tts", "cname")
ARGS_KEYS = (
    "name", "labels", "sort_index", "correlation", "device", "stream", "bytes", "memory bandwidth (GB/s)",
    "External id", "Task Type", "Stream Id", "Device Id", "size(Byte)", "data size(B)", "Addr", "Bytes",
    "Total Allocated", "Total Reserved", "Device Type", "rank", "world_size")
TOP_KEYS = ("traceEvents", "distributedInfo", "deviceProperties", "schemaVersion", "baseTimeNanoseconds",
            "displayTimeUnit", "msprof_py", "traceName")


# ---------------------------------------------------------------- mutations

@dataclass
class JsonCase:
    """One hostile input: the seed it came from, what was done, the bytes, how it is read."""

    seed: str
    steps: list[str]
    data: bytes
    #: "bytes" (import_bytes), or a file for import_trace: "json", "gzip", "gzip-cut" (a
    #: copy interrupted two thirds in) or "gzip-flip" (one byte of the stream inverted).
    as_file: str

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying example
        head = self.data[:300]
        return f"JsonCase(seed={self.seed!r}, as_file={self.as_file!r}, steps={self.steps!r}, data[:300]={head!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis prints cases with this
        p.text(repr(self))


@st.composite
def json_cases(draw: st.DrawFn, seeds: dict[str, bytes]) -> JsonCase:
    seed = draw(st.sampled_from(sorted(seeds)))
    doc = parse(seeds[seed])
    steps: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(_structural(doc, steps))
    data = dumps(doc)
    # Hypothesis leans to the first choice and to small numbers: byte damage is the last one.
    if draw(st.integers(0, 3)) == 3:
        data = draw(_bytewise(data, steps))
    as_file = draw(st.sampled_from(("bytes", "bytes", "bytes", "json", "gzip", "gzip-cut", "gzip-flip")))
    return JsonCase(seed, steps, data, as_file)


def _is_array(v: Any) -> bool:
    return isinstance(v, list) and not isinstance(v, Obj)


def _events(doc: Any) -> list | None:
    if isinstance(doc, Obj):
        found = [v for k, v in doc if k == "traceEvents"]
        return found[0] if found and _is_array(found[0]) else None
    return doc if _is_array(doc) else None


@st.composite
def _structural(draw: st.DrawFn, doc: Any, steps: list[str]) -> Any:
    events = _events(doc)
    op = draw(st.sampled_from(("set", "set", "set_arg", "drop", "extra", "repeat_key", "event", "top", "proc",
                               "every_event", "export", "export")))
    if op == "top" or not events:
        if not isinstance(doc, Obj) or draw(st.booleans()):
            if draw(st.booleans()) and events is not None:  # object form <-> bare array
                steps.append("swap object/array form")
                return events if isinstance(doc, Obj) else Obj([("traceEvents", events)])
            value = draw(hostile)
            steps.append(f"document = {_short(value)}")
            return value
        key, value = draw(st.sampled_from(TOP_KEYS)), draw(hostile)
        steps.append(f"top {key!r} = {_short(value)}")
        return Obj([*(kv for kv in doc if kv[0] != key), (key, value)])
    if op == "export" and isinstance(doc, Obj) and any(k == "msprof_py" for k, _ in doc):
        return draw(_export_block(doc, steps))
    if op == "every_event":  # one field of every event: whole columns of one odd type
        key, value = draw(st.sampled_from(EVENT_KEYS + tuple(f"args.{k}" for k in ARGS_KEYS))), draw(hostile)
        for j, ev in enumerate(events):
            if isinstance(ev, Obj):
                events[j] = _with(ev, key, value)
        steps.append(f"every event {key!r} = {_short(value)}")
        return doc
    i = draw(st.integers(0, len(events) - 1))
    ev = events[i]
    if op == "event" or not isinstance(ev, Obj):
        how = draw(st.sampled_from(("replace", "delete", "duplicate")))
        if how == "replace":
            value = draw(hostile)
            events[i] = value
            steps.append(f"event {i} = {_short(value)}")
        elif how == "delete":
            del events[i]
            steps.append(f"delete event {i}")
        else:
            events.insert(i, ev)
            steps.append(f"duplicate event {i}")
        return doc
    if op == "set":
        key, value = draw(st.sampled_from(EVENT_KEYS)), draw(hostile)
        events[i] = _with(ev, key, value)
        steps.append(f"event {i} {key!r} = {_short(value)}")
    elif op == "set_arg":
        key, value = draw(st.sampled_from(ARGS_KEYS)), draw(hostile)
        events[i] = _with(ev, f"args.{key}", value)
        steps.append(f"event {i} args {key!r} = {_short(value)}")
    elif op == "drop":
        key = draw(st.sampled_from([k for k, _ in ev] or ["ph"]))
        events[i] = Obj(kv for kv in ev if kv[0] != key)
        steps.append(f"event {i} drop {key!r}")
    elif op == "extra":
        key = draw(st.one_of(st.text(max_size=8), st.sampled_from(("", "traceEvents", "ph ", "\u00e9", "\ud800"))))
        value = draw(hostile)
        ev.append((key, value))
        steps.append(f"event {i} extra {key!r} = {_short(value)}")
    elif op == "repeat_key":
        key, value = draw(st.sampled_from(EVENT_KEYS)), draw(hostile)
        ev.insert(draw(st.integers(0, len(ev))), (key, value))
        steps.append(f"event {i} repeats {key!r} = {_short(value)}")
    else:  # proc: a process renamed to an Ascend track, so its events take the device paths
        track = draw(st.sampled_from(("Ascend Hardware", "CANN", "HCCL", "Overlap Analysis", "Python")))
        pid = next((v for k, v in ev if k == "pid"), 0)
        events.append(Obj([("ph", "M"), ("name", "process_name"), ("pid", pid), ("tid", 0),
                           ("args", Obj([("name", track)]))]))
        steps.append(f"process of event {i} named {track!r}")
    return doc


@st.composite
def _export_block(draw: st.DrawFn, doc: Obj, steps: list[str]) -> Obj:
    """An export's `msprof_py` block with one typed column, or one metadata field, damaged."""
    block = next(v for k, v in doc if k == "msprof_py")
    if not isinstance(block, Obj):
        return doc
    typed = next((v for k, v in block if k == "typed"), None)
    if isinstance(typed, Obj) and typed and draw(st.booleans()):
        j = draw(st.integers(0, len(typed) - 1))
        name, column = typed[j]
        how = draw(st.sampled_from(("value", "shorter", "whole")))
        if how == "value" and isinstance(column, list) and column:
            at, value = draw(st.integers(0, len(column) - 1)), draw(hostile)
            column[at] = value
            steps.append(f"export typed {name!r}[{at}] = {_short(value)}")
        elif how == "shorter" and isinstance(column, list):
            del column[len(column) // 2:]
            steps.append(f"export typed {name!r} cut to {len(column)} values")
        else:
            value = draw(hostile)
            typed[j] = (name, value)
            steps.append(f"export typed {name!r} = {_short(value)}")
        return doc
    key, value = draw(st.sampled_from(("origin_ns", "world_size", "source_format", "extra", "typed", "schema_version"))), \
        draw(hostile)
    block[:] = [*(kv for kv in block if kv[0] != key), (key, value)]
    steps.append(f"export {key!r} = {_short(value)}")
    return doc


def _with(ev: Obj, key: str, value: Any) -> Obj:
    """The event with `key` (or `args.KEY`, inside its args object) set to `value`."""
    if key.startswith("args."):
        key = key[5:]
        args = next((v for k, v in ev if k == "args"), None)
        args = Obj(kv for kv in args if kv[0] != key) if isinstance(args, Obj) else Obj()
        args.append((key, value))
        key, value = "args", args
    return Obj([*(kv for kv in ev if kv[0] != key), (key, value)])


@st.composite
def _bytewise(draw: st.DrawFn, data: bytes, steps: list[str]) -> bytes:
    op = draw(st.sampled_from(("splice", "flip", "truncate", "bom", "utf16")))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if op == "truncate":
        cut = draw(st.integers(1, max(len(data) - 1, 1)))  # an empty file is one case, not a fifth of them
        steps.append(f"truncate at byte {cut}")
        return data[:cut]
    if op == "splice":
        junk = draw(st.one_of(st.sampled_from(RAWS), st.binary(min_size=1, max_size=4),
                              st.sampled_from((b"}", b"]", b",", b'"', b"\\", b"\x00", b"{", b"["))))
        steps.append(f"insert {bytes(junk)!r} at byte {at}")
        return data[:at] + bytes(junk) + data[at:]
    if op == "flip":
        value = draw(st.integers(0, 255))
        steps.append(f"byte {at} = {value:#04x}")
        return data[:at] + bytes([value]) + data[at + 1:]
    if op == "bom":
        steps.append("UTF-8 byte-order mark")
        return b"\xef\xbb\xbf" + data
    steps.append("UTF-16 text")
    return data.decode("utf-8", "replace").encode("utf-16", "surrogatepass")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def write_case(case: JsonCase, directory: Path) -> Path:
    """The case as a file in `directory`, gzip-compressed (and damaged) as the case says."""
    if not case.as_file.startswith("gzip"):
        path = directory / "case.json"
        path.write_bytes(case.data)
        return path
    packed = bytearray(gzip.compress(case.data, mtime=0))
    if case.as_file == "gzip-cut":
        del packed[len(packed) * 2 // 3:]
    elif case.as_file == "gzip-flip":
        packed[len(packed) // 2] ^= 0xFF
    path = directory / "case.json.gz"
    path.write_bytes(bytes(packed))
    return path
