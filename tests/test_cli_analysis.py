"""analyze / report / diff from the command line, on emulated traces with known problems."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.trace import write_trace
from runtime_emu import Kernel, Runtime, scenarios

runner = CliRunner()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    out = {}
    for label, name, switches, params in (("healthy", "yolo-pipeline", (), {}),
                                          ("serial", "yolo-pipeline", (), {"triple_buffer": False}),
                                          ("leak", "resnet50-infer", ("leak",), {})):
        path = d / f"{label}.parquet"
        write_trace(scenarios.run(name, switches=switches, **params).trace, path)
        out[label] = path
    # A race between kernels whose names would be markup if not escaped.
    rt = Runtime()
    rt.set_device(0)
    a, b = rt.create_stream(), rt.create_stream()
    buf = rt.malloc(1 << 20)
    rt.launch_kernel(Kernel("<img src=x onerror=alert(1)>", 100_000), 20, a, writes=(buf,))
    rt.launch_kernel(Kernel("reader</script>", 1_000, core="vector"), 4, b, reads=(buf,))
    rt.synchronize_device()
    out["race"] = d / "race.parquet"
    write_trace(rt.finish().trace, out["race"])
    return out


def test_analyze_prints_ranked_findings_with_remedies(traces):
    result = runner.invoke(app, ["analyze", str(traces["leak"]), "--json"])
    assert result.exit_code == 0, result.output
    findings = json.loads(result.output)["findings"]
    # 4 steps of 1 GiB leaked: 6.25% of the device's 64 GiB, a warning by the one severity rule
    assert findings[0]["code"] == "MEMORY_LEAK" and findings[0]["severity"] == "warning"
    assert findings[0]["lost_bytes"] == 4 * (1 << 30) + 4 * 512  # the caching allocator rounds each up
    assert findings[0]["lookup"]["remedy"].startswith("Free on every path")


def test_html_report_is_self_contained_and_escapes_names(traces, tmp_path):
    out = tmp_path / "race.html"
    result = runner.invoke(app, ["report", str(traces["race"]), "-o", str(out), "--format", "html"])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html
    assert "reader</script>" not in html
    import re

    assert not re.search(r"<script[^>]*\bsrc=", html)  # plotly.js is inline: works offline
    assert not re.search(r"<link[^>]*\bhref=\"http", html)
    assert "MISSING_SYNC" in html and "Add aclrtRecordEvent" in html


def test_json_report_carries_streams_and_copies(traces, tmp_path):
    out = tmp_path / "r.json"
    assert runner.invoke(app, ["report", str(traces["healthy"]), "-o", str(out), "-f", "json"]).exit_code == 0
    doc = json.loads(out.read_text())
    assert set(doc["streams"][0]) == {"rank", "device", "stream", "busy_ns", "idle_ns", "queue_len_max", "queue_len_mean"}
    assert {c["kind"] for c in doc["copies"]} == {"Memcpy HtoD", "Memcpy DtoH"}
    assert set(doc["copies"][0]) == {"rank", "kind", "count", "gbps_mean", "gbps_max"}
    assert {"step_time_ns_mean", "device_utilisation_mean", "bubble_ratio", "throughput_steps_per_s"} <= set(doc["summary"])
    assert doc["findings"] == []


def test_fail_on_sets_the_exit_code_for_ci(traces, tmp_path):
    out = tmp_path / "r.md"
    leak = str(traces["leak"])
    assert runner.invoke(app, ["report", leak, "-o", str(out), "-f", "md", "--fail-on", "warning"]).exit_code == 1
    assert runner.invoke(app, ["report", leak, "-o", str(out), "-f", "md", "--fail-on", "critical"]).exit_code == 0
    assert runner.invoke(app, ["report", str(traces["healthy"]), "-o", str(out), "-f", "md", "--fail-on",
                               "warning"]).exit_code == 0
    assert "# msprof-py bottleneck report" in out.read_text()


@pytest.mark.parametrize("args, message", [
    (["--format", "pdf"], "unknown report format 'pdf'; choose one of md, html, json"),
    (["--fail-on", "sometimes"], "unknown --fail-on severity 'sometimes'; choose one of warning, critical"),
    (["--window", "most"], "unknown analysis window 'most'; choose one of all, complete_steps"),
    (["--top", "3"], "No such option: --top (Possible options: --output) (see msprof-py report --help)"),
    (["-a", "nope"], "unknown analyzer 'nope'; choose from bandwidth, bubbles, cores, launch, links, memory, pipeline, queue, ranks, sync"),
])
def test_bad_report_options_exit_2_and_write_nothing(traces, tmp_path, args, message):
    out = tmp_path / "nothing.html"
    result = runner.invoke(app, ["report", str(traces["healthy"]), "-o", str(out), *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"msprof-py: error: {message}\n"
    assert not out.exists()


def test_diff_shows_the_pipelined_version_is_faster(traces):
    result = runner.invoke(app, ["diff", str(traces["serial"]), str(traces["healthy"]), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {r["metric"]: r for r in doc["metrics"]}
    assert rows["throughput (steps/s)"]["change"] > 0.4 and rows["throughput (steps/s)"]["better"]
    assert rows["bubble ratio"]["new"] < rows["bubble ratio"]["base"]
    assert {f["code"]: f["status"] for f in doc["findings"]}.get("BUBBLE_DATA") == "fixed"
