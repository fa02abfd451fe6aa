"""Analyzers read what a row is from its kind, never from its name or category.

The tables are built by hand with names no producer writes, and each case is checked against
the same rows with the kind replaced by `marker`: the answer must follow the kind.
"""

from __future__ import annotations

import numpy as np

from analyzers import Frames, Severity, run
from analyzers.causality.graph import HOST_CLASSES, host_state, stream_tasks
from msprof_py.trace.schema import COLUMN_NAMES, TraceMeta, build_table

MiB = 1 << 20


def trace(rows: list[dict]):
    """A trace of `rows` (column -> value; rank 0, pid 1, tid 1 unless given)."""
    base = {"rank": 0, "pid": 1, "tid": 1}
    rows = [{**base, **r} for r in rows]
    return build_table({c: [r.get(c) for r in rows] for c in COLUMN_NAMES}, TraceMeta(source_format="chrome"))


def as_markers(rows: list[dict], kinds: tuple[str, ...]) -> list[dict]:
    return [{**r, "kind": "marker"} if r["kind"] in kinds else r for r in rows]


def _task(name, corr, stream, ts, dur, launch_ts):
    return [
        {"ph": "X", "name": "launch", "kind": "launch", "ts": launch_ts, "dur": 5, "corr": corr},
        {"ph": "X", "name": name, "kind": "kernel", "pid": 9, "tid": stream, "ts": ts, "dur": dur, "corr": corr,
         "device": 0, "stream": stream},
    ]


RACE = [
    *_task("producer", 1, 1, 100, 400, 10),  # writes 0xA0 from 100 to 500
    *_task("consumer", 2, 2, 200, 100, 20),  # reads 0xA0 from 200: nothing orders it after the write
    {"ph": "i", "name": "st", "kind": "mem_write", "ts": 10, "addr": 0xA0, "corr": 1, "device": 0, "stream": 1},
    {"ph": "i", "name": "ld", "kind": "mem_read", "ts": 20, "addr": 0xA0, "corr": 2, "device": 0, "stream": 2},
]


def test_buffer_accesses_are_the_mem_read_and_mem_write_rows():
    acc = Frames(trace(RACE)).accesses
    assert [tuple(r) for r in acc[["rank", "ts", "kind", "addr", "corr"]].astype(str).itertuples(index=False)] == [
        ("0", "10", "mem_write", "160", "1"), ("0", "20", "mem_read", "160", "2")]


def test_missing_sync_is_found_from_access_kinds_whatever_their_names():
    (race,) = [f for f in run(trace(RACE), ["sync"]).findings if f.code == "MISSING_SYNC"]
    assert (race.rank, race.stream, race.ts_ns, race.dur_ns) == (0, 2, 200, 300)
    assert race.severity == Severity.CRITICAL
    unmarked = run(trace(as_markers(RACE, ("mem_read", "mem_write"))), ["sync"])
    assert [f for f in unmarked.findings if f.code == "MISSING_SYNC"] == []


FAILED = [
    {"ph": "i", "name": "oom", "kind": "alloc_fail", "ts": 50, "bytes": 30 * MiB, "value": float(10 * MiB),
     "device": 0},
    # A failure with no largest-free figure (PyTorch's [OutOfMemory]) says nothing about fragmentation.
    {"ph": "i", "name": "oom", "kind": "alloc_fail", "ts": 60, "bytes": 64 * MiB, "device": 0},
]


def test_failed_allocations_are_the_alloc_fail_rows():
    fails = Frames(trace(FAILED)).alloc_failures
    assert fails[["rank", "device", "ts", "bytes"]].values.tolist() == [[0, 0, 50, 30 * MiB], [0, 0, 60, 64 * MiB]]
    assert fails.value.tolist()[0] == 10 * MiB and np.isnan(fails.value.tolist()[1])


def test_fragmentation_from_a_failed_allocation_whatever_its_name():
    (frag,) = run(trace(FAILED), ["memory"]).findings
    # Without memory counters the free total is unknown: a suspect (warning), with no cost in bytes.
    assert (frag.code, frag.severity, frag.rank, frag.device, frag.ts_ns, frag.lost_bytes) == (
        "MEMORY_FRAGMENTATION", Severity.WARNING, 0, 0, 50, None)
    assert frag.evidence == [{"ts": 50, "requested": 30 * MiB, "free": None, "largest_free": 10 * MiB}]
    assert "memory" in run(trace(as_markers(FAILED, ("alloc_fail",))), ["memory"]).skipped


HOST = [
    {"ph": "X", "name": "fetch", "kind": "data_load", "ts": 0, "dur": 100},
    {"ph": "X", "name": "prep", "kind": "host_work", "ts": 50, "dur": 100},  # overlaps the fetch: union 150
    {"ph": "X", "name": "letterbox", "kind": "api", "ts": 200, "dur": 50},  # a name is not a kind
    {"ph": "X", "name": "wait", "kind": "sync", "ts": 300, "dur": 40},
    {"ph": "X", "name": "DataLoader.__next__", "kind": "api", "tid": 2, "ts": 0, "dur": 80},
    {"ph": "X", "name": "load", "kind": "data_load", "tid": 3, "ts": 10, "dur": 30},
]


def test_host_work_rows_are_the_host_work_and_data_load_kinds():
    work = Frames(trace(HOST)).host_work
    assert [tuple(r) for r in work[["tid", "name", "kind", "ts", "dur", "end"]].astype(str).itertuples(index=False)] \
        == [("1", "fetch", "data_load", "0", "100", "100"), ("1", "prep", "host_work", "50", "100", "150"),
            ("3", "load", "data_load", "10", "30", "40")]


def test_host_state_counts_each_instant_once_in_its_highest_class_per_thread():
    frames = Frames(trace(HOST))
    state = host_state(frames, 0, stream_tasks(frames))
    assert state.threads == [(1, 1), (1, 2), (1, 3)]

    def spent(thread, a, b):
        covers = state.upto[state.index(1, thread)]
        totals = [int(c.between(np.array([a]), np.array([b]))[0]) for c in covers]
        return {k: t - p for k, t, p in zip(HOST_CLASSES, totals, [0, *totals[:-1]]) if t - p}

    # Thread 1: fetch (data_load) 0-100, prep (host_work) 50-150 under it from 50, letterbox
    # (api) 200-250, a sync 300-340: the overlap 50-100 counts once, as data loading.
    assert spent(1, 0, 400) == {"sync": 40, "data_load": 100, "host_work": 50, "framework": 50}
    assert spent(1, 60, 120) == {"data_load": 40, "host_work": 20}
    assert spent(2, 0, 400) == {"framework": 80}  # a DataLoader-named api call is still an api call
    assert spent(3, 0, 400) == {"data_load": 30}


