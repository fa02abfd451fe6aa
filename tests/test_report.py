"""Reports: strict JSON, the HTML page's markup and charts, the per-step breakdown, the format
picked from the file name, the summary's shares that add up, and `diff` costs in their unit."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from analyzers import Frames
from msprof_py import loading, report
from msprof_py.breakdown import UNCLASSIFIED, step_breakdown
from msprof_py.cli import app
from msprof_py.compare import compare
from msprof_py.trace import write_trace
from runtime_emu import scenarios

runner = CliRunner()
SPEC = re.compile(r'<script type="application/json" class="plotly-spec" data-target="([^"]+)">(.*?)</script>', re.S)
SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.S | re.I)
REAL = ("kineto/queue_16rank_rank0.json.gz", "kineto/nccl_2rank_rank0.json.gz")


def strict_loads(text: str):
    """json.loads that rejects NaN, Infinity and -Infinity, as RFC 8259 parsers (jq) do."""
    def reject(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=reject)


@pytest.fixture(scope="module")
def emulated():
    """yolo-pipeline without triple buffering, leaking: time and memory findings, 6 steps."""
    trace = scenarios.run("yolo-pipeline", switches=["leak"], triple_buffer=False).trace
    return trace, report.build(trace)


@pytest.fixture(scope="module")
def real_reports(real_traces):
    return {name: report.build(loading.load_any(real_traces / name, analysis_only=True)) for name in REAL}


def test_strict_json_turns_nan_and_infinity_into_null():
    text = report.to_json({"summary": {"a": float("nan")}, "findings": [{"value": float("inf")}],
                           "metrics": {"x": [1.0, float("-inf")]}, "timelines": [None]})
    assert strict_loads(text) == {"summary": {"a": None}, "findings": [{"value": None}], "metrics": {"x": [1.0, None]}}


def test_json_report_of_an_emulated_run_is_strict_json(emulated, tmp_path):
    _, rep = emulated
    doc = strict_loads(report.write(rep, tmp_path / "r.json", "json").read_text())
    assert {"summary", "findings", "metrics", "breakdown", "devices"} <= set(doc)
    _assert_ranked(doc["findings"])
    units = {f["code"]: f["cost_unit"] for f in doc["findings"]}
    assert units["MEMORY_LEAK"] == "bytes"


@pytest.mark.parametrize("name", REAL)
def test_json_report_of_a_real_trace_is_strict_json(real_reports, name, tmp_path):
    doc = strict_loads(report.write(real_reports[name], tmp_path / "r.json", "json").read_text())
    assert doc["findings"] and doc["breakdown"]
    _assert_ranked(doc["findings"])


def _assert_ranked(findings):
    order = ["critical", "warning", "info"]
    severities = [f["severity"] for f in findings]
    assert severities == sorted(severities, key=order.index)  # most severe first
    for sev in order:  # within a severity: time by cost, then memory
        mine = [f for f in findings if f["severity"] == sev]
        timed = [f["cost"] for f in mine if f["cost_unit"] == "ns"]
        assert timed == sorted(timed, reverse=True)
        units = [f["cost_unit"] for f in mine if f["cost_unit"]]
        assert units == sorted(units, key=["ns", "bytes"].index)


def _outside_scripts(html: str) -> str:
    return SCRIPT.sub("", html)


def _specs(html: str) -> dict[str, dict]:
    return {target: strict_loads(body) for target, body in SPEC.findall(html)}


def test_html_report_markup_is_balanced_and_escapes_only_inside_scripts(emulated, tmp_path):
    _, rep = emulated
    html = report.write(rep, tmp_path / "r.html", "html").read_text()
    outside = _outside_scripts(html)
    assert "<\\/" not in outside
    assert len(re.findall(r"<div\b", outside)) == len(re.findall(r"</div>", outside)) > 0
    assert len(re.findall(r"<script\b", html, re.I)) == len(re.findall(r"</script>", html, re.I))
    assert not re.search(r"<script[^>]*\bsrc=", html)  # plotly.js inline: works offline


def test_script_text_escapes_only_what_ends_a_script():
    js = 'a="</div>"; b="</SCRIPT>"; c="<!-- x";'
    assert report._script_text(js) == 'a="</div>"; b="<\\/script>"; c="<\\x21-- x";'


def test_html_report_has_the_step_breakdown_and_charts_sized_to_content(emulated, tmp_path):
    trace, rep = emulated
    html = report.write(rep, tmp_path / "r.html", "html").read_text()
    specs = _specs(html)
    steps = len(Frames(trace).steps)
    assert steps == 6 and len(rep["breakdown"]) == steps
    bars = specs["chart-breakdown"]["data"]
    assert {t["name"] for t in bars} >= {"compute", "communication", "copy"}
    assert all(len(t["x"]) == steps for t in bars)
    assert any(t["name"].startswith("idle: ") for t in bars)
    for target, spec in specs.items():
        height = spec["layout"]["height"]
        margin = spec["layout"]["margin"]
        assert height >= 170, target
        assert height - margin["t"] - margin["b"] >= 100, target  # a plot area, not a flat line
    lost = specs["chart-lost"]
    assert len(lost["data"][0]["y"]) == sum(1 for f in rep["findings"] if f["cost_unit"] == "ns" and f["cost"])


def test_html_report_has_an_evidence_timeline_per_top_finding(emulated, tmp_path):
    _, rep = emulated
    html = report.write(rep, tmp_path / "r.html", "html").read_text()
    specs = _specs(html)
    timelines = [k for k in specs if k.startswith("chart-timeline-")]
    assert len(timelines) == len(rep["findings"][:report.TIMELINES]) == len(rep["timelines"])
    for i, w in enumerate(rep["timelines"], 1):
        spec = specs[f"chart-timeline-{i}"]
        shape = spec["layout"]["shapes"][0]
        assert shape["x0"] == pytest.approx(w["highlight_start_ns"] / 1e6)
        lanes = {y for t in spec["data"] for y in t["y"]}
        assert lanes == set(w["lanes"]) and any(x.startswith("stream") for x in lanes)
        assert any(x.startswith("host") for x in lanes)


def test_html_report_of_a_big_real_trace_stays_small(real_reports, tmp_path):
    rep = real_reports["kineto/queue_16rank_rank0.json.gz"]
    html = report.write(rep, tmp_path / "r.html", "html").read_text()
    specs = _specs(html)
    events = [sum(len(t["y"]) for t in s["data"]) for k, s in specs.items() if k.startswith("chart-timeline-")]
    assert events and max(events) <= report.TIMELINE_EVENTS
    assert any(w and w["dropped"] for w in rep["timelines"])  # the cap did cut
    assert len(html) < len(_plotly_js()) + 1_000_000
    outside = _outside_scripts(html)
    assert "<\\/" not in outside and outside.count("<div") == outside.count("</div>")


def _plotly_js() -> str:
    import plotly.offline

    return plotly.offline.get_plotlyjs()


def test_breakdown_parts_add_up_to_the_step_time(emulated):
    trace, _ = emulated
    frames = Frames(trace)
    rows = step_breakdown(frames)
    assert len(rows) == 6
    for r in rows:
        parts = r["compute_ns"] + r["communication_ns"] + r["copy_ns"] + r["idle_ns"]
        assert parts == r["step_ns"] == r["end_ns"] - r["start_ns"]
        assert min(r["compute_ns"], r["communication_ns"], r["copy_ns"], r["idle_ns"]) >= 0
        if r["idle_by_cause"]:
            assert sum(r["idle_by_cause"].values()) == r["idle_ns"]


def test_breakdown_attributes_idle_to_the_bubble_analyzers_gaps(emulated):
    from analyzers.bubbles import ALL_CAUSES, device_windows

    trace, _ = emulated
    frames = Frames(trace)
    rows = step_breakdown(frames)
    # The step windows are the bubble analyzer's, measured on the device.
    w = device_windows(frames)[(0, 0)]
    assert [(r["start_ns"], r["end_ns"]) for r in rows] == list(zip(w["start"], w["end"]))
    for r in rows:
        assert set(r["idle_by_cause"]) <= {*ALL_CAUSES, UNCLASSIFIED}
    # Without triple buffering the cores idle through host preprocessing: data loading is the
    # largest idle cause of every step after the first.
    assert all(max(r["idle_by_cause"], key=r["idle_by_cause"].get) == "data" for r in rows[1:])


def test_summary_shares_add_up(emulated):
    _, rep = emulated
    rows = {label.strip(): value for label, value, _ in report._summary_rows(rep["summary"])}

    def pct(v):
        return float(v.rstrip("%"))

    assert pct(rows["device utilisation"]) + pct(rows["device idle"]) == pytest.approx(100, abs=0.11)
    causes = [pct(v) for k, v in rows.items() if k.startswith("idle: ")]
    assert causes and sum(causes) == pytest.approx(pct(rows["bubble ratio"]), abs=0.1 * len(causes) + 0.01)
    md = report.to_markdown(rep)
    assert "| device utilisation |" in md and "1 - device utilisation" in md


def test_markdown_findings_show_cost_in_their_unit(emulated):
    _, rep = emulated
    md = report.to_markdown(rep)
    # One unit per quantity (MiB for memory, ms for time), 3 significant digits.
    def three_digits(text: str) -> bool:
        digits = text.replace(",", "")
        if "." not in digits:  # 6,140: the zero only holds the place
            digits = digits.rstrip("0")
        return len(digits.replace(".", "").lstrip("0")) == 3

    leak = md[md.index("(MEMORY_LEAK)"):]
    m = re.search(r"lost: ([\d.,]+) MiB", leak.split("###")[0])
    assert m and three_digits(m.group(1))
    first = md[md.index("### 1."):].split("###")[1]
    m = re.search(r"lost: ([\d.,]+) ms", first)
    assert m and three_digits(m.group(1))
    assert not re.search(r"\d (us|MB)\b", md)


# --- report -o: the format from the file name -------------------------------------------------


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "healthy.parquet"
    write_trace(scenarios.run("resnet50-infer").trace, path)
    return path


@pytest.mark.parametrize("name, head", [("r.md", "# msprof-py bottleneck report"),
                                        ("r.markdown", "# msprof-py bottleneck report"),
                                        ("r.html", "<!doctype html>"), ("R.HTM", "<!doctype html>"),
                                        ("r.json", "{")])
def test_report_format_follows_the_extension(small_trace, tmp_path, name, head):
    out = tmp_path / name
    result = runner.invoke(app, ["report", str(small_trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith(head)
    fmt = report.EXTENSIONS[out.suffix.lower()]
    assert f"wrote {fmt} report" in result.output


def test_report_format_option_names_the_format_of_an_unknown_extension(small_trace, tmp_path):
    out = tmp_path / "r.txt"
    result = runner.invoke(app, ["report", str(small_trace), "-o", str(out), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("# msprof-py bottleneck report")


@pytest.mark.parametrize("name, args, message", [
    ("x.html", ["--format", "md"],
     "msprof-py: error: --format md contradicts the file name x.html (.html is html); "
     "drop --format or change the extension"),
    ("x.md", ["-f", "json"],
     "msprof-py: error: --format json contradicts the file name x.md (.md is md); "
     "drop --format or change the extension"),
    ("x.txt", [],
     "msprof-py: error: cannot tell the report format from the file name x.txt; use .md, .html or .json, "
     "or give --format"),
    ("x", [], "msprof-py: error: cannot tell the report format from the file name x; use .md, .html or .json, "
              "or give --format"),
    ("x.txt", ["--format", "pdf"], "msprof-py: error: unknown report format 'pdf'; choose one of md, html, json"),
])
def test_report_format_conflicts_are_one_line_errors(small_trace, tmp_path, name, args, message):
    out = tmp_path / name
    result = runner.invoke(app, ["report", str(small_trace), "-o", str(out), *args])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [message]
    assert not out.exists()


# --- diff: costs in their unit ------------------------------------------------------------------


@pytest.fixture(scope="module")
def leak_runs(tmp_path_factory, small_trace):
    d = tmp_path_factory.mktemp("leak")
    out = {"healthy": small_trace}
    for label, steps in (("leak", None), ("leak_longer", 8)):
        out[label] = d / f"{label}.parquet"
        write_trace(scenarios.run("resnet50-infer", switches=["leak"], steps=steps).trace, out[label])
    return out


def _diff(runs, a, b):
    result = runner.invoke(app, ["diff", str(runs[a]), str(runs[b]), "--json"])
    assert result.exit_code == 0, result.output
    doc = strict_loads(result.output)
    return {f["code"]: f for f in doc["findings"]}


def test_diff_counts_a_leak_in_bytes(leak_runs):
    new = _diff(leak_runs, "healthy", "leak")["MEMORY_LEAK"]
    assert new["unit"] == "bytes" and new["status"] == "new"
    assert new["base_count"] == 0 and new["new_count"] == 1 and new["new_cost"] > 2**20
    fixed = _diff(leak_runs, "leak", "healthy")["MEMORY_LEAK"]
    assert fixed["status"] == "fixed" and fixed["base_cost"] == new["new_cost"]
    worse = _diff(leak_runs, "leak", "leak_longer")["MEMORY_LEAK"]
    assert worse["status"] == "worse" and worse["new_cost"] > worse["base_cost"] == new["new_cost"]
    better = _diff(leak_runs, "leak_longer", "leak")["MEMORY_LEAK"]
    assert better["status"] == "better"


def test_diff_prints_a_leak_in_mib_not_ms(leak_runs):
    result = runner.invoke(app, ["diff", str(leak_runs["leak"]), str(leak_runs["leak_longer"])],
                           terminal_width=160)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "MEMORY_LEAK" in line)
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    assert cells[0] == "MEMORY_LEAK" and cells[1] == "1 -> 1" and cells[4] == "worse"
    assert cells[2:4] == ["4,100 MiB", "8,190 MiB"]  # 4 and 8 steps of 1 GiB (and 512 B)
    assert "0.000 -> 0.000" not in result.output


def test_compare_keeps_time_and_memory_apart():
    def rep(*findings):
        return {"summary": {"bubble_ratio": float("nan")}, "findings": list(findings)}

    t = {"code": "X", "cost_unit": "ns", "lost_ns": 2_000_000, "lost_bytes": None}
    m = {"code": "X", "cost_unit": "bytes", "lost_ns": None, "lost_bytes": 3 << 20}
    n = {"code": "Y", "cost_unit": "", "lost_ns": None, "lost_bytes": None}
    table = compare(rep(t, m, n), rep({**t, "lost_ns": 3_000_000}, {**m, "lost_bytes": 1 << 20}, n, n))
    rows = {(r["code"], r["unit"]): r for r in table["findings"]}
    assert rows[("X", "ns")]["status"] == "worse" and rows[("X", "bytes")]["status"] == "better"
    assert rows[("Y", "")]["status"] == "worse"  # no cost: more findings is worse
    assert [r["unit"] for r in table["findings"]] == ["ns", "bytes", ""]
    assert all(r["metric"] != "bubble ratio" for r in table["metrics"])  # NaN on both sides: no row


def test_the_report_carries_the_critical_path_per_rank_in_every_format(emulated, tmp_path):
    from analyzers.causality.critical_path import critical_path

    trace, rep = emulated
    cp = rep["critical_path"]
    frames = Frames(trace)
    ranks = sorted({int(r) for r in frames.table.column("rank").to_pylist()})
    assert [r["rank"] for r in cp["ranks"]] == ranks
    for r in cp["ranks"]:
        assert sum(r["blame_ns"].values()) == r["region_ns"]
        assert r["length_ns"] == critical_path(frames, r["rank"]).length_ns
        assert len(r["top_ops"]) <= report.CRITICAL_PATH_OPS
    md = report.to_markdown(rep)
    assert "## Critical path" in md and f"### rank {ranks[0]}: path " in md
    html = report.to_html(rep)
    assert "<h2>Critical path</h2>" in html and cp["ranks"][0]["top_ops"][0]["name"] in html
