"""`msprof-py emulate --stream / --export off / --ground-truth off`: the options that let a long
cluster run write its trace as it goes without its memory growing with its length. A streamed
run's PROF dir must hold exactly the table the in-memory run writes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from msprof_py import prof_dir
from msprof_py.cli import app
from msprof_py.trace import read_trace
from runtime_emu import scenarios

runner = CliRunner()
BASE = ["emulate", "bert-train-dp", "--ranks", "4", "--steps", "2"]


def run(out: Path, *args: str):
    result = runner.invoke(app, [*BASE, *args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    [prof] = prof_dir.prof_dirs(out)
    return prof, result


def files(prof: Path) -> list[str]:
    """The PROF dir's files, the export time stamps blanked."""
    out = []
    for f in sorted(prof.rglob("*")):
        if f.is_file():
            rel = f.relative_to(prof).as_posix()
            out.append(rel.rsplit("_", 1)[0] + "_STAMP.csv" if rel.endswith(".csv") else
                       "mindstudio_profiler_output/msprof_STAMP.json" if "/msprof_" in rel else rel)
    return out


def test_a_streamed_run_writes_the_prof_dir_the_in_memory_run_writes(tmp_path: Path):
    whole, _ = run(tmp_path / "whole")
    streamed, _ = run(tmp_path / "streamed", "--stream")
    assert files(streamed) == files(whole)
    assert ".staging" not in {p.name for p in streamed.iterdir()}
    a, b = prof_dir.read_raw(whole), prof_dir.read_raw(streamed)
    assert len(a.table) == 12_912
    assert b.table.equals(a.table) and b.meta == a.meta
    # Per rank, the host and device parts are the same rows too (one file per rank and side).
    parts = sorted(whole.glob("*/data/rank=*/part-0.parquet"))
    assert len(parts) == 8
    for part in parts:
        rel = part.relative_to(whole)
        assert read_trace(streamed / rel).table.equals(read_trace(part).table), rel
    sa, sb = prof_dir.read_status(whole), prof_dir.read_status(streamed)
    assert sb["summary"] == sa["summary"] == {"events": 12_852, "ranks": 4, "devices": 4, "steps": 2,
                                              "span_ns": 28_757_883}
    assert sb["status"] == "complete"
    assert sb["command"] == "emulate bert-train-dp --seed 0 --steps 2 --ranks 4 --stream"
    assert json.loads((streamed / "ground_truth.json").read_text()) == \
        json.loads((whole / "ground_truth.json").read_text())


def test_export_off_writes_the_raw_data_and_says_how_to_export_later(tmp_path: Path):
    prof, result = run(tmp_path, "--stream", "--export", "off")
    assert not (prof / prof_dir.EXPORT_DIR).exists()
    assert sorted(p.name for p in prof.iterdir()) == ["README.txt", "device_0", "device_1", "device_2", "device_3",
                                                     "ground_truth.json", "host", "status.json"]
    assert f"--export=on --output={prof} writes them" in result.stderr
    assert prof_dir.read_status(prof)["command"].endswith("--stream --export off")
    # ... and the later export writes what the run would have.
    written = prof_dir.export(prof)
    # The 10 summaries and the timeline, and (4 ranks: a job) cluster_step_trace_time.csv.
    assert len(written) == 12 and "cluster_step_trace_time.csv" in {p.name for p in written}


def test_ground_truth_off_keeps_none_and_the_trace_is_unchanged(tmp_path: Path):
    on = scenarios.run("bert-train-dp", ranks=4, steps=2)
    spec = scenarios.get("bert-train-dp")
    cfg = scenarios.configure(spec, [], ranks=4, steps=2)
    off = scenarios.run_configured(spec, cfg, ground_truth=False)
    assert off.trace.table.equals(on.trace.table)
    assert off.ground_truth["tasks"]["corr"] == [] and off.ground_truth["host_blocks"]["rank"] == []
    assert off.ground_truth["hccl"]["collectives"] == []
    assert len(on.ground_truth["tasks"]["corr"]) == 1_928 and len(on.ground_truth["hccl"]["collectives"]) == 10
    prof, _ = run(tmp_path, "--ground-truth", "off")
    assert not (prof / "ground_truth.json").exists()


def test_ground_truth_off_with_a_problem_is_one_line_and_exit_2(tmp_path: Path):
    result = runner.invoke(app, [*BASE, "--switch", "slow-rank", "--ground-truth", "off", "--output", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "msprof-py: error: --ground-truth off cannot be used with --switch: injected problems are described from "
        "the ground truth (drop the --switch options or keep --ground-truth on)"]
    assert not list(tmp_path.iterdir()), "nothing written"


def test_an_unknown_on_off_value_is_one_line_and_exit_2(tmp_path: Path):
    for option in ("--export", "--ground-truth"):
        result = runner.invoke(app, [*BASE, option, "maybe", "--output", str(tmp_path)])
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        assert line == f"msprof-py: error: unknown {option} value 'maybe'; choose one of on, off"
