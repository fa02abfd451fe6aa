"""Decoding edges of Chrome JSON: byte-order marks, events without a time, numbers out of range."""

from __future__ import annotations

import gzip

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.errors import TraceFormatError
from msprof_py.trace import import_trace
from msprof_py.trace.importers import import_bytes

runner = CliRunner()
BOM = b"\xef\xbb\xbf"
X = b'{"ph":"X","name":"k","pid":1,"tid":2,"ts":%s,"dur":%s}'


def events(*items: bytes) -> bytes:
    return b"[" + b",".join(items) + b"]"


def x(ts: bytes | str = b"10", dur: bytes | str = b"2") -> bytes:
    ts, dur = (v.encode() if isinstance(v, str) else v for v in (ts, dur))
    return X % (ts, dur)


# ---------------------------------------------------------------- byte-order mark

@pytest.mark.parametrize("body", [events(x(), x(b"12.5")), b'{"traceEvents":' + events(x(), x(b"12.5")) + b"}"])
def test_a_utf8_byte_order_mark_is_accepted(body):
    plain = import_bytes(body)
    assert plain.table.column("ts").to_pylist() == [0, 2500]
    assert import_bytes(BOM + body).equals(plain)
    # A writable buffer is decoded in place and given back exactly as it came.
    buf = bytearray(BOM + body)
    assert import_bytes(buf).equals(plain)
    assert bytes(buf) == BOM + body


def test_a_byte_order_mark_in_a_gzip_file_and_through_the_cli(tmp_path):
    src = tmp_path / "bom.json.gz"
    src.write_bytes(gzip.compress(BOM + events(x(), x(b"13"))))
    assert import_trace(src).table.column("dur").to_pylist() == [2000, 2000]
    result = runner.invoke(app, ["info", str(src), "--json"])
    assert result.exit_code == 0, result.output


def test_utf16_text_is_named():
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x()).decode().encode("utf-16"))
    assert err.value.one_line() == "trace: not a trace: the text is UTF-16, not UTF-8 (re-save the trace as UTF-8)"


# ---------------------------------------------------------------- events without ts

def test_an_event_without_ts_is_an_error():
    no_ts = b'{"ph":"X","name":"k","pid":1,"tid":2,"dur":3}'
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x(), no_ts))
    assert err.value.one_line() == ("trace: event 1: 'X' event has no 'ts' (every event but metadata (ph 'M') "
                                    "needs one; --lenient skips such events)")
    for ph in (b"B", b"i", b"C", b"s"):
        with pytest.raises(TraceFormatError, match=f"event 0: '{ph.decode()}' event has no 'ts'"):
            import_bytes(events(b'{"ph":"%s","name":"k","pid":1,"tid":2}' % ph))


def test_lenient_counts_and_drops_events_without_ts():
    no_ts = b'{"ph":"X","name":"gone","pid":1,"tid":2,"dur":3}'
    trace = import_bytes(events(x(), no_ts, x(b"11")), lenient=True)
    assert trace.table.column("name").to_pylist() == ["k", "k"]
    assert trace.meta.extra["skipped_events"] == 1


def test_metadata_events_need_no_ts():
    meta = b'{"ph":"M","name":"process_name","pid":1,"args":{"name":"host"}}'
    trace = import_bytes(events(meta, x(b"10")))
    assert sorted(zip(trace.table.column("ph").to_pylist(), trace.table.column("ts").to_pylist())) == [
        ("M", 0), ("X", 0)]
    assert "skipped_events" not in trace.meta.extra


def test_cli_import_lenient_reports_the_event_without_ts(tmp_path):
    src = tmp_path / "t.json"
    src.write_bytes(events(x(), b'{"ph":"X","name":"k","pid":1,"tid":2}'))
    out = tmp_path / "t.parquet"
    strict = runner.invoke(app, ["import", str(src), "-o", str(out)])
    assert strict.exit_code == 2
    assert strict.stderr == (f"msprof-py: error: {src}: event 1: 'X' event has no 'ts' (every event but "
                             "metadata (ph 'M') needs one; --lenient skips such events)\n")
    assert not out.exists()
    lenient = runner.invoke(app, ["import", str(src), "-o", str(out), "--lenient"])
    assert lenient.exit_code == 0, lenient.output
    assert lenient.stdout == f"wrote 1 events to {out}\nskipped 1 malformed events\n"


# ---------------------------------------------------------------- numbers out of range

@pytest.mark.parametrize(("ts", "dur", "message"), [
    ("1e300", "2", "event 0: 'ts' 1e300 is out of range (int64 nanoseconds)"),
    ('"1e300"', "2", "event 0: 'ts' 1e300 is out of range (int64 nanoseconds)"),
    ("-1e300", "2", "event 0: 'ts' -1e300 is out of range (int64 nanoseconds)"),
    ("1e999999999", "2", "event 0: 'ts' 1e999999999 is out of range (int64 nanoseconds)"),
    ("10", "1e300", "event 0: 'dur' 1e300 is out of range (int64 nanoseconds)"),
    ("99999999999999999999999", "2", "event 0: 'ts' 99999999999999999999999 is out of range (int64 nanoseconds)"),
    # abs(INT64_MIN) wraps round to itself: the bound is checked on both sides.
    ("-9223372036854775808", "2", "event 0: 'ts' -9223372036854775808 is out of range (int64 nanoseconds)"),
    ("9223372036854776", "2", "event 0: 'ts' 9223372036854776 is out of range (int64 nanoseconds)"),
    ("9223372036854775.808", "2", "event 0: 'ts' 9223372036854775.808 is out of range (int64 nanoseconds)"),
    ("1" * 400, "2", "event 0: 'ts' 1111111111111111111111111111111111111... is out of range (int64 nanoseconds)"),
])
def test_numbers_outside_int64_ns_say_out_of_range(ts, dur, message):
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x(b"10"), x(ts, dur))[:1] + x(ts, dur) + b"]")
    assert err.value.one_line() == f"trace: {message}"
    assert import_bytes(events(x(), x(ts, dur)), lenient=True).meta.extra["skipped_events"] == 1


def test_the_largest_times_that_fit_are_exact():
    top = import_bytes(events(x("0", "0"), x("9223372036854775.807", "0")))
    assert top.table.column("ts").to_pylist() == [0, 2**63 - 1]
    bottom = import_bytes(events(x("-9223372036854775.808", "0"), x("-0.001", "0")))
    assert bottom.meta.origin_ns == -(2**63)
    assert bottom.table.column("ts").to_pylist() == [0, 2**63 - 1]
    longest = import_bytes(events(x("-9223372036854775.808", "9223372036854775.807")))
    assert longest.table.column("dur").to_pylist() == [2**63 - 1]


def test_a_span_or_an_end_beyond_int64_ns_is_out_of_range():
    # Each number fits, but ts relative to the origin (or ts + dur) would not.
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x("-9223372036854775.808", "0"), x("1", "0")))
    assert err.value.one_line() == ("trace: event 1: 'ts' is out of range (the trace would span more than "
                                    "int64 nanoseconds, about 292 years)")
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x("0", "1"), x("5", "9223372036854775.807")))
    assert err.value.one_line() == "trace: event 1: 'dur' is out of range (ts + dur is beyond int64 nanoseconds)"


def test_tiny_and_long_decimals_round_to_the_nanosecond():
    trace = import_bytes(events(x("1e-300", "0.0000000000000000000015"), x('"2.0005"', "1.00000000000000000000051")))
    assert trace.table.column("ts").to_pylist() == [0, 2000]  # 2000.5 ns rounds half to even
    assert trace.table.column("dur").to_pylist() == [0, 1000]


@pytest.mark.parametrize("key", ["pid", "tid"])
def test_ids_wider_than_64_bits_say_out_of_range(key):
    ev = b'{"ph":"X","name":"k","pid":1,"tid":2,"ts":1,"dur":1}'.replace(f'"{key}":'.encode(),
                                                                         f'"{key}":1{"0" * 20},"_":'.encode())
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(ev))
    assert err.value.one_line() == f"trace: event 0: '{key}' 100000000000000000000 is out of range (64-bit integers)"


def test_flow_ids_wider_than_64_bits_are_kept_as_their_text():
    # torch_npu's HostToDevice ids pass 2**64: an id is a name, of any size, never a quantity.
    for v in (2**64, -(2**63) - 1, 10**40):
        trace = import_bytes(events(b'{"ph":"s","name":"f","pid":1,"tid":2,"ts":1,"id":%d}' % v))
        assert trace.table.column("id").to_pylist() == [str(v)]


@pytest.mark.parametrize("ts", ['"0x10"', '"1_000"', '"nan"', '"."', '"\u0662"', '"1e"', '""'])
def test_text_that_is_no_decimal_is_not_a_number_and_lenient_agrees(ts):
    with pytest.raises(TraceFormatError, match=r"event 0: 'ts' is not a number: "):
        import_bytes(events(x(ts)))
    assert import_bytes(events(x(ts), x()), lenient=True).meta.extra["skipped_events"] == 1


def test_cli_says_out_of_range(tmp_path):
    src = tmp_path / "big.json"
    src.write_bytes(events(x("1e300")))
    result = runner.invoke(app, ["info", str(src)])
    assert result.exit_code == 2
    assert result.stderr == f"msprof-py: error: {src}: event 0: 'ts' 1e300 is out of range (int64 nanoseconds)\n"


# ---------------------------------------------------------------- extreme exponents

def test_a_vanishing_exponent_is_zero_and_a_huge_string_one_is_out_of_range():
    """Regressions: ts 1e-9999999 crashed the process inside the decimal cast; a string ts with a
    huge exponent raised decimal.InvalidOperation instead of the project's one-line error."""
    trace = import_bytes(events(x(b"1e-9999999")))
    assert trace.table.column("ts").to_pylist() == [0]
    assert trace.table.column("dur").to_pylist() == [2000]
    with pytest.raises(TraceFormatError) as err:
        import_bytes(events(x(b'"748e99999999"')))
    assert err.value.one_line() == "trace: event 0: 'ts' 748e99999999 is out of range (int64 nanoseconds)"
