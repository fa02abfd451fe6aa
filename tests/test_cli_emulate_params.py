"""`msprof-py emulate`'s typed scenario parameters, `--list` / `SCENARIO --help`, `--version` and
the pure-core warning: a command-line value means what the scenario declares (`False` is the
boolean), and every mistake is one line and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import runtime_emu
import simcore._loader
from msprof_py import __version__, capture, prof_dir
from msprof_py.cli import app
from msprof_py.trace import chrome, native
from runtime_emu import _loader, scenarios, tables

runner = CliRunner()


def emulate(tmp_path: Path, *args: str):
    return runner.invoke(app, ["emulate", *args, "--output", str(tmp_path)])


def only_run(out: Path) -> Path:
    [prof] = prof_dir.prof_dirs(out)
    return prof


def device_streams(table: pa.Table) -> set[int]:
    df = table.to_pandas()
    return set(df[df["kind"] == "kernel"]["stream"].dropna().astype(int))


def rows(table: pa.Table) -> pd.DataFrame:
    """A table's rows as a sorted plain frame: a PROF dir stores them in its own order."""
    df = table.to_pandas()
    df = df.astype(object).where(df.notna(), None).astype(str)
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------------- booleans
@pytest.mark.parametrize("text, value", [("False", False), ("no", False), ("0", False), ("true", True),
                                         ("YES", True), ("1", True)])
def test_boolean_parameters_accept_true_false_yes_no_1_0_in_any_case(tmp_path: Path, text: str, value: bool):
    result = emulate(tmp_path, "yolo-pipeline", "--steps", "2", "--param", f"triple_buffer={text}")
    assert result.exit_code == 0, result.output
    prof = only_run(tmp_path)
    assert f"--param triple_buffer={str(value).lower()}" in prof_dir.read_status(prof)["command"]
    # Triple buffering runs the model, the input and the output copies on three streams; without it, one.
    assert len(device_streams(prof_dir.read_raw(prof).table)) == (2 if value else 1)


def test_a_value_that_is_no_boolean_is_one_line_and_exit_2(tmp_path: Path):
    line = one_error_line(emulate(tmp_path, "yolo-pipeline", "--param", "triple_buffer=maybe"))
    assert line == "msprof-py: error: triple_buffer must be true or false (or yes/no, 1/0), got 'maybe'"
    assert not prof_dir.prof_dirs(tmp_path)


def test_triple_buffer_false_on_the_command_line_is_the_serial_schedule_of_the_python_api(tmp_path: Path):
    result = emulate(tmp_path, "yolo-pipeline", "--param", "triple_buffer=False")
    assert result.exit_code == 0, result.output
    got = prof_dir.read_raw(only_run(tmp_path)).table
    serial = scenarios.run("yolo-pipeline", triple_buffer=False).trace.table
    healthy = scenarios.run("yolo-pipeline").trace.table
    assert rows(got).equals(rows(serial))
    assert got.num_rows != healthy.num_rows and device_streams(got) != device_streams(healthy)


# ---------------------------------------------------------------------- other types and names
def test_an_unknown_parameter_lists_the_known_ones(tmp_path: Path):
    line = one_error_line(emulate(tmp_path, "yolo-pipeline", "--param", "triple_bufer=false"))
    assert line == ("msprof-py: error: unknown parameter 'triple_bufer' for scenario 'yolo-pipeline'; "
                    "choose from preset, triple_buffer")
    line = one_error_line(emulate(tmp_path, "llm-train", "--param", "nodes=8"))
    assert line == ("msprof-py: error: unknown parameter 'nodes' for scenario 'llm-train-2server'; "
                    "choose from batch, layers, preset, problem_rank, roce_over_pcie, servers, zero")


@pytest.mark.parametrize("param, message", [
    ("batch=x", "batch must be an integer, got 'x'"),
    ("batch=0", "batch must be >= 1, got 0"),
    ("intra=nvlink", "intra must be 'hccs' or 'pcie' (or auto), got 'nvlink'"),
    ("layers", "--param 'layers': expected NAME=VALUE"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path: Path, param: str, message: str):
    assert one_error_line(emulate(tmp_path, "bert-train-dp", "--param", param)) == f"msprof-py: error: {message}"


def test_the_python_api_rejects_a_value_of_the_wrong_type():
    with pytest.raises(ValueError, match=r"^triple_buffer must be true or false, got 'False'$"):
        scenarios.run("yolo-pipeline", triple_buffer="False")


def test_optional_parameters_take_auto(tmp_path: Path):
    spec = scenarios.get("bert-train-dp")
    assert scenarios.parse_params(spec, {"intra": "AUTO", "layers": "2"}) == {"intra": None, "layers": 2}
    assert [spec.params["intra"].text(v) for v in (None, "pcie")] == ["auto", "pcie"]


# ---------------------------------------------------------------------- --ranks
def test_ranks_3_on_bert_runs_when_no_problem_is_asked_for(tmp_path: Path):
    result = emulate(tmp_path, "bert-train-dp", "--ranks", "3", "--steps", "1", "--param", "layers=1")
    assert result.exit_code == 0, result.output
    assert prof_dir.read_status(only_run(tmp_path))["summary"]["ranks"] == 3


def test_the_default_problem_rank_follows_the_world_size_and_a_given_one_is_checked(tmp_path: Path):
    result = emulate(tmp_path, "bert-train-dp", "--ranks", "3", "--steps", "1", "--param", "layers=1",
                     "--switch", "slow-rank")
    assert result.exit_code == 0, result.output
    truth = json.loads((only_run(tmp_path) / "ground_truth.json").read_text())
    assert {p["where"]["rank"] for p in truth["problems"]} == {2}
    line = one_error_line(emulate(tmp_path, "bert-train-dp", "--ranks", "3", "--param", "problem_rank=3"))
    assert line == "msprof-py: error: problem_rank must be 0..2, got 3"
    # The defaults as they were: rank 3 of 8, rank 3 of server 1 (11) of 2 x 8.
    assert scenarios.configure(scenarios.get("bert-train-dp"), [])["problem_rank"] == 3
    assert scenarios.configure(scenarios.get("llm-train-2server"), [])["problem_rank"] == 11


def test_llm_train_takes_the_server_count_and_defaults_to_8_npus_each():
    cfg = scenarios.configure(scenarios.get("llm-train"), [], params={"servers": 8})
    assert (cfg.scenario, cfg.ranks, cfg["servers"], cfg["problem_rank"]) == ("llm-train-2server", 64, 8, 11)
    with pytest.raises(ValueError, match="multiple of 8 servers"):
        scenarios.configure(scenarios.get("llm-train"), [], ranks=60, params={"servers": 8})


def test_64_ranks_over_8_servers_is_one_command(tmp_path: Path):
    result = emulate(tmp_path, "llm-train", "--ranks", "64", "--param", "servers=8", "--steps", "1",
                     "--param", "layers=1")
    assert result.exit_code == 0, result.output
    df = prof_dir.read_raw(only_run(tmp_path)).table.to_pandas()
    assert df["rank"].nunique() == 64 and set(df["device"].dropna().astype(int)) == set(range(8))
    # Eight servers of eight: HCCS only inside a server, a RoCE NIC on every rank.
    names = set(df[df["kind"] == "counter"]["name"].astype(str))
    hccs = {n for n in names if n.endswith(".hccs GB/s")}
    assert hccs == {f"r{a}->r{b}.hccs GB/s" for a in range(64) for b in range(64) if a != b and a // 8 == b // 8}
    assert {f"r{r}.roce_tx GB/s" for r in range(64)} <= names


# ---------------------------------------------------------------------- --list / --help
def test_list_shows_every_scenario_with_its_parameters_and_switches():
    result = runner.invoke(app, ["emulate", "--list"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for spec in scenarios.list_scenarios():
        assert f"\n{spec.name}" in f"\n{out}"
        for name in scenarios.all_params(spec):
            assert f"    {name} " in out
    assert "llm-train-2server (also llm-train): 16 ranks, 3 steps by default" in out
    assert "    servers         int        default 2       servers joined by RoCE" in out
    one = runner.invoke(app, ["emulate", "resnet50-infer", "--list"]).stdout
    assert one.startswith("resnet50-infer: 1 rank, 4 steps by default\n") and "yolo" not in one


def test_scenario_help_shows_its_parameters_and_switches():
    result = runner.invoke(app, ["emulate", "yolo-pipeline", "--help"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "--param" in out  # the command's own help comes first
    assert "yolo-pipeline: 1 rank, 6 steps by default" in out
    assert "    triple_buffer  bool  default true    three buffer slots" in out
    assert "  switches (--switch NAME, repeatable):" in out and "    missing-sync          the cross-stream" in out
    generic = runner.invoke(app, ["emulate", "--help"]).stdout
    assert "scenarios: bert-train-dp, llm-pipeline, llm-train-2server, resnet50-infer, yolo-pipeline" in generic


# ---------------------------------------------------------------------- --version, the pure-core warning
def test_version_says_which_emulator_core_runs():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    core = "compiled" if runtime_emu.COMPILED else f"pure Python; {simcore._loader.pure_reason}"
    scanner = "native scanner" if chrome._scan is not None else f"msgspec; {native.reason}"
    build = "native" if tables.native_module() is not None else \
        "Arrow; native build not compiled, reinstall with a C compiler"
    kernels = "native" if _loader.native("_core") is not None else \
        "Python; native core not compiled, reinstall with a C compiler"
    assert result.stdout == f"msprof-py {__version__} (emulator core: {core}; engine and kernels: {kernels}; " \
                            f"trace build: {build}; JSON import: {scanner})\n"


def test_version_with_the_pure_core_forced():
    out = subprocess.run([sys.executable, "-m", "msprof_py.cli", "--version"], capture_output=True, text=True,
                         env={**os.environ, "MSPROF_PY_PURE": "1"}, timeout=120)
    assert (out.returncode, out.stdout) == (0, f"msprof-py {__version__} (emulator core: pure Python; "
                                               f"MSPROF_PY_PURE=1; engine and kernels: Python; MSPROF_PY_PURE=1; "
                                               f"trace build: Arrow; MSPROF_PY_PURE=1; JSON "
                                               f"import: {native.state()})\n")


def test_version_with_the_msgspec_import_forced():
    out = subprocess.run([sys.executable, "-m", "msprof_py.cli", "--version"], capture_output=True, text=True,
                         env={**os.environ, "MSPROF_PY_PURE_IMPORT": "1"}, timeout=120)
    assert out.returncode == 0
    assert out.stdout.endswith("; JSON import: msgspec; MSPROF_PY_PURE_IMPORT=1)\n")


def test_a_large_run_on_the_pure_core_prints_one_warning_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(runtime_emu, "COMPILED", False)
    monkeypatch.setattr(simcore._loader, "pure_reason", "not built")
    monkeypatch.setattr(capture, "LARGE_RUN_EVENTS", 1_000)
    result = emulate(tmp_path, "yolo-pipeline", "--steps", "2")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == ["msprof-py: warning: ~1,240 trace events on the pure-Python emulator core (not built), "
                        "about 4x slower than the compiled one; build it with `pip install -e .` (needs a C "
                        "compiler and the Python headers)"]
    monkeypatch.setattr(runtime_emu, "COMPILED", True)
    result = emulate(tmp_path, "yolo-pipeline", "--steps", "2")
    assert result.exit_code == 0 and "warning" not in result.stderr
    monkeypatch.setattr(runtime_emu, "COMPILED", False)
    monkeypatch.setattr(capture, "LARGE_RUN_EVENTS", 1_000_000)
    result = emulate(tmp_path, "yolo-pipeline", "--steps", "2")
    assert result.exit_code == 0 and "warning" not in result.stderr


@pytest.mark.parametrize("name, kw", [("yolo-pipeline", {}), ("resnet50-infer", {}),
                                      ("bert-train-dp", {"ranks": 4, "steps": 1}),
                                      ("llm-train-2server", {"steps": 1, "layers": 2})])
def test_the_size_estimate_is_within_a_third_of_the_events_recorded(name: str, kw: dict):
    spec = scenarios.get(name)
    steps, ranks = kw.pop("steps", None), kw.pop("ranks", None)
    cfg = scenarios.configure(spec, [], steps=steps, ranks=ranks, params=kw)
    events = len(scenarios.run(name, steps=steps, ranks=ranks, **kw).trace)
    assert abs(spec.size(cfg) - events) < events / 3, (spec.size(cfg), events)
