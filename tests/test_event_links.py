"""Kineto's typed event links: CUPTI's Stream Wait Event is a `wait` on the waiting stream naming
its event (`addr`) and that event's record call (`value` = the cudaEventRecord call's `corr`,
whose `stream` is the stream it recorded on); Event Sync is the host's `sync`. The dependency
graph never puts the wait row, written at the call's host time, in its stream's FIFO order."""

from __future__ import annotations

import gzip
import json

import numpy as np

from analyzers import Frames
from analyzers.causality.graph import rank_graph, stream_tasks
from msprof_py.trace.importers import import_trace

EVENT_SYNC = "kineto/event_sync_multi_stream.json.gz"
ALEXNET = "kineto/alexnet_critical_path.json.gz"


def rows_named(t, *names):
    df = t.to_pandas()
    return df[df["name"].astype(str).isin(names)].sort_values(["ts", "name"], kind="stable")


def typed(df, *cols):
    out = []
    for r in df[list(cols)].itertuples(index=False):
        out.append(tuple(None if (isinstance(v, float) and np.isnan(v)) else (int(v) if isinstance(v, float) else v)
                         for v in r))
    return out


def test_stream_wait_event_is_a_wait_on_its_stream_naming_its_event_and_record_call(real_traces):
    t = import_trace(real_traces / EVENT_SYNC)
    cols = ("name", "kind", "device", "stream", "corr", "addr", "value")
    got = typed(rows_named(t, "Stream Wait Event", "cudaStreamWaitEvent"), *cols)
    # The host call stays the host's (no stream: a wait on a stream is the device's).
    assert got == [("cudaStreamWaitEvent", "wait", None, None, 1389, None, None),
                   ("Stream Wait Event", "wait", 0, 24, 1389, 19, 1385)]
    # The record calls say where they recorded the event and which event, as far as a sync
    # record names them; the last one no record names keeps none of it.
    assert typed(rows_named(t, "cudaEventRecord"), *cols) == [
        ("cudaEventRecord", "api", 0, 20, 32, 9, None), ("cudaEventRecord", "api", 0, 28, 62, 9, None),
        ("cudaEventRecord", "api", 0, 20, 1385, 19, None), ("cudaEventRecord", "api", None, None, 1418, None, None)]


def test_event_sync_and_context_sync_are_host_syncs(real_traces):
    t = import_trace(real_traces / EVENT_SYNC)
    cols = ("name", "kind", "device", "stream", "corr", "addr", "value")
    assert typed(rows_named(t, "Event Sync", "Context Sync"), *cols) == [
        ("Event Sync", "sync", 0, -1, 24, 9, -1),  # CUPTI saw no record of event 9 yet: -1
        ("Event Sync", "sync", 0, -1, 54, 9, 32),
        ("Event Sync", "sync", 0, -1, 1410, 9, 62),
        ("Context Sync", "sync", 0, -1, 1424, None, None)]
    # The runtime calls they pair with are syncs too; the trace's waits are the one stream wait.
    kinds = t.to_pandas()["kind"].astype(str)
    assert (int((kinds == "wait").sum()), int((kinds == "sync").sum())) == (2, 8)
    assert set(rows_named(t, "cudaEventQuery", "cudaDeviceSynchronize")["kind"].astype(str)) == {"sync"}


def test_the_import_keeps_the_args_verbatim(real_traces):
    t = import_trace(real_traces / EVENT_SYNC)
    src = json.loads(gzip.open(real_traces / EVENT_SYNC).read())["traceEvents"]
    want = [e["args"] for e in src if e.get("cat") == "cuda_sync"]
    got = [json.loads(a) for a in rows_named(t, "Event Sync", "Stream Wait Event", "Context Sync")["args"]]
    assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, want))


def test_the_wait_row_is_no_stream_task_and_no_host_thread(real_traces):
    frames = Frames(import_trace(real_traces / EVENT_SYNC))
    tasks = stream_tasks(frames)
    assert "wait" not in set(tasks["kind"]) and len(tasks) == 6
    host, _ = rank_graph(frames, 0, 5_000)
    assert (0, 24) not in host.threads


def test_alexnets_stream_waits_link_their_records(real_traces):
    """alexnet_critical_path's 20 Stream Wait Events: stream 7 waits for events recorded on
    streams 20-27 (cuDNN's FFT streams, most of them empty), stream 20 for events on stream 7."""
    t = import_trace(real_traces / ALEXNET)
    w = rows_named(t, "Stream Wait Event")
    assert len(w) == 20 and set(w["kind"].astype(str)) == {"wait"} and w["value"].notna().all()
    rec = rows_named(t, "cudaEventRecord")
    assert int(rec["stream"].notna().sum()) == 20
    assert sorted(set(rec["stream"].dropna().astype(int))) == [7, 20, 21, 22, 23, 24, 25, 26, 27]
