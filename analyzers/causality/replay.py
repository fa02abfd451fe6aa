"""Replay: re-time a trace through its dependency graph, with remedies applied or none.

The graph is the critical path's (analyzers.causality.critical_path, Holistic Trace Analysis'
convention): the start and end of every host call and device task, every rank in one node space,
joined where a collective released its ranks. Each node gets a new time: the latest of its
predecessors' new times plus the edges' weights, plus the node's own slack, how much later than
that it happened in the trace (what the trace does not explain: host time between calls, the
device's dispatch, a delay nothing recorded). Without remedies every node keeps its time, so the
replay reproduces the trace exactly, which `tests/test_replay.py` checks on every scenario and
shared real trace (a node whose predecessors would put it later than it ran is an inconsistent
graph, and fails it). A remedy edits edge weights: a launch call's cost, a data-loading span, a
synchronize's wait; the change travels along the recorded dependencies, so what waited for the
edited work moves and what did not stays. The saving is the span the replay takes off the run.

Device tasks keep their recorded duration: no remedy here changes what a task shares (links,
cores), which is why the replay needs no resource model yet.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzers.causality.critical_path import _KK, _LAUNCH, _OP, _SYNC, JobGraph, job_graph
from analyzers.frames import Frames
from msprof_py.trace.schema import Trace

#: The remedies, each a documented edit of the graph (`Remedy.edit`), by the name the CLI takes.
REMEDY_DOCS = {
    "launch": "fuse launches / capture a graph: every launch call costs at most ARG ns (default 2000) and "
              "its task's launch delay shrinks by what the call saved",
    "data": "prefetch data: data loading and host work (data_load / host_work calls) move to a loader "
            "thread that prepares each batch as soon as it finished the one before (one batch ahead); "
            "the host's next call waits for its batch and for the host, no longer for the loading itself",
    "sync": "defer synchronizes to the end of the step: every synchronize call but the last of its thread "
            "in each step costs nothing and no longer waits for the device",
}
#: A fused or graph-captured launch's cost (ns): what one kernel of a captured graph costs the host.
LAUNCH_FLOOR_NS = 2_000


@dataclass
class Edit:
    """A remedy's edit of the graph: new edge weights (NaN drops an edge), edges added (their
    weights), and nodes that lose their slack (they no longer wait for what the trace showed)."""

    w: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    add_w: np.ndarray
    no_slack: np.ndarray


@dataclass(frozen=True)
class Remedy:
    """One remedy: `name` (a key of REMEDY_DOCS) and its argument (None: the default)."""

    name: str
    arg: int | None = None

    @classmethod
    def parse(cls, text: str) -> Remedy:
        """`NAME` or `NAME=ARG` (ARG an integer); ValueError naming the choices otherwise."""
        name, _, arg = text.partition("=")
        name = name.strip().lower()
        if name not in REMEDY_DOCS:
            raise ValueError(f"unknown remedy {text!r}: choose one of {', '.join(REMEDY_DOCS)}")
        if arg and name != "launch":
            raise ValueError(f"remedy {name!r} takes no argument (got {text!r})")
        try:
            value = int(arg) if arg else None
        except ValueError:
            raise ValueError(f"remedy {text!r}: the argument must be an integer (ns)") from None
        if value is not None and value < 0:
            raise ValueError(f"remedy {text!r}: the argument must be >= 0 ns")
        return cls(name, value)

    def edit(self, frames: Frames, jg: JobGraph, e: Edit) -> None:
        """Apply this remedy to the edit `e` of `jg` (in place)."""
        a = jg.arrays
        etype, cause = a["etype"], a["cause"]
        w = e.w[:len(etype)]  # the graph's own edges (a view: edits write through)
        if self.name == "launch":
            floor = LAUNCH_FLOOR_NS if self.arg is None else self.arg
            calls = (etype == _OP) & (cause == "launch")
            saved = np.clip(w[calls] - floor, 0, None)
            w[calls] -= saved
            # A task launched into an empty queue hangs off its call's start: the call's saving
            # comes off its launch delay too.
            by_call = pd.Series(saved, index=a["what"][calls]).groupby(level=0).sum()
            call_label, call_end = _launch_of_tasks(jg)  # by task label (an edge into a task is charged to it)
            into = etype == _LAUNCH
            cut = by_call.reindex(call_label.reindex(a["what"][into]).to_numpy()).fillna(0).to_numpy()
            w[into] = np.clip(w[into] - cut, 0, None)
            # A task queued behind the one before it whose gap lasted while its own launch call
            # still ran: that part of the gap was the call's.
            kk = np.flatnonzero(etype == _KK)
            lab = call_label.reindex(a["what"][kk]).to_numpy()
            has = ~np.isnan(lab)
            kk, lab = kk[has], lab[has]
            end_node = call_end.reindex(a["what"][kk]).to_numpy().astype(np.int64)
            waited = np.clip(jg.node_ts[end_node] - jg.node_ts[a["src"][kk]], 0, None)
            gain = np.minimum(by_call.reindex(lab).fillna(0).to_numpy(), waited)
            w[kk] = np.clip(w[kk] - gain, 0, None)
        elif self.name == "data":
            _prefetch(jg, e)
        elif self.name == "sync":
            _defer_syncs(frames, jg, e)


def _host_nodes(jg: JobGraph, klasses: tuple[str, ...]) -> pd.DataFrame:
    """The host calls of `klasses`, every rank: rank, pid, tid, ts, end, start / end node, label."""
    parts = []
    for r, g in jg.graphs.items():
        c = g.calls
        i = np.flatnonzero(c["klass"].isin(klasses).to_numpy())
        off = jg.offsets[r]
        parts.append(pd.DataFrame({"rank": r, "pid": c["pid"].to_numpy(np.int64)[i], "tid": c["tid"].to_numpy(np.int64)[i],
                                   "ts": c["ts"].to_numpy(np.int64)[i], "end": c["end"].to_numpy(np.int64)[i],
                                   "start_node": off + i, "end_node": off + g.H + i,
                                   "label": jg.label_offsets[r] + i}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _prefetch(jg: JobGraph, e: Edit) -> None:
    """Data loading on a loader thread, one batch ahead (REMEDY_DOCS["data"])."""
    a = jg.arrays
    calls = _host_nodes(jg, ("data_load", "host_work"))
    if calls.empty:
        return
    starts = calls["start_node"].to_numpy()
    ends = calls["end_node"].to_numpy()
    into = np.isin(a["dst"], starts)
    out_of = np.isin(a["src"], ends) & (a["etype"] == _OP)
    # What the host did before a loading span now leads straight to what it did after it.
    before = pd.DataFrame({"node": a["dst"][into], "src": a["src"][into]})
    after = pd.DataFrame({"node": a["src"][out_of], "dst": a["dst"][out_of]})
    pos = pd.Series(np.arange(len(starts)), index=starts)
    before["k"] = pos.reindex(before["node"]).to_numpy()
    pos = pd.Series(np.arange(len(ends)), index=ends)
    after["k"] = pos.reindex(after["node"]).to_numpy()
    bridge = before.merge(after, on="k")
    e.w[:len(a["dst"])][into] = np.nan
    src, dst = [bridge["src"].to_numpy(np.int64)], [bridge["dst"].to_numpy(np.int64)]
    # The loader prepares each batch once it finished the one before.
    for _, g in calls.sort_values("ts", kind="stable").groupby(["rank", "pid", "tid"], sort=False):
        src.append(g["end_node"].to_numpy()[:-1])
        dst.append(g["start_node"].to_numpy()[1:])
    _add(e, np.concatenate(src), np.concatenate(dst))
    e.no_slack[starts] = True


def _defer_syncs(frames: Frames, jg: JobGraph, e: Edit) -> None:
    """Every synchronize but the last of its thread in each step costs nothing and waits for
    nothing (REMEDY_DOCS["sync"])."""
    a = jg.arrays
    calls = _host_nodes(jg, ("sync",))
    if calls.empty:
        return
    steps = frames.steps
    calls["step"] = -1
    for r, g in steps.groupby("rank"):
        bounds = np.sort(g["ts"].to_numpy(np.int64))
        sel = (calls["rank"] == r).to_numpy()
        calls.loc[sel, "step"] = np.searchsorted(bounds, calls.loc[sel, "ts"].to_numpy(np.int64), side="right")
    last = calls.sort_values("ts", kind="stable").groupby(["rank", "pid", "tid", "step"]).tail(1).index
    gone = calls.drop(index=last)
    w = e.w[:len(a["etype"])]
    w[(a["etype"] == _OP) & np.isin(a["what"], gone["label"].to_numpy())] = 0
    w[(a["etype"] == _SYNC) & np.isin(a["dst"], gone["end_node"].to_numpy())] = np.nan


def _launch_of_tasks(jg: JobGraph) -> tuple[pd.Series, pd.Series]:
    """By task label: the label of the call that launched it, and that call's end node."""
    labels, calls, ends = [], [], []
    for r, g in jg.graphs.items():
        launch = g.tasks["launch"].to_numpy(np.int64) if g.D else np.zeros(0, dtype=np.int64)
        j = np.flatnonzero(launch >= 0)
        lo = jg.label_offsets[r]
        labels.append(lo + g.H + j)
        calls.append(lo + launch[j])
        ends.append(jg.offsets[r] + g.H + launch[j])
    if not labels:
        return pd.Series(dtype=np.float64), pd.Series(dtype=np.float64)
    index = np.concatenate(labels)
    return pd.Series(np.concatenate(calls), index=index), pd.Series(np.concatenate(ends), index=index)


def _launch_order(jg: JobGraph) -> tuple[np.ndarray, np.ndarray]:
    """(end node of its launch call, start node of the task) for every launched task."""
    src, dst = [], []
    for r, g in jg.graphs.items():
        launch = g.tasks["launch"].to_numpy(np.int64) if g.D else np.zeros(0, dtype=np.int64)
        j = np.flatnonzero(launch >= 0)
        src.append(jg.offsets[r] + g.H + launch[j])
        dst.append(jg.offsets[r] + 2 * g.H + j)
    if not src:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64)


def _task_nodes(jg: JobGraph) -> np.ndarray:
    """The start and end nodes of every device task."""
    parts = [jg.offsets[r] + 2 * g.H + np.arange(2 * g.D) for r, g in jg.graphs.items()]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _stream_order(jg: JobGraph) -> tuple[np.ndarray, np.ndarray]:
    """(end node of the task before, start node of the task) for consecutive tasks of a stream."""
    src, dst = [], []
    for r, g in jg.graphs.items():
        t = g.tasks
        if t.empty:
            continue
        dev, st = t["device"].to_numpy(np.int64), t["stream"].to_numpy(np.int64)
        same = (dev[1:] == dev[:-1]) & (st[1:] == st[:-1])  # tasks are sorted per stream by ts
        j = np.flatnonzero(same) + 1
        base = jg.offsets[r] + 2 * g.H
        src.append(base + g.D + j - 1)
        dst.append(base + j)
    if not src:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64)


def _add(e: Edit, src: np.ndarray, dst: np.ndarray) -> None:
    e.src = np.concatenate([e.src, src.astype(np.int64)])
    e.dst = np.concatenate([e.dst, dst.astype(np.int64)])
    e.add_w = np.concatenate([e.add_w, np.zeros(len(src), dtype=np.int64)])


@dataclass
class ReplayResult:
    """A replay: the re-timed trace (host calls and device tasks moved; other rows as recorded,
    a host row without a node shifted with its thread), the run's span (first to last device
    task) before and after, and how many nodes moved."""

    trace: Trace
    span_ns: int
    new_span_ns: int
    moved: int
    remedies: tuple[Remedy, ...]

    @property
    def saving_ns(self) -> int:
        return self.span_ns - self.new_span_ns


def replay(frames: Frames, remedies: tuple[Remedy, ...] | list[Remedy] = ()) -> ReplayResult:
    """Re-time `frames`' trace with `remedies` applied (see the module docstring)."""
    remedies = tuple(remedies)
    if frames.window != "all":
        raise ValueError("replay re-times the whole trace: use Frames(trace) (window 'all')")
    jg = job_graph(frames)
    n = len(jg.node_ts)
    a = jg.arrays
    if not n or not a:
        return ReplayResult(frames.trace, 0, 0, 0, remedies)
    # Stream order holds whatever a remedy does: every task after the one before it on its stream
    # (the graph joins a task launched into an empty queue to its launch call only).
    # And a launched task never starts before its launch call returned (the graph may join it to
    # the task before it only).
    fifo_src, fifo_dst = (np.concatenate(x) for x in zip(_stream_order(jg), _launch_order(jg)))
    fwd = jg.node_ts[fifo_src] <= jg.node_ts[fifo_dst]  # rows that overlap in the trace: no order
    fifo_src, fifo_dst = fifo_src[fwd], fifo_dst[fwd]
    src = np.concatenate([a["src"], fifo_src])
    dst = np.concatenate([a["dst"], fifo_dst])
    w0 = np.concatenate([a["w"], np.zeros(len(fifo_src), dtype=np.int64)])
    none = np.zeros(0, dtype=np.int64)
    e = Edit(w0.astype(np.float64), none, none, none, np.zeros(n, dtype=bool))
    for r in remedies:
        r.edit(frames, jg, e)
    new = retime(jg.node_ts, src, dst, w0, e)
    # The run's span: first to last device task (all nodes where no task ran).
    dev = _task_nodes(jg)
    dev = dev if len(dev) else np.arange(n)
    span = int(jg.node_ts[dev].max() - jg.node_ts[dev].min())
    new_span = int(new[dev].max() - new[dev].min())
    table = _write(frames, jg, new)
    return ReplayResult(Trace(table, frames.trace.meta), span, new_span, int((new != jg.node_ts).sum()), remedies)


def retime(node_ts: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray, e: Edit | None = None) -> np.ndarray:
    """New node times: each node at the latest of its predecessors' new time + new weight (`e`:
    the edit; an edge with a NaN weight is dropped, `e.src` -> `e.dst` added), plus its slack in
    the trace (its time minus the latest of its predecessors' time + weight; none for
    `e.no_slack`); a node whose every edge was dropped keeps its time."""
    n = len(node_ts)
    if e is None:
        none = np.zeros(0, dtype=np.int64)
        e = Edit(w.astype(np.float64), none, none, none, np.zeros(n, dtype=bool))
    lo = np.iinfo(np.int64).min
    best = np.full(n, lo, dtype=np.int64)
    np.maximum.at(best, dst, node_ts[src] + w)
    slack = np.where(best > lo, node_ts - best, 0)
    if (slack < 0).any():
        raise ValueError(f"the dependency graph puts {int((slack < 0).sum())} node(s) later than they ran")
    slack[e.no_slack] = 0
    keep = ~np.isnan(e.w)
    src_k = np.concatenate([src[keep], e.src])
    dst_k = np.concatenate([dst[keep], e.dst])
    w_k = np.concatenate([e.w[keep].astype(np.int64), e.add_w])
    order = np.argsort(src_k, kind="stable")
    starts = np.searchsorted(src_k[order], np.arange(n + 1)).tolist()
    dst_o, w_o = dst_k[order].tolist(), w_k[order].tolist()
    # Every edge, dropped or added, orders its nodes.
    src_all, dst_all = np.concatenate([src, e.src]), np.concatenate([dst, e.dst])
    all_order = np.argsort(src_all, kind="stable")
    all_starts = np.searchsorted(src_all[all_order], np.arange(n + 1)).tolist()
    all_dst = dst_all[all_order].tolist()
    indeg = np.bincount(dst_all, minlength=n).tolist()
    arrive: list[int | None] = [None] * n  # the latest new predecessor time + weight, over the kept edges
    out = node_ts.astype(np.int64).tolist()
    slack_l = slack.tolist()
    ready = deque(np.flatnonzero(np.asarray(indeg) == 0).tolist())
    seen = 0
    while ready:
        u = ready.popleft()
        seen += 1
        got = arrive[u]
        if got is not None:
            out[u] = got + slack_l[u]
        tu = out[u]
        for k in range(starts[u], starts[u + 1]):
            v = dst_o[k]
            t = tu + w_o[k]
            if arrive[v] is None or t > arrive[v]:
                arrive[v] = t
        for k in range(all_starts[u], all_starts[u + 1]):
            v = all_dst[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if seen != n:
        raise ValueError(f"the dependency graph has a cycle ({n - seen} nodes left)")
    return np.asarray(out, dtype=np.int64)


def _write(frames: Frames, jg: JobGraph, new: np.ndarray) -> pa.Table:
    """The trace table with every node's row re-timed, and host rows without a node (steps,
    annotations) shifted as the thread's last node before them moved."""
    t = frames.trace.table  # every column (window "all": the same rows as frames.table)
    ts = t.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    dur = t.column("dur").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    has_dur = t.column("dur").is_valid().to_numpy(zero_copy_only=False)
    new_ts, new_end = ts.copy(), ts + dur
    placed = np.zeros(len(ts), dtype=bool)
    host_keys, host_t, host_shift = [], [], []
    # Each row moves by its nodes' shifts (a node's time may differ from its row's: a call that
    # overlaps its parent's end ends with it in the graph).
    shift = new - jg.node_ts
    for r, g in jg.graphs.items():
        off = jg.offsets[r]
        H, D = g.H, g.D
        rows = g.calls["table_row"].to_numpy(np.int64)
        s = shift[off:off + H]
        new_ts[rows] = ts[rows] + s
        new_end[rows] = ts[rows] + dur[rows] + shift[off + H:off + 2 * H]
        placed[rows] = True
        host_keys.append(np.stack([np.full(H, r), g.calls["pid"].to_numpy(np.int64), g.calls["tid"].to_numpy(np.int64)],
                                  axis=1))
        host_t.append(g.calls["ts"].to_numpy(np.int64))
        host_shift.append(s)
        rows = g.tasks["table_row"].to_numpy(np.int64)
        new_ts[rows] = ts[rows] + shift[off + 2 * H:off + 2 * H + D]
        new_end[rows] = ts[rows] + dur[rows] + shift[off + 2 * H + D:off + 2 * H + 2 * D]
        placed[rows] = True
    if host_keys:
        _shift_host_rows(t, ts, dur, new_ts, new_end, placed, np.concatenate(host_keys), np.concatenate(host_t),
                         np.concatenate(host_shift))
    out = t.set_column(t.schema.get_field_index("ts"), "ts", pa.array(new_ts, type=t.schema.field("ts").type))
    new_dur = np.where(has_dur, new_end - new_ts, 0)
    dur_col = pa.array(new_dur, type=t.schema.field("dur").type, mask=~has_dur)
    return out.set_column(t.schema.get_field_index("dur"), "dur", dur_col)


def _shift_host_rows(t: pa.Table, ts, dur, new_ts, new_end, placed, keys, call_ts, shift) -> None:
    """Move each host row (no stream) that is no node by the shift of its thread's last call that
    started at or before it (its start and its end each)."""
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    pid = t.column("pid").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    tid = t.column("tid").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    free = ~placed & ~t.column("stream").is_valid().to_numpy(zero_copy_only=False)
    if not free.any():
        return
    df = pd.DataFrame({"rank": keys[:, 0], "pid": keys[:, 1], "tid": keys[:, 2], "t": call_ts, "shift": shift})
    for (r, p, q), g in df.groupby(["rank", "pid", "tid"], sort=False):
        g = g.sort_values("t", kind="stable")
        sel = np.flatnonzero(free & (rank == r) & (pid == p) & (tid == q))
        if not len(sel):
            continue
        t_arr, s_arr = g["t"].to_numpy(), g["shift"].to_numpy()
        for at, target in ((ts[sel], new_ts), (ts[sel] + dur[sel], new_end)):
            k = np.clip(np.searchsorted(t_arr, at, side="right") - 1, 0, len(t_arr) - 1)
            target[sel] = at + s_arr[k]
