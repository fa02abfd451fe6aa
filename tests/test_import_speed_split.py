"""The decoder's fast paths give exactly what the exact path gives: the same table, the same
metadata, the same error. The msgspec fast path (the event array cut into batches without a
first parse) is tested with the native scanner off; `outcome` runs the import as it is, native
scanner first (tests/test_import_native.py covers that one on its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msprof_py.errors import TraceFormatError
from msprof_py.trace import chrome
from msprof_py.trace.importers import import_bytes, read_bytes


def exact(data: bytes | bytearray, monkeypatch, **kw):
    """The import with the fast path switched off."""
    with monkeypatch.context() as m:
        m.setattr(chrome, "_decode_plain", lambda *a, **k: None)
        m.setattr(chrome, "_scan", None)
        return outcome(data, **kw)


def outcome(data: bytes | bytearray, **kw):
    try:
        return import_bytes(data, **kw)
    except TraceFormatError as exc:
        return f"error: {exc}"


def fast_taken(data: bytes | bytearray, monkeypatch) -> bool:
    taken = []
    real = chrome._decode_plain

    def spy(*a, **k):
        out = real(*a, **k)
        taken.append(out is not None)
        return out

    with monkeypatch.context() as m:
        m.setattr(chrome, "_decode_plain", spy)
        m.setattr(chrome, "_scan", None)
        outcome(data)
    return taken == [True]


def same(a, b) -> bool:
    return a == b if isinstance(a, str) or isinstance(b, str) else a.equals(b)


def ev(i: int, name: str = "k", args: object = None, **more) -> dict:
    e = {"ph": "X", "name": name, "cat": "kernel", "pid": 1, "tid": 7, "ts": 1000 + i, "dur": 2, **more}
    if args is not None:
        e["args"] = args
    return e


def trace(events: list[dict], *, before: dict | None = None, after: dict | None = None, indent=None) -> bytes:
    doc = {**(before or {}), "traceEvents": events, **(after or {})}
    return json.dumps(doc, indent=indent).encode()


#: Events whose text holds '}, {' where no cut may go: in a name, in nested args.
AWKWARD = [ev(i, name="a}, {b" if i % 3 == 0 else "k",
              args={"inputs": [{"shape": [i]}, {"shape": [i, 2]}], "note": "}, {\"ph\": \"X\"}"})
           for i in range(60)]


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 256)


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("writable", [False, True])
def test_cuts_inside_values_are_skipped_and_the_table_is_exact(small_batches, monkeypatch, indent, writable):
    data = trace(AWKWARD, before={"schemaVersion": 1}, after={"traceName": "x]}", "list": [{"a": [1]}]}, indent=indent)
    buf = bytearray(data) if writable else data
    assert fast_taken(buf, monkeypatch)
    got = import_bytes(buf)
    assert got.equals(exact(data, monkeypatch))
    assert got.meta.source_meta == {"schemaVersion": 1, "traceName": "x]}", "list": [{"a": [1]}]}
    assert bytes(buf) == data  # the in-place brackets are put back


def test_a_bare_array_takes_the_fast_path(small_batches, monkeypatch):
    data = json.dumps(AWKWARD).encode()
    assert fast_taken(data, monkeypatch)
    assert import_bytes(data).equals(exact(data, monkeypatch))


@pytest.mark.parametrize("data", [
    # The key spelled with an escape, twice, or not at top level: the exact path decides.
    b'{"trace\\u0045vents": [' + json.dumps(ev(0)).encode() + b"]}",
    b'{"traceEvents": [' + json.dumps(ev(0)).encode() + b'], "traceEvents": []}',
    b'{"traceEvents": [], "traceEvents": [' + json.dumps(ev(0)).encode() + b"]}",
    b'{"meta": {"traceEvents": [' + json.dumps(ev(0)).encode() + b"]}}",
    b'{"traceEvents": []}',
    b"[]",
    b'{"traceEvents": [1, 2]}',
    b'{"traceEvents": [' + json.dumps(ev(0)).encode() + b"]} trailing",
    b'{"traceEvents": [' + json.dumps(ev(0)).encode() + b"]",
])
def test_unusual_layouts_give_what_the_exact_path_gives(monkeypatch, data):
    assert same(outcome(data), exact(data, monkeypatch))


def test_errors_are_the_exact_paths(small_batches, monkeypatch):
    events = [ev(i) for i in range(200)]
    events[150]["dur"] = -1
    data = trace(events)
    assert outcome(data) == exact(data, monkeypatch)
    assert "event 150: negative 'dur'" in outcome(data)
    # Bad JSON after a bad event: the JSON error wins, as on the exact path.
    truncated = trace([ev(i) for i in range(200)])[:-40]
    assert outcome(truncated) == exact(truncated, monkeypatch)
    assert "truncated" in outcome(truncated)


@pytest.mark.parametrize("lenient", [False, True])
def test_lenient_imports_are_exact(small_batches, monkeypatch, lenient):
    events = [ev(i) for i in range(100)]
    events[40]["ts"] = "not a number"
    del events[70]["ph"]
    data = trace(events)
    assert same(outcome(data, lenient=lenient), exact(data, monkeypatch, lenient=lenient))


def test_real_traces_are_exact_in_small_batches(real_traces: Path, monkeypatch):
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 64 << 10)
    for path in sorted(real_traces.glob("*/*.json*")):
        data = bytes(read_bytes(path))
        assert same(outcome(bytearray(data)), exact(data, monkeypatch)), path.name


def test_extra_keys_are_kept_verbatim_whatever_their_mix(small_batches, monkeypatch):
    """Other keys in any mix per event (and string pids/tids) land in `extra` as the event had them."""
    keys = ["bp", "s", "cname", "é key", "args2"]
    events = []
    for i in range(120):
        e = ev(i)
        for j, k in enumerate(keys):
            if (i >> j) & 1:
                e[k] = {"n": i, "t": "ü"} if k == "args2" else f"v{i}"
        if i % 7 == 0:
            e["pid"] = "Spans"
        if i % 11 == 0:
            e["tid"] = "thread é"
        events.append(e)
    data = trace(events)
    got = import_bytes(data)
    assert got.equals(exact(data, monkeypatch))
    table = got.table.sort_by([("ts", "ascending")])
    for e, text in zip(events, table.column("extra").to_pylist()):
        want = {k: v for k, v in e.items() if k in keys}
        want.update({k: e[k] for k in ("pid", "tid") if isinstance(e[k], str)})
        assert (json.loads(text) if text is not None else {}) == want
