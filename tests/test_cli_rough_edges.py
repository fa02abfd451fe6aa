"""What a newcomer meets first: choices, one-line errors, piped output, sample directories, numbers.

Through Typer's CliRunner, except where the point is a real process: output piped to another
program, and which modules a bare start-up imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.trace import units

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces" / "emulated"
SCRIPT = Path(sys.executable).with_name("msprof-py")
runner = CliRunner()


def one_line_error(args: list[str]) -> str:
    """Run the CLI, expect exit 2, nothing on stdout and exactly one line on stderr; return it."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert result.stdout == "", args
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("msprof-py: error: "), (args, result.stderr)
    assert "Traceback" not in result.stderr
    return lines[0].removeprefix("msprof-py: error: ")


# ---------------------------------------------------------------- choices and errors

@pytest.mark.parametrize("args, message", [
    (["analyze", "T", "--window", "last"], "unknown analysis window 'last'; choose one of all, complete_steps"),
    (["diff", "A", "B", "--window", "ALL"], "unknown analysis window 'ALL'; choose one of all, complete_steps"),
    (["report", "T", "-o", "r.md", "--window", ""], "unknown analysis window ''; choose one of all, complete_steps"),
    (["report", "T", "-o", "r.md", "-f", "MD"], "unknown report format 'MD'; choose one of md, html, json"),
    (["report", "T", "-o", "r.md", "--fail-on", "info"],
     "unknown --fail-on severity 'info'; choose one of warning, critical"),
    (["emulate", "resnet50-infer", "--memory", "maybe"], "unknown --memory value 'maybe'; choose one of on, off"),
    (["info", "T", "--top", "-1"], "Invalid value for '--top': -1 is smaller than the minimum 0 "
                                   "(see msprof-py info --help)"),
    (["info", "T", "--top", "ten"], "Invalid value for '--top': 'ten' is not a valid integer "
                                    "(see msprof-py info --help)"),
    (["info"], "Missing argument 'TRACE' (see msprof-py info --help)"),
    (["info", "T", "--colour"], "No such option: --colour (see msprof-py info --help)"),
    (["emulate", "--ranks", "0"], "Invalid value for '--ranks': 0 is smaller than the minimum 1 "
                                  "(see msprof-py emulate --help)"),
])
def test_bad_values_are_one_line_errors_before_any_work(args, message):
    """Checked by the option's type, so before the trace (here a file that does not exist) is read."""
    assert one_line_error(args) == message


def test_unknown_analyzer_is_one_line(tmp_path):
    trace = str(SAMPLES / "resnet50-infer")
    assert one_line_error(["analyze", trace, "-a", "nope"]) == (
        "unknown analyzer 'nope'; choose from bandwidth, bubbles, cores, launch, links, memory, pipeline, queue, ranks, sync")
    assert one_line_error(["analyze", trace, "-a", "bubbles", "-a", "x", "-a", "y"]).startswith(
        "unknown analyzer 'x', 'y'; choose from ")
    out = tmp_path / "r.md"
    assert one_line_error(["report", trace, "-o", str(out), "-a", "nope"]).startswith("unknown analyzer 'nope'")
    assert not out.exists()


def test_unknown_scenario_is_one_line():
    assert one_line_error(["eval", "-s", "nope", "--quick"]).startswith("unknown scenario(s) nope; choose from ")
    assert one_line_error(["emulate", "nope", "-o", "x"]).startswith("unknown scenario 'nope'")


def test_a_choice_is_accepted_as_its_enum():
    result = runner.invoke(app, ["analyze", str(SAMPLES / "resnet50-infer"), "-a", "bubbles",
                                 "--window", "complete_steps", "--json"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)) == {"findings", "skipped"}


def test_no_arguments_prints_the_help():
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage: msprof-py [OPTIONS] COMMAND [ARGS]..." in result.output
    assert "info" in result.output and "analyze" in result.output


def test_eval_help_shows_the_defaults_where_they_are_defined():
    from msprof_py import evaluate

    result = runner.invoke(app, ["eval", "--help"])
    assert result.exit_code == 0
    assert (f"defaults: {evaluate.DEFAULT_SEEDS} seeds (0..{evaluate.DEFAULT_SEEDS - 1}); a problem kind injected "
            f"fewer than {evaluate.MIN_INJECTIONS} times gets further seeds") in result.output


# ---------------------------------------------------------------- sample directories, info

def test_a_sample_directory_is_the_trace_it_holds():
    sample = SAMPLES / "bert-train-dp"
    direct = runner.invoke(app, ["info", str(sample / "trace"), "--json"])
    given = runner.invoke(app, ["info", str(sample), "--json"])
    assert direct.exit_code == given.exit_code == 0, given.output
    assert json.loads(given.stdout) == json.loads(direct.stdout)
    assert json.loads(given.stdout)["ranks"] == list(range(8))


def test_a_sample_directory_can_be_analyzed():
    result = runner.invoke(app, ["analyze", str(SAMPLES / "resnet50-infer-serial-copies"), "--json"])
    assert result.exit_code == 0, result.output
    assert "BUBBLE_COPY" in {f["code"] for f in json.loads(result.stdout)["findings"]}


def test_a_directory_without_a_table_is_still_an_error(tmp_path):
    (tmp_path / "trace").mkdir()  # a trace/ directory with no partitions in it
    assert "no rank=*/*.parquet partitions" in one_line_error(["info", str(tmp_path)])


def test_info_counts_ranks_then_lists_them():
    result = runner.invoke(app, ["info", str(SAMPLES / "bert-train-dp")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "ranks:          8 (0, 1, 2, 3, 4, 5, 6, 7)" in lines
    assert "world size:     8" in lines
    one = runner.invoke(app, ["info", str(SAMPLES / "resnet50-infer")]).stdout.splitlines()
    assert "ranks:          1 (0)" in one and "devices:        1 (0)" in one


def test_info_times_are_ms_to_three_digits_and_json_is_exact():
    sample = SAMPLES / "resnet50-infer"
    doc = json.loads(runner.invoke(app, ["info", str(sample), "--json"]).stdout)
    text = runner.invoke(app, ["info", str(sample)]).stdout
    span = doc["span_ns"]
    assert f"span:           {units.ms(span)} ({span:,} ns)" in text.splitlines()
    top = doc["top_device"][0]
    row = next(line for line in text.splitlines() if line.startswith(f"│ {top['name']} "))
    assert units.sig(top["total_ns"] / 1e6) in row and units.sig(100 * top["share_of_span"]) in row
    assert " us " not in text and " ns)" in text  # the exact span in ns is the one other unit


# ---------------------------------------------------------------- piped output

def run_piped(*args: str) -> subprocess.CompletedProcess:
    assert SCRIPT.exists(), f"{SCRIPT} missing: install the package into this venv"
    return subprocess.run([str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300, cwd=str(REPO))


def test_piped_analyze_is_never_cut():
    sample = "sample_traces/emulated/resnet50-infer-serial-copies"
    proc = run_piped("analyze", sample, "-a", "bubbles", "-a", "sync")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "…" not in out and "\x1b[" not in out  # no ellipsis, no colour codes
    assert out.splitlines()[0].strip() == f"{sample}: findings, most costly first"  # the path in one piece
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    # Each finding's message sits whole on one line of its cell.
    doc = json.loads(run_piped("analyze", sample, "-a", "bubbles", "-a", "sync", "--json").stdout)
    for f in doc["findings"]:
        assert any(f["message"] in line for line in lines), f["message"]
        assert any(f["lookup"]["remedy"] in line for line in lines), f["lookup"]["remedy"]


def test_piped_info_shows_whole_kernel_names(real_traces):
    src = real_traces / "kineto/queue_16rank_rank0.json.gz"
    doc = json.loads(run_piped("info", str(src), "--json").stdout)
    longest = max((t["name"] for t in doc["top_device"]), key=len)
    assert len(longest) > 200
    proc = run_piped("info", str(src))
    assert proc.returncode == 0, proc.stderr
    assert any(f"│ {longest} " in line for line in proc.stdout.splitlines())


def test_piped_diff_is_never_cut():
    base = "sample_traces/emulated/yolo-pipeline-no-triple-buffer"
    new = "sample_traces/emulated/yolo-pipeline"
    proc = run_piped("diff", base, new)
    assert proc.returncode == 0, proc.stderr
    assert f"{base} -> {new}" in proc.stdout and "…" not in proc.stdout


# ---------------------------------------------------------------- start-up

def test_start_up_imports_nothing_heavy():
    """`--help` loads typer and the CLI module only: no pandas, pyarrow, plotly, rich, pydantic,
    analyzers or emulator (the speed target itself is checked by benchmarks/bench_cli.py)."""
    probe = ("import sys\n"
             "sys.argv = ['msprof-py', '--help']\n"
             "from msprof_py.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "heavy = ('pandas', 'pyarrow', 'numpy', 'plotly', 'rich', 'pydantic', 'analyzers', 'runtime_emu', "
             "'msgspec', 'dash')\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_info_on_parquet_imports_no_analyzer_no_plotting(tmp_path):
    probe = ("import sys\n"
             f"sys.argv = ['msprof-py', 'info', {str(SAMPLES / 'resnet50-infer')!r}]\n"
             "from msprof_py.cli import main\n"
             "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             "heavy = ('plotly', 'pydantic', 'analyzers', 'runtime_emu', 'dash', 'jinja2')\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


# ---------------------------------------------------------------- numbers for people

@pytest.mark.parametrize("value, text", [
    (4284415.999999998, "4,280,000"), (146589.2, "147,000"), (13.964, "14.0"), (0.00725, "0.00725"),
    (9.996, "10.0"), (999.6, "1,000"), (0.5, "0.500"), (-3.2119, "-3.21"), (0, "0"), (123, "123"),
    (float("nan"), "nan"), (None, "-"),
])
def test_three_significant_digits(value, text):
    assert units.sig(value) == text


def test_one_unit_per_quantity():
    assert units.ms(146_589_200) == "147 ms"
    assert units.ms(7_250) == "0.00725 ms"
    assert units.mib(3_211_776) == "3.06 MiB"
    assert units.mib(4284415.999999998) == "4.09 MiB"
    assert units.pct(0.7134) == "71.3%"
    assert units.ms(None) == units.mib(None) == units.pct(None) == "-"


def test_report_shows_metrics_in_their_unit_and_json_keeps_them_exact(tmp_path):
    leak = str(SAMPLES / "resnet50-infer-leak")
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert runner.invoke(app, ["report", leak, "-o", str(md), "-a", "memory"]).exit_code == 0
    assert runner.invoke(app, ["report", leak, "-o", str(js), "-a", "memory"]).exit_code == 0
    finding = next(f for f in json.loads(js.read_text())["findings"] if f["code"] == "MEMORY_LEAK")
    assert finding["metric"] == "bytes_per_step" and isinstance(finding["value"], float)
    line = (f"- metric: bytes_per_step = {units.mib(finding['value'])} "
            f"(threshold {units.mib(finding['threshold'])})")
    assert line in md.read_text().splitlines()


def test_summary_reads_chunked_sliced_columns_with_nulls():
    """summarize reads columns from their Arrow buffers: chunks with their own dictionaries,
    slices (a non-zero offset), null dur / device / stream / name."""
    import pyarrow as pa

    from msprof_py.summary import summarize
    from msprof_py.trace import Trace, TraceMeta
    from msprof_py.trace.schema import arrow_schema

    rows = [  # rank, ph, name, ts, dur, kind, device, stream
        (0, "M", "process_name", 0, None, "meta", None, None),
        (0, "X", "gemm", 100, 50, "kernel", 0, 7),
        (0, "X", None, 120, 10, "kernel", 0, 9),
        (1, "X", "gemm", 90, 40, "kernel", None, 3),
        (1, "X", "cudaLaunchKernel", 95, None, "launch", None, None),
        (1, "X", "(unnamed)", 200, 5, "kernel", 1, 3),
        (1, "i", "gemm", 300, None, "kernel", 1, 3),
    ]
    schema = arrow_schema(TraceMeta())
    base = pa.Table.from_pylist([dict(zip(("rank", "ph", "name", "ts", "dur", "kind", "device", "stream"), r))
                                 for r in [(9, "X", "pad", 0, 1, "kernel", 0, 0)] + rows],
                                schema=pa.schema([schema.field(c) for c in
                                                  ("rank", "ph", "name", "ts", "dur", "kind", "device", "stream")]))
    sliced = base.slice(1)  # every column now starts at offset 1
    halves = pa.concat_tables([sliced.slice(0, 3), sliced.slice(3).unify_dictionaries()])
    full = pa.Table.from_arrays([halves.column(f.name) if f.name in halves.column_names
                                 else pa.nulls(len(rows), f.type) for f in schema], schema=schema)
    assert full.column("kind").num_chunks == 2 and full.column("dur").chunks[0].offset == 1
    got = summarize(Trace(table=full, meta=TraceMeta()), top=5)
    assert (got.start_ns, got.end_ns, got.span_ns) == (90, 300, 210)
    assert got.ranks == (0, 1) and got.devices == (0, 1)
    assert [(s.rank, s.device, s.streams) for s in got.streams] == [(0, 0, (7, 9)), (1, 1, (3,)), (1, None, (3,))]
    assert got.kinds == {"kernel": 5, "launch": 1, "meta": 1}
    assert [(n.name, n.count, n.total_ns) for n in got.top_device] == [("gemm", 2, 90), ("(unnamed)", 2, 15)]
    assert [(n.name, n.count, n.total_ns) for n in got.top_host] == [("cudaLaunchKernel", 1, 0)]


def test_info_on_parquet_does_not_make_pyarrow_import_pandas():
    """pyarrow imports pandas on its first conversion of a Python value; `info` never makes one."""
    probe = ("import sys\n"
             f"sys.argv = ['msprof-py', 'info', {str(SAMPLES / 'bert-train-dp')!r}]\n"
             "from msprof_py.cli import main\n"
             "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas' or m == 'pyarrow.acero'))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_piped_eval_is_never_cut():
    proc = run_piped("eval", "-s", "resnet50-infer", "--quick")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout
    assert ("target: precision and recall >= 0.950 per kind; findings = claims of the kind's codes (a finding, "
            "or each occurrence it lists)") in lines
    note = next(line for line in lines if line.startswith("not a healthy variant: "))
    assert note.endswith("(its copy bubbles would count against serial-copies)")
    assert any(line.startswith("│ serial-copies ") for line in lines)


def test_fast_conversion_gives_typer_s_values_for_every_parameter():
    """msprof_py.cli_params converts without pydantic; for every parameter of every command it
    must accept what Typer's own converter accepts, give the same value, and reject the rest."""
    import typer.main
    from typer._click import Context
    from typer._coercion import build_runtime_param

    from msprof_py import cli_params

    group = typer.main.get_command(app)
    ctx = Context(group)
    cli_params.install(group, ctx)
    samples = ["0", "1", "-1", "7", "x", "", "on", "off", "all", "complete_steps", "md", "warning", "a/b.json",
               "True", "no", " 7 ", "007", "+3", "3.0", "1e3", "1_000", "ON", "Off", "٣", "1__0", "-0", ".0", "3.", " -3.00 "]
    checked = 0
    for command in [group, *group.commands.values()]:
        for param in command.get_params(ctx):
            ours = param._runtime_param
            if not isinstance(ours, cli_params._PlainParam):
                continue
            theirs = build_runtime_param(param.type_descriptor)
            for raw in samples:
                value = [raw] if param.multiple or param.nargs == -1 else raw
                outcome = []
                for converter in (ours, theirs):
                    try:
                        outcome.append(("ok", converter.coerce(value, param=param, ctx=ctx)))
                    except cli_params.BadParameter:
                        outcome.append(("bad", None))
                assert outcome[0] == outcome[1], (command.name, param.name, raw, outcome)
                checked += 1
    assert checked > 500


def test_piped_help_lists_every_command_uncut():
    proc = run_piped("--help")
    assert proc.returncode == 0, proc.stderr
    commands = proc.stdout.split("Commands:\n", 1)[1].splitlines()
    names = [line.split()[0] for line in commands if line.strip()]
    assert names == ["import", "export", "info", "critical-path", "replay", "whatif", "cluster", "analyze", "report", "diff", "eval", "emulate", "demo",
                     "dashboard", "sql"]
    assert all(not line.rstrip().endswith("...") for line in commands)
