"""The cluster analyses of a job (`msprof-py cluster`), partition by partition.

msprof-analyze's cluster analyses need every rank, but only a little of each: a rank's collective
parts (its arrival at each collective), what communication.json needs of it (its collectives and
its link-rate series) and its own step table. So, as `msprof_py.report.analyze` does for the
analyzers, each rank partition is read by one task (in this process, or on a Dask worker, which
holds one partition at a time) that returns those small summaries, and the driver reduces them:
it matches the collectives across ranks (slow ranks), builds communication.json and the matrix
from every partition's summary (`communication.reduce`: the per-op time split, the links and
their slow ones) and concatenates the step tables. Nothing reads the whole trace on the driver,
and the result is that of the whole trace (tests/test_cluster.py compares them).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from msprof_py.errors import MsprofError
from msprof_py.trace.schema import Trace


def partition_summary(part: Any) -> dict[str, Any]:
    """The task of one partition (or a batch of consecutive ones; on disk or in memory): its
    collective parts, its communication summary and its step table."""
    from analyzers import Frames
    from analyzers.causality import pipeline
    from analyzers.cluster import collective_parts
    from msprof_py import communication, report, summaries

    trace = report._partition_trace(part)
    frames = Frames(trace)
    ranks = summaries.rank_steps(frames.steps)
    return {
        "parts": collective_parts(frames),
        "transfers": pipeline.own_transfers(frames),
        "comm": communication.summarize(_CommRows(trace, frames)),
        "steps": summaries.step_table(ranks, frames.device_ops) if len(ranks) else None,
        "ranks": sorted(int(r) for r in trace.table.column("rank").unique().to_pylist()),
        "topology": (trace.meta.extra or {}).get("topology") or {},
        "origin_ns": int(trace.meta.origin_ns or 0),
    }


class _CommRows:
    """What `communication.summarize` reads of a partition (its `tasks` and `counters`), without
    `summaries.Rows`' pandas copy of every row: the collectives and wait tasks go through Rows, the
    counters stay a name / ts / value frame (the name categorical). A partition that records every
    link of the cluster (rank 0 of an emulated job: 13M rows, nearly all link counters) then
    costs its counters' three columns, not the whole table as objects."""

    def __init__(self, trace: Trace, frames: Any) -> None:
        import pyarrow as pa

        from msprof_py import summaries

        comm = frames.kind_mask(("collective", "wait"))
        self.tasks = summaries.Rows(Trace(table=trace.table.filter(pa.array(comm)), meta=trace.meta)).tasks
        counter = frames.kind_mask(("counter",))
        self.counters = trace.table.select(["name", "ts", "value"]).filter(pa.array(counter)).to_pandas()


def analyze(parts: list, *, engine: str = "local", scheduler: str | None = None, workers: int | None = None,
            progress: bool | None = None, input_bytes: int = 0, console: Any = None) -> dict[str, Any]:
    """The cluster analyses (what `msprof-py cluster --format json` prints) of a job given as rank
    partitions (`report.rank_partitions`, or `report.split_by_rank` of a trace loaded whole), run
    on `engine` as `report.analyze` runs the analyzers."""
    from analyzers.causality import pipeline
    from analyzers.cluster import report as cluster_report
    from msprof_py import communication, loading, summaries
    from msprof_py.report import _engine, local_batches

    if not parts:
        raise MsprofError("the trace has no ranks to analyze")
    with loading.progress_reporter(input_bytes, force=progress, console=console) as bar, \
            _engine(engine, scheduler, workers, len(parts)) as client:
        bar("cluster", 0, len(parts))
        if client is None:
            out, done = [], 0
            for batch in local_batches(parts):
                out.append(partition_summary(batch))
                done += len(batch)
                bar("cluster", done, len(parts))
        else:
            import distributed

            shipped = client.scatter(list(parts)) if isinstance(parts[0], Trace) else parts
            futures = [client.submit(partition_summary, p, pure=False) for p in shipped]
            for i, _ in enumerate(distributed.as_completed(futures), 1):
                bar("cluster", i, len(futures))
            out = [f.result() for f in futures]
    ranks = sorted({r for o in out for r in o["ranks"]})
    if len(ranks) < 2:
        raise MsprofError(f"the cluster analyses need a multi-rank trace; it holds {len(ranks)} rank(s)")
    # The ops and links as tables: the cluster analyses need their sums, not communication.json's dicts.
    ops, sent = communication.tables([o["comm"] for o in out], out[0]["topology"])
    frames = [o["parts"] for o in out if len(o["parts"])]
    coll = pd.concat(frames, ignore_index=True) if frames else out[0]["parts"]
    result = cluster_report(coll, communication.link_table(sent))
    tables = [o["steps"] for o in out if o["steps"] is not None and len(o["steps"])]
    steps = (summaries.cluster_step_trace_time(
        pd.concat(tables, ignore_index=True).sort_values(["rank", "step"], kind="stable").reset_index(drop=True))
        if tables else None)
    own = [o["transfers"] for o in out if len(o["transfers"])]
    cells = pipeline.view_cells(pipeline.view(pd.concat(own, ignore_index=True))) if own else []
    return {"steps": [] if steps is None else steps.to_dict("records"), **result,
            "communication_time": communication.op_time_split_table(ops), "pipeline": cells}
