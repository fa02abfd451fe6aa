"""torch_npu output as torch_npu writes it: the `*_ascend_pt` folder, its rank, its HCCL ops.

The job in shared/real_traces/ascend/resnet_2rank_level1_text ran on 2 ranks; each rank's folder
holds profiler_info_N.json (the rank) and ASCEND_PROFILER_OUTPUT/trace_view.json (the timeline).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.errors import MsprofError
from msprof_py.loading import load_any
from msprof_py.trace import import_bytes, import_trace
from tests.conftest import REAL_TRACES

TEXT = REAL_TRACES / "ascend" / "resnet_2rank_level1_text"
DB = REAL_TRACES / "ascend" / "resnet_2rank_level1_db"
runner = CliRunner()


def folder(rank: int) -> Path:
    return TEXT / f"rank{rank}_ascend_pt"


def view(rank: int) -> Path:
    return folder(rank) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"


def ranks(trace) -> set[int]:
    return set(trace.table.column("rank").to_pylist())


# ---------------------------------------------------------------- the rank

@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_folder_imports_as_its_rank(rank):
    assert ranks(import_trace(view(rank))) == {rank}


def test_profiler_info_says_the_rank_before_hccl(tmp_path):
    # The profiler's own record of the rank wins over what the HCCL tasks suggest.
    copy = tmp_path / "rank5_ascend_pt"
    shutil.copytree(folder(1), copy)
    info = json.loads((copy / "profiler_info_1.json").read_text())
    (copy / "profiler_info_1.json").unlink()
    (copy / "profiler_info_5.json").write_text(json.dumps({**info, "rank_id": 5}))
    assert ranks(import_trace(copy / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")) == {5}
    # A rank_id of -1 (a run torch_npu saw as not distributed) leaves the file's N.
    (copy / "profiler_info_5.json").write_text(json.dumps({**info, "rank_id": -1}))
    assert ranks(import_trace(copy / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")) == {5}


def test_without_its_folder_the_rank_comes_from_hccl_src_rank(tmp_path):
    alone = tmp_path / "trace_view.json"
    shutil.copy(view(1), alone)
    assert ranks(import_trace(alone)) == {1}
    assert ranks(import_bytes(view(1).read_bytes())) == {1}
    # No HCCL rows, no profiler_info: rank 0, as before.
    assert ranks(import_trace(REAL_TRACES / "ascend" / "torch_npu_trace_view.json.gz")) == {0}


# ---------------------------------------------------------------- HCCL ops and their stream

@pytest.mark.parametrize("rank", [0, 1])
def test_hccl_ops_run_on_the_stream_of_their_hardware_tasks(rank):
    df = import_trace(view(rank)).to_pandas()
    hccl_pid = df.loc[(df["name"] == "process_name") & df["args"].str.contains('"HCCL"'), "pid"].iloc[0]
    ops = df[(df["pid"] == hccl_pid) & df["name"].str.startswith("hcom_")]
    assert len(ops) == 4 and (ops["kind"] == "collective").all()
    assert ops["stream"].tolist() == [4, 4, 4, 4]
    # Stream 4 is where their SDMA / Notify Wait / Write Value tasks ran on the Ascend Hardware.
    hw = df[(df["stream"] == 4) & (df["pid"] != hccl_pid) & (df["ph"] == "X")]
    assert set(hw["name"]) == {"SDMA", "Notify Wait", "Write Value", "EVENT_RECORD", "EVENT_WAIT"}
    # The HCCL task rows (Plane threads) repeat those tasks: they keep no stream, or they'd count twice.
    planes = df[(df["pid"] == hccl_pid) & (df["ph"] == "X") & ~df["name"].str.startswith("hcom_")]
    assert len(planes) == 296 and planes["stream"].isna().all()


def test_an_hccl_op_without_matching_hardware_tasks_takes_its_task_rows_stream():
    df = import_trace(Path(__file__).parent / "data" / "ids_beyond_64_bits_torch_npu.json").to_pandas()
    op = df[df["name"] == "hcom_allReduce__586_0_1"]
    assert op["stream"].tolist() == [4]
    assert df.loc[df["name"].isin(["Notify_Wait", "Memcpy"]), "stream"].isna().all()


# ---------------------------------------------------------------- launch -> task links

@pytest.mark.parametrize("rank", [0, 1])
def test_every_host_to_device_flow_links_its_own_launch_and_task(rank):
    df = import_trace(view(rank)).to_pandas()
    launches = df[df["kind"] == "launch"].dropna(subset=["corr"])
    # Before: the 187 flows with ids beyond 2**64 gave 187 launches and their tasks one corr, 0.
    assert len(launches) == 205 and launches["corr"].is_unique and (launches["corr"] != 0).all()
    # A task's corr is its launch's, or that of the aclopCompileAndExecute call (op_compile) that launched it.
    compiles = df[(df["kind"] == "op_compile") & df["corr"].notna()]
    tasks = df[df["kind"].isin(["kernel", "memcpy", "memset", "collective"]) & df["corr"].notna()]
    assert set(tasks["corr"]) <= set(launches["corr"]) | set(compiles["corr"])
    assert len(tasks) == 211
    # Only the 5 op_compile calls have two tasks each (two MEMCPY_ASYNC); every launch has its own.
    shared = tasks[tasks["corr"].duplicated(keep=False)]
    assert len(shared) == 10 and set(shared["corr"]) <= set(compiles["corr"])


# ---------------------------------------------------------------- the folder as a trace path

@pytest.mark.parametrize("given", ["rank1_ascend_pt", "rank1_ascend_pt/ASCEND_PROFILER_OUTPUT"])
def test_a_rank_folder_is_a_trace_path(given):
    want = import_trace(view(1))
    assert import_trace(TEXT / given).equals(want)
    assert load_any(TEXT / given).equals(want)


def test_cli_takes_the_rank_folder(tmp_path):
    result = runner.invoke(app, ["info", str(folder(1))])
    assert result.exit_code == 0, result.output
    assert "ranks:          1 (1)" in result.stdout
    result = runner.invoke(app, ["import", str(folder(1)), "-o", str(tmp_path / "r1.parquet")])
    assert result.exit_code == 0, result.output
    assert ranks(load_any(tmp_path / "r1.parquet")) == {1}
    result = runner.invoke(app, ["analyze", str(folder(0)), "--json"])
    assert result.exit_code == 0, result.output


# A folder of rank folders is one job (tests/test_multirank_inputs.py): its first rank folder
# without a timeline is the error.
@pytest.mark.parametrize("given, where, says", [
    (DB / "rank1_ascend_pt", DB / "rank1_ascend_pt", "a torch_npu output folder exported as a database (analysis.db, "
                                                     "ascend_pytorch_profiler_1.db), with no ASCEND_PROFILER_OUTPUT/trace_view.json"),
    (DB, DB / "rank0_ascend_pt", "a torch_npu output folder exported as a database (analysis.db, "
                                 "ascend_pytorch_profiler_0.db), with no ASCEND_PROFILER_OUTPUT/trace_view.json"),
])
def test_a_torch_npu_folder_without_a_timeline_is_one_line(given, where, says, tmp_path):
    out = tmp_path / "out.parquet"
    for argv in (["info", str(given)], ["import", str(given), "-o", str(out)]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and "Traceback" not in result.output
        assert result.stderr.splitlines() == [result.stderr.strip()]
        assert result.stderr.startswith(f"msprof-py: error: {where}: {says}")
    assert not out.exists()


def test_an_unparsed_rank_folder_says_to_parse_it(tmp_path):
    raw = tmp_path / "host_123_20250109_ascend_pt"
    (raw / "PROF_000001_20250109165203456_ABCDEFGHIJKLMNOP").mkdir(parents=True)
    with pytest.raises(MsprofError, match="not parsed yet") as err:
        load_any(raw)
    assert "torch_npu.profiler.profiler.analyse" in err.value.one_line()


def test_a_directory_that_is_neither_keeps_its_old_error(tmp_path):
    with pytest.raises(MsprofError, match=r"no rank=\*/\*\.parquet partitions"):
        load_any(tmp_path)
