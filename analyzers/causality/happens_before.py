"""Happens-before between device tasks, by vector clocks, and the reads it leaves unordered
after a write: missing synchronisation, in time and memory linear in tasks and accesses.

A task happens before another when a chain of recorded releases leads from its end to the
other's start (graph.Tasks): the stream's FIFO order; an event wait, which is ordered after every
task on another stream of its device that had ended when the wait was released (the event it
waited for was recorded behind one of them: taking them all never invents a race); a task whose
launching thread issued a stream-wait call (or a call that enqueued no task: an event wait the
runtime skipped because the event had fired) before launching it, likewise at its start, unless
the trace links that wait to its event's record (Kineto's Stream Wait Event): then after exactly
the task behind the record (graph.Tasks.event_src); and a host synchronize, after which the
thread's launches are ordered after every task that had ended when the call returned. Each
task's vector clock holds, per stream of its device, the last task of that stream that happens
before it (its position on the stream), so "W happens before R" is one comparison.

A read R on stream A of a buffer that a task W on stream B != A wrote, W launched no later than R,
is a race when W does not happen before R. Per buffer and stream only the last such write is
kept (an earlier write on B is ordered before R whenever the last one is), so each read is
checked against at most one write per stream.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.causality.graph import Tasks, _waited, rank_graph, stream_tasks
from analyzers.frames import Frames

RACE_COLUMNS = ["rank", "device", "addr", "r_corr", "r_name", "r_stream", "r_ts", "w_corr", "w_name", "w_stream",
                "w_end"]


def races(frames: Frames, slack_ns: int = 5_000) -> pd.DataFrame:
    """Reads of a buffer left unordered after a write on another stream (RACE_COLUMNS), by r_ts."""
    acc = frames.accesses
    if acc.empty:
        return pd.DataFrame(columns=RACE_COLUMNS)
    tasks_all = stream_tasks(frames)
    parts = []
    for rank in sorted(acc["rank"].unique()):
        mine = tasks_all[tasks_all["rank"] == rank]
        if mine.empty:
            continue
        host, T = rank_graph(frames, int(rank), slack_ns)
        waited = T.waited | _after_silent_waits(frames, int(rank), T, host, mine)
        clocks = _clocks(T, host, waited)
        parts.append(_check(int(rank), T, clocks, acc[acc["rank"] == rank]))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=RACE_COLUMNS)
    return pd.concat(parts, ignore_index=True).sort_values("r_ts", kind="stable").reset_index(drop=True)


def _after_silent_waits(frames: Frames, rank: int, T: Tasks, host, tasks: pd.DataFrame) -> np.ndarray:
    """Tasks launched after a call that put something on a stream but left no task there: a
    runtime writes no device wait for an event that had already fired when the stream reached
    it (the emulator's aclrtStreamWaitEvent then), so such a call may be an event wait. Taking it
    for one orders more, never less: it can hide a race, never invent one."""
    launches = frames.launches
    launches = launches[launches["rank"] == rank]
    silent = launches[~np.isin(launches["corr"].to_numpy(np.float64), tasks["corr"].to_numpy(np.float64))]
    if silent.empty:
        return np.zeros(len(T.ts), dtype=bool)
    return _waited(frames, rank, host, T.prev, T.launch_ts, T.thread, calls=silent)


class _Clocks:
    """Per device: its streams, each task's position on its stream, and each task's vector clock."""

    def __init__(self) -> None:
        self.lane: dict[int, dict[int, int]] = {}  # device -> stream -> column
        self.seq = {}  # task -> position on its stream
        self.vc: dict[int, np.ndarray] = {}  # task -> clock over its device's streams


def _clocks(T: Tasks, host, waited: np.ndarray) -> _Clocks:
    out = _Clocks()
    n = len(T.ts)
    seq = np.zeros(n, dtype=np.int64)
    out.seq = seq
    # Per thread, its synchronize calls by end: what the thread knew had finished after each.
    sync_end = [np.sort(c["end"].to_numpy(np.int64)) for c in host.sync_calls]
    for dev in np.unique(T.device):
        on = np.flatnonzero(T.device == dev)
        streams = sorted(set(T.stream[on].tolist()))
        col = {s: i for i, s in enumerate(streams)}
        out.lane[int(dev)] = col
        # Per stream: its tasks by start, their running max end (a FIFO's ends only grow).
        lanes = {}
        prev = np.full(n, -1, dtype=np.int64)
        for s in streams:
            idx = on[T.stream[on] == s]
            idx = idx[np.argsort(T.ts[idx], kind="stable")]
            seq[idx] = np.arange(len(idx))
            prev[idx[1:]] = idx[:-1]
            lanes[s] = (idx, np.maximum.accumulate(T.end[idx]))
        vc = _DeviceClocks(T, lanes, col, prev, seq, sync_end, waited)
        # In time order (a task at its start, a wait at its end, zero-length tasks before waits
        # before the rest at one instant) a node's dependencies are nearly always done already;
        # `of` computes the others first.
        is_wait = T.kind[on] == "wait"
        key = np.where(is_wait, T.end[on], T.ts[on])
        prio = np.where(T.end[on] == T.ts[on], 0, np.where(is_wait, 1, 2))
        for j in on[np.lexsort((prio, key))].tolist():
            out.vc[j] = vc.of(("task", j))
    return out


class _DeviceClocks:
    """The vector clocks of one device's tasks, each computed once, dependencies first.

    Nodes: ("task", j), and ("sync", thread, k) for a thread's k-th synchronize (by end). A task
    depends on the task before it on its stream, on its thread's last synchronize that returned
    before its launch, on the task behind the record of an event a linked stream wait made it
    wait for, and, for an event wait (at its end) or a task launched after a stream-wait call no
    link explains (at its start), on the last task of every other stream that had ended by then. A
    dependency met again while being computed (tasks of zero length at one instant) is left out.
    """

    def __init__(self, T: Tasks, lanes: dict, col: dict, prev: np.ndarray, seq: np.ndarray, sync_end: list,
                 waited: np.ndarray) -> None:
        self.T, self.lanes, self.col, self.prev, self.seq, self.sync_end = T, lanes, col, prev, seq, sync_end
        self.waited = waited
        self.S = len(col)
        self.done: dict = {}

    def _ended_by(self, t: int, skip: int | None = None) -> list:
        """The last task of each stream (`skip` left out) that had ended by t: with it, all before it."""
        deps = []
        for s, (idx, reach) in self.lanes.items():
            if s == skip:
                continue
            k = int(np.searchsorted(reach, t, side="right")) - 1
            if k >= 0:
                deps.append(("task", int(idx[k])))
        return deps

    def _deps(self, node: tuple) -> list:
        T = self.T
        if node[0] == "sync":
            _, th, k = node
            deps = self._ended_by(int(self.sync_end[th][k]))
            return deps + [("sync", th, k - 1)] if k > 0 else deps
        j = node[1]
        deps = [("task", int(self.prev[j]))] if self.prev[j] >= 0 else []
        th = int(T.thread[j])
        if th >= 0 and not np.isnan(T.launch_ts[j]) and len(self.sync_end[th]):
            k = int(np.searchsorted(self.sync_end[th], T.launch_ts[j], side="right")) - 1
            if k >= 0:
                deps.append(("sync", th, k))
        src = int(T.event_src[j])
        if src >= 0 and T.device[src] == T.device[j]:
            deps.append(("task", src))
        s = int(T.stream[j])
        if T.kind[j] == "wait":
            deps += self._ended_by(int(T.end[j]), skip=s)
        elif self.waited[j]:
            deps += self._ended_by(int(T.ts[j]), skip=s)
        return deps

    def of(self, node: tuple) -> np.ndarray:
        """The clock of `node`, computing its dependencies first (depth first, no recursion)."""
        if node in self.done:
            return self.done[node]
        deps = self._deps(node)
        if all(d in self.done for d in deps):
            return self._compute(node, deps)
        stack = [(node, iter(deps))]
        on_path = {node}
        while stack:
            x, todo = stack[-1]
            for d in todo:
                if d not in self.done and d not in on_path:
                    stack.append((d, iter(self._deps(d))))
                    on_path.add(d)
                    break
            else:
                self._compute(x, self._deps(x))
                on_path.discard(x)
                stack.pop()
        return self.done[node]

    def _compute(self, x: tuple, deps: list) -> np.ndarray:
        """x's clock: the join of its done dependencies' clocks, with its own place on its stream."""
        clock = np.full(self.S, -1, dtype=np.int64)
        for d in deps:
            got = self.done.get(d)
            if got is not None:
                np.maximum(clock, got, out=clock)
        if x[0] == "task":
            clock[self.col[int(self.T.stream[x[1]])]] = int(self.seq[x[1]])
        self.done[x] = clock
        return clock


def _check(rank: int, T: Tasks, clocks: _Clocks, acc: pd.DataFrame) -> pd.DataFrame:
    """The reads in `acc` left unordered after a write (RACE_COLUMNS)."""
    work = np.flatnonzero(T.kind != "wait")
    corr = T.corr[work]
    ok = ~np.isnan(corr)
    by_corr = pd.Series(work[ok]).groupby(corr[ok]).first()
    task = by_corr.reindex(acc["corr"].to_numpy(np.float64)).to_numpy()
    has = ~np.isnan(task)
    a = acc[has].assign(task=task[has].astype(np.int64))
    launch = T.launch_ts[a["task"].to_numpy()]
    a = a.assign(launch=launch, write=(a["kind"].astype(str) == "mem_write").to_numpy())
    a = a[~np.isnan(a["launch"].to_numpy())]
    # In launch order, writes before reads launched at the same time (the rule: W launched no
    # later than R).
    a = a.sort_values(["launch", "write"], ascending=[True, False], kind="stable")
    rows = []
    last: dict[tuple[int, int], dict[int, int]] = {}  # (device, addr) -> stream -> last write's task
    for addr, j, write in zip(a["addr"].to_numpy(np.int64).tolist(), a["task"].tolist(), a["write"].tolist()):
        dev = int(T.device[j])
        s = int(T.stream[j])
        writers = last.setdefault((dev, addr), {})
        if write:
            writers[s] = j
            continue
        vc = clocks.vc[j]
        col = clocks.lane[dev]
        for ws, w in writers.items():
            if ws != s and clocks.seq[w] > vc[col[ws]]:
                rows.append((rank, dev, addr, T.corr[j], T.name[j], s, int(T.ts[j]), T.corr[w], T.name[w], ws,
                             int(T.end[w])))
    return pd.DataFrame(rows, columns=RACE_COLUMNS)
