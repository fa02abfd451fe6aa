"""Peak device memory of torch_npu traces, from the NPU memory counters their timeline carries.

torch_npu's trace_view.json has an "NPU MEM" process whose counters ("APP/DDR", "APP/HBM",
"APP/Memory", "Device/...") sample the device memory in KB ({"KB": ...}) every 20 ms; "APP/Memory"
is what the application holds (its HBM plus DDR). The peak is its largest sample: on the shared
2-rank ResNet job, the same figure the output folder's memory_record.csv gives as the APP
component's largest "Total Reserved(MB)". Expected figures are read from the raw files with the
standard library.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzers.frames import Frames
from analyzers.overview import overview
from msprof_py import report
from msprof_py.cli import app
from msprof_py.loading import load_any
from msprof_py.summary import peak_memory_bytes, summarize
from msprof_py.trace import import_bytes, import_trace

runner = CliRunner()
JOB = Path("ascend") / "resnet_2rank_level1_text"
#: rank -> the peak of its "APP/Memory" counter: 2,164,460 KB and 2,164,464 KB.
PEAK = {0: 2_216_407_040, 1: 2_216_411_136}


def _output(real_traces: Path, rank: int) -> Path:
    return real_traces / JOB / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"


def _app_memory_kb(path: Path) -> list[float]:
    events = json.loads(path.read_text(encoding="utf-8"))
    return [e["args"]["KB"] for e in events if e.get("ph") == "C" and e.get("name") == "APP/Memory"]


def _memory_record_app_mb(path: Path) -> list[float]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return [float(r["Total Reserved(MB)"]) for r in csv.DictReader(fh) if r["Component"] == "APP"]


@pytest.mark.parametrize("rank", [0, 1])
def test_peak_is_the_app_memory_counters_largest_sample(real_traces, rank):
    out = _output(real_traces, rank)
    samples = _app_memory_kb(out / "trace_view.json")
    assert len(samples) == 14
    assert max(samples) * 1024 == PEAK[rank]
    # The output folder's own record of the same memory says the same, in MB.
    assert max(_memory_record_app_mb(out / "memory_record.csv")) * 2**20 == PEAK[rank]
    trace = import_trace(out.parent)
    assert trace.meta.source_format == "ascend"
    assert peak_memory_bytes(trace.table) == PEAK[rank]
    assert summarize(trace).peak_memory_bytes == PEAK[rank]


def test_report_and_info_show_the_peak(real_traces):
    folder = _output(real_traces, 0).parent
    trace = import_trace(folder)
    assert overview(Frames(trace))["peak_memory_bytes"] is None  # the overview names no NPU counter
    rep = report.build(trace, timelines=0)
    assert rep["summary"]["peak_memory_bytes"] == PEAK[0]
    assert "| peak device memory | 2,110 MiB |  |" in report.to_markdown(rep).splitlines()
    assert "<tr><th>peak device memory</th><td>2,110 MiB</td>" in report.to_html(rep)
    doc = json.loads(runner.invoke(app, ["info", str(folder), "--json"]).stdout)
    assert doc["peak_memory_bytes"] == PEAK[0]
    assert "peak memory:    2,110 MiB" in runner.invoke(app, ["info", str(folder)]).stdout.splitlines()


def test_a_timeline_without_memory_counters_has_no_peak(real_traces):
    trace = import_trace(real_traces / "ascend" / "torch_npu_trace_view.json.gz")
    assert peak_memory_bytes(trace.table) is None
    assert report.build(trace, timelines=0)["summary"]["peak_memory_bytes"] is None


# ---------------------------------------------------------------- the other producers: as the overview says

def test_kineto_memory_events_peak_at_the_largest_total_allocated():
    """PyTorch's `[memory]` instants: the allocator's "Total Allocated" after each, in bytes."""
    def mem(ts: int, size: int, total: int) -> dict:
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Addr": 4096, "Bytes": size, "Total Allocated": total, "Total Reserved": 2**22,
                         "Device Id": 0, "Device Type": 1}}
    doc = {"schemaVersion": 1, "traceEvents": [mem(1, 512, 512), mem(2, 1024, 1536), mem(3, -512, 1024)]}
    trace = import_bytes(json.dumps(doc).encode())
    assert peak_memory_bytes(trace.table) == 1536 == overview(Frames(trace))["peak_memory_bytes"]


def test_emulated_counters_peak_as_the_overview_says():
    trace = load_any(Path(__file__).resolve().parents[1] / "sample_traces" / "emulated" / "resnet50-infer-leak")
    # Its "Device memory used" counter's largest sample, as the overview reads it.
    assert peak_memory_bytes(trace.table) == 6_583_089_280 == overview(Frames(trace))["peak_memory_bytes"]
