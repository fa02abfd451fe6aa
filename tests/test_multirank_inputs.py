"""A multi-rank job from per-rank inputs: several traces, a folder of per-rank Kineto files, a folder
of torch_npu `*_ascend_pt` folders, and a folder holding torch_npu's summaries beside trace_view.json.

Each trace's rank is the one the trace states (Kineto `distributedInfo.rank`, torch_npu
`profiler_info_N.json`, HCCL's "src rank"); two inputs that hold the same rank are one line and
exit 2, with nothing written. The traces: shared/real_traces/kineto/dlrm_8rank (8 ranks of one DLRM
step, 50 KB each) and shared/real_traces/ascend/resnet_2rank_level1_text (2 torch_npu rank folders).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from dashboard.data import load_trace
from msprof_py import report
from msprof_py.cli import app
from msprof_py.errors import MsprofError
from msprof_py.loading import input_bytes, load_any, table_path, trace_inputs
from msprof_py.trace import import_trace
from msprof_py.trace.parquet import read_trace
from tests.conftest import REAL_TRACES

DLRM = REAL_TRACES / "kineto" / "dlrm_8rank"
NPU = REAL_TRACES / "ascend" / "resnet_2rank_level1_text"
ASCEND = REAL_TRACES / "ascend"
runner = CliRunner()


def dlrm(rank: int) -> Path:
    return next(DLRM.glob(f"worker{rank}_*.pt.trace.json.gz"))


def ranks(trace) -> list[int]:
    return sorted(set(trace.table.column("rank").to_pylist()))


def rank_rows(trace, rank: int) -> dict[str, list]:
    """One rank's rows, column by column (values: the dictionary encoding of a table does not count)."""
    t = trace.table.filter(pc.equal(trace.table.column("rank"), rank))
    return {name: t.column(name).to_pylist() for name in t.column_names}


def alone(path: Path, job) -> dict[str, list]:
    """The rows of the trace at `path` imported alone, with ts on the job's clock."""
    trace = load_any(path)
    rows = {name: trace.table.column(name).to_pylist() for name in trace.table.column_names}
    shift = trace.meta.origin_ns - job.meta.origin_ns
    rows["ts"] = [ts + shift for ts in rows["ts"]]
    return rows


def one_line_error(argv: list[str]) -> str:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    assert result.stderr.splitlines() == [result.stderr.strip()]
    return result.stderr.strip()


# ---------------------------------------------------------------- a folder of per-rank Kineto files

def test_a_folder_of_kineto_files_is_the_job_each_rank_as_its_file_alone():
    job = load_any(DLRM)
    assert ranks(job) == list(range(8))
    assert job.meta.world_size == 8 and job.meta.source_format == "kineto"
    origins = []
    for rank in range(8):
        want = alone(dlrm(rank), job)
        got = rank_rows(job, rank)
        assert len(got["ts"]) == len(want["ts"]) == {0: 3290, 1: 3424, 2: 3268, 3: 3474, 4: 3310, 5: 3250,
                                                     6: 3272, 7: 3250}[rank]
        assert got == want  # every column, the step column per rank included
        assert set(got["step"]) - {None} == {10}
        origins.append(load_any(dlrm(rank)).meta.origin_ns)
    # Time 0 is the earliest rank's start: rank 1 began first.
    assert job.meta.origin_ns == min(origins) == origins[1] == 1694128201421058000
    assert len(job) == 26538


def test_import_of_the_folder_or_of_the_files_in_any_order_writes_one_rank_partitioned_table(tmp_path):
    whole = load_any(DLRM)
    out = tmp_path / "job"
    result = runner.invoke(app, ["import", str(DLRM), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 26538 events of 8 ranks (0..7) from 8 traces to {out}\n"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet")) == \
        [f"rank={r}/part-0.parquet" for r in range(8)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]  # nothing set aside is left
    written = read_trace(out)
    assert written.table.equals(whole.table) and written.meta == whole.meta

    files = [str(dlrm(r)) for r in range(8)]
    random.Random(3).shuffle(files)
    result = runner.invoke(app, ["import", *files, "-o", str(tmp_path / "again")])
    assert result.exit_code == 0, result.output
    assert read_trace(tmp_path / "again").table.equals(whole.table)
    # One file holds every rank too.
    result = runner.invoke(app, ["import", *files[:3], "-o", str(tmp_path / "three.parquet")])
    assert result.exit_code == 0, result.output
    three = read_trace(tmp_path / "three.parquet")
    assert ranks(three) == sorted(int(Path(f).name[6]) for f in files[:3])
    for rank in ranks(three):
        assert rank_rows(three, rank) == alone(dlrm(rank), three)


def test_a_job_table_is_read_back_rank_by_rank_by_info_and_sql(tmp_path):
    out = tmp_path / "job"
    assert runner.invoke(app, ["import", str(dlrm(2)), str(dlrm(5)), "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["info", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ranks"] == [2, 5]
    result = runner.invoke(app, ["sql", str(out), "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank",
                                 "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["rank,n", "2,3268", "5,3250"]


def test_the_folder_is_one_input_for_every_command():
    result = runner.invoke(app, ["info", str(DLRM), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["ranks"] == list(range(8)) and info["world_size"] == 8 and info["events"] == 26538
    assert input_bytes(DLRM) == sum(f.stat().st_size for f in DLRM.iterdir())
    # Not a rank-partitioned table: the engine gets the job loaded whole and split by rank.
    assert table_path(DLRM) == DLRM and report.rank_partitions(DLRM) is None
    assert ranks(load_trace(DLRM)) == list(range(8))  # the dashboard's loader


def test_analyze_on_the_folder_sees_the_job_across_ranks():
    result = runner.invoke(app, ["analyze", str(DLRM), "--json"])
    assert result.exit_code == 0, result.output
    findings = json.loads(result.stdout)["findings"]
    assert {r for f in findings for r in [f["rank"], *f["ranks"]]} == set(range(8))
    # The ranks' collectives line up only on one clock: rank 7 is the one the others wait for.
    slow = [f for f in findings if f["code"] == "SLOW_RANK"]
    assert [f["rank"] for f in slow] == [7]
    assert slow[0]["message"].startswith("rank 7 arrived last at 4 of 8 matched collectives")


def test_side_files_in_a_kineto_folder_are_not_traces(tmp_path):
    for rank in (0, 3):
        shutil.copy(dlrm(rank), tmp_path)
    shutil.copy(ASCEND / "cluster_communication.json", tmp_path)
    (tmp_path / "profiler_metadata.json").write_text("{}")
    assert [p.name for p in trace_inputs(tmp_path)] == [dlrm(0).name, dlrm(3).name]
    assert ranks(load_any(tmp_path)) == [0, 3]


# ---------------------------------------------------------------- a folder of torch_npu rank folders

def test_a_folder_of_ascend_pt_folders_is_the_job_of_their_ranks(tmp_path):
    assert trace_inputs(NPU) == [NPU / f"rank{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
                                 for r in (0, 1)]
    job = load_any(NPU)
    assert ranks(job) == [0, 1]
    for rank in (0, 1):
        view = NPU / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
        want = import_trace(view)
        assert ranks(want) == [rank]  # from its profiler_info_N.json
        assert len(rank_rows(job, rank)["ts"]) == len(want) == {0: 10112, 1: 9969}[rank]
    out = tmp_path / "npu"
    result = runner.invoke(app, ["import", str(NPU), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 20081 events of 2 ranks (0, 1) from 2 traces to {out}\n"
    assert sorted(p.name for p in out.iterdir()) == ["rank=0", "rank=1"]
    assert read_trace(out).table.equals(job.table)
    result = runner.invoke(app, ["info", str(NPU), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ranks"] == [0, 1]


def test_report_on_the_torch_npu_folder(tmp_path):
    result = runner.invoke(app, ["report", str(NPU), "-o", str(tmp_path / "r.json"), "--no-what-if"])
    assert result.exit_code == 0, result.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert {f["rank"] for f in rep["findings"]} == {0, 1}


# ---------------------------------------------------------------- the same rank twice

def test_two_inputs_of_the_same_rank_are_one_line_and_nothing_is_written(tmp_path):
    copy = tmp_path / "rank0_again.json.gz"
    shutil.copy(dlrm(0), copy)
    out = tmp_path / "job"
    line = one_line_error(["import", str(dlrm(0)), str(dlrm(1)), str(copy), "-o", str(out)])
    assert line == (f"msprof-py: error: {dlrm(0)} and {copy} both hold rank 0 (give one trace per rank: a trace's "
                    "rank is read from the trace itself, from Kineto's distributedInfo.rank, torch_npu's "
                    "profiler_info_N.json or HCCL's src rank)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [copy.name]  # no output, nothing set aside
    # An old table at the output stays as it was.
    assert runner.invoke(app, ["import", str(dlrm(4)), "-o", str(out)]).exit_code == 0
    one_line_error(["import", str(dlrm(0)), str(copy), "-o", str(out)])
    assert ranks(read_trace(out)) == [4]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([copy.name, "job"])
    # A folder with two files of one rank: the same line, from every command.
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(dlrm(0), folder)
    shutil.copy(copy, folder)
    line = one_line_error(["info", str(folder)])
    assert line.startswith(f"msprof-py: error: {folder / copy.name} and {folder / dlrm(0).name} both hold rank 0 (")
    assert one_line_error(["analyze", str(folder)]) == line
    with pytest.raises(MsprofError, match="both hold rank 0"):
        load_trace(folder)


def test_one_file_given_twice_and_traces_of_other_jobs_are_refused(tmp_path):
    line = one_line_error(["import", str(dlrm(0)), str(dlrm(0)), "-o", str(tmp_path / "job")])
    assert line == f"msprof-py: error: {dlrm(0)}: given twice (give each rank's trace once)"
    other = REAL_TRACES / "kineto" / "sampled_128rank_rank1.json.gz"  # rank 1 of a 128-rank job
    line = one_line_error(["import", str(dlrm(0)), str(other), "-o", str(tmp_path / "job")])
    assert line == (f"msprof-py: error: {dlrm(0)} states world size 8 and {other} 128: they are not one job "
                    "(give the per-rank traces of one job)")
    missing = tmp_path / "rank9.json"
    line = one_line_error(["import", str(dlrm(0)), str(missing), "-o", str(tmp_path / "job")])
    assert line == f"msprof-py: error: {missing}: no such file or directory"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- torch_npu's summaries beside trace_view.json

def test_a_folder_of_summaries_beside_trace_view_json_reads_the_timeline(tmp_path):
    output = NPU / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    shutil.copy(output / "trace_view.json", tmp_path)
    shutil.copy(output / "kernel_details.csv", tmp_path)
    for name in ("cluster_step_trace_time.csv", "cluster_communication.json"):
        shutil.copy(ASCEND / name, tmp_path)
    assert trace_inputs(tmp_path) == [tmp_path / "trace_view.json"]
    trace = load_any(tmp_path)
    assert trace.equals(import_trace(tmp_path / "trace_view.json"))
    assert ranks(trace) == [1] and len(trace) == 9969  # outside its rank folder: rank from HCCL's src rank
    result = runner.invoke(app, ["info", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ranks"] == [1]
    # The summaries alone stay refused: each file, and the folder without its timeline.
    for name in ("kernel_details.csv", "cluster_step_trace_time.csv", "cluster_communication.json"):
        assert "a summary table, not a timeline" in one_line_error(["info", str(tmp_path / name)])
    (tmp_path / "trace_view.json").unlink()
    assert one_line_error(["info", str(tmp_path)]) == (
        f"msprof-py: error: {tmp_path}: holds torch_npu / msprof-analyze summaries (cluster_communication.json, "
        "cluster_step_trace_time.csv, kernel_details.csv) but no timeline beside them (msprof-py reads the "
        "timeline: put the trace_view.json torch_npu wrote with them in this folder, or give the *_ascend_pt "
        "folder it is in)")


def test_sql_on_a_folder_of_per_rank_traces_says_to_import_them_first():
    # SQL runs over one Parquet table; a job's folder is several JSON traces.
    assert one_line_error(["sql", str(DLRM), "select count(*) from trace"]) == (
        f"msprof-py: error: {DLRM}: sql reads Parquet trace tables; this folder holds 8 per-rank traces "
        f"(import them first: msprof-py import {DLRM} -o JOB/)")
