"""msprof-style capture: `msprof-py --application=...` / `emulate` / `demo`, the PROF directory,
`--export=on` / `--query=on`, the recording switches, `msprof_py.profile`, and faults (crash,
SIGTERM, SIGKILL of the program, kill -9 of msprof-py itself, bad input).

Programs run as real child processes; expectations come from running the same program in this
process (the emulator is deterministic) or from the program's own structure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import msprof_py
from msprof_py import capture, prof_dir
from msprof_py.cli import app
from msprof_py.summaries import HEADERS
from runtime_emu import acl
from runtime_emu.recorder import Switches

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TWO_STREAMS = ROOT / "examples" / "two_streams.py"
MSPROF = str(Path(sys.executable).parent / "msprof-py")
SUMMARY_FILES = [*(f"{n}_*.csv" for n in HEADERS), "communication.json", "communication_matrix.json", "msprof_*.json"]

#: A test program: `app.py MODE STEPS`, two MatMuls and a synchronize per step.
APP = '''
import sys, time
from runtime_emu import Kernel, acl

mode, steps = sys.argv[1], int(sys.argv[2])
for session in range(2 if mode == "twice" else 1):
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    k = Kernel("MatMul", block_ns=10_000, core="cube")
    buf = acl.rt.malloc(1 << 20)
    for i in range(steps):
        with acl.prof.step():
            acl.rt.launch_kernel(k, 20, s)
            acl.rt.launch_kernel(k, 20, s)
            acl.rt.synchronize_stream(s)
        if mode == "slow":
            time.sleep(0.02)
        if mode == "crash" and i == 2:
            raise RuntimeError("boom")
    if mode != "nofinalize":
        acl.finalize()
sys.exit(3 if mode == "exit3" else 0)
'''


@pytest.fixture
def app_py(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def runs(out: Path) -> list[Path]:
    return prof_dir.prof_dirs(out)


def table(prof: Path) -> pd.DataFrame:
    return prof_dir.read_raw(prof).table.to_pandas()


def kinds(prof: Path) -> dict[str, int]:
    return table(prof)["kind"].value_counts().to_dict()


def rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows as a sorted plain frame, to compare tables as multisets of rows."""
    df = df.astype(object).where(df.notna(), None).astype(str)
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def in_process_two_streams() -> pd.DataFrame:
    """examples/two_streams.py run here, its trace taken from acl.on_finalize."""
    import runpy

    got = []
    acl.on_finalize.append(got.append)
    argv = sys.argv
    try:
        sys.argv = [str(TWO_STREAMS)]
        runpy.run_path(str(TWO_STREAMS), run_name="__main__")
    finally:
        sys.argv = argv
        acl.on_finalize.remove(got.append)
    return got[0].trace.table.to_pandas()


# ---------------------------------------------------------------- capture and layout
def test_application_capture_lays_out_a_prof_dir_with_every_call_recorded(tmp_path: Path) -> None:
    out = tmp_path / "profiling"
    result = runner.invoke(app, [f"--application=python {TWO_STREAMS}", f"--output={out}"])
    assert result.exit_code == 0, result.output
    [prof] = runs(out)
    assert re.fullmatch(r"PROF_000001_\d{17}_[A-Z]{16}", prof.name)
    assert (prof / "host/data/rank=0/part-0.parquet").is_file()
    assert (prof / "device_0/data/rank=0/part-0.parquet").is_file()
    assert not (prof / prof_dir.STAGING_DIR).exists()
    export = prof / prof_dir.EXPORT_DIR
    for pattern in SUMMARY_FILES:
        assert len(list(export.glob(pattern))) == 1, pattern
    stamps = {re.search(r"_(\d{14})\.(csv|json)$", f.name).group(1) for f in export.iterdir() if "_2" in f.name}
    assert len(stamps) == 1
    status = json.loads((prof / "status.json").read_text())
    assert (status["status"], status["reasons"], status["exit_code"], status["source"]) == \
        ("complete", [], 0, "application")
    # 143 events, and the device buffer each of the 6 copies (3 steps, an upload and a download)
    # touches, as a mem_write / mem_read row.
    assert status["summary"] == {"events": 143 + 6, "ranks": 1, "devices": 1, "steps": 3, "span_ns": 2775270}
    readme = (prof / "README.txt").read_text()
    assert "status: complete" in readme and "device_0/data/" in readme and "host/data/" in readme
    for f in export.iterdir():
        assert f"{prof_dir.EXPORT_DIR}/{f.name}" in readme
    # Every runtime call of the program is in the capture: the same rows as running it here.
    assert rows(table(prof)).equals(rows(in_process_two_streams()))
    # The timeline is Chrome JSON with one event per row.
    [timeline] = export.glob("msprof_*.json")
    assert len(json.loads(timeline.read_text())["traceEvents"]) == len(table(prof))
    assert f"profile data in {prof}" in result.stderr


def test_positional_form_passes_the_programs_arguments_and_exit_code(tmp_path: Path, app_py: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["--output", str(out), str(app_py), "exit3", "4"])
    assert result.exit_code == 3
    [prof] = runs(out)
    status = prof_dir.read_status(prof)
    assert status["status"] == "incomplete" and status["reasons"] == ["the program exited with code 3"]
    df = table(prof)
    assert sorted(df.loc[df["kind"] == "step", "name"]) == [f"ProfilerStep#{i}" for i in range(4)]
    assert (df["kind"] == "kernel").sum() == 8


def test_each_session_of_a_program_gets_its_own_prof_dir(tmp_path: Path, app_py: Path) -> None:
    result = runner.invoke(app, [f"--application=python {app_py} twice 2", f"--output={tmp_path}"])
    assert result.exit_code == 0
    first, second = runs(tmp_path)
    assert (first.name[:12], second.name[:12]) == ("PROF_000001_", "PROF_000002_")
    for prof in (first, second):
        assert prof_dir.read_status(prof)["status"] == "complete"
        assert kinds(prof)["kernel"] == 4


def test_the_agent_reaches_the_runtime_through_acl_on_init_in_every_python_process(
        tmp_path: Path, app_py: Path, monkeypatch) -> None:
    """The capture's sitecustomize hooks the agent into acl.on_init of the program and of a Python
    child it starts, loads neither the emulator nor Arrow before the program imports the runtime,
    and still runs the sitecustomize the program's own PYTHONPATH had."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    monkeypatch.setenv("PYTHONPATH", str(own))
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import os, subprocess, sys\n"
        "assert os.environ.get('OWN_SITECUSTOMIZE') == 'ran'\n"
        "assert not {'runtime_emu', 'pyarrow', 'msprof_py.trace'} & set(sys.modules), sorted(sys.modules)\n"
        f"subprocess.run([sys.executable, {str(app_py)!r}, 'once', '1'], check=True)\n"
        "from runtime_emu import acl\n"
        "assert len(acl.on_init) == 1\n"
        f"exec(open({str(app_py)!r}).read().replace('sys.argv[1], int(sys.argv[2])', '\"once\", 2'))\n")
    result = runner.invoke(app, [f"--application=python {parent}", f"--output={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    profs = runs(tmp_path / "out")  # the child's session and the parent's, in pid order
    assert sorted(kinds(p)["kernel"] for p in profs) == [2, 4]
    assert {prof_dir.read_status(p)["status"] for p in profs} == {"complete"}


def test_a_program_that_never_starts_the_runtime_gets_an_explained_empty_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--application", "python -c 'print(1)'", "--output", str(tmp_path)])
    assert result.exit_code == 0
    [prof] = runs(tmp_path)
    status = prof_dir.read_status(prof)
    assert status["status"] == "incomplete"
    assert status["reasons"] == ["nothing was recorded: the program never called acl.init() (or died before "
                                 "its first flush)"]
    assert "nothing was recorded" in (prof / "README.txt").read_text()


# ---------------------------------------------------------------- switches
def _pids(df: pd.DataFrame, process: str) -> set:
    meta = df[(df["kind"] == "meta") & (df["name"] == "process_name")]
    return set(meta.loc[meta["args"].str.contains(f'"{process}"', regex=False), "pid"])


def governed(df: pd.DataFrame, switch: str) -> pd.Series:
    """The rows a recording switch controls, from typed columns and process / counter names."""
    device = df["pid"].isin(_pids(df, "Ascend Hardware"))
    k, name = df["kind"].astype(str), df["name"].astype(str)
    if switch == "task_time":
        # A task's buffer accesses (mem_read / mem_write, which name it by corr) go with the tasks.
        return (k.isin(["kernel", "memcpy", "memset", "collective", "flow", "mem_read", "mem_write"])
                | (device & k.isin(["wait", "marker"])) | ((k == "counter") & name.str.startswith("Queue depth")))
    if switch == "runtime_api":
        return k.isin(["api", "launch", "sync", "flow", "host_work", "data_load"]) | ((k == "wait") & ~device)
    if switch == "memory":
        return k.isin(["alloc", "free", "alloc_fail"]) | ((k == "counter") & name.str.startswith("Device memory"))
    if switch == "hccl":
        return (k == "collective") | ((k == "wait") & (df["cat"].astype(str) == "hccl"))
    assert switch == "sys_hardware_mem"
    return ((k == "counter") & name.str.endswith(" GB/s")) | df["pid"].isin(_pids(df, "Links"))


@pytest.fixture(scope="module")
def bert_all_on(tmp_path_factory) -> pd.DataFrame:
    return table(capture.emulate("bert-train-dp", tmp_path_factory.mktemp("on"), steps=1))


@pytest.mark.parametrize("switch", ["task_time", "runtime_api", "memory", "hccl", "sys_hardware_mem"])
def test_each_switch_off_removes_exactly_what_it_governs(tmp_path: Path, bert_all_on: pd.DataFrame,
                                                         switch: str) -> None:
    option = "--" + switch.replace("_", "-")
    result = runner.invoke(app, ["emulate", "bert-train-dp", "--steps", "1", f"{option}=off",
                                 "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    off = table(runs(tmp_path)[0])
    gone = governed(bert_all_on, switch)
    assert gone.sum() > 0
    assert governed(off, switch).sum() == 0
    assert rows(off).equals(rows(bert_all_on[~gone]))
    assert prof_dir.read_status(runs(tmp_path)[0])["switches"][switch] is False


def test_switches_reach_the_captured_program(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--task-time=off", "--memory=off", "--output", str(tmp_path), str(TWO_STREAMS)])
    assert result.exit_code == 0
    got = kinds(runs(tmp_path)[0])
    assert not {"kernel", "memcpy", "flow", "alloc", "free"} & set(got)
    assert (got["launch"], got["sync"], got["step"]) == (18, 3, 3)


# ---------------------------------------------------------------- emulate, export, query, demo
def test_emulate_writes_the_same_layout_plus_ground_truth(tmp_path: Path) -> None:
    result = runner.invoke(app, ["emulate", "yolo-pipeline", "--switch", "leak", "--steps", "3", "--param",
                                 "triple_buffer=false", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [prof] = runs(tmp_path)
    truth = json.loads((prof / "ground_truth.json").read_text())
    assert [p["problem"] for p in truth["problems"]] == ["leak"]
    status = prof_dir.read_status(prof)
    assert (status["status"], status["source"], status["summary"]["steps"]) == ("complete", "emulate", 3)
    assert "ground_truth.json" in (prof / "README.txt").read_text()
    for pattern in SUMMARY_FILES:
        assert len(list((prof / prof_dir.EXPORT_DIR).glob(pattern))) == 1


def exports(export: Path) -> dict[str, bytes]:
    """Summary files by name without their time stamp (the timeline left out: it is large)."""
    return {re.sub(r"_\d{14}", "", f.name): f.read_bytes() for f in export.iterdir()
            if not f.name.startswith("msprof_")}


def test_export_regenerates_the_exports_from_raw_data(tmp_path: Path) -> None:
    prof = capture.emulate("yolo-pipeline", tmp_path, steps=2)
    export = prof / prof_dir.EXPORT_DIR
    before = exports(export)
    for f in export.iterdir():
        f.rename(export / re.sub(r"_(\d{14})", "_19990101000000", f.name))  # an old version's exports
    (export / "op_summary_19990101000000.csv").write_text("stale\n")
    result = runner.invoke(app, ["--export=on", f"--output={prof}"])
    assert result.exit_code == 0, result.output
    assert exports(export) == before
    assert not list(export.glob("*19990101000000*"))


def test_query_lists_the_runs(tmp_path: Path) -> None:
    a = capture.emulate("yolo-pipeline", tmp_path, steps=2)
    b = capture.emulate("bert-train-dp", tmp_path, steps=1, ranks=4)
    result = runner.invoke(app, ["--query=on", "--output", str(tmp_path)])
    assert result.exit_code == 0
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in result.stdout.splitlines() if "PROF_" in line}
    assert lines[a.name][:4] == ["complete", "1", "1", "2"]
    assert lines[b.name][:4] == ["complete", "4", "4", "1"]
    # The spans (emulated time, the same for every seed-0 run) in ms to 3 significant digits.
    assert [prof_dir.read_status(p)["summary"]["span_ns"] for p in (a, b)] == [7_765_874, 14_407_429]
    assert (lines[a.name][4], lines[b.name][4]) == ("7.77 ms", "14.4 ms")
    assert [r["job"] for r in prof_dir.query(tmp_path)] == [a.name, b.name]


def test_demo_prints_findings_and_writes_the_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [prof] = runs(tmp_path)
    assert (prof / "report.html").is_file() and "report.html" in (prof / "README.txt").read_text()
    for text in ("MEMORY_LEAK", "BUBBLE_DATA", str(prof / "report.html"), "ui.perfetto.dev", f"analyze {prof}"):
        assert text in result.stdout
    # It ends with the command that opens this run in the dashboard.
    assert f"dashboard:    msprof-py dashboard {prof}  (then open http://127.0.0.1:8050/)" in result.stdout
    analyzed = runner.invoke(app, ["analyze", str(prof), "--json"])
    assert analyzed.exit_code == 0
    assert "MEMORY_LEAK" in {f["code"] for f in json.loads(analyzed.stdout)["findings"]}


# ---------------------------------------------------------------- msprof_py.profile
PROFILED = '''
import msprof_py
from runtime_emu import Kernel, acl

def program(out, schedule, steps=8):
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    k = Kernel("MatMul", block_ns=10_000, core="cube")
    with msprof_py.profile(output=out, schedule=schedule) as prof:
        for _ in range(steps):
            with acl.prof.step():
                acl.rt.launch_kernel(k, 20, s)
                acl.rt.launch_kernel(k, 20, s)
                acl.rt.synchronize_stream(s)
            prof.step()
    switches = acl.current().sw
    acl.finalize()
    return prof, switches
'''


def _profiled(tmp_path: Path, schedule) -> tuple[msprof_py.profiler.profile, pd.DataFrame, Switches]:
    ns: dict = {}
    exec(PROFILED, ns)
    prof, switches = ns["program"](tmp_path, schedule)
    return prof, table(prof.path), switches


def test_schedule_actions_follow_torch_profiler() -> None:
    sched = msprof_py.schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    assert [sched(i).value for i in range(12)] == ["none", "none", "warmup", "record", "record", "none", "warmup",
                                                  "record", "record", "none", "none", "none"]


def test_profile_records_only_the_active_steps(tmp_path: Path) -> None:
    prof, df, switches = _profiled(tmp_path, msprof_py.schedule(wait=1, warmup=1, active=3, repeat=1))
    assert sorted(df.loc[df["kind"] == "step", "name"]) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    kernels = df[df["kind"] == "kernel"]
    assert sorted(kernels["step"]) == [2, 2, 3, 3, 4, 4]
    assert (df["kind"] == "launch").sum() == 6
    # Only the program's own synchronizes: the profiler's drains at the window edges are unrecorded.
    assert sorted(df.loc[df["kind"] == "sync", "name"]) == ["aclrtSynchronizeStream"] * 3
    assert set(df.loc[df["kind"] != "meta", "step"].dropna()) == {2, 3, 4}
    assert switches == Switches()  # the runtime records as before once the block ends
    assert len(prof.windows) == 1 and prof_dir.read_status(prof.path)["status"] == "complete"


def test_profile_without_schedule_records_every_step(tmp_path: Path) -> None:
    _, df, _ = _profiled(tmp_path, None)
    assert (df["kind"] == "step").sum() == 8 and (df["kind"] == "kernel").sum() == 16


# ---------------------------------------------------------------- faults
def _spawn(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "MSPROF_PY_FLUSH_S": "0.05"}
    return subprocess.Popen([MSPROF, "--output", str(out), *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_flush(out: Path, timeout_s: float = 20.0) -> dict:
    """Wait until the program has flushed a snapshot with at least 3 steps; return the run status."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for state in out.glob(f"PROF_*/{prof_dir.STAGING_DIR}/session-0-*/state.json"):
            if json.loads(state.read_text())["rows"] > 60:
                prof = state.parents[2]
                return {**prof_dir.read_status(prof), "prof": prof}
        time.sleep(0.02)
    raise AssertionError("the program never flushed")


def _check_partial(prof: Path, reason: str) -> pd.DataFrame:
    status = prof_dir.read_status(prof)
    assert status["status"] == "incomplete" and reason in status["reasons"], status
    assert "status: incomplete" in (prof / "README.txt").read_text()
    df = table(prof)
    steps = sorted(int(n.split("#")[1]) for n in df.loc[df["kind"] == "step", "name"])
    assert len(steps) >= 3 and steps == list(range(len(steps)))
    assert (df["kind"] == "kernel").sum() >= 2 * len(steps)
    return df


def test_a_crashing_program_is_flushed_and_marked_incomplete(tmp_path: Path, app_py: Path) -> None:
    result = runner.invoke(app, ["--output", str(tmp_path), str(app_py), "crash", "10"])
    assert result.exit_code == 1
    [prof] = runs(tmp_path)
    assert prof_dir.read_status(prof)["reasons"] == ["the program exited with code 1",
                                                     "the program raised RuntimeError: boom"]
    df = table(prof)
    assert ((df["kind"] == "step").sum(), (df["kind"] == "kernel").sum()) == (3, 6)


def test_a_program_that_never_finalizes_is_finalized_at_exit(tmp_path: Path, app_py: Path) -> None:
    result = runner.invoke(app, ["--output", str(tmp_path), str(app_py), "nofinalize", "4"])
    assert result.exit_code == 0
    [prof] = runs(tmp_path)
    assert prof_dir.read_status(prof)["status"] == "complete"
    assert kinds(prof)["kernel"] == 8


@pytest.mark.parametrize("who", ["program", "capture"])
def test_sigterm_flushes_and_marks_the_run_incomplete(tmp_path: Path, app_py: Path, who: str) -> None:
    proc = _spawn(tmp_path, str(app_py), "slow", "2000")
    status = _wait_for_flush(tmp_path)
    os.kill(status["program_pid"] if who == "program" else proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    _check_partial(status["prof"], "the program was killed by SIGTERM")
    assert "saved at SIGTERM: the data stops there" in prof_dir.read_status(status["prof"])["reasons"]


def test_sigkill_of_the_program_keeps_the_last_flush(tmp_path: Path, app_py: Path) -> None:
    proc = _spawn(tmp_path, str(app_py), "slow", "2000")
    status = _wait_for_flush(tmp_path)
    os.kill(status["program_pid"], signal.SIGKILL)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    _check_partial(status["prof"], "the program was killed by SIGKILL")


def test_kill_9_of_msprof_py_leaves_only_readable_parquet(tmp_path: Path, app_py: Path) -> None:
    proc = _spawn(tmp_path, str(app_py), "slow", "2000")
    status = _wait_for_flush(tmp_path)
    time.sleep(0.2)  # a few more flushes, one maybe mid-write
    proc.kill()
    proc.wait(timeout=10)
    os.kill(status["program_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while capture._alive(status["program_pid"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    files = list(tmp_path.rglob("*.parquet"))
    assert files
    for f in files:
        assert pq.read_table(f).num_rows > 0
    # The capture never finished: --export=on assembles what the program flushed.
    result = runner.invoke(app, ["--export=on", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    _check_partial(status["prof"], "the capture stopped before the program ended (was msprof-py killed?)")
    assert not (status["prof"] / prof_dir.STAGING_DIR).exists()


@pytest.mark.parametrize("args, message", [
    (["--application=python missing.py"], "missing.py: no such file"),
    (["--application="], "--application is empty"),
    (["--application", "   "], "--application is empty"),
    (["--application=no-such-program-xyz"], "no-such-program-xyz: command not found"),
    (["--application=./tool.sh"], "./tool.sh: not an executable file"),
    (["--application=python app.py", "--output={file}/sub"], "cannot create directory"),
    (["--application=python app.py", "--output={file}"], "not a directory"),
    (["--application=python app.py"], "--application needs --output"),
    (["--query=on", "--export=on", "--output=out"], "choose one of"),
    (["--task-time=off"], "nothing to do"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, app_py: Path, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tool.sh").write_text("#!/bin/sh\n")
    (tmp_path / "file").write_text("")
    args = [a.replace("{file}", str(tmp_path / "file")) for a in args]
    if not any(a.startswith("--output") for a in args) and "needs --output" not in message \
            and "nothing to do" not in message:
        args.append(f"--output={tmp_path / 'out'}")
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.startswith("msprof-py: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not list(tmp_path.rglob("PROF_*"))


def test_a_snapshot_between_calls_is_the_final_trace() -> None:
    from runtime_emu import Kernel, Runtime

    rt = Runtime(seed=0)
    rt.set_device(0)
    s = rt.create_stream()
    for _ in range(3):
        rt.launch_kernel(Kernel("MatMul", block_ns=10_000), 20, s)
        rt.synchronize_stream(s)
    snap = rt.snapshot()
    final = rt.finish().trace
    assert rows(snap.table.to_pandas()).equals(rows(final.table.to_pandas()))
    assert (snap.table.to_pandas()["kind"] == "kernel").sum() == 3
