"""Numbers as the commands print them, in a real process with stdout piped: 3 significant digits
in text, time in ms and memory in MiB; full precision in JSON and CSV.

The expected texts are written out here, rounded by hand from the exact values (which the tests
also pin from the JSON output), so they check the formatting instead of repeating it.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = "sample_traces/emulated"
SCRIPT = Path(sys.executable).with_name("msprof-py")
NO_TRIPLE = f"{SAMPLES}/yolo-pipeline-no-triple-buffer"
TRIPLE = f"{SAMPLES}/yolo-pipeline"
LEAK = f"{SAMPLES}/resnet50-infer-leak"


def run(*args: str) -> subprocess.CompletedProcess:
    assert SCRIPT.exists(), f"{SCRIPT} missing: install the package into this venv"
    return subprocess.run([str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300, cwd=str(REPO))


def ok(*args: str) -> str:
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "…" not in proc.stdout  # piped: no colour, nothing cut
    return proc.stdout


def table_rows(text: str) -> list[list[str]]:
    """The cells of every body line of the rich tables in `text`."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def one_line_error(*args: str) -> str:
    proc = run(*args)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# ---------------------------------------------------------------- analyze

@pytest.fixture(scope="module")
def no_triple_json() -> dict:
    return json.loads(ok("analyze", NO_TRIPLE, "--format", "json"))


def test_analyze_table_costs_in_ms_and_mib(no_triple_json):
    # A time finding's cost is what its fix saves (the trace replayed with its remedy), ranked by it;
    # the table's "lost" column keeps what the trace measured (each idle nanosecond under one cause)
    # and the fix's saving is under the message. The sync stall has no cost of its own.
    assert [(f["code"], f["severity"], f["cost_unit"], f["cost"], f["lost_ns"]) for f in no_triple_json["findings"]] == [
        ("BUBBLE_COPY", "critical", "ns", 11216744.0, 1368320), ("BUBBLE_DATA", "warning", "ns", 1747040.0, 8936624),
        ("LAUNCH_BOUND", "info", "ns", 15000.0, 5000), ("BUBBLE_SYNC", "info", "ns", 0.0, 906800),
        ("SYNC_STALL", "info", "", 0.0, None)]
    span = 27285470
    assert [f["what_if"] for f in no_triple_json["findings"]] == [
        {"remedy": r, "saving_ns": n, "saving_share": round(n / span, 6), "span_ns": span, "new_span_ns": span - n}
        for r, n in (("copy", 11216744), ("data", 1747040), ("launch", 15000), ("sync", 0))] + [None]
    text = ok("analyze", NO_TRIPLE)
    rows = [r for r in table_rows(text) if r[0]]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("1", "critical", "Device idle: waiting on a copy (BUBBLE_COPY)", "rank 0, device 0, stream 1", "1.37 ms"),
        ("2", "warning", "Device idle: data loading / preprocessing (BUBBLE_DATA)", "rank 0, device 0, stream 1",
         "8.94 ms"),
        ("3", "info", "Launch-bound: tasks too small for their launch cost (LAUNCH_BOUND)",
         "rank 0, device 0, stream 1", "0.00500 ms"),
        ("4", "info", "Device idle: host synchronize (BUBBLE_SYNC)", "rank 0, device 0, stream 1", "0.907 ms"),
        ("5", "info", "Host stalls in synchronize calls (SYNC_STALL)", "rank 0", "-"),
    ]
    fixes = [c[2] for c in table_rows(text) if c[2].startswith("fix: ")]
    assert fixes == ["fix: copy -> saves 11.2 ms (41.1%)", "fix: data -> saves 1.75 ms (6.40%)",
                     "fix: launch -> saves 0.0150 ms (0.0550%)", "fix: sync -> saves 0 ms (0%)"]
    # Without the replay: ranked by the time measured lost, as before.
    plain = json.loads(ok("analyze", NO_TRIPLE, "--json", "--no-what-if"))["findings"]
    assert [(f["code"], f["cost"], f["what_if"]) for f in plain] == [
        ("BUBBLE_DATA", 8936624.0, None), ("BUBBLE_COPY", 1368320.0, None), ("BUBBLE_SYNC", 906800.0, None),
        ("LAUNCH_BOUND", 5000.0, None), ("SYNC_STALL", 0.0, None)]


def test_analyze_table_memory_cost_in_mib():
    [leak] = [f for f in json.loads(ok("analyze", LEAK, "--json"))["findings"] if f["code"] == "MEMORY_LEAK"]
    assert (leak["cost_unit"], leak["cost"]) == ("bytes", 6442454016.0)  # 6 x 1,073,742,336 B leaked: 6,144 MiB
    rows = [r for r in table_rows(ok("analyze", LEAK)) if r[0]]
    assert (rows[0][2], rows[0][3], rows[0][4]) == ("Device memory grows every step (MEMORY_LEAK)",
                                                    "rank 0, device 0", "6,140 MiB")


def test_analyze_json_flag_is_format_json(no_triple_json):
    assert json.loads(ok("analyze", NO_TRIPLE, "--json")) == no_triple_json
    assert set(no_triple_json) == {"findings", "skipped"}


def _read_back(value: object, cell: str) -> object:
    """A CSV cell read as the type of the JSON value it should equal."""
    if value is None:
        assert cell == ""
        return None
    if isinstance(value, bool):
        return cell == "True"
    if isinstance(value, int):
        return int(cell)
    if isinstance(value, float):
        return float(cell)
    if isinstance(value, (list, dict)):
        return json.loads(cell)
    return cell


def test_analyze_csv_has_the_json_values_at_full_precision(no_triple_json):
    proc = run("analyze", NO_TRIPLE, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    # The analyzers that could not run are no findings: on stderr, as the table prints them.
    assert proc.stderr == "msprof-py: skipped analyzer ranks: fewer than two ranks in the trace\n"
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    findings = no_triple_json["findings"]
    assert len(rows) == len(findings) == 5
    for row, f in zip(rows, findings):
        flat = {k: v for k, v in f.items() if k != "lookup"}
        flat.update({f"lookup_{k}": v for k, v in f["lookup"].items()})
        assert set(flat) <= set(row), set(flat) - set(row)  # every JSON field has its column
        for key, value in flat.items():
            assert _read_back(value, row[key]) == value, key
        end = f["ts_ns"] + f["dur_ns"]
        assert int(row["end_ns"]) == end
    # Full precision, not the table's 3 significant digits.
    first = rows[1]
    assert (first["code"], first["severity"], first["rank"], first["device"], first["stream"]) == \
        ("BUBBLE_DATA", "warning", "0", "0", "1")
    assert (first["ts_ns"], first["dur_ns"], first["end_ns"]) == ("4755971", "21462104", "26218075")
    assert (first["cost"], first["cost_unit"], first["lost_ns"], first["value"]) == \
        ("1747040.0", "ns", "8936624", "0.327523")
    assert json.loads(first["what_if"]) == {"remedy": "data", "saving_ns": 1747040, "saving_share": 0.064028,
                                            "span_ns": 27285470, "new_span_ns": 25538430}
    assert first["lookup_code"] == "BUBBLE_DATA"
    assert rows[4]["stream"] == rows[4]["lost_ns"] == rows[4]["cost_unit"] == ""  # None: an empty cell


def test_analyze_format_errors_are_one_line():
    assert one_line_error("analyze", NO_TRIPLE, "--format", "xml") == \
        "msprof-py: error: unknown --format value 'xml'; choose one of table, csv, json"
    assert one_line_error("analyze", NO_TRIPLE, "--json", "--format", "csv") == \
        "msprof-py: error: --json contradicts --format csv; give one of them"


def test_analyze_help_lists_the_formats():
    assert "--format <table|csv|json>" in " ".join(ok("analyze", "--help").split())


# ---------------------------------------------------------------- diff

def test_diff_metrics_and_changes_at_3_significant_digits():
    exact = json.loads(ok("diff", NO_TRIPLE, TRIPLE, "--json"))
    # Exact values: throughput 204.046 -> 436.480 (+113.91%), step 4.900857 -> 2.291056 ms,
    # utilisation 0.578882 -> 0.982808, bubble 0.421118 -> 0.017192 (-95.918%), peak memory
    # 42.9728 -> 60.9184 MiB, span 29.426142 -> 18.090999 ms.
    assert [(m["metric"], round(m["base"], 6), round(m["new"], 6)) for m in exact["metrics"]] == [
        ("throughput (steps/s)", 204.045945, 436.479883), ("step time (ms)", 4.900857, 2.291056),
        ("device utilisation", 0.578882, 0.982808), ("bubble ratio", 0.421118, 0.017192),
        ("peak memory (MiB)", 42.972809, 60.918427), ("span (ms)", 29.426142, 18.090999)]
    rows = table_rows(ok("diff", NO_TRIPLE, TRIPLE))
    assert rows == [
        ["throughput (steps/s)", "204", "436", "+114%"],
        ["step time (ms)", "4.90", "2.29", "-53.3%"],
        ["device utilisation", "57.9%", "98.3%", "+69.8%"],
        ["bubble ratio", "42.1%", "1.72%", "-95.9%"],
        ["peak memory (MiB)", "43.0", "60.9", "+41.8%"],
        ["span (ms)", "29.4", "18.1", "-38.5%"],
        # findings: costs 8,936,624 ns, 1,368,320 ns, 906,800 ns and 5,000 ns
        ["BUBBLE_DATA", "1 -> 0", "8.94 ms", "-", "fixed"],
        ["BUBBLE_COPY", "1 -> 0", "1.37 ms", "-", "fixed"],
        ["BUBBLE_SYNC", "1 -> 0", "0.907 ms", "-", "fixed"],
        ["LAUNCH_BOUND", "1 -> 0", "0.00500 ms", "-", "fixed"],
        ["SYNC_STALL", "1 -> 0", "-", "-", "fixed"],
    ]


def test_diff_no_change_is_0_percent():
    rows = table_rows(ok("diff", LEAK, LEAK))
    assert all(r[3] == "0%" for r in rows[:6]), rows


# ---------------------------------------------------------------- info

def test_info_span_and_top_names():
    exact = json.loads(ok("info", f"{SAMPLES}/bert-train-dp", "--top", "1", "--json"))
    assert exact["span_ns"] == 41656770
    assert exact["top_device"][0]["total_ns"] == 45534336  # 109.3% of the span (8 ranks)
    text = ok("info", f"{SAMPLES}/bert-train-dp", "--top", "1")
    assert "span:           41.7 ms (41,656,770 ns)" in text.splitlines()
    assert ["hcom_allReduce", "120", "45.5", "109"] in table_rows(text)


# ---------------------------------------------------------------- eval

def test_eval_ratios_target_and_run_time():
    text = ok("eval", "--quick", "-s", "yolo-pipeline")
    lines = text.splitlines()
    assert ("target: precision and recall >= 0.950 per kind; findings = claims of the kind's codes (a finding, "
            "or each occurrence it lists)") in lines
    [runs] = [line for line in lines if line.startswith("runs: ")]
    # The run time in ms (the one time unit), 3 significant digits: 2,070 ms, 987 ms, 12.3 ms ...
    match = re.fullmatch(r"runs: \d+ \(\d+ healthy\) of \d+ scenario/switch/parameter variants; seeds 0; "
                         r"([0-9,.]+) ms", runs)
    assert match, runs
    digits = match.group(1).replace(",", "").replace(".", "").lstrip("0")
    assert len(digits.rstrip("0") if "." not in match.group(1) else digits) <= 3, runs
    rows = table_rows(text)
    # problem, injected, minor, matched, recall, findings, true, precision, target
    assert rows and all(re.fullmatch(r"1\.00|0\.\d{3}|-", cell) for r in rows for cell in (r[4], r[7])), rows
