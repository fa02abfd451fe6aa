"""The native event scanner (msprof_py/trace/_scan.c) gives exactly the msgspec decoder's import.

On what it takes, the table (with its metadata) equals the msgspec decoder's; on what it declines
(anything outside the events real profilers write), the msgspec decoder decides, so the outcome
(table or one-line error) is the same either way. The fuzz test (fuzz/checks.py) checks the same
on mutations of the real traces.
"""

from __future__ import annotations

import json

import pytest

from msprof_py.errors import TraceFormatError
from msprof_py.trace import chrome, native
from msprof_py.trace.importers import import_bytes, read_bytes


def test_the_install_built_the_scanner():
    # setup.py compiles it wherever a C compiler is (every machine the tests run on).
    assert chrome._scan is not None, native.reason

REAL = ("ascend/torch_npu_trace_view.json.gz", "kineto/alexnet_critical_path.json.gz",
        "kineto/amd_mi250_rocm.json.gz", "kineto/event_sync_multi_stream.json.gz",
        "kineto/nccl_2rank_rank0.json.gz", "kineto/ns_resolution_rank0.json.gz",
        "kineto/queue_16rank_rank0.json.gz", "kineto/sampled_128rank_rank0.json.gz",
        "kineto/sampled_128rank_rank1.json.gz", "kineto/tiny_base.json.gz")


def outcome(data: bytes | bytearray):
    try:
        return import_bytes(bytearray(data), where="t")
    except TraceFormatError as exc:
        return f"error: {exc}"


def msgspec_outcome(data: bytes | bytearray, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(chrome, "_scan", None)
        return outcome(data)


def taken(data: bytes | bytearray) -> bool:
    return chrome._decode_native(bytearray(data), bytes(data).lstrip()[:1], True) is not None


def assert_same(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
    else:
        assert a.table.equals(b.table, check_metadata=True)
        assert a.meta == b.meta


def ev(i: int, **more) -> dict:
    return {"ph": "X", "name": f"k{i % 3}", "cat": "kernel", "pid": 1, "tid": 7, "ts": 1000 + i, "dur": 2, **more}


def doc(events: list, **top) -> bytes:
    # Non-ASCII as it is: escaped keys and pids are outside the scanner's subset.
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}, ensure_ascii=False).encode()


@pytest.mark.parametrize("name", REAL)
def test_every_real_trace_is_scanned_natively_into_the_msgspec_table(real_traces, monkeypatch, name):
    data = read_bytes(real_traces / name)
    assert taken(data)
    assert_same(outcome(data), msgspec_outcome(data, monkeypatch))


def split_and_record_scans(monkeypatch) -> list[tuple[int, int]]:
    """Every array split in two halves; the (lo, hi) of each scan the import makes, in the list."""
    monkeypatch.setattr(chrome, "SPLIT_BYTES", 1)
    spans: list[tuple[int, int]] = []
    real = chrome._scan
    monkeypatch.setattr(chrome, "_scan", type("RecordingScanner", (), {
        "scan": staticmethod(lambda *a: spans.append(a[1:]) or real.scan(*a)),
        "extras": staticmethod(real.extras)}))
    return spans


@pytest.mark.parametrize("name", ["kineto/queue_16rank_rank0.json.gz", "ascend/torch_npu_trace_view.json.gz"])
def test_two_halves_on_two_threads_give_the_whole_table(real_traces, monkeypatch, name):
    data = read_bytes(real_traces / name)
    whole = outcome(data)
    halves = split_and_record_scans(monkeypatch)
    assert_same(outcome(data), whole)
    halves.sort()
    assert len(halves) == 2 and halves[0][1] < halves[1][0]


def test_a_middle_cut_inside_a_value_falls_back_to_one_scan(monkeypatch):
    # Every event's name and args hold '}, {', so the cut near the middle is likely inside one.
    events = [ev(i, name="a}, {b", args={"x": "}, {", "l": [{"a": 1}, {"b": 2}]}) for i in range(400)]
    data = doc(events)
    spans = split_and_record_scans(monkeypatch)
    got = outcome(data)
    # The first '}, {' after the middle is inside a name: two halves refused, then one whole scan.
    assert len(spans) == 3 and spans[2] == (min(spans[0][0], spans[1][0]), max(spans[0][1], spans[1][1]))
    assert_same(got, msgspec_outcome(data, monkeypatch))
    assert taken(data)


# Inputs the scanner takes: each must give the msgspec decoder's table exactly.
TAKEN = {
    "decimals beyond ns round half to even": [
        ev(0, ts="1.0005", dur=0.0005), ev(1, dur=0.0015), ev(2, dur=0.0025), ev(3, dur=0.00150001),
        ev(4, dur=12.77012757357446), ev(5, ts=-1.0005), ev(6, ts=-1.0015), ev(7, dur=0.0004999999999999999999999)],
    "string and float times": [ev(0, ts="1704161511422855.116"), ev(1, ts=1712195495519689.047, dur="63.813"),
                               ev(2, ts="007.5"), ev(3, ts="-0"), ev(4, ts=-0)],
    "largest times": [ev(0, ts=9223372036854774, dur=0), ev(1, ts="9223372036854775.807", dur=0)],
    "string pids and tids": [ev(0, pid="Spans", tid="PyTorch Profiler"), ev(1, pid="123", tid="-7"),
                             ev(2, pid="\u00e9t\u00e9", tid=3), {"ph": "M", "name": "process_name", "pid": "Traces",
                                                                "tid": 0, "args": {"name": "x"}}],
    "escapes in names": [ev(0, name='a"b\\c/\b\f\n\r\t\u00e9\U0001F600', cat="k\u2028")],
    "ids": [ev(0, ph="s", id=0), ev(1, ph="f", id=-5, bp="e"), ev(2, ph="b", id="0x1f"),
            ev(3, ph="e", id=9999999999999999999), ev(4, ph="n", id=-999999999999999999), ev(5, id=None)],
    "nulls and absences": [ev(0, name=None, cat=None, args=None, dur=None), {"ph": "i", "ts": 5, "s": "g"},
                           {"ph": "M", "name": "thread_name"}, ev(1, pid=None, tid=None)],
    "other keys in first-appearance order": [ev(0, zz=1), ev(1, yy=[1, {"a": None}], zz="x"), ev(2, s="t", bp="e"),
                                             ev(3, **{"\u00e9": True, "": 0, "Trace name": {"a": [1.5e3]}})],
    "nested args verbatim": [ev(0, args={"a": [1, -2.5e-3, True, False, None, "\\u00e9", {"b": {}}], "c": []})],
}


@pytest.mark.parametrize("case", list(TAKEN))
def test_what_the_scanner_takes_is_the_msgspec_table(monkeypatch, case):
    data = doc(TAKEN[case], traceName="x")
    assert taken(data), case
    assert_same(outcome(data), msgspec_outcome(data, monkeypatch))


def test_pretty_printed_text_and_a_bare_array_are_taken(monkeypatch):
    events = TAKEN["other keys in first-appearance order"] + TAKEN["string pids and tids"]
    for data in (json.dumps({"traceEvents": events}, indent=2, ensure_ascii=False).encode(),
                 json.dumps(events, ensure_ascii=False).encode(),
                 b"\xef\xbb\xbf" + json.dumps(events, indent=1, ensure_ascii=False).encode()):
        assert taken(data.removeprefix(b"\xef\xbb\xbf"))
        assert_same(outcome(data), msgspec_outcome(data, monkeypatch))


def test_other_keys_first_seen_in_the_second_half_keep_the_whole_files_order(monkeypatch):
    events = [ev(i) for i in range(300)] + [ev(300, yy=1, zz=2), ev(301, zz=3)] + [ev(i, xx=i) for i in range(302, 600)]
    events[10]["zz"] = 0
    data = doc(events)
    monkeypatch.setattr(chrome, "SPLIT_BYTES", 1)
    got = outcome(data)
    assert_same(got, msgspec_outcome(data, monkeypatch))
    extra = got.table.column("extra").to_pylist()
    assert sorted(e for e in extra if e and "yy" in e) == ['{"zz":2,"yy":1}']


# Inputs the scanner declines: the msgspec decoder decides, with its own error or table.
DECLINED = {
    "lone high surrogate in args": doc([ev(0, args={"a": "x"})]).replace(b'"a": "x"', b'"a": "\\ud800"'),
    "lone low surrogate in an other key": doc([ev(0, bp="x")]).replace(b'"bp": "x"', b'"bp": "\\udc00"'),
    "escaped key": doc([ev(0)]).replace(b'"tid"', b'"t\\u0069d"'),
    "escaped string pid": doc([ev(0, pid="a\nb")]),
    "exponent in ts": doc([ev(0)]).replace(b'"ts": 1000', b'"ts": 1e3'),
    "ts out of range": doc([ev(0, ts=9223372036854775)]),
    "float ts out of range": doc([ev(0, ts="9223372036854775.808")]),
    "huge ts": doc([ev(0)]).replace(b'"ts": 1000', b'"ts": 1e300'),
    "missing ts": doc([{"ph": "X", "name": "a", "pid": 1, "tid": 1}]),
    "missing ph": doc([{"name": "a", "ts": 1}]),
    "negative dur": doc([ev(0, dur=-1)]),
    "duplicate key": doc([ev(0)]).replace(b'"dur": 2', b'"dur": 2, "dur": 3'),
    "duplicate other key": doc([ev(0, bp="e")]).replace(b'"bp": "e"', b'"bp": "e", "bp": "s"'),
    "invalid UTF-8 in a name": doc([ev(0, name="ab")]).replace(b'"ab"', b'"a\xff"'),
    "overlong UTF-8 in args": doc([ev(0, args={"a": "ab"})]).replace(b'"ab"', b'"\xc0\xaf"'),
    "deep nesting": doc([ev(0)]).replace(b'"dur": 2', b'"dur": 2, "args": ' + b'{"a":' * 60 + b"1" + b"}" * 60),
    "id -0": doc([ev(0)]).replace(b'"dur": 2', b'"dur": 2, "id": -0'),
    "id beyond 64 bits": doc([ev(0, id=2**64)]),
    "float id": doc([ev(0, id=1.5)]),
    "boolean ts": doc([ev(0, ts=True)]),
    "args a list": doc([ev(0, args=[1])]),
    "name a number": doc([ev(0, name=5)]),
    "NaN": doc([ev(0)]).replace(b'"dur": 2', b'"dur": NaN'),
    "trailing comma": doc([ev(0)]).replace(b'"dur": 2}', b'"dur": 2,}'),
    "control character in a string": doc([ev(0, name="ab")]).replace(b'"ab"', b'"a\tb"'),
    "leading zero": doc([ev(0)]).replace(b'"ts": 1000', b'"ts": 01000'),
    "an event that is not an object": doc([ev(0), 5]),
    "no events": doc([]),
}


@pytest.mark.parametrize("case", list(DECLINED))
def test_what_the_scanner_declines_the_msgspec_decoder_decides(monkeypatch, case):
    data = DECLINED[case]
    assert not taken(data), case
    assert_same(outcome(data), msgspec_outcome(data, monkeypatch))


def test_declined_inputs_keep_their_exact_errors(monkeypatch):
    assert outcome(DECLINED["negative dur"]) == "error: t: event 0: negative 'dur' (-1)"
    assert outcome(DECLINED["missing ts"]) == msgspec_outcome(DECLINED["missing ts"], monkeypatch)
    assert "out of range" in outcome(DECLINED["float ts out of range"])


def test_the_scanner_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("MSPROF_PY_PURE_IMPORT", "1")
    assert native.load() is None and native.state() == "msgspec; MSPROF_PY_PURE_IMPORT=1"
    monkeypatch.setenv("MSPROF_PY_PURE_IMPORT", "0")
    assert native.load() is not None and native.state() == "native scanner"


def test_a_span_outside_the_buffer_is_a_value_error():
    with pytest.raises(ValueError, match="span outside the buffer"):
        chrome._scan.scan(b"{}", 0, 3)
