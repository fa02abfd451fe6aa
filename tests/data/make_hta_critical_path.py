"""Regenerate hta_critical_path.json: HTA's critical path on the shared Kineto traces.

HTA 0.5's critical_path_analysis needs pandas < 3, so this runs in its own environment:

    python3 -m venv /tmp/htaenv && /tmp/htaenv/bin/pip install HolisticTraceAnalysis "pandas<3"
    HTA_DISABLE_NS_ROUNDING=1 /tmp/htaenv/bin/python tests/data/make_hta_critical_path.py

For each trace: the path's length (the sum of its edges' weights, in the trace's microseconds),
its edge count, and its length per HTA edge type and per event category (bound_by), the whole
trace as the region (annotation "").
"""

import gzip
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

TRACES = ("alexnet_critical_path", "event_sync_multi_stream")
HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[2] / "shared" / "real_traces" / "kineto"


def reference(name: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        with gzip.open(SHARED / f"{name}.json.gz") as src, open(Path(d) / f"{name}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
        ta = TraceAnalysis(trace_dir=d)
        rank = next(iter(ta.t.traces))
        graph, ok = ta.critical_path_analysis(rank=rank, annotation="", instance_id=None)
        assert ok, f"HTA found no critical path on {name}"
        bd = graph.get_critical_path_breakdown()
        by_type = bd.groupby(bd["type"].astype(str))["duration"].sum()
        return {
            "length": int(bd["duration"].sum()),
            "edges": int(len(bd)),
            "by_edge_type": {k.replace("CPEdgeType.", ""): int(v) for k, v in by_type.items()},
            "by_bound": {k: int(v) for k, v in bd.groupby("bound_by")["duration"].sum().items()},
        }


def main() -> None:
    logging.getLogger("hta").setLevel(logging.ERROR)
    import hta
    out = {"hta_version": getattr(hta, "__version__", "0.5"), "region": "whole trace (annotation '')",
           "unit": "trace time units (us)", "traces": {n: reference(n) for n in TRACES}}
    (HERE / "hta_critical_path.json").write_text(json.dumps(out, indent=2) + "\n")
    json.dump(out, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
