"""The `msprof-py` CLI: import / export / info on real traces, and clean failures on bad input.

Expected numbers are computed here from the raw JSON with the standard library (Decimal for
times), independently of the importers and of `summarize`.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.loading import progress_reporter
from msprof_py.trace import read_trace

runner = CliRunner()
KINETO_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ASCEND = "ascend/torch_npu_trace_view.json.gz"
NCCL = "kineto/nccl_2rank_rank0.json.gz"
TINY = "kineto/tiny_base.json.gz"


# ---------------------------------------------------------------- independent expectations

def raw_trace(path: Path) -> tuple[list[dict], dict]:
    """(events, top-level object) parsed exactly: floats as Decimal."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return (doc["traceEvents"], doc) if isinstance(doc, dict) else (doc, {})


def us_to_ns(v) -> int:
    return int((Decimal(str(v)) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def device_events(events: list[dict], top: dict) -> list[dict]:
    """X events that ran on a device: Kineto kernel/memcpy/memset categories, or the tasks of
    the torch_npu "Ascend Hardware" process."""
    if top:  # Kineto: an object with traceEvents
        return [e for e in events if e.get("ph") == "X" and e.get("cat") in KINETO_DEVICE_CATS]
    hw = {e["pid"] for e in events
          if e.get("ph") == "M" and e.get("name") == "process_name" and e["args"]["name"] == "Ascend Hardware"}
    return [e for e in events if e.get("ph") == "X" and e["pid"] in hw]


def expected(path: Path, top_n: int = 5) -> dict:
    """What `info --json` must say about a trace, from its raw JSON."""
    events, top = raw_trace(path)
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    starts = [us_to_ns(e["ts"]) for e in timed]
    ends = [us_to_ns(e["ts"]) + (us_to_ns(e["dur"]) if "dur" in e else 0) for e in timed]
    dev = device_events(events, top)
    stream_key = "stream" if top else "Stream Id"
    totals: dict[str, list[int]] = {}
    for e in dev:
        entry = totals.setdefault(e["name"], [0, 0])
        entry[0] += 1
        entry[1] += us_to_ns(e["dur"])
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top_n]
    return {
        "events": len(events),
        "span_ns": max(ends) - min(starts),
        "rank": (top.get("distributedInfo") or {}).get("rank", 0),
        "device_events": len(dev),
        "streams": sorted({e["args"][stream_key] for e in dev}),
        "top_device": [(name, count, total) for name, (count, total) in ranked],
    }


def kineto_kernel_counts(path: Path) -> tuple[int, int]:
    """(compute kernels, collective kernels): cat=='kernel' X events split on 'nccl' in the name."""
    events, _ = raw_trace(path)
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    nccl = sum("nccl" in e["name"].lower() for e in kernels)
    return len(kernels) - nccl, nccl


def info_json(path: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["info", str(path), "--json", *extra])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return json.loads(result.stdout)


def kind_counts(path: Path) -> Counter:
    table = read_trace(path).table
    return Counter(table.column("kind").cast("string").to_pylist())


# ---------------------------------------------------------------- import

def test_import_kineto_to_parquet_file(real_traces, tmp_path):
    src, out = real_traces / NCCL, tmp_path / "nccl.parquet"
    events, _ = raw_trace(src)
    result = runner.invoke(app, ["import", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {len(events)} events to {out}\n"
    assert result.stderr == ""
    kinds = kind_counts(out)
    assert sum(kinds.values()) == len(events) == 40573
    assert (kinds["kernel"], kinds["collective"]) == kineto_kernel_counts(src) == (2679, 21)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nccl.parquet"]


def test_import_to_rank_partitioned_directory(real_traces, tmp_path):
    src, out = real_traces / "kineto/sampled_128rank_rank1.json.gz", tmp_path / "table"
    events, top = raw_trace(src)
    assert top["distributedInfo"]["rank"] == 1
    result = runner.invoke(app, ["import", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {len(events)} events to {out}\n"
    assert [p.relative_to(out).as_posix() for p in sorted(out.rglob("*"))] == ["rank=1", "rank=1/part-0.parquet"]
    assert len(read_trace(out)) == len(events)
    assert kind_counts(out)["kernel"] == kineto_kernel_counts(src)[0]


def test_import_ascend_device_tasks(real_traces, tmp_path):
    src, out = real_traces / ASCEND, tmp_path / "npu.parquet"
    events, top = raw_trace(src)
    assert top == {}  # torch_npu writes a bare array
    result = runner.invoke(app, ["import", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 3670 events to {out}\n"
    kinds = kind_counts(out)
    assert sum(kinds.values()) == len(events) == 3670
    device = sum(kinds[k] for k in ("kernel", "memcpy", "memset", "collective"))
    assert device == len(device_events(events, top)) == 276


def test_import_lenient_skips_one_bad_event(tmp_path):
    good = {"ph": "X", "name": "k", "cat": "kernel", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2.0,
            "args": {"device": 0, "stream": 7}}
    events = [good, {**good, "ts": 10, "tid": {"not": "an id"}}, {**good, "ts": 20}]
    src = tmp_path / "one_bad.json"
    src.write_text(json.dumps({"traceEvents": events}))
    strict = runner.invoke(app, ["import", str(src), "-o", str(tmp_path / "strict.parquet")])
    assert strict.exit_code == 2
    assert not (tmp_path / "strict.parquet").exists()

    out = tmp_path / "lenient.parquet"
    result = runner.invoke(app, ["import", str(src), "-o", str(out), "--lenient"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 2 events to {out}\nskipped 1 malformed events\n"
    table = read_trace(out).table
    assert table.column("ts").to_pylist() == [0, 18500]  # ns from the first event
    assert info_json(out)["skipped_events"] == 1


@pytest.mark.parametrize("name, what", [
    ("kernel_details.csv", "torch_npu kernel_details.csv"),
    ("cluster_step_trace_time.csv", "msprof-analyze cluster_step_trace_time.csv"),
    ("cluster_communication.json", "msprof-analyze cluster_communication.json"),
])
def test_summary_tables_beside_a_timeline_are_named_not_parsed(real_traces, tmp_path, name, what):
    src, out = real_traces / "ascend" / name, tmp_path / "out.parquet"
    result = runner.invoke(app, ["import", str(src), "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith(f"msprof-py: error: {src}: not a trace: it is a {what}")
    assert lines[0].endswith("a summary table, not a timeline (pass the trace_view.json or msprof_*.json "
                             "timeline beside it)")


# ---------------------------------------------------------------- export

def test_export_kineto_keeps_every_event_exactly(real_traces, tmp_path):
    src, out = real_traces / NCCL, tmp_path / "nccl.json.gz"
    result = runner.invoke(app, ["export", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    events, _ = raw_trace(src)
    assert result.stdout == f"wrote {len(events)} events to {out}\n"
    exported, doc = raw_trace(out)
    origin_ns = min(us_to_ns(e["ts"]) for e in events if "ts" in e)
    assert doc["msprof_py"]["origin_ns"] == origin_ns

    def key(e: dict, shift_ns: int) -> tuple:
        dur = us_to_ns(e["dur"]) if "dur" in e else None
        return e["ph"], e.get("name"), us_to_ns(e["ts"]) - shift_ns, dur

    assert Counter(key(e, 0) for e in exported) == Counter(key(e, origin_ns) for e in events)


def test_export_from_parquet_equals_export_from_json(real_traces, tmp_path):
    src = real_traces / ASCEND
    table = tmp_path / "npu.parquet"
    assert runner.invoke(app, ["import", str(src), "-o", str(table)]).exit_code == 0
    from_json, from_parquet = tmp_path / "a.json", tmp_path / "b.json"
    assert runner.invoke(app, ["export", str(src), "-o", str(from_json)]).exit_code == 0
    result = runner.invoke(app, ["export", str(table), "-o", str(from_parquet)])
    assert result.exit_code == 0, result.output
    assert from_parquet.read_bytes() == from_json.read_bytes()
    assert len(json.loads(from_parquet.read_bytes())["traceEvents"]) == 3670


# ---------------------------------------------------------------- info

def test_info_json_matches_raw_kineto(real_traces):
    src = real_traces / NCCL
    want = expected(src)
    got = info_json(src, "--top", "5")
    assert got["source_format"] == "kineto"
    assert got["events"] == want["events"]
    assert got["span_ns"] == want["span_ns"]
    assert got["ranks"] == [want["rank"]] == [0]
    assert got["world_size"] == 2
    assert got["streams"] == [{"rank": 0, "device": 0, "streams": want["streams"]}]
    assert sum(got["kinds"].values()) == want["events"]
    assert (got["kinds"]["kernel"], got["kinds"]["collective"]) == kineto_kernel_counts(src)
    assert [(t["name"], t["count"], t["total_ns"]) for t in got["top_device"]] == want["top_device"]
    assert got["top_device"][0]["share_of_span"] == pytest.approx(want["top_device"][0][2] / want["span_ns"])
    assert len(got["top_host"]) == 5


def test_info_json_matches_raw_ascend(real_traces):
    src = real_traces / ASCEND
    want = expected(src, top_n=3)
    got = info_json(src, "--top", "3")
    assert got["source_format"] == "ascend"
    assert (got["events"], got["span_ns"]) == (want["events"], want["span_ns"])
    assert [s["streams"] for s in got["streams"]] == [want["streams"]]
    assert sum(got["kinds"].get(k, 0) for k in ("kernel", "memcpy", "memset", "collective")) == want["device_events"]
    assert [(t["name"], t["count"], t["total_ns"]) for t in got["top_device"]] == want["top_device"]


def test_info_on_every_real_trace(real_traces):
    files = sorted(real_traces.rglob("*.json.gz"))
    assert len(files) >= 10, files  # 9 Kineto + 1 torch_npu at the time of writing
    for src in files:
        want = expected(src, top_n=10)  # info's default --top
        got = info_json(src)
        where = src.relative_to(real_traces)
        assert got["events"] == want["events"], where
        assert sum(got["kinds"].values()) == want["events"], where
        assert got["span_ns"] == want["span_ns"], where
        assert got["ranks"] == [want["rank"]], where
        device = sum(got["kinds"].get(k, 0) for k in ("kernel", "memcpy", "memset", "collective"))
        assert device == want["device_events"], where
        assert sorted({s for g in got["streams"] for s in g["streams"]}) == want["streams"], where
        assert [(t["name"], t["count"], t["total_ns"]) for t in got["top_device"]] == want["top_device"], where


def test_info_tables_on_a_terminal_less_stdout(real_traces):
    src = real_traces / TINY
    result = runner.invoke(app, ["info", str(src), "--top", "2"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    text = result.stdout
    assert "kineto" in text
    assert "events per kind" in text and "top device work" in text and "top host APIs" in text
    span_ns = expected(src)["span_ns"]
    assert f"({span_ns:,} ns)" in text


def test_info_reads_parquet_directory(real_traces, tmp_path):
    src, out = real_traces / TINY, tmp_path / "tiny"
    assert runner.invoke(app, ["import", str(src), "-o", str(out)]).exit_code == 0
    assert info_json(out) == info_json(src)


def test_info_on_a_hand_built_trace(tmp_path):
    """Metadata time is not span; streams and top names are exact; names are not rich markup."""
    src = tmp_path / "hand.json"
    src.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "GPU 0"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000, "dur": 5.5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1001, "dur": 1,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "[/oops] gemm", "pid": 0, "tid": 7, "ts": 1002, "dur": 3,
         "args": {"device": 0, "stream": 7, "correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "[/oops] gemm", "pid": 0, "tid": 9, "ts": 1003, "dur": 4.25,
         "args": {"device": 0, "stream": 9}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 9, "ts": 1008, "dur": 0.5,
         "args": {"device": 0, "stream": 9, "bytes": 4096}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 1006, "dur": 2,
         "args": {"device": 0, "stream": 7}},
    ]}))
    got = info_json(src, "--top", "2")
    span_ns = 1_008_500 - 1_000_000
    assert (got["start_ns"], got["end_ns"], got["span_ns"]) == (1_000_000, 1_008_500, span_ns)
    assert got["streams"] == [{"rank": 0, "device": 0, "streams": [7, 9]}]
    assert got["kinds"] == {"kernel": 2, "memcpy": 1, "collective": 1, "api": 1, "launch": 1, "meta": 1}
    assert got["top_device"] == [
        {"name": "[/oops] gemm", "count": 2, "total_ns": 7250, "share_of_span": 7250 / span_ns},
        {"name": "ncclKernel_AllReduce", "count": 1, "total_ns": 2000, "share_of_span": 2000 / span_ns},
    ]
    assert [(t["name"], t["total_ns"]) for t in got["top_host"]] == [("aten::mm", 5500), ("cudaLaunchKernel", 1000)]
    text = runner.invoke(app, ["info", str(src)])
    assert text.exit_code == 0, text.output
    # total 7,250 ns in ms, 3 significant digits; names are not rich markup
    assert "[/oops] gemm" in text.stdout and "0.00725" in text.stdout


# ---------------------------------------------------------------- bad input

def assert_rejected(bad: Path, tmp_path: Path, *, lenient: bool = False) -> str:
    """import, export and info all fail with one clean line naming the file; nothing is written."""
    outdir = tmp_path / "out"
    outdir.mkdir(exist_ok=True)
    lines = []
    for command, out in (("import", outdir / "t.parquet"), ("import", outdir / "tdir"),
                         ("export", outdir / "t.json.gz"), ("info", None)):
        args = [command, str(bad)] + (["-o", str(out)] if out else []) + (["--lenient"] if lenient else [])
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert result.stdout == ""
        err = result.stderr.splitlines()
        assert len(err) == 1, result.stderr
        assert err[0].startswith(f"msprof-py: error: {bad}"), err[0]
        assert list(outdir.iterdir()) == []  # no output, no stray temporary files
        lines.append(err[0])
    assert len(set(lines)) == 1, lines  # the same message whatever the command
    return lines[0]


def test_truncated_json(real_traces, tmp_path):
    data = gzip.decompress((real_traces / NCCL).read_bytes())
    bad = tmp_path / "half.json"
    bad.write_bytes(data[: len(data) // 2])
    assert "truncated" in assert_rejected(bad, tmp_path)


def test_truncated_gzip(real_traces, tmp_path):
    data = (real_traces / NCCL).read_bytes()
    bad = tmp_path / "half.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    assert "gzip" in assert_rejected(bad, tmp_path)


def test_corrupt_gzip(real_traces, tmp_path):
    data = bytearray((real_traces / TINY).read_bytes())
    mid = len(data) // 2
    data[mid: mid + 8] = bytes(b ^ 0xFF for b in data[mid: mid + 8])
    bad = tmp_path / "corrupt.json.gz"
    bad.write_bytes(bytes(data))
    assert "gzip" in assert_rejected(bad, tmp_path)


def test_json_object_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "foo.json"
    bad.write_text('{"foo": 1}')
    assert "traceEvents" in assert_rejected(bad, tmp_path)


def test_json_array_of_numbers(tmp_path):
    bad = tmp_path / "numbers.json"
    bad.write_text("[1, 2, 3]")
    assert_rejected(bad, tmp_path)
    # Leniency skips bad events; it must not turn a non-trace into an empty trace.
    assert "all 3 events are malformed" in assert_rejected(bad, tmp_path, lenient=True)


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.json"
    bad.write_bytes(b"")
    assert "empty" in assert_rejected(bad, tmp_path)


def _events_file(tmp_path: Path, name: str, bad_event: str) -> Path:
    good = '{"ph":"X","name":"k","cat":"kernel","pid":0,"tid":7,"ts":1.0,"dur":2.0}'
    path = tmp_path / name
    path.write_bytes(b'{"traceEvents":[' + good.encode() + b"," + bad_event.encode("utf-8", "surrogateescape") + b"]}")
    return path


def test_ts_as_list(tmp_path):
    bad = _events_file(tmp_path, "ts_list.json", '{"ph":"X","name":"k","pid":0,"tid":7,"ts":[1,2],"dur":1}')
    assert "event 1: 'ts'" in assert_rejected(bad, tmp_path)


def test_negative_dur(tmp_path):
    bad = _events_file(tmp_path, "neg_dur.json", '{"ph":"X","name":"k","pid":0,"tid":7,"ts":5,"dur":-3}')
    assert "negative 'dur'" in assert_rejected(bad, tmp_path)


def test_nan_ts(tmp_path):
    bad = _events_file(tmp_path, "nan.json", '{"ph":"X","name":"k","pid":0,"tid":7,"ts":NaN,"dur":1}')
    assert "NaN" in assert_rejected(bad, tmp_path)


def test_id_wider_than_64_bits_is_kept_and_exported_as_a_string(tmp_path):
    # Ids are names of any size (torch_npu's pass 2**64); the export writes one no 64-bit reader takes as a string.
    wide = _events_file(tmp_path, "wide_id.json",
                        '{"ph":"s","name":"flow","cat":"ac2g","pid":0,"tid":7,"ts":3,"id":123456789012345678901234}')
    out = tmp_path / "wide.json"
    assert runner.invoke(app, ["export", str(wide), "-o", str(out)]).exit_code == 0
    assert b'"id":"123456789012345678901234"' in out.read_bytes()


def test_name_with_invalid_utf8(tmp_path):
    bad = _events_file(tmp_path, "bad_utf8.json", '{"ph":"X","name":"k\udcff\udcfe","pid":0,"tid":7,"ts":3,"dur":1}')
    assert b"\xff\xfe" in bad.read_bytes()
    assert "UTF-8" in assert_rejected(bad, tmp_path)


def test_parquet_with_missing_columns(real_traces, tmp_path):
    table = read_trace(_imported_parquet(real_traces, tmp_path)).table
    bad = tmp_path / "in" / "missing.parquet"
    # Keep the msprof-py metadata so the reader gets as far as checking the columns.
    pq.write_table(table.drop_columns(["ts", "kind"]), bad)
    assert "missing column(s) ts, kind" in assert_rejected(bad, tmp_path)


def test_parquet_that_is_not_a_trace_table(tmp_path):
    import pyarrow as pa

    bad = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), bad)
    assert_rejected(bad, tmp_path)


def test_nonexistent_input(tmp_path):
    assert "no such file" in assert_rejected(tmp_path / "nope.json", tmp_path)


def test_output_in_nonexistent_directory(real_traces, tmp_path):
    src = real_traces / TINY
    for command, out in (("import", tmp_path / "nodir" / "t.parquet"), ("export", tmp_path / "nodir" / "t.json")):
        result = runner.invoke(app, [command, str(src), "-o", str(out)])
        assert result.exit_code == 2, result.output
        assert result.stderr == f"msprof-py: error: {out}: directory {out.parent} does not exist\n"
        assert "Traceback" not in result.output
        assert not out.parent.exists()


def test_output_over_a_foreign_directory_is_refused_and_kept(real_traces, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = runner.invoke(app, ["import", str(real_traces / TINY), "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"msprof-py: error: {out}: exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_unknown_and_missing_options_exit_2(real_traces, tmp_path):
    src = str(real_traces / TINY)
    assert runner.invoke(app, ["import", src, "--bogus"]).exit_code == 2
    assert runner.invoke(app, ["import", src]).exit_code == 2  # -o is required
    assert runner.invoke(app, ["info"]).exit_code == 2
    assert runner.invoke(app, ["frobnicate"]).exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_console_script_prints_one_line_and_exits_2(tmp_path):
    script = Path(sys.executable).parent / "msprof-py"
    assert script.exists(), f"{script} missing: run `{sys.executable} -m pip install -e .`"
    bad = tmp_path / "foo.json"
    bad.write_text('{"foo": 1}')
    out = tmp_path / "out.parquet"
    proc = subprocess.run([str(script), "import", str(bad), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"msprof-py: error: {bad}: ")
    assert "Traceback" not in proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------- progress

def test_progress_is_silent_off_a_terminal():
    sink = io.StringIO()
    with progress_reporter(1 << 40, console=Console(file=sink)) as report:
        report("decompress", 5, 10)
    assert sink.getvalue() == ""


def test_progress_bar_when_forced():
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=80)
    with progress_reporter(0, force=True, console=console) as report:
        report("decompress", 5, 10)
        report("encode", 10, 10)
    assert "decompress" in sink.getvalue() and "encode" in sink.getvalue()


def _imported_parquet(real_traces: Path, tmp_path: Path) -> Path:
    out = tmp_path / "in" / "tiny.parquet"
    out.parent.mkdir(exist_ok=True)
    assert runner.invoke(app, ["import", str(real_traces / TINY), "-o", str(out)]).exit_code == 0
    return out
