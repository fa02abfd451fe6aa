"""`msprof-py sql` and `msprof_py.sql`: DuckDB views over a trace's Parquet files.

Every view is checked row for row against a pandas computation over `read_trace` (or the PROF
directory's `read_raw`) written here from the views' documented definitions, on an emulated
2-rank PROF directory, the 8-rank slow-rank sample and two real imported traces (Kineto NCCL,
torch_npu). The README's three queries run as the README prints them, give the README's output,
and agree with pandas.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import msprof_py
from msprof_py import capture, prof_dir
from msprof_py.cli import app
from msprof_py.errors import MsprofError
from msprof_py.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
SLOW = ROOT / "sample_traces" / "emulated" / "bert-train-dp-slow-rank"
LEAK = ROOT / "sample_traces" / "emulated" / "resnet50-infer-leak"
CLI = Path(sys.executable).parent / "msprof-py"
runner = CliRunner()

DEVICE = ("kernel", "memcpy", "memset", "collective")
MEMORY_COUNTER = re.compile(r"\b(?:allocated|reserved)\b|\bmemory\b.*\bused\b", re.IGNORECASE)


# ---------------------------------------------------------------- traces

@pytest.fixture(scope="module")
def prof(tmp_path_factory) -> Path:
    """A small emulated multi-rank run: a PROF directory (host and device parts, by rank)."""
    return capture.emulate("bert-train-dp", tmp_path_factory.mktemp("prof"), ranks=2, steps=3)


@pytest.fixture(scope="module")
def nccl(tmp_path_factory, real_traces) -> Path:
    """A real Kineto trace (2-rank NCCL job, rank 0) imported to a Parquet file."""
    out = tmp_path_factory.mktemp("nccl") / "nccl.parquet"
    result = runner.invoke(app, ["import", str(real_traces / "kineto/nccl_2rank_rank0.json.gz"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def npu(tmp_path_factory, real_traces) -> Path:
    """A real torch_npu trace imported to a rank-partitioned directory."""
    out = tmp_path_factory.mktemp("npu") / "table"
    result = runner.invoke(app, ["import", str(real_traces / "ascend/torch_npu_trace_view.json.gz"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def frame(path: Path) -> pd.DataFrame:
    """The whole table in pandas, dictionary columns as plain text, nullable integers as Python ints
    (exact: a float64 column would round the 19-digit correlation ids of torch_npu traces)."""
    trace = prof_dir.read_raw(path) if prof_dir.is_prof_dir(path) else read_trace(
        path / "trace" if (path / "trace").is_dir() else path)
    df = trace.table.to_pandas(integer_object_nulls=True)
    for col in ("ph", "name", "cat", "kind"):
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df


def norm(v):
    """One value as both sides can compare it: None for any null, ints for integral numbers."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def rows(data, columns: list[str] | None = None) -> list[tuple]:
    """Rows (a DataFrame's columns, or fetched tuples) normalized and sorted, as a multiset."""
    if isinstance(data, pd.DataFrame):
        data = list(data[columns].itertuples(index=False, name=None))
    out = [tuple(norm(v) for v in row) for row in data]
    return sorted(out, key=lambda r: tuple("" if v is None else str(v) for v in r))


def view(path: Path, query: str) -> list[tuple]:
    return msprof_py.sql(path, query).fetchall()


# ---------------------------------------------------------------- independent expectations

def expect_slices(df: pd.DataFrame) -> pd.DataFrame:
    s = df[df["ph"] == "X"].copy()
    s["dur"] = s["dur"].fillna(0).astype(np.int64)
    s["end"] = s["ts"] + s["dur"]
    return s


def expect_tasks(df: pd.DataFrame) -> pd.DataFrame:
    x = expect_slices(df)
    is_task = x["stream"].notna() & (x["kind"].isin(DEVICE) | (x["kind"].isin(("wait", "sync", "marker"))
                                                                & x["corr"].notna()))
    tasks = x[is_task]
    host = x[~is_task & x["corr"].notna() & x["kind"].isin(("api", "launch", "sync", "wait", "op_compile"))].copy()
    host["is_launch"] = host["kind"] == "launch"
    host = host.sort_values(["rank", "corr", "is_launch", "ts"], kind="stable").drop_duplicates(
        ["rank", "corr"], keep="last")
    host = host[["rank", "corr", "name", "kind", "ts", "dur"]].rename(
        columns={"name": "launch_name", "kind": "launch_kind", "ts": "launch_ts", "dur": "launch_dur"})
    out = tasks.merge(host, on=["rank", "corr"], how="left")
    out["queue_delay"] = out["ts"] - (out["launch_ts"] + out["launch_dur"])
    return out


def expect_flows(df: pd.DataFrame) -> pd.DataFrame:
    s = df[df["ph"] == "s"][["rank", "cat", "id", "corr", "ts", "pid"]]
    f = df[df["ph"] == "f"][["rank", "cat", "id", "corr", "ts", "pid"]]
    m = s.merge(f, on=["rank", "cat", "id"], suffixes=("_s", "_f"))
    m["corr"] = m["corr_s"].where(m["corr_s"].notna(), m["corr_f"])
    m["latency"] = m["ts_f"] - m["ts_s"]
    return m


def expect_live(df: pd.DataFrame) -> pd.DataFrame:
    """alloc / free rows with live bytes: the running sum per (rank, device) in table order by ts."""
    mem = df[df["kind"].isin(("alloc", "free"))].copy()
    mem["delta"] = np.where(mem["kind"] == "alloc", mem["bytes"], -mem["bytes"]).astype(np.int64)
    mem["dev"] = mem["device"].fillna(-1)
    mem = mem.sort_values(["rank", "dev", "ts"], kind="stable")
    mem["live"] = mem.groupby(["rank", "dev"])["delta"].cumsum()
    return mem


# ---------------------------------------------------------------- every view, on four traces

TRACES = ["prof", "slow", "nccl", "npu"]


@pytest.fixture(params=TRACES)
def trace_path(request) -> Path:
    return SLOW if request.param == "slow" else request.getfixturevalue(request.param)


def test_events_is_the_whole_table(trace_path):
    df = frame(trace_path)
    cols = ["rank", "ph", "name", "ts", "dur", "pid", "tid", "kind", "device", "stream", "corr", "bytes", "addr",
            "value", "step"]
    assert rows(view(trace_path, f"SELECT {', '.join(cols)} FROM events")) == rows(df, cols)
    types = {r[0]: r[1] for r in msprof_py.sql(trace_path).execute("DESCRIBE events").fetchall()}
    assert types["rank"] == "INTEGER" and types["ts"] == "BIGINT" and types["kind"] == "VARCHAR"
    assert list(types) == list(df.columns)


def test_slices(trace_path):
    s = expect_slices(frame(trace_path))
    cols = ["rank", "device", "stream", "pid", "tid", "ts", "dur", "end", "name", "kind", "corr", "step", "bytes"]
    got = view(trace_path, "SELECT " + ", ".join(f'"{c}"' for c in cols) + " FROM slices")
    assert len(got) == len(s) > 0
    assert rows(got) == rows(s, cols)


def test_counters(trace_path):
    df = frame(trace_path)
    c = df[df["ph"] == "C"]
    cols = ["rank", "device", "stream", "ts", "name", "value", "step"]
    assert rows(view(trace_path, f"SELECT {', '.join(cols)} FROM counters")) == rows(c, cols)
    assert (len(c) > 0) == (trace_path in (SLOW,) or prof_dir.is_prof_dir(trace_path))


def test_flows(trace_path):
    m = expect_flows(frame(trace_path))
    got = view(trace_path, "SELECT rank, cat, id, corr, start_ts, start_pid, finish_ts, finish_pid, latency FROM flows")
    assert len(got) == len(m) > 0
    assert rows(got) == rows(m, ["rank", "cat", "id", "corr", "ts_s", "pid_s", "ts_f", "pid_f", "latency"])


def test_tasks_with_their_launches(trace_path):
    t = expect_tasks(frame(trace_path))
    cols = ["rank", "device", "stream", "ts", "dur", "name", "kind", "corr", "launch_name", "launch_kind",
            "launch_ts", "launch_dur", "queue_delay"]
    got = view(trace_path, f"SELECT {', '.join(cols)} FROM tasks")
    assert len(got) == len(t) > 0
    assert rows(got) == rows(t, cols)
    # Nearly every task found the call that launched it (the torch_npu sample records fewer launches).
    launched = sum(r[cols.index("launch_ts")] is not None for r in got)
    assert launched == t["launch_ts"].notna().sum() and launched / len(got) > 0.5


def test_memory(trace_path):
    df = frame(trace_path)
    live = expect_live(df)
    got = view(trace_path, "SELECT rank, device, ts, kind, name, addr, bytes, delta, live, value FROM memory "
                           "WHERE kind IN ('alloc', 'free')")
    assert rows(got) == rows(live, ["rank", "device", "ts", "kind", "name", "addr", "bytes", "delta", "live", "value"])
    counters = df[(df["ph"] == "C") & df["name"].fillna("").map(lambda n: bool(MEMORY_COUNTER.search(n)))]
    got = view(trace_path, "SELECT rank, device, ts, name, value FROM memory WHERE kind = 'counter'")
    assert rows(got) == rows(counters, ["rank", "device", "ts", "name", "value"])
    fails = df[df["kind"] == "alloc_fail"]
    assert view(trace_path, "SELECT count(*) FROM memory WHERE kind = 'alloc_fail'") == [(len(fails),)]
    emulated = trace_path == SLOW or prof_dir.is_prof_dir(trace_path)
    assert (len(live) > 0 and len(counters) > 0) == emulated


def test_steps(trace_path):
    df = frame(trace_path)
    s = expect_slices(df)
    s = s[s["kind"] == "step"].copy()
    s["number"] = [int(n.rsplit("#", 1)[1]) for n in s["name"]]
    got = view(trace_path, 'SELECT rank, step, name, ts, dur, "end" FROM steps')
    assert len(got) == len(s) > 0
    assert rows(got) == rows(s, ["rank", "number", "name", "ts", "dur", "end"])


def test_views_on_known_numbers(nccl, prof):
    """A few figures known from the sources, beside the pandas comparisons."""
    assert view(nccl, "SELECT step, name FROM steps ORDER BY ts") == [
        (4, "ProfilerStep#4"), (5, "ProfilerStep#5"), (6, "ProfilerStep#6")]
    assert view(nccl, "SELECT kind, count(*) FROM tasks GROUP BY kind ORDER BY kind") == [
        ("collective", 21), ("kernel", 2679), ("memcpy", 960), ("memset", 114)]
    assert view(prof, "SELECT DISTINCT rank FROM events ORDER BY rank") == [(0,), (1,)]
    assert view(prof, "SELECT count(*) FROM steps") == [(6,)]


def test_leak_sample_live_bytes_grow(tmp_path):
    """The leak sample's live bytes at each step's end grow by the same amount every step."""
    got = view(LEAK, """
        SELECT s.step, (SELECT last(m.live ORDER BY m.ts) FROM memory m
                        WHERE m.kind IN ('alloc', 'free') AND m.rank = s.rank AND m.ts <= s."end") AS live
        FROM steps s ORDER BY s.step""")
    live = expect_live(frame(LEAK))
    steps = expect_slices(frame(LEAK))
    steps = steps[steps["kind"] == "step"].sort_values("ts")
    expected = [int(live[live["ts"] <= end]["live"].iloc[-1]) for end in steps["end"]]
    assert [v for _, v in got] == expected
    growth = np.diff(expected)
    assert len(growth) >= 4 and (growth > 0).all()


def test_a_task_takes_the_launch_among_host_calls_of_its_corr(tmp_path):
    """Two host slices with the task's corr (an API span around the launch call): the launch is the
    task's; a task's own device-side twin (a CUDA Stream Sync and its cudaStreamSynchronize) is not."""
    from msprof_py.trace import write_trace
    from msprof_py.trace.schema import COLUMN_NAMES, TraceMeta, build_table

    base = {"rank": 0, "ph": "X", "cat": None, "id": None, "args": None, "extra": None, "device": None,
            "stream": None, "bytes": None, "addr": None, "value": None, "step": None}
    events = [
        {**base, "name": "aclnnAdd", "kind": "api", "ts": 100, "dur": 50, "pid": 1, "tid": 1, "corr": 7},
        {**base, "name": "aclrtLaunchKernel", "kind": "launch", "ts": 110, "dur": 20, "pid": 1, "tid": 1, "corr": 7},
        {**base, "name": "Add", "kind": "kernel", "ts": 200, "dur": 30, "pid": 2, "tid": 3, "corr": 7,
         "device": 0, "stream": 3},
        {**base, "name": "cudaStreamSynchronize", "kind": "sync", "ts": 240, "dur": 40, "pid": 1, "tid": 1,
         "corr": 8},
        {**base, "name": "Stream Sync", "kind": "sync", "ts": 245, "dur": 30, "pid": 2, "tid": 3, "corr": 8,
         "device": 0, "stream": 3},
        {**base, "name": "annotation", "kind": "marker", "ts": 200, "dur": 80, "pid": 2, "tid": 3,
         "device": 0, "stream": 3, "corr": None},
    ]
    path = write_trace(build_table({c: [e[c] for e in events] for c in COLUMN_NAMES}, TraceMeta()),
                       tmp_path / "t.parquet")
    got = view(path, "SELECT name, launch_name, launch_kind, launch_ts, launch_end, queue_delay FROM tasks "
                     "ORDER BY ts, name")
    assert got == [("Add", "aclrtLaunchKernel", "launch", 110, 130, 70),
                   ("Stream Sync", "cudaStreamSynchronize", "sync", 240, 280, -35)]


# ---------------------------------------------------------------- the README's queries

def readme_examples() -> list[tuple[str, str]]:
    """(query, printed output) of each example in the README's "SQL over traces" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## SQL over traces", 1)[1].split("\n## ", 1)[0]
    queries = re.findall(r"```sql\n(.*?)```", section, re.S)
    outputs = re.findall(r"```text\n(.*?)```", section, re.S)
    assert len(queries) == len(outputs) == 3
    assert "sample_traces/emulated/bert-train-dp-slow-rank" in section
    return list(zip(queries, outputs))


def test_readme_prints_what_the_command_prints():
    for query, printed in readme_examples():
        result = runner.invoke(app, ["sql", str(SLOW), query])
        assert result.exit_code == 0, result.output
        lines = [line.rstrip() for line in result.output.strip("\n").splitlines()]
        assert lines == printed.strip("\n").splitlines()


def test_readme_idle_per_stream_matches_pandas():
    query = readme_examples()[0][0]
    df = frame(SLOW)
    ops = expect_slices(df)
    ops = ops[ops["kind"].isin(DEVICE) & ops["stream"].notna()].sort_values(["rank", "device", "stream", "ts"])
    expected = []
    for (rank, device, stream), g in ops.groupby(["rank", "device", "stream"]):
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        prev_end = np.maximum.accumulate(end)[:-1]
        idle = int(np.maximum(ts[1:] - prev_end, 0).sum())
        span = int(end.max() - ts.min())
        expected.append((int(rank), int(device), int(stream), len(g), span, idle, round(100 * idle / span, 1)))
    expected.sort(key=lambda r: (r[6], r[0], r[2]))
    assert view(SLOW, query) == expected[:4]
    assert expected[0][0] == 3  # the slow rank's compute stream idles least
    # The same numbers as the streams analyzer (HTA's definition).
    from analyzers.frames import Frames
    from analyzers.streams import stream_time

    st = stream_time(Frames(read_trace(SLOW / "trace")))
    by_key = {(r.rank, r.device, r.stream): (r.idle_ns, r.last_ns - r.first_ns) for r in st.itertuples()}
    for rank, device, stream, _, span, idle, _ in expected:
        assert by_key[(rank, device, stream)] == (idle, span)


def test_readme_top_kernels_per_step_matches_pandas():
    query = readme_examples()[1][0]
    ops = expect_slices(frame(SLOW))
    kernels = ops[(ops["kind"] == "kernel") & ops["stream"].notna()]
    g = kernels.groupby(["step", "name"]).agg(calls=("ts", "size"), total_ns=("dur", "sum")).reset_index()
    g = g.sort_values(["step", "total_ns", "name"], ascending=[True, False, True])
    top = g.groupby("step").head(3)
    expected = [(int(r.step), r.name, int(r.calls), int(r.total_ns)) for r in top.itertuples()]
    assert view(SLOW, query) == expected
    assert len(expected) == 9


def test_readme_memory_peak_matches_pandas():
    query = readme_examples()[2][0]
    live = expect_live(frame(SLOW))
    peak = live.groupby(["rank", "dev"])["live"].max()
    expected = [(int(r), int(d), int(p), round(p / 2**20, 1)) for (r, d), p in peak.items()]
    assert view(SLOW, query) == expected
    assert len(expected) == 8 and expected[0][2] == 881_066_592


# ---------------------------------------------------------------- output formats

def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_csv_keeps_full_precision():
    query = "SELECT rank, name, avg(dur) / 3 AS third FROM tasks GROUP BY rank, name ORDER BY rank, name LIMIT 50"
    result = runner.invoke(app, ["sql", str(SLOW), query, "--format", "csv"])
    assert result.exit_code == 0, result.output
    parsed = list(csv.reader(io.StringIO(result.output)))
    assert parsed[0] == ["rank", "name", "third"]
    expected = view(SLOW, query)
    assert len(parsed) - 1 == len(expected) == 50
    assert [(int(r), n, float(t)) for r, n, t in parsed[1:]] == expected
    assert any(len(t) > 12 for _, _, t in parsed[1:])  # not rounded for show


def test_csv_nulls_are_empty():
    result = runner.invoke(app, ["sql", str(SLOW), "SELECT 1 AS a, NULL AS b, 'x,y' AS c", "-f", "csv"])
    assert result.output == 'a,b,c\n1,,"x,y"\n'


def test_json_is_an_array_of_objects():
    query = "SELECT rank, step, name, ts, dur FROM steps ORDER BY rank, ts"
    result = runner.invoke(app, ["sql", str(SLOW), query, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rel = msprof_py.sql(SLOW, query)
    assert data == [dict(zip(rel.columns, row)) for row in rel.fetchall()]
    assert len(data) == 24
    empty = runner.invoke(app, ["sql", str(SLOW), "SELECT * FROM steps WHERE rank = 99", "-f", "json"])
    assert json.loads(empty.output) == []
    odd = runner.invoke(app, ["sql", str(SLOW), "SELECT 'nan'::DOUBLE AS n, 1.50 AS d, [1, 2] AS l", "-f", "json"])
    assert json.loads(odd.output) == [{"n": None, "d": 1.5, "l": [1, 2]}]


def test_table_is_whole_when_piped():
    long_name = "k" * 300
    query = (f"SELECT '{long_name}' AS name, 1234567890 AS ns, 0.5 AS half, NULL AS nothing, "
             "'[memory]' AS markup")
    result = cli("sql", str(SLOW), query)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(long_name in line for line in lines)  # one line, not cut or folded
    assert "1,234,567,890" in result.stdout and "0.5" in result.stdout and "NULL" in result.stdout
    assert "[memory]" in result.stdout  # not taken for rich markup
    assert lines[-1] == "1 row" and all(line == line.rstrip() for line in lines)


# ---------------------------------------------------------------- interactive mode

def test_interactive_reads_piped_stdin():
    script = ".tables\nSELECT count(*) AS n\n  FROM steps;\n.schema steps\nSELECT max(step) AS last FROM steps\n"
    result = cli("sql", str(SLOW), "-f", "csv", stdin=script)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout.splitlines()
    assert out[0] == "events  slices  counters  flows  tasks  memory  steps"
    assert out[1:3] == ["n", "24"]
    assert out[3] == "column_name,column_type,null,key,default,extra"
    assert [line.split(",")[0] for line in out[4:12]] == ["rank", "step", "name", "pid", "tid", "ts", "dur", "end"]
    assert out[12:] == ["last", "2"]  # the last statement ran at end of input without ';'


def test_interactive_goes_on_after_an_error_and_exits_2():
    result = cli("sql", str(SLOW), "-f", "csv", stdin="SELEC 1;\nSELECT 7 AS x;\n.nope\n.quit\nSELECT 8;\n")
    assert result.returncode == 2
    assert result.stdout == "x\n7\n"  # nothing after .quit
    errors = result.stderr.splitlines()
    assert errors == ['msprof-py: error: Parser Error: syntax error at or near "SELEC"',
                      "msprof-py: error: unknown command '.nope'; try .help"]


def test_interactive_empty_input():
    result = cli("sql", str(SLOW), stdin="")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("args, message", [
    (["SELEC 1"], 'Parser Error: syntax error at or near "SELEC"'),
    (["SELECT * FROM kernels"], "Catalog Error: Table with name kernels does not exist!"),
    (["SELECT nope FROM tasks"], 'Binder Error: Referenced column "nope" not found in FROM clause!'),
    (["SELECT 1", "--format", "xml"], "unknown --format value 'xml'; choose one of table, csv, json"),
    (["SELECT CAST('x' AS INTEGER)"], "Conversion Error: Could not convert string 'x' to INT32"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = cli("sql", str(SLOW), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"msprof-py: error: {message}")


def test_missing_and_non_parquet_traces(tmp_path, real_traces):
    result = cli("sql", str(tmp_path / "none.parquet"), "SELECT 1")
    assert (result.returncode, result.stderr) == (2, f"msprof-py: error: {tmp_path / 'none.parquet'}: no such file "
                                                     "or directory\n")
    json_trace = real_traces / "kineto/tiny_base.json.gz"
    result = cli("sql", str(json_trace), "SELECT 1")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "sql reads Parquet trace tables" in result.stderr and "msprof-py import" in result.stderr
    (tmp_path / "empty").mkdir()
    result = cli("sql", str(tmp_path / "empty"), "SELECT 1")
    assert result.returncode == 2 and "no Parquet files" in result.stderr and len(result.stderr.splitlines()) == 1
    other = tmp_path / "other.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1]}), other)
    result = cli("sql", str(other), "SELECT 1")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "not an msprof-py trace table" in result.stderr


# ---------------------------------------------------------------- Python API

def test_python_api_connection_and_relation(prof):
    import duckdb

    con = msprof_py.sql(prof)
    assert isinstance(con, duckdb.DuckDBPyConnection)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views >= {"events", "slices", "counters", "flows", "tasks", "memory", "steps"}
    rel = msprof_py.sql(prof, "SELECT rank, count(*) AS n FROM tasks GROUP BY rank ORDER BY rank")
    assert isinstance(rel, duckdb.DuckDBPyRelation)
    del con
    import gc

    gc.collect()
    df = rel.df()  # the relation keeps its connection alive
    expected = expect_tasks(frame(prof)).groupby("rank").size()
    assert df["n"].tolist() == expected.tolist() and df["rank"].tolist() == [0, 1]
    with pytest.raises(MsprofError, match="Catalog Error"):
        msprof_py.sql(prof, "SELECT * FROM nowhere")
    with pytest.raises(MsprofError, match="no such file"):
        msprof_py.sql(prof / "missing")
    assert msprof_py.sql is sys.modules["msprof_py.sql"] and msprof_py.sql.VIEWS[0] == "events"


def test_import_and_help_do_not_load_duckdb():
    code = ("import sys, msprof_py, msprof_py.cli; "
            "assert 'duckdb' not in sys.modules and 'msprof_py.sql' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout == "ok\n", out.stderr
    help_out = cli("sql", "--help")
    assert help_out.returncode == 0 and "--format" in help_out.stdout and "QUERY" in help_out.stdout
