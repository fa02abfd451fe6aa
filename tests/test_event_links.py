"""Kineto's typed event links: CUPTI's Stream Wait Event is a `wait` on the waiting stream naming
its event (`addr`) and that event's record call (`value` = the cudaEventRecord call's `corr`,
whose `stream` is the stream it recorded on); Event Sync is the host's `sync`. The dependency
graph releases the task the wait held back by the task behind the record (graph.Tasks.event_src),
not by whichever task on another stream ended last (the guess left for traces without the link),
and never puts the wait row, written at the call's host time, in its stream's FIFO order."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from analyzers import Frames
from analyzers.causality import attribution
from analyzers.causality.critical_path import critical_path
from analyzers.causality.graph import rank_graph, stream_tasks
from msprof_py.trace.importers import import_trace
from tests.test_causality import launch, table, task

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
    host, T = rank_graph(frames, 0, 5_000)
    assert (0, 24) not in host.threads
    # The memset the wait held back (first on stream 24) is released by the kernel launched on
    # stream 20 before the record call (corr 1385), not by stream 28's, which ended later.
    j = int(np.flatnonzero(T.event_src != -1)[0])
    assert (T.name[j], int(T.stream[j]), int(T.corr[j])) == ("Memset (Device)", 24, 1411)
    s = int(T.event_src[j])
    assert (T.name[s], int(T.stream[s]), int(T.corr[s])) == ("ampere_sgemm_128x64_nn", 20, 27)
    assert int((T.event_src != -1).sum()) == 1


def test_alexnets_stream_waits_link_their_records(real_traces):
    """alexnet_critical_path's 20 Stream Wait Events: stream 7 waits for events recorded on
    streams 20-27 (cuDNN's FFT streams, most of them empty), stream 20 for events on stream 7."""
    t = import_trace(real_traces / ALEXNET)
    w = rows_named(t, "Stream Wait Event")
    assert len(w) == 20 and set(w["kind"].astype(str)) == {"wait"} and w["value"].notna().all()
    rec = rows_named(t, "cudaEventRecord")
    assert int(rec["stream"].notna().sum()) == 20
    assert sorted(set(rec["stream"].dropna().astype(int))) == [7, 20, 21, 22, 23, 24, 25, 26, 27]
    _, T = rank_graph(Frames(t), 0, 5_000)
    linked = np.flatnonzero(T.event_src != -1)
    # Two iterations of 3 linked tasks: stream 20 twice (two waits before two launches), stream 7
    # once (8 waits before one launch: the source that ended last, on stream 20).
    assert [int(T.stream[j]) for j in linked] == [7, 7, 20, 20, 20, 20]
    assert (T.event_src[linked] >= 0).all()
    assert all(int(T.stream[s]) == (20 if int(T.stream[j]) == 7 else 7) for j, s in zip(linked, T.event_src[linked]))


# ---------------------------------------------------------------- hand-built tables
US = 1_000


def record(ts, corr, stream, event=7):
    """cudaEventRecord: the host call, with the stream it recorded the event on."""
    return {"ph": "X", "name": "cudaEventRecord", "kind": "api", "ts": ts, "dur": 2 * US, "corr": corr,
            "device": 0, "stream": stream, "addr": event}


def stream_wait(ts, corr, stream, record_corr, event=7):
    """cudaStreamWaitEvent (the host call) and CUPTI's Stream Wait Event on the waiting stream,
    at the call's host time."""
    return [{"ph": "X", "name": "cudaStreamWaitEvent", "kind": "wait", "ts": ts, "dur": 3 * US, "corr": corr},
            {**task("Stream Wait Event", "wait", stream, ts + US, 2 * US, corr), "addr": event,
             "value": record_corr}]


def program(*links):
    """K0 then copy C1 on stream 1 (C1 100-500 us), copy C3 on stream 3 (100-540 us, ending
    nearer K2's start), K2 on stream 2 at 545 us, launched at 40 us after `links`; K5 on stream 1
    launched after every record call."""
    return [launch(0, 3 * US, 1), task("K0", "kernel", 1, 10 * US, 90 * US, 1),
            launch(5 * US, 3 * US, 2), task("C1", "memcpy", 1, 100 * US, 400 * US, 2),
            launch(12 * US, 3 * US, 3), task("C3", "memcpy", 3, 100 * US, 440 * US, 3),
            *links,
            launch(40 * US, 10 * US, 4), task("K2", "kernel", 2, 545 * US, 50 * US, 4),
            launch(60 * US, 3 * US, 5), task("K5", "kernel", 1, 600 * US, 50 * US, 5)]


def got(rows):
    t = attribution(Frames(table(rows)))
    return [(int(r.ts) // US, int(r.end) // US, r.cause, int(r.via)) for r in t.sort_values("ts").itertuples()
            if r.next_name == "K2"]


def test_the_recorded_link_names_the_task_behind_the_record_not_the_last_to_end():
    linked = program(record(20 * US, 100, 1), *stream_wait(30 * US, 101, 2, 100))
    # C1 (stream 1) was launched last before the record call: K2 waited for it; C3 ended later.
    assert got(linked) == [(100, 500, "copy", 1), (500, 545, "dispatch", 1)]
    # The same program with only the host's stream-wait call: the guess names the last to end.
    guessed = [r for r in linked if r["name"] != "Stream Wait Event"]
    assert got(guessed) == [(100, 540, "copy", 3), (540, 545, "dispatch", 3)]
    # The critical path runs through C1 as well.
    cp = critical_path(Frames(table(linked)), 0)
    names = [r.name for r in cp.segments.itertuples() if r.weight_ns > 0]
    assert "C1" in names and "C3" not in names


def test_a_task_several_waits_held_back_waits_for_the_source_that_ended_last():
    rows = program(record(20 * US, 100, 1), record(25 * US, 102, 3, event=8),
                   *stream_wait(30 * US, 101, 2, 100), *stream_wait(34 * US, 103, 2, 102, event=8))
    assert got(rows) == [(100, 540, "copy", 3), (540, 545, "dispatch", 3)]


def test_a_link_to_an_event_recorded_behind_nothing_is_no_release_and_no_guess():
    # The event was recorded on stream 4, where nothing was launched before the record: it had
    # fired already, so K2 waited for nothing recorded; the guess would have named C3.
    rows = program(record(20 * US, 100, 4), *stream_wait(30 * US, 101, 2, 100))
    assert got(rows) == [(100, 545, "unexplained", -1)]
    _, T = rank_graph(Frames(table(rows)), 0, 5_000)
    assert (T.event_src == -1).all() and not T.waited.any()


@pytest.mark.parametrize("record_corr", [-1, 999], ids=["CUPTI saw no record", "record call not in the trace"])
def test_a_link_the_table_cannot_follow_falls_back_to_the_guess(record_corr):
    rows = program(record(20 * US, 100, 1), *stream_wait(30 * US, 101, 2, record_corr))
    assert got(rows) == [(100, 540, "copy", 3), (540, 545, "dispatch", 3)]


def test_the_wait_row_is_not_in_its_streams_fifo():
    # Written at the call's host time (31-33 us), as a task it would release K2 at 33 us and
    # count as an event wait of its own: it is not one of the stream's tasks.
    rows = program(record(20 * US, 100, 1), *stream_wait(30 * US, 101, 2, 100))
    frames = Frames(table(rows))
    tasks = stream_tasks(frames)
    assert list(tasks.loc[tasks["stream"] == 2, "name"]) == ["K2"]
    _, T = rank_graph(frames, 0, 5_000)
    k2 = int(np.flatnonzero(T.name == "K2")[0])
    assert T.prev[k2] == -1 and T.name[T.event_src[k2]] == "C1"


def test_a_linked_wait_orders_the_read_after_the_task_behind_the_record_only():
    """Happens-before: K2 is ordered after C1 (behind the record), not after W1, which stream 1 ran
    after the record call although it ended before K2 began. The guess (every task ended by then)
    hides that race; the link finds it."""
    from tests.test_causality import access, race_pairs

    buf, buf2 = 0xA000, 0xB000
    rows = [*program(record(20 * US, 100, 1), *stream_wait(30 * US, 101, 2, 100)),
            launch(22 * US, 3 * US, 6), task("W1", "kernel", 1, 500 * US, 20 * US, 6),
            access("mem_write", buf2, 2, 100 * US), access("mem_write", buf, 6, 500 * US),
            access("mem_read", buf2, 4, 545 * US), access("mem_read", buf, 4, 545 * US)]
    assert race_pairs(rows) == [(6, 4, 1, 2)]
    assert race_pairs([r for r in rows if r["name"] != "Stream Wait Event"]) == []
