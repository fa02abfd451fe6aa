"""Rank-partitioned analysis (`analyze` / `report --engine local|dask`): the findings of a run over
the rank partitions, in process or on a real two-worker Dask LocalCluster, are those of the
whole-trace `analyzers.run`: same codes, places, times, costs and order."""

from __future__ import annotations

import json
import logging
import math
import sys

import distributed
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from analyzers import Frames, run
from msprof_py import report
from msprof_py.cli import app
from msprof_py.trace import write_trace
from msprof_py.trace.parquet import read_trace
from runtime_emu import scenarios

runner = CliRunner()

#: name -> (scenario, switches, params): a slow rank and a slow link (cross-rank findings), per-rank
#: problems (a leak on one rank, copies contending with collectives on every rank), and 12 ranks
#: (rank 10 and 11 sort before 2 as text: the merge must order them as the whole-trace run does).
CASES = {
    "slow-rank": ("bert-train-dp", ["slow-rank", "slow-link"], {"ranks": 4, "steps": 3, "layers": 2}),
    "per-rank": ("bert-train-dp", ["leak", "bandwidth-contention"], {"ranks": 4, "steps": 5, "layers": 1}),
    "12-ranks": ("llm-train-2server", ["slow-rank"], {"ranks": 12, "steps": 2, "layers": 1, "servers": 2}),
    # A pipeline: its stages' hand-overs are matched across the partitions.
    "pipeline": ("llm-pipeline", ["pipeline-bubble"], {"ranks": 4, "steps": 2}),
}
#: The findings each case must give (code, rank, device, stream, the other ranks), in the whole-trace
#: run's order: a problem found on several ranks is one finding led by the rank it costs most.
R4 = [0, 1, 2, 3]


def others(lead, ranks=R4):
    return [r for r in ranks if r != lead]


R12 = list(range(12))
EXPECTED = {
    "slow-rank": [("LOW_OVERLAP", 0, None, None, others(0)), ("BUBBLE_COLLECTIVE", 0, 0, 1, others(0)),
                  ("BUBBLE_COPY", 0, 0, 1, others(0)), ("BUBBLE_DATA", 2, 2, 1, others(2)),
                  ("BUBBLE_SYNC", 0, 0, 1, others(0)), ("LAUNCH_BOUND", 0, 0, 1, others(0)),
                  ("SLOW_LINK", 1, None, None, []), ("SLOW_RANK", 3, 3, None, others(3)),
                  ("SYNC_STALL", 0, None, None, others(0))],
    "per-rank": [("BANDWIDTH_CONTENTION", 0, 0, None, others(0)), ("LOW_OVERLAP", 1, None, None, others(1)),
                 ("BUBBLE_COLLECTIVE", 1, 1, 1, others(1)), ("BUBBLE_COPY", 0, 0, 1, others(0)),
                 ("BUBBLE_SYNC", 2, 2, 1, others(2)), ("LAUNCH_BOUND", 0, 0, 1, others(0)),
                 ("MEMORY_LEAK", 3, 3, None, []), ("SYNC_STALL", 0, None, None, others(0))],
    "12-ranks": [("LOW_OVERLAP", 11, None, None, others(11, R12)), ("BUBBLE_COLLECTIVE", 7, 1, 1, others(7, R12)),
                 ("BUBBLE_COPY", 0, 0, 1, others(0, R12)), ("SLOW_RANK", 9, 3, None, others(9, R12)),
                 ("SYNC_STALL", 0, None, None, others(0, R12))],
    "pipeline": [("BUBBLE_COLLECTIVE", 0, 0, 1, others(0)), ("BUBBLE_COPY", 0, 0, 1, []), ("BUBBLE_DATA", 0, 0, 1, []),
                 ("BUBBLE_SYNC", 0, 0, 1, others(0)), ("LAUNCH_BOUND", 0, 0, 1, others(0)),
                 ("PIPELINE_BUBBLE", 0, None, None, others(0)), ("SYNC_STALL", 0, None, None, others(0))],
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("partitioned")
    out = {}
    for label, (name, switches, params) in CASES.items():
        write_trace(scenarios.run(name, switches=switches, seed=0, **params).trace, d / label, partition_by_rank=True)
        out[label] = d / label
    return out


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as c:
        yield c


def where(result):
    return [(f.code, f.rank, f.device, f.stream, f.ranks) for f in result.findings]


def plain(o):
    """Metrics with floats to 12 significant digits (a rolling sum over one rank's copies alone,
    the bandwidth in use, can differ from one over all ranks in the last bit), NaN as text."""
    if isinstance(o, dict):
        return {k: plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
    if isinstance(o, float):
        return float(f"{o:.12g}") if math.isfinite(o) else str(o)  # NaN == NaN here
    return o


@pytest.mark.parametrize("case", list(CASES))
def test_local_and_dask_engines_give_the_whole_trace_findings(traces, cluster, case):
    whole = run(read_trace(traces[case]))
    parts = report.rank_partitions(traces[case])
    assert [p[0] for p in parts] == list(range(CASES[case][2]["ranks"]))
    local = report.analyze(parts, engine="local")
    on_dask = report.analyze(parts, engine="dask", scheduler=cluster.scheduler_address)
    assert where(whole) == EXPECTED[case]
    expected = [f.to_dict() for f in whole.findings]  # codes, where, when, costs, evidence, lookup, order
    assert [f.to_dict() for f in local.findings] == expected
    assert [f.to_dict() for f in on_dask.findings] == expected
    assert local.skipped == on_dask.skipped == whole.skipped == {}
    assert plain(local.metrics) == plain(on_dask.metrics) == plain(whole.metrics)
    assert local.platform == on_dask.platform == whole.platform == "ascend"


@pytest.mark.parametrize("case", list(CASES))
def test_local_batches_of_a_few_ranks_give_the_whole_trace_findings(traces, case, monkeypatch):
    """The local engine groups consecutive ranks up to a row budget: with a budget of about two
    ranks' rows, batches of 1-3 ranks must still give the whole trace's findings."""
    whole = run(read_trace(traces[case]))
    parts = report.rank_partitions(traces[case])
    rows = [sum(pq.ParquetFile(f).metadata.num_rows for f in p[2]) for p in parts]
    monkeypatch.setattr(report, "LOCAL_BATCH_ROWS", 2 * max(rows[1:]) + 1)
    batches = report.local_batches(parts)
    assert 1 < len(batches) < len(parts) and max(map(len, batches)) >= 2
    assert [p for b in batches for p in b] == parts
    local = report.analyze(parts, engine="local")
    assert [f.to_dict() for f in local.findings] == [f.to_dict() for f in whole.findings]
    assert plain(local.metrics) == plain(whole.metrics)


def test_slow_rank_reduced_from_arrival_tables(traces):
    (f,) = [f for f in report.analyze(report.rank_partitions(traces["slow-rank"]), ["ranks"]).findings]
    assert (f.code, f.rank, f.ranks, f.analyzer) == ("SLOW_RANK", 3, [0, 1, 2], "ranks")
    assert f.lookup is not None and f.lookup.code == "SLOW_RANK"


def test_a_partition_task_reads_one_rank(traces):
    parts = report.rank_partitions(traces["slow-rank"])
    rank, how, files = parts[2]
    trace = report.read_partition(how, files)
    assert (rank, how, len(files)) == (2, "table", 1)
    assert set(trace.table.column("rank").to_pylist()) == {2}
    whole = read_trace(traces["slow-rank"])
    assert 0 < trace.table.num_rows < whole.table.num_rows / 3
    partial = report.analyze_partition(parts[2], None, "all")
    assert partial.ranks == [2] and set(partial.summaries) == {"ranks", "links", "pipeline"}
    # The slow-rank summary is the rank's collective arrival table, not its events.
    assert len(partial.summaries["ranks"]["parts"]) < trace.table.num_rows / 20


def test_cli_analyze_dask_starts_and_closes_a_local_cluster(traces):
    path = str(traces["slow-rank"])
    local = runner.invoke(app, ["analyze", path, "--json"])
    dask = runner.invoke(app, ["analyze", path, "--json", "--engine", "dask", "--workers", "2"])
    assert local.exit_code == 0 and dask.exit_code == 0, local.output + dask.output
    assert dask.stdout == local.stdout
    doc = json.loads(dask.stdout)
    trace = read_trace(traces["slow-rank"])
    result = run(trace)
    report.predict_fixes(result, Frames(trace))  # the fixes replayed, as analyze does by default
    whole = report.findings_report(result)
    assert doc["findings"] == whole["findings"] and doc["skipped"] == whole["skipped"]
    assert sorted({f["code"] for f in doc["findings"]}) == ["BUBBLE_COLLECTIVE", "BUBBLE_COPY", "BUBBLE_DATA",
                                                            "BUBBLE_SYNC", "LAUNCH_BOUND", "LOW_OVERLAP", "SLOW_LINK",
                                                            "SLOW_RANK", "SYNC_STALL"]


def test_cli_report_on_a_scheduler_matches_the_local_report(traces, cluster, tmp_path):
    path = str(traces["per-rank"])
    a, b = tmp_path / "local.json", tmp_path / "dask.json"
    assert runner.invoke(app, ["report", path, "-o", str(a)]).exit_code == 0
    res = runner.invoke(app, ["report", path, "-o", str(b), "--engine", "dask", "--scheduler",
                              cluster.scheduler_address])
    assert res.exit_code == 0, res.output
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    assert db["findings"] == da["findings"] and db["skipped"] == da["skipped"]
    # Every figure, the metrics included: the report's pieces come from the partitions.
    assert plain(db) == plain(da)


def test_forced_progress_shows_partitions_done(traces, cluster):
    import io

    from rich.console import Console

    parts = report.rank_partitions(traces["slow-rank"])
    for engine, scheduler in (("local", None), ("dask", cluster.scheduler_address)):
        sink = io.StringIO()
        report.analyze(parts, ["ranks"], engine=engine, scheduler=scheduler, progress=True,
                       console=Console(file=sink, force_terminal=True, width=80))
        assert "analyze" in sink.getvalue() and "100%" in sink.getvalue()
    quiet = runner.invoke(app, ["analyze", str(traces["slow-rank"]), "--json"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_unknown_engine_is_one_line(traces):
    res = runner.invoke(app, ["analyze", str(traces["slow-rank"]), "--engine", "spark"])
    assert res.exit_code == 2
    assert res.stderr == "msprof-py: error: unknown analysis engine 'spark'; choose one of local, dask\n"


def test_missing_dask_extra_says_how_to_install_it(traces, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    res = runner.invoke(app, ["analyze", str(traces["slow-rank"]), "--engine", "dask"])
    assert res.exit_code == 2
    assert res.stderr == ("msprof-py: error: the Dask engine needs the dask extra: "
                          "pip install 'msprof-py[dask]'\n")


@pytest.mark.parametrize("address", ["not-an-address", "tcp://127.0.0.1"])
def test_bad_scheduler_address_is_one_line(traces, address):
    res = runner.invoke(app, ["analyze", str(traces["slow-rank"]), "--engine", "dask", "--scheduler", address])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"msprof-py: error: cannot connect to the Dask scheduler {address}: ")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.output
    assert res.stderr.endswith("(give its address as tcp://HOST:PORT)\n")


def test_scheduler_without_dask_engine_is_a_usage_error(traces):
    res = runner.invoke(app, ["analyze", str(traces["slow-rank"]), "--workers", "2"])
    assert res.exit_code == 2
    assert res.stderr == "msprof-py: error: --scheduler and --workers go with --engine dask\n"


def test_a_single_file_trace_is_split_by_rank_in_memory(traces, tmp_path):
    whole = read_trace(traces["slow-rank"])
    one = tmp_path / "one.parquet"
    write_trace(whole, one)
    assert report.rank_partitions(one) is None
    res = report.analyze(report.split_by_rank(read_trace(one)))
    assert [f.to_dict() for f in res.findings] == [f.to_dict() for f in run(whole).findings]


def test_communication_matrix_reduced_from_per_rank_summaries(traces):
    from msprof_py import communication
    from msprof_py.summaries import Rows

    whole = read_trace(traces["12-ranks"])
    expected = communication.summaries(Rows(whole))
    parts = [communication.summarize(Rows(t)) for t in report.split_by_rank(whole)]
    assert all(len(p["collectives"]) < t.table.num_rows / 20 for p, t in zip(parts, report.split_by_rank(whole)))
    got = communication.reduce(parts, Rows(whole).topology, int(whole.meta.origin_ns or 0))
    assert json.dumps(got) == json.dumps(expected)  # same content, same key order
    assert sorted(expected[0], key=int) == [str(r) for r in range(12)]


def test_without_a_preset_copies_are_judged_against_every_ranks_reference(tmp_path, cluster):
    from msprof_py.trace.schema import TraceMeta, build_table

    ms = 1_000_000
    # Rank 0's 2 MiB copies ran alone (the reference: ~42 GB/s); rank 1's two 4 MiB copies shared
    # HBM and took 200 us against 100 us alone. Only rank 0 has reference copies: a partition
    # judged by its own copies alone would find nothing on rank 1.
    rows = [(0, 1, 5 * ms + i * ms, 50_000, 2 << 20) for i in range(3)]
    rows += [(1, 2, 1 * ms, 200_000, 4 << 20), (1, 3, 1 * ms, 200_000, 4 << 20)]
    rows += [(r, 9, 0, 10_000, None) for r in (0, 1)]  # a kernel per rank
    n = len(rows)
    cols = {"rank": [r[0] for r in rows], "ph": ["X"] * n,
            "name": ["Memcpy DtoD" if r[4] else "k" for r in rows], "cat": [None] * n,
            "ts": [r[2] for r in rows], "dur": [r[3] for r in rows], "pid": [r[0] for r in rows],
            "tid": [r[1] for r in rows], "id": [None] * n, "args": [None] * n, "extra": [None] * n,
            "kind": ["memcpy" if r[4] else "kernel" for r in rows], "device": [r[0] for r in rows],
            "stream": [r[1] for r in rows], "corr": [None] * n, "bytes": [r[4] for r in rows],
            "addr": [None] * n, "value": [None] * n, "step": [None] * n}
    write_trace(build_table(cols, TraceMeta(source_format="chrome")), tmp_path / "t", partition_by_rank=True)
    whole = run(read_trace(tmp_path / "t"), ["bandwidth"])
    assert [(f.code, f.rank, f.lost_ns) for f in whole.findings] == [("BANDWIDTH_CONTENTION", 1, 100_000)]
    parts = report.rank_partitions(tmp_path / "t")
    for engine, scheduler in (("local", None), ("dask", cluster.scheduler_address)):
        res = report.analyze(parts, ["bandwidth"], engine=engine, scheduler=scheduler)
        assert [f.to_dict() for f in res.findings] == [f.to_dict() for f in whole.findings]
        assert plain(res.metrics) == plain(whole.metrics)


def _whole_cluster(trace):
    """The cluster analyses of a trace loaded whole, computed without the partitioned driver."""
    from analyzers import Frames
    from analyzers.causality import pipeline
    from analyzers.cluster import report as cluster_report
    from msprof_py import communication
    from msprof_py.summaries import Rows, cluster_step_table

    comm, matrix = communication.summaries(Rows(trace))
    steps = cluster_step_table(trace)
    frames = Frames(trace)
    return {"steps": steps.to_dict("records"), **cluster_report(frames, matrix),
            "communication_time": communication.op_time_split(comm),
            "pipeline": pipeline.view_cells(pipeline.view(pipeline.own_transfers(frames)))}


@pytest.mark.parametrize("case", ["slow-rank", "12-ranks", "pipeline"])
def test_cluster_analyses_by_partition_on_both_engines_are_the_whole_trace_s(traces, cluster, case):
    from msprof_py import cluster as cluster_analyses

    whole = plain(_whole_cluster(read_trace(traces[case])))
    parts = report.rank_partitions(traces[case])
    local = cluster_analyses.analyze(parts, engine="local")
    on_dask = cluster_analyses.analyze(parts, engine="dask", scheduler=cluster.scheduler_address)
    assert plain(local) == whole
    assert plain(on_dask) == whole
    # The injected straggler is the slow rank either way.
    assert [r["rank"] for r in local["slow_ranks"]][:1] == {"slow-rank": [3], "12-ranks": [9], "pipeline": []}[case]
    assert (len(local["pipeline"]) == 24) == (case == "pipeline")
    assert len(local["steps"]) == CASES[case][2]["ranks"] * CASES[case][2]["steps"]
