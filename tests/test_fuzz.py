"""Fuzzing the trace readers with mutations of real traces (a fixed, derandomized sample in CI).

Every input must give a correct import or the project's one-line error (see fuzz/checks.py);
`python -m fuzz.fuzz_importers` runs the same cases by the thousand.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir

from fuzz.checks import FuzzFailure, check_cli, check_json, check_parquet, check_roundtrip, outcome
from fuzz.json_cases import JsonCase, Seeds, json_cases, json_seeds, write_case
from fuzz.parquet_cases import ParquetCase, parquet_cases, parquet_seeds
from msprof_py.errors import TraceFormatError
from msprof_py.trace import import_bytes, import_trace, read_trace, write_trace
from msprof_py.trace.schema import META_KEY

# Hypothesis caches what it learns from the source under its home directory: not in the tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "msprof-py-hypothesis")

#: Deterministic: the same cases on every run, no example database, no time limit per case.
CI = settings(derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seeds(real_traces: Path) -> dict[str, bytes]:
    return Seeds(json_seeds(real_traces).items())


def test_every_seed_imports_cleanly(real_traces):
    for name, data in json_seeds(real_traces).items():
        assert check_json(data) == "ok", name


def test_json_importers_on_mutated_real_traces(seeds, tmp_path):
    outcomes = []

    @settings(CI, max_examples=250)
    @given(case=json_cases(seeds))
    def run(case: JsonCase) -> None:
        file = write_case(case, tmp_path) if case.as_file != "bytes" else None
        outcomes.append(check_json(case.data, file=file))

    run()
    assert len(outcomes) == 250
    # The mutations must not all be fatal (nor all harmless): both outcomes are exercised.
    assert outcomes.count("ok") >= 25 and outcomes.count("error") >= 25, outcomes.count("ok")


def test_parquet_reader_on_damaged_tables(seeds, tmp_path):
    tables = parquet_seeds(seeds, ("kineto-event-sync", "torch-npu"))
    outcomes = []

    @settings(CI, max_examples=120)
    @given(case=parquet_cases(tables, tmp_path / "seed"))
    def run(case: ParquetCase) -> None:
        outcomes.append(check_parquet(case.write(tmp_path / "case", tables[case.seed]), case.columns))

    run()
    assert len(outcomes) == 120
    assert outcomes.count("ok") >= 10 and outcomes.count("error") >= 40, outcomes.count("ok")


def test_imported_mutations_round_trip_through_parquet(seeds, tmp_path):
    @settings(CI, max_examples=40)
    @given(case=json_cases(seeds))
    def run(case: JsonCase) -> None:
        if check_json(case.data) == "ok":
            check_roundtrip(import_bytes(case.data), tmp_path)

    run()


def test_cli_on_mutated_traces(seeds, tmp_path):
    tables = parquet_seeds(seeds, ("kineto-tiny",))

    @settings(CI, max_examples=30)
    @given(case=json_cases(seeds))
    def json_run(case: JsonCase) -> None:
        check_cli(write_case(case, tmp_path), tmp_path)

    @settings(CI, max_examples=20)
    @given(case=parquet_cases(tables, tmp_path / "seed"))
    def parquet_run(case: ParquetCase) -> None:
        check_cli(case.write(tmp_path / "case", tables[case.seed]), tmp_path)

    json_run()
    parquet_run()


def test_the_rule_fails_anything_but_a_trace_or_a_one_line_error():
    assert isinstance(outcome(lambda: _raise(TraceFormatError("fuzz: bad")), "fuzz"), TraceFormatError)
    with pytest.raises(FuzzFailure, match=r"^ZeroDivisionError: integer division or modulo by zero \(at test_fuzz"):
        outcome(lambda: 1 // 0, "fuzz")
    with pytest.raises(FuzzFailure, match="bad error message"):
        outcome(lambda: _raise(TraceFormatError("fuzz: two\nlines")), "fuzz")
    with pytest.raises(FuzzFailure, match="bad error message"):
        outcome(lambda: _raise(TraceFormatError("fuzz: " + "x" * 500)), "fuzz")
    with pytest.raises(FuzzFailure, match="RuntimeWarning"):
        outcome(lambda: np.int64(2**62) * np.int64(4), "fuzz")  # a number silently wrapped round


def _raise(exc: Exception) -> None:
    raise exc


# ---------------------------------------------------------------- regressions
# Minimal reproducers of what the fuzzer found: each crashed (or was silently wrong) before.

def ev(**fields) -> str:
    return json.dumps({"ph": "X", "name": "k", "cat": "kernel", "pid": 1, "tid": 7, "ts": 10, "dur": 2, **fields})


def events(*items: str) -> bytes:
    return ("[" + ",".join(items) + "]").encode()


def rejected(data: bytes, *, lenient: bool = False) -> str:
    with pytest.raises(TraceFormatError) as err:
        import_bytes(data, lenient=lenient)
    return err.value.one_line()


@pytest.mark.parametrize("where", ["args", "top", "extra"])
def test_deep_nesting_is_an_error_not_a_recursion_error(where):
    deep = "[" * 100_000 + "]" * 100_000
    data = {"args": '[{"ph":"X","ts":1,"args":{"a":%s}}]', "top": '{"traceEvents":[],"other":%s}',
            "extra": '[{"ph":"X","ts":1,"zzz":%s}]'}[where] % deep
    message = "trace: invalid JSON: values nested too deeply (no trace nests lists or objects hundreds of levels deep)"
    assert rejected(data.encode()) == message
    assert rejected(data.encode(), lenient=True) == message


def test_args_that_are_not_an_object():
    # A memcpy's args were decoded as an object for its bandwidth: a bare 0 crashed the importer.
    data = events(ev(cat="gpu_memcpy", args=0))
    assert rejected(data) == "trace: event 0: 'args' must be an object, got a number"
    assert rejected(events(ev(args=[1]))) == "trace: event 0: 'args' must be an object, got a list"
    assert rejected(events(ev(args="x"))) == "trace: event 0: 'args' must be an object, got a string"
    trace = import_bytes(events(ev(cat="gpu_memcpy", args=0), ev()), lenient=True)
    assert (len(trace), trace.meta.extra["skipped_events"]) == (1, 1)


def test_null_args_are_no_args():
    trace = import_bytes(events(ev(args=None)))
    assert trace.table.column("args").to_pylist() == [None]


def test_event_keys_that_are_not_identifiers_are_kept():
    trace = import_bytes(events(ev(**{"Trace name": 1, "": [2], "\u00e9": {"a": None}})))
    assert json.loads(trace.table.column("extra")[0].as_py()) == {"Trace name": 1, "": [2], "\u00e9": {"a": None}}


@pytest.mark.parametrize("key", ['a"b', "a\\b", "a\nb", "\x00"])
def test_event_keys_with_quotes_backslashes_or_control_characters(key):
    data = events(ev(), ev(**{key: 1}))
    message = rejected(data)
    assert message.startswith("trace: event 1: key ") and message.endswith(
        " holds a backslash, quote or control character, which event keys cannot have here "
        "(--lenient skips such events)")
    assert "\n" not in message
    trace = import_bytes(data, lenient=True)
    assert (len(trace), trace.meta.extra["skipped_events"]) == (1, 1)


def test_a_pid_of_superscript_digits_is_a_name_not_a_number():
    # "²".isdigit() is true but int("²") raises: a string pid must be ASCII digits to be a number.
    trace = import_bytes(events(ev(pid="\u00b2"), ev(pid="12")))
    pids = trace.table.column("pid").to_pylist()
    assert pids[1] == 12 and pids[0] < 0  # a synthetic id, the text kept in `extra`
    assert json.loads(trace.table.column("extra")[0].as_py()) == {"pid": "\u00b2"}


def written(tmp_path: Path, real_traces: Path) -> tuple[pa.Table, Path]:
    trace = import_trace(real_traces / "kineto/tiny_base.json.gz")
    return trace.table, write_trace(trace, tmp_path / "t.parquet")


@pytest.mark.parametrize(("value", "message"), [
    (b"{", "msprof-py metadata is not valid JSON"),
    (b"\xff\xfe", "msprof-py metadata is not valid JSON"),
    (b"[]", "msprof-py metadata is not a JSON object"),
    (b'{"origin_ns": "x"}', "msprof-py metadata: 'origin_ns' has the wrong type (str)"),
    (b'{"origin_ns": true}', "msprof-py metadata: 'origin_ns' has the wrong type (bool)"),
    (b'{"origin_ns": 1e300}', "msprof-py metadata: 'origin_ns' has the wrong type (float)"),
    (b'{"origin_ns": 100000000000000000000}', "msprof-py metadata: 'origin_ns' is out of range (int64 nanoseconds)"),
    (b'{"extra": 5}', "msprof-py metadata: 'extra' has the wrong type (int)"),
])
def test_damaged_parquet_metadata(tmp_path, real_traces, value, message):
    table, _ = written(tmp_path, real_traces)
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: value}), bad)
    with pytest.raises(TraceFormatError) as err:
        read_trace(bad)
    assert err.value.one_line() == f"{bad}: {message}"


def test_a_column_name_that_is_not_utf8(tmp_path, real_traces):
    table, _ = written(tmp_path, real_traces)
    path = tmp_path / "names.parquet"
    pq.write_table(table.append_column("zzqq", pa.array([0] * len(table))), path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"zzqq", b"\xff\xfe\xfd\xfc"))
    with pytest.raises(TraceFormatError, match=r"names.parquet: not a readable Parquet file \("):
        read_trace(path)


def test_dictionary_indices_out_of_range(tmp_path, real_traces):
    table, _ = written(tmp_path, real_traces)
    kind = table.column("kind").combine_chunks()
    wild = pa.DictionaryArray.from_arrays(pa.array([99] * len(table), pa.int32()), kind.dictionary, safe=False)
    path = tmp_path / "wild.parquet"
    # No statistics: min/max would read the values the wild indices point at (past the dictionary).
    pq.write_table(table.set_column(table.schema.get_field_index("kind"), table.schema.field("kind"), wild), path,
                   write_statistics=False)
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert "Dictionary indices invalid" in err.value.one_line()


def test_partitions_that_differ_in_nullability(tmp_path, real_traces):
    table, _ = written(tmp_path, real_traces)
    root = tmp_path / "job"
    for rank, t in ((0, table), (1, table.cast(pa.schema([f.with_nullable(True) for f in table.schema],
                                                          metadata=table.schema.metadata)))):
        (root / f"rank={rank}").mkdir(parents=True)
        pq.write_table(t, root / f"rank={rank}" / "part-0.parquet")
    back = read_trace(root)
    assert len(back) == 2 * len(table)
    assert back.table.schema.field("ts").nullable is False


def test_reading_some_columns_of_a_table_missing_one(tmp_path, real_traces):
    table, _ = written(tmp_path, real_traces)
    path = tmp_path / "no_ts.parquet"
    pq.write_table(table.drop_columns(["ts"]), path)
    with pytest.raises(TraceFormatError) as err:
        read_trace(path, columns=["ts", "kind"])
    assert err.value.one_line() == (f"{path}: missing column(s) ts (is this an msprof-py trace table? "
                                    "import JSON traces with 'msprof-py import')")


@pytest.mark.parametrize("field", [b'"zz":"\xff"', b'"args":{"a":"\xc3\x28"}'])
def test_invalid_utf8_in_a_kept_field_names_the_event_and_lenient_skips_it(field):
    data = b'[{"ph":"X","ts":1},{"ph":"X","ts":2,' + field + b"}]"
    assert rejected(data) in ("trace: event 1: a field is not valid UTF-8", "trace: event 1: 'args' is not valid UTF-8")
    trace = import_bytes(data, lenient=True)
    assert (len(trace), trace.meta.extra["skipped_events"]) == (1, 1)


@pytest.mark.parametrize(("text", "shown"), [
    ("9" * 39, "9" * 39),  # Arrow's decimal128 cast wrapped this round to -26596012780397245730.2
    ("9" * 5000, "9" * 37 + "..."),  # ... and this to -1 (it imported as ts -1 us)
    ("9" * 5000 + ".5", "9" * 37 + "..."),  # ... and this to a "negative 'dur'" of 5000 digits
])
def test_long_digit_strings_are_out_of_range_not_wrapped_round(text, shown):
    for key in ("ts", "dur"):
        fields = {"ts": 1, "dur": 1, key: text}
        assert rejected(events(ev(**fields))) == f"trace: event 0: '{key}' {shown} is out of range (int64 nanoseconds)"


def test_thirty_digits_scaled_down_by_an_exponent_are_exact():
    trace = import_bytes(events(ev(ts="1" * 30 + "e-24", dur=0)))
    assert trace.meta.origin_ns == 111_111_111  # 111111.111111 us, to the nanosecond


def test_a_pid_string_of_thousands_of_digits_is_a_name():
    # int() refuses more than 4300 digits: such a pid is a name, as any non-number is.
    trace = import_bytes(events(ev(pid="9" * 5000)))
    assert trace.table.column("pid")[0].as_py() < 0


def test_an_ascend_process_label_with_a_huge_number_is_no_device():
    # "Rank 99999999999999999999" was read as the device number and overflowed the int32 column.
    procs = ['{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":"%s"}}' % (p, n)
             for p, n in ((1, "Ascend Hardware"), (2, "Ascend Hardware"))]
    labels = ['{"ph":"M","name":"process_labels","pid":%d,"tid":0,"args":{"labels":"%s"}}' % (p, n)
              for p, n in ((1, "Rank 99999999999999999999"), (2, "NPU 3"))]
    tasks = [ev(pid=p, tid=5, ts=10 + p, args={"Task Type": "AI_CORE"}) for p in (1, 2)]
    trace = import_bytes(events(*procs, *labels, *tasks))
    x = trace.table.filter(pc.equal(trace.table.column("ph"), "X"))
    assert sorted(zip(x.column("pid").to_pylist(), x.column("device").to_pylist())) == [(1, 0), (2, 3)]
