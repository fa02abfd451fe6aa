"""The critical path of a rank over a region (the run, or one step): the longest chain of
recorded activity through the dependency graph, and what each of its nanoseconds was.

The graph follows the convention of Holistic Trace Analysis' critical path analysis, so the
two agree on the same trace (tests/test_critical_path.py keeps HTA's figures):

- Nodes: the start and the end of every host call with a duration (the call kinds of
  `HOST_KINDS`) and of every device task on a stream (kernels, copies, memsets, collectives;
  device-side waits with no weight of their own).
- Host program order: inside a top-level call, consecutive start / end points of its nested
  calls are joined by edges weighing the time between them, charged to the innermost open call;
  consecutive top-level calls are joined by a zero-weight edge (time no call covers is not
  evidence of anything). A blocking call (a synchronize, a blocking copy) weighs nothing from
  its last inner point to its end: that wait is the device's, reached through a sync edge.
- A device task weighs its duration; a wait task nothing (its producer's edge explains an event
  wait; a collective's rendezvous with its peers, as HCCL's Notify_Wait, is time the rank spent
  waiting for another rank, not work on its path).
- Launch: a task launched into an empty stream queue, after the task before it on its stream
  ended, hangs off its launch call's start, weighing the launch delay. Otherwise it hangs off
  the end of the task before it on its stream, weighing the gap between them (queue / dispatch).
- Event: a task whose stream wait the trace links to its event's record call (Kineto's Stream
  Wait Event) hangs, with no weight, off the end of the task launched last on the recorded
  stream before that call (graph.Tasks.event_src); a task whose thread issued a stream wait the
  trace does not link hangs off the end of the task on another stream of its device that ended
  last before it began (the release's timing is the only evidence); an emulated wait task hangs
  off its producer (graph.Tasks.producer).
- Sync: a blocking host call ends, with no weight, after each stream's last task that was still
  running while the call waited.

Each edge of the path is charged to one cause (`CP_CAUSES`): a launch delay is `launch` up to its
call's own time plus DISPATCH_NS, a queue gap `dispatch` up to DISPATCH_NS, and the rest of either
`unexplained` (as in the attribution); the region's time that no edge of the path covers is
`untraced`, so the causes sum to the region's length exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzers.causality.attribution import DISPATCH_NS
from analyzers.causality.collectives import parts as collective_parts
from analyzers.causality.contention import contended_rows
from analyzers.causality.graph import (
    _class_of,
    _event_ids,
    _producers,
    _waited,
    blocked_corrs,
    rank_graph,
    stream_tasks,
)
from analyzers.frames import Frames

#: How close a wait's end must be to its producer's end (as in the attribution).
SLACK_NS = 5_000
#: Host call kinds that are nodes of the path.
HOST_KINDS = ("api", "launch", "sync", "wait", "data_load", "host_work", "host_idle", "op_compile")
#: What a nanosecond of the critical path was, with its label.
CP_CAUSE_LABELS = {
    "compute": "device compute (kernels)",
    "copy": "device copies / memsets",
    "collective": "collective communication",
    "launch": "launch (launch calls and the delay to the task's start)",
    "dispatch": "device queue: gap after the task before on the stream",
    "contention": "core contention: ready, waiting for cores other streams' kernels held",
    "sync": "host synchronize (its own time, not its wait)",
    "blocking_copy": "blocking copy on the host (its own time)",
    "queue": "a launch blocked at a full stream queue (from the task that retired to its return)",
    "compile": "operator compile on the host",
    "data": "data loading / host work",
    "host_idle": "host idle",
    "host": "host: framework / other calls",
    "unexplained": "unexplained: a delay past the launch or queue with nothing recorded",
    "untraced": "untraced (no recorded activity on the path)",
}
CP_CAUSES = tuple(CP_CAUSE_LABELS)
#: Host class (graph.HOST_CLASSES) -> the cause of host time on the path.
_HOST_CLASS_CAUSE = {"sync": "sync", "blocking_copy": "blocking_copy", "queue": "queue", "op_compile": "compile",
                     "launch": "launch",
                     "data_load": "data", "host_work": "data", "host_idle": "host_idle", "framework": "host"}
_TASK_CAUSE = {"kernel": "compute", "memcpy": "copy", "memset": "copy", "collective": "collective", "wait": "dispatch"}
#: Edge types, as HTA names them (critical_path_*), for the comparison and the breakdown.
EDGE_TYPES = ("operator", "dependency", "kernel_launch_delay", "kernel_kernel_delay", "sync_dependency")
_OP, _DEP, _LAUNCH, _KK, _SYNC = range(5)

SEGMENT_COLUMNS = ["rank", "ts", "end", "weight_ns", "cause", "edge", "name", "where"]


@dataclass
class CriticalPath:
    """One rank's critical path over [start, end); the job's (rank None) across all ranks."""

    rank: int | None
    start: int
    end: int
    #: The path's edges in time order (SEGMENT_COLUMNS): `where` is "stream S" or "thread T".
    segments: pd.DataFrame

    @property
    def length_ns(self) -> int:
        """The path's length: the sum of its edges' weights (what HTA calls its length)."""
        return int(self.segments["weight_ns"].sum()) if len(self.segments) else 0

    @property
    def region_ns(self) -> int:
        return int(self.end - self.start)

    def blame(self) -> pd.Series:
        """ns per cause (CP_CAUSES order), `untraced` the region time off the path: sums to region_ns."""
        by = self.segments.groupby("cause")["weight_ns"].sum() if len(self.segments) else pd.Series(dtype=np.int64)
        out = pd.Series({c: int(by.get(c, 0)) for c in CP_CAUSES}, dtype=np.int64)
        out["untraced"] = self.region_ns - int(out.drop("untraced").sum())
        return out

    def by_edge(self) -> pd.Series:
        by = self.segments.groupby("edge")["weight_ns"].sum() if len(self.segments) else pd.Series(dtype=np.int64)
        return pd.Series({e: int(by.get(e, 0)) for e in EDGE_TYPES}, dtype=np.int64)

    def top_ops(self, n: int = 10) -> pd.DataFrame:
        """The ops that set the path's length, longest first: rank, name, where, cause, ns, count."""
        s = self.segments[self.segments["weight_ns"] > 0]
        if s.empty:
            return pd.DataFrame(columns=["rank", "name", "where", "cause", "ns", "count"])
        g = s.groupby(["rank", "name", "where", "cause"], as_index=False).agg(ns=("weight_ns", "sum"),
                                                                             count=("weight_ns", "size"))
        return g.sort_values(["ns", "rank", "name"], ascending=[False, True, True]).head(n).reset_index(drop=True)

    def by_rank(self) -> pd.Series:
        """ns of the path on each rank (the job's path crosses ranks), most first."""
        if not len(self.segments):
            return pd.Series(dtype=np.int64)
        by = self.segments.groupby("rank")["weight_ns"].sum().astype(np.int64)
        return by.sort_values(ascending=False, kind="stable")


def critical_path(frames: Frames, rank: int, start: int | None = None, end: int | None = None) -> CriticalPath:
    """`rank`'s critical path over the host calls that start in [start, end) and the device tasks
    they launched (tasks with no launch call: those that start in it); the whole trace by default."""
    g = _Graph(frames, rank, start, end)
    return g.longest_path()


def step_paths(frames: Frames, rank: int) -> list[tuple[object, CriticalPath]]:
    """One critical path per step of `rank` (its `ProfilerStep` / step slices), in order."""
    steps = frames.steps
    steps = steps[steps["rank"] == rank]
    return [(s.step if pd.notna(s.step) else s.name, critical_path(frames, rank, int(s.ts), int(s.end)))
            for s in steps.itertuples()]


def job_critical_path(frames: Frames, regions: dict[int, tuple[int, int]] | None = None) -> CriticalPath | None:
    """The job's critical path across ranks (see critical_paths); None when no collective of the
    trace joins two ranks."""
    return critical_paths(frames, regions)[1]


def critical_paths(frames: Frames, regions: dict[int, tuple[int, int]] | None = None
                   ) -> tuple[dict[int, CriticalPath], CriticalPath | None]:
    """Each rank's critical path (over its region in `regions`, rank -> (start, end); every rank's
    whole trace by default) and the job's: the ranks' graphs joined where a collective released
    its ranks. A rank's part that waited for its peers waits with no weight until the last rank
    arrived, and that rank's arrival is its predecessor; so the job's path runs through the rank
    each collective waited for, and its segments say which rank each nanosecond was on. The job's
    path is None when no collective of the trace joins two of the ranks. The whole trace's
    paths (no `regions`) are cached per frames: reports and analyzers share them."""
    if regions is None:
        key = ("causality.critical_paths",)
        if key not in frames._cache:
            frames._cache[key] = _critical_paths(frames, None)
        return frames._cache[key]
    return _critical_paths(frames, regions)


@dataclass
class JobGraph:
    """Every rank's graph (over its region) in one node space, joined where a collective
    released its ranks: `arrays` as `_Graph.arrays` with the rank offsets applied, `labels` the
    (name, where) of each event an edge is charged to, `joined` whether a rendezvous edge joins
    two ranks."""

    graphs: dict[int, _Graph]
    offsets: dict[int, int]
    #: Per rank, where its events start in the label space (`arrays["what"]`: host call i of rank
    #: r is label_offsets[r] + i, its task j label_offsets[r] + H + j).
    label_offsets: dict[int, int]
    node_ts: np.ndarray
    arrays: dict[str, np.ndarray]
    labels: tuple[np.ndarray, np.ndarray]
    joined: bool


def job_graph(frames: Frames, regions: dict[int, tuple[int, int]] | None = None) -> JobGraph:
    """The ranks' graphs in one node space, with the rendezvous edges of critical_paths."""
    present = sorted({int(r) for r in np.unique(frames.table.column("rank").to_numpy())})
    if regions is not None:
        present = [r for r in present if r in regions]
    graphs: dict[int, _Graph] = {}
    offsets, label_offsets, parts, labels, off, lab = {}, {}, [], [], 0, 0
    for r in present:
        g = _Graph(frames, r, *(regions or {}).get(r, (None, None)))
        offsets[r] = off
        label_offsets[r] = lab
        a = g.arrays()
        labels.append(g.labels())
        parts.append({**a, "src": a["src"] + off, "dst": a["dst"] + off, "what": a["what"] + lab})
        off += len(g.node_ts)
        lab += len(labels[-1][0])
        graphs[r] = g
    node_ts = (np.concatenate([g.node_ts for g in graphs.values()]) if graphs else np.zeros(0, dtype=np.int64))
    joined = len(graphs) >= 2 and any(len(g.rv_node) for g in graphs.values())
    if joined:
        parts.append(_rendezvous_edges(frames, graphs, offsets, node_ts, lab, labels))
    a = ({k: np.concatenate([x[k] for x in parts]) for k in parts[0]} if parts else {})
    names = np.concatenate([x[0] for x in labels]) if labels else np.zeros(0, dtype=object)
    where = np.concatenate([x[1] for x in labels]) if labels else np.zeros(0, dtype=object)
    return JobGraph(graphs, offsets, label_offsets, node_ts, a, (names, where), joined)


def _critical_paths(frames: Frames, regions: dict[int, tuple[int, int]] | None
                    ) -> tuple[dict[int, CriticalPath], CriticalPath | None]:
    jg = job_graph(frames, regions)
    per = {r: g.longest_path() for r, g in jg.graphs.items()}
    if not jg.joined:
        return per, None
    a = jg.arrays
    path = _longest(len(jg.node_ts), a["src"], a["dst"], a["w"], "the job")
    start = min(g.start for g in jg.graphs.values())
    end = max(g.end for g in jg.graphs.values())
    return per, CriticalPath(None, start, end, _segments(jg.node_ts, a, path, *jg.labels))


def _rendezvous_edges(frames: Frames, graphs: dict[int, _Graph], offsets: dict[int, int], node_ts: np.ndarray,
                      lab: int, labels: list) -> dict[str, np.ndarray]:
    """The edges from the last rank's arrival at each collective to the parts that waited for it
    (appending their labels to `labels`)."""
    p = collective_parts(frames)
    # The last rank's arrival releases each waiting part.
    last = p[(p["rank"] == p["last_rank"]) & (p["ranks"] > 1)]
    last = {(int(g), int(q)): (int(r), str(n), int(t))
            for g, q, r, n, t in zip(last["group"], last["seq"], last["rank"], last["name"], last["ts"])}
    cs, cd, names, where, ranks = [], [], [], [], []
    for r, g in graphs.items():
        for group, seq, name, node in zip(g.rv_parts["group"].tolist(), g.rv_parts["seq"].tolist(),
                                          g.rv_parts["name"].tolist(), g.rv_node.tolist()):
            hit = last.get((int(group), int(seq)))
            if hit is None or hit[0] not in graphs:
                continue
            u = graphs[hit[0]].collective_start(hit[1], hit[2])
            if u < 0:
                continue
            cs.append(offsets[hit[0]] + u)
            cd.append(offsets[r] + node)
            names.append(name)
            where.append(f"waiting for rank {hit[0]}")
            ranks.append(r)
    cs_a, cd_a = np.asarray(cs, dtype=np.int64), np.asarray(cd, dtype=np.int64)
    # Clocks of different hosts may disagree: a release that would run back in time is dropped.
    fwd = node_ts[cs_a] <= node_ts[cd_a] if len(cs_a) else np.zeros(0, dtype=bool)
    n = int(fwd.sum())
    edges = {"src": cs_a[fwd], "dst": cd_a[fwd], "w": np.zeros(n, dtype=np.int64),
             "etype": np.full(n, _SYNC, dtype=np.int64), "cause": np.full(n, "collective", dtype=object),
             "allowed": np.full(n, np.iinfo(np.int64).max, dtype=np.int64),
             "contended": np.zeros(n, dtype=np.int64),
             "what": lab + np.arange(n, dtype=np.int64), "rank": np.asarray(ranks, dtype=np.int64)[fwd]}
    labels.append((np.asarray(names, dtype=object)[fwd], np.asarray(where, dtype=object)[fwd]))
    return edges


def job_step_paths(frames: Frames) -> list[tuple[int, CriticalPath | None]]:
    """The job's critical path per step number (each rank over its own step of that number)."""
    steps = frames.steps.dropna(subset=["step"])
    out = []
    for step, g in steps.groupby("step", sort=True):
        regions = {int(r): (int(x["ts"].min()), int(x["end"].max())) for r, x in g.groupby("rank")}
        out.append((int(step), critical_paths(frames, regions)[1]))
    return out


class _Graph:
    """The nodes and weighted edges of one rank's region (see the module docstring)."""

    def __init__(self, frames: Frames, rank: int, start: int | None, end: int | None) -> None:
        self.rank = rank
        tasks_all = stream_tasks(frames)
        tasks = tasks_all[(tasks_all["rank"] == rank) & tasks_all["kind"].isin(tuple(_TASK_CAUSE))]
        # `row`: the task's row in stream_tasks (for the rank graph's event sources).
        tasks = tasks.assign(contended=contended_rows(frames)[tasks.index.to_numpy()], row=tasks.index.to_numpy())
        calls = self._host_calls(frames, rank, tasks)
        lo = -np.inf if start is None else start
        hi = np.inf if end is None else end
        # Half-open, so that consecutive steps share no call.
        calls = calls[(calls["ts"] >= lo) & (calls["ts"] < hi)].reset_index(drop=True)
        tasks = self._tasks_in(tasks, frames, rank, calls, lo, hi)
        self.calls, self.tasks = calls, tasks
        H, D = len(calls), len(tasks)
        self.H, self.D = H, D
        self.node_ts = np.concatenate([calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64),
                                       tasks["ts"].to_numpy(np.int64), tasks["end"].to_numpy(np.int64)])
        # A collective part that waited for its peers gets a node at its release (the last rank's
        # arrival): it waits (no weight) until then and works after it (see job_critical_path).
        self.rv_parts = pd.DataFrame(columns=["group", "seq", "name", "ts", "release"])
        parts = collective_parts(frames)
        parts = parts[(parts["rank"] == rank) & (parts["ranks"] > 1) & (parts["waited_ns"] > 0)]
        self.rv_task, self.rv_node = self._rendezvous(parts[["group", "seq", "name", "ts", "release"]])
        self.src: list[int] = []
        self.dst: list[int] = []
        self.w: list[int] = []
        self.etype: list[int] = []
        self.cause: list[str] = []
        self.what: list[int] = []  # the event an edge is charged to: host call i, or H + task j
        self.dropped = 0  # edges that would run back in time
        self._chunks: list[tuple] = []  # the vectorised edges (src, dst, w, etype, cause, what), after the lists'
        self._host_edges()
        self._device_edges(frames)
        self._pack()
        if start is None:
            self.start = int(self.node_ts.min()) if len(self.node_ts) else 0
            self.end = int(self.node_ts.max()) if len(self.node_ts) else 0
        else:
            self.start = int(start)
            self.end = max(int(end), int(self.node_ts.max()) if len(self.node_ts) else int(end))

    # -- nodes ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _host_calls(frames: Frames, rank: int, tasks: pd.DataFrame) -> pd.DataFrame:
        t = frames.table
        mask = frames.kind_mask(HOST_KINDS) & (t.column("rank").to_numpy() == rank)
        # A wait on a stream is the device's (an event wait task, a collective's notify wait), not a call.
        mask &= ~(frames.kind_mask(("wait",)) & t.column("stream").is_valid().to_numpy(zero_copy_only=False))
        sub = t.select(["ph", "name", "ts", "dur", "pid", "tid", "kind", "corr"]).filter(pa.array(mask)).to_pandas()
        sub["table_row"] = np.flatnonzero(mask)  # the row of the trace table (replay writes it back)
        sub = sub[(sub["ph"] == "X") & (sub["dur"].fillna(0) > 0)].copy()
        sub["end"] = sub["ts"] + sub["dur"].astype(np.int64)
        sub["klass"] = _class_of(sub, tasks)
        # A launch made at a full queue returned when a task of its stream retired: it blocks.
        full = (sub["klass"] == "launch").to_numpy() & np.isin(sub["corr"].to_numpy(np.float64),
                                                               blocked_corrs(frames, rank))
        sub.loc[full, "klass"] = "queue"
        return sub.sort_values(["pid", "tid", "ts", "end"], ascending=[True, True, True, False],
                               kind="stable").reset_index(drop=True)

    @staticmethod
    def _tasks_in(tasks: pd.DataFrame, frames: Frames, rank: int, calls: pd.DataFrame, lo, hi) -> pd.DataFrame:
        launches = calls[calls["kind"].astype(str).isin(("launch", "op_compile"))]
        index = pd.Series(launches.index.to_numpy(), index=launches["corr"].to_numpy()).groupby(level=0).first()
        corr = tasks["corr"].to_numpy(np.float64)
        at = index.reindex(corr).to_numpy()
        tasks = tasks.assign(launch=np.where(np.isnan(at), -1, at).astype(np.int64))
        # Tasks whose launch call lies outside the region are not the region's; tasks that have
        # no launch call anywhere (HCCL's own tasks) enter by their start.
        all_launches = frames.launches
        launched = np.isin(corr, all_launches[all_launches["rank"] == rank]["corr"].to_numpy(np.float64))
        ts = tasks["ts"].to_numpy(np.int64)
        keep = (tasks["launch"].to_numpy() >= 0) | (~launched & (ts >= lo) & (ts < hi))
        return tasks[keep].sort_values(["device", "stream", "ts", "end"], kind="stable").reset_index(drop=True)

    def _rendezvous(self, rv: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(task index, node index) of each part in `rv` (name, ts, release) found among the
        tasks; the nodes are appended to node_ts at the release, inside the task's span."""
        none = np.zeros(0, dtype=np.int64)
        t = self.tasks
        if rv.empty or t.empty:
            return none, none
        coll = t[t["kind"] == "collective"]
        at = pd.Series(coll.index.to_numpy(), index=pd.MultiIndex.from_arrays(
            [coll["name"].astype(str).to_numpy(), coll["ts"].to_numpy(np.int64)]))
        at = at[~at.index.duplicated()]
        idx = pd.MultiIndex.from_arrays([rv["name"].astype(str).to_numpy(), rv["ts"].to_numpy(np.int64)])
        j = at.reindex(idx).to_numpy(np.float64)
        ok = ~np.isnan(j)
        j = j[ok].astype(np.int64)
        release = rv["release"].to_numpy(np.int64)[ok]
        ts, end = t["ts"].to_numpy(np.int64)[j], t["end"].to_numpy(np.int64)[j]
        nodes = len(self.node_ts) + np.arange(len(j), dtype=np.int64)
        self.node_ts = np.concatenate([self.node_ts, np.clip(release, ts, end)])
        self.rv_parts = rv[ok].reset_index(drop=True)
        return j, nodes

    def collective_start(self, name: str, ts: int) -> int:
        """The start node of the collective task `name` that starts at `ts` (-1: not in the region)."""
        if not hasattr(self, "_coll_at"):
            t = self.tasks
            coll = t[t["kind"] == "collective"]
            self._coll_at = dict(zip(zip(coll["name"].astype(str), coll["ts"].astype(np.int64)), coll.index))
        j = self._coll_at.get((name, int(ts)))
        return -1 if j is None else 2 * self.H + int(j)

    def _hs(self, i: int) -> int:
        return i

    def _he(self, i: int) -> int:
        return self.H + i

    def _edge(self, u: int, v: int, etype: int, what: int, cause: str, zero: bool = False) -> None:
        if self.node_ts[v] < self.node_ts[u]:
            # Timestamps contradict the dependency (a launch written after its task began, a
            # task overlapping the one before it on a lane): the path never runs back in time.
            self.dropped += 1
            return
        self.src.append(u)
        self.dst.append(v)
        self.w.append(0 if zero or etype in (_DEP, _SYNC) else int(self.node_ts[v] - self.node_ts[u]))
        self.etype.append(etype)
        self.cause.append(cause)
        self.what.append(what)

    def _edges(self, u: np.ndarray, v: np.ndarray, etype: int, what: np.ndarray, cause, zero=False) -> None:
        """`_edge` over arrays (cause: one string or one per edge; zero: one flag or one per edge)."""
        u, v, what = np.asarray(u, np.int64), np.asarray(v, np.int64), np.asarray(what, np.int64)
        n = len(u)
        if not n:
            return
        zero = np.broadcast_to(np.asarray(zero, dtype=bool), (n,))
        cause = np.broadcast_to(np.asarray(cause, dtype=object), (n,))
        ok = self.node_ts[v] >= self.node_ts[u]
        self.dropped += int((~ok).sum())
        u, v, what, zero, cause = u[ok], v[ok], what[ok], zero[ok], cause[ok]
        w = np.where(zero | (etype in (_DEP, _SYNC)), 0, self.node_ts[v] - self.node_ts[u])
        self._chunks.append((u, v, w.astype(np.int64), np.full(len(u), etype, dtype=np.int64), cause, what))

    def _pack(self) -> None:
        """The edges as arrays, in the order made (the scalar ones first: the host's come before
        any vectorised one): a rank's graph holds no Python object per edge once built."""
        lists = (self.src, self.dst, self.w, self.etype)
        ints = [np.concatenate([np.asarray(x, dtype=np.int64), *[c[k] for c in self._chunks]]) for k, x in
                enumerate(lists)]
        self.src, self.dst, self.w, self.etype = ints  # type: ignore[assignment]
        self.cause = np.concatenate([np.asarray(self.cause, dtype=object),  # type: ignore[assignment]
                                     *[np.asarray(c[4], dtype=object) for c in self._chunks]])
        self.what = np.concatenate([np.asarray(self.what, dtype=np.int64),  # type: ignore[assignment]
                                    *[c[5] for c in self._chunks]])
        self._chunks = []

    # -- edges ---------------------------------------------------------------------------------------------------

    def _host_edges(self) -> None:
        c = self.calls
        if c.empty:
            return
        ts = c["ts"].to_numpy(np.int64)
        end = c["end"].to_numpy(np.int64).copy()
        klass = c["klass"].to_numpy()
        cause = [_HOST_CLASS_CAUSE[k] for k in klass]
        blocking = np.isin(klass, ("sync", "blocking_copy", "queue"))
        thread = (c["pid"].astype(np.int64) * (1 << 32) + c["tid"].astype(np.int64)).to_numpy()
        bounds = np.flatnonzero(np.diff(thread)) + 1
        for lo, hi in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(c)]]).tolist()):
            stack: list[int] = []
            last = -1  # the last node inside the open top-level call
            last_top = -1  # the end node of the last top-level call
            for i in range(lo, hi):
                while stack and end[stack[-1]] <= ts[i]:
                    last, last_top = self._exit(stack, last, last_top, blocking, cause)
                if stack and end[i] > end[stack[-1]]:
                    end[i] = end[stack[-1]]  # a call overlapping its parent's end ends with it
                    self.node_ts[self._he(i)] = end[i]
                if not stack:
                    if last_top >= 0:
                        self._edge(last_top, self._hs(i), _DEP, i, "host")
                else:
                    self._edge(last, self._hs(i), _OP, stack[-1], cause[stack[-1]])
                last = self._hs(i)
                stack.append(i)
            while stack:
                last, last_top = self._exit(stack, last, last_top, blocking, cause)

    def _exit(self, stack: list[int], last: int, last_top: int, blocking, cause) -> tuple[int, int]:
        i = stack.pop()
        self._edge(last, self._he(i), _OP, i, cause[i], zero=bool(blocking[i]))
        if not stack:
            return -1, self._he(i)
        return self._he(i), last_top

    def _device_edges(self, frames: Frames) -> None:
        t = self.tasks
        if t.empty:
            return
        ts = t["ts"].to_numpy(np.int64)
        end = t["end"].to_numpy(np.int64)
        kind = t["kind"].to_numpy()
        device = t["device"].to_numpy(np.int64)
        stream = t["stream"].to_numpy(np.int64)
        launch = t["launch"].to_numpy(np.int64)
        calls_ts = self.calls["ts"].to_numpy(np.int64)
        l_ts = np.where(launch >= 0, calls_ts[np.maximum(launch, 0)] if len(calls_ts) else 0, np.iinfo(np.int64).max)
        same = np.zeros(len(t), dtype=bool)
        same[1:] = (device[1:] == device[:-1]) & (stream[1:] == stream[:-1])
        prev = np.where(same, np.arange(len(t)) - 1, -1)
        q_launch, q_start = _queue_lengths(ts, l_ts, launch >= 0, device, stream)
        release = self._event_sources(frames, t, prev, l_ts, launch)
        j = np.arange(len(t))
        H, D = self.H, self.D
        is_wait = kind == "wait"
        # A wait weighs nothing: an event wait is explained by its producer's edge, a collective's
        # rendezvous (HCCL's Notify_Wait) by the peer it waited for, which a rank's trace does not
        # hold; so a rank's path runs through what it did, and the rank that others waited for has
        # the longest one.
        waiting = t["waiting"].to_numpy(bool) if "waiting" in t else is_wait
        rv = np.zeros(len(t), dtype=bool)
        rv[self.rv_task] = True
        self._edges(2 * H + j, 2 * H + D + j, _OP, H + j, np.array([_TASK_CAUSE[k] for k in kind], dtype=object),
                    zero=is_wait | waiting | rv)
        if len(self.rv_task):
            k = self.rv_task
            self._edges(2 * H + k, self.rv_node, _OP, H + k, "collective", zero=True)
            self._edges(self.rv_node, 2 * H + D + k, _OP, H + k, "collective")
        q = release
        # A wait's end is released by its producer's end; another task's start by the task
        # whose end fired the event it waited for.
        m = is_wait & (q >= 0)
        self._edges(2 * H + D + q[m], 2 * H + D + j[m], _SYNC, H + j[m], "dispatch")
        m = ~is_wait & (q >= 0)
        self._edges(2 * H + D + q[m], 2 * H + j[m], _SYNC, H + j[m], "dispatch")
        q = np.where(is_wait, -1, q)
        p = prev
        p_end = np.where(p >= 0, end[np.maximum(p, 0)], np.iinfo(np.int64).min)
        q_end = np.where(q >= 0, end[np.maximum(q, 0)], np.iinfo(np.int64).min)
        launched = launch >= 0
        by_launch = launched & (p_end < l_ts) & (q_end < l_ts)
        # A gap after the task before is the queue's only when the task was launched (a task no
        # call launched may have been written to the stream at any time).
        by_prev = ~by_launch & (p >= 0) & ((q < 0) | (q_end < p_end))
        # A stream's first task, with more launched behind it before it started: its launch is
        # still its only release (HTA leaves such a task unconnected).
        first = ~by_launch & ~by_prev & (p < 0) & (q < 0) & launched
        m = by_launch | first
        # A call that compiled the operator before launching it is compile time, not launch.
        klass = self.calls["klass"].to_numpy()[launch[m]] if len(self.calls) else np.zeros(0, dtype=object)
        self._edges(launch[m], 2 * H + j[m], _LAUNCH, H + j[m], np.where(klass == "op_compile", "compile", "launch"))
        self._edges(2 * H + D + p[by_prev], 2 * H + j[by_prev], _KK, H + j[by_prev], "dispatch",
                    zero=~launched[by_prev])
        self._sync_edges(ts, end, device, stream)

    def _event_sources(self, frames: Frames, t: pd.DataFrame, prev, l_ts, launch) -> np.ndarray:
        """Per task: the task whose end released it through an event (-1: none). A wait task's
        producer; a task whose stream wait the trace links to its event's record, the task behind
        that record (graph.Tasks.event_src; none when that task is outside the region); else,
        after a stream-wait call, the task on another stream that ended last before it began."""
        ts = t["ts"].to_numpy(np.int64)
        end = t["end"].to_numpy(np.int64)
        kind = t["kind"].to_numpy()
        device = t["device"].to_numpy(np.int64)
        stream = t["stream"].to_numpy(np.int64)
        out = _producers(ts, end, kind, device, stream, SLACK_NS, _event_ids(t))
        host, T = rank_graph(frames, self.rank, SLACK_NS)  # its threads: the same for any region
        linked = np.zeros(len(t), dtype=bool)
        if len(t) and (T.event_src >= 0).any():
            tasks_all = stream_tasks(frames)
            # The rank graph's tasks are the rank's stream_tasks rows, in order.
            mine = np.flatnonzero(tasks_all["rank"].to_numpy() == self.rank)
            ti = np.searchsorted(mine, t["row"].to_numpy(np.int64))
            src = T.event_src[ti]
            linked = src >= 0
            pos = np.full(len(T.ts), -1, dtype=np.int64)
            pos[ti] = np.arange(len(t))
            out[linked] = pos[src[linked]]
        thread = np.full(len(t), -1, dtype=np.int64)
        if len(self.calls):
            c = self.calls
            th = np.array([host.index(int(p), int(q)) for p, q in zip(c["pid"], c["tid"])], dtype=np.int64)
            thread[launch >= 0] = th[launch[launch >= 0]]
        lts = np.where(launch >= 0, l_ts, np.nan).astype(np.float64)
        waited = _waited(frames, self.rank, host, prev, lts, thread) & (kind != "wait") & ~linked
        if waited.any():
            out[waited] = _last_other_end(ts, end, device, stream, kind, np.flatnonzero(waited))
        return out

    def _sync_edges(self, ts, end, device, stream) -> None:
        """Each blocking host call ends after every stream's last task that ran while it waited;
        a launch blocked at a full queue after its own stream's (the task that retired)."""
        c = self.calls
        if c.empty:
            return
        klass = c["klass"].to_numpy()
        c_ts = c["ts"].to_numpy(np.int64)
        c_end = c["end"].to_numpy(np.int64)
        launch = self.tasks["launch"].to_numpy(np.int64) if self.D else np.zeros(0, np.int64)
        # The lane each blocked launch waited on: its task's (device, stream).
        lane_of = np.full((len(c), 2), np.iinfo(np.int64).min, dtype=np.int64)
        hit = np.flatnonzero(launch >= 0)
        lane_of[launch[hit], 0], lane_of[launch[hit], 1] = device[hit], stream[hit]
        lanes = pd.DataFrame({"d": device, "s": stream}).groupby(["d", "s"]).indices
        syncs = np.flatnonzero(np.isin(klass, ("sync", "blocking_copy")))
        for (d, s_), idx in lanes.items():
            idx = np.asarray(idx)
            if len(syncs):
                order = idx[np.argsort(ts[idx], kind="stable")]
                k = np.searchsorted(ts[order], c_end[syncs], side="right") - 1
                ok = k >= 0
                j = order[np.maximum(k, 0)]
                # Still running while the call waited, and done by the time it returned.
                ok &= (end[j] >= c_ts[syncs]) & (end[j] <= c_end[syncs])
                self._edges(2 * self.H + self.D + j[ok], self.H + syncs[ok], _SYNC, syncs[ok], "sync")
            queued = np.flatnonzero((klass == "queue") & (lane_of[:, 0] == d) & (lane_of[:, 1] == s_))
            if len(queued):
                # The task of its stream that retired last before it returned freed its slot.
                order = idx[np.argsort(end[idx], kind="stable")]
                k = np.searchsorted(end[order], c_end[queued], side="right") - 1
                ok = k >= 0
                j = order[np.maximum(k, 0)]
                ok &= end[j] >= c_ts[queued]
                self._edges(2 * self.H + self.D + j[ok], self.H + queued[ok], _SYNC, queued[ok], "queue")

    # -- the longest path ----------------------------------------------------------------------------------------

    def arrays(self) -> dict[str, np.ndarray]:
        """The edges as arrays (src, dst, w, etype, cause, allowed, name, where, rank): `allowed` is
        how much of an edge its own cause may keep (see _segments), `name` / `where` the event it
        is charged to."""
        src, what, etype = self.src, self.what, self.etype
        # A delay is the launch's (its call's own time and the dispatch after it) or the queue's
        # (the dispatch after the task before) only up to DISPATCH_NS past that: beyond it the
        # task waited for something the trace does not record, as the attribution says.
        allowed = np.full(len(src), np.iinfo(np.int64).max, dtype=np.int64)
        launch = etype == _LAUNCH
        if launch.any():
            call = src[launch]
            allowed[launch] = (self.node_ts[self.H + call] - self.node_ts[call]) + DISPATCH_NS
        allowed[etype == _KK] = DISPATCH_NS
        # A delay into a kernel that was ready while other streams' kernels held every core is
        # core contention, up to that wait (analyzers.causality.contention).
        contended = np.zeros(len(src), dtype=np.int64)
        into = (etype == _LAUNCH) | (etype == _KK)
        if into.any() and self.D:
            contended[into] = self.tasks["contended"].to_numpy(np.int64)[self.dst[into] - 2 * self.H]
        return {"src": src, "dst": self.dst, "w": self.w, "etype": etype, "cause": self.cause, "allowed": allowed,
                "contended": contended, "what": what,
                "rank": np.full(len(src), self.rank, dtype=np.int64)}

    def labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(name, where) of each event an edge can be charged to (`what`): host calls, then tasks."""
        names = np.concatenate([self.calls["name"].astype(str).to_numpy(), self.tasks["name"].astype(str).to_numpy()])
        where = np.concatenate([("thread " + self.calls["tid"].astype(str)).to_numpy(),
                                ("stream " + self.tasks["stream"].astype(str)).to_numpy()])
        return names.astype(object), where.astype(object)

    def longest_path(self) -> CriticalPath:
        a = self.arrays()
        path = _longest(len(self.node_ts), a["src"], a["dst"], a["w"], f"rank {self.rank}")
        return CriticalPath(self.rank, self.start, self.end, _segments(self.node_ts, a, path, *self.labels()))


def _longest(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, what: str) -> np.ndarray:
    """The edges of the longest path of the DAG (n nodes; edges src -> dst weighing w), in order."""
    if not len(src):
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[order], np.arange(n + 1))
    indeg = np.bincount(dst, minlength=n)
    ready = deque(np.flatnonzero(indeg == 0).tolist())
    dst_o, w_o = dst[order].tolist(), w[order].tolist()
    starts_l = starts.tolist()
    dist_l = [0] * n
    via_l = [-1] * n  # the edge the best path arrives by
    indeg_l = indeg.tolist()
    order_l = order.tolist()
    seen = 0
    while ready:
        u = ready.popleft()
        seen += 1
        du = dist_l[u]
        for k in range(starts_l[u], starts_l[u + 1]):
            v = dst_o[k]
            if via_l[v] < 0 or du + w_o[k] > dist_l[v]:
                dist_l[v] = du + w_o[k]
                via_l[v] = order_l[k]
            indeg_l[v] -= 1
            if indeg_l[v] == 0:
                ready.append(v)
    if seen != n:
        raise ValueError(f"{what}: the dependency graph has a cycle ({n - seen} nodes left)")
    node = int(np.argmax(dist_l))
    path = []
    while via_l[node] >= 0:
        e = via_l[node]
        path.append(e)
        node = int(src[e])
    path.reverse()
    return np.asarray(path, dtype=np.int64)


def _segments(node_ts: np.ndarray, a: dict[str, np.ndarray], path: np.ndarray, names: np.ndarray,
              where: np.ndarray) -> pd.DataFrame:
    """The path's edges as SEGMENT_COLUMNS rows. An edge into a kernel that waited for cores ends
    with `contention` (up to its `contended` time); the rest of an edge longer than it may keep
    (`allowed`) is split into its own cause up to that and `unexplained` past it."""
    if not len(path):
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    src, dst = a["src"][path], a["dst"][path]
    etype, weight, allowed = a["etype"][path], a["w"][path], a["allowed"][path]
    ts = node_ts[src]
    cont = np.minimum(a["contended"][path], np.maximum(weight, 0))
    rest = weight - cont
    own = np.where(rest > allowed, allowed, rest)
    # Up to three pieces per edge, in time order: its own cause, unexplained, contention.
    lens = np.stack([own, rest - own, cont], axis=1)
    keep = lens > 0
    keep[:, 0] |= ~keep.any(axis=1)  # a zero-weight edge stays one row
    rows, piece = np.nonzero(keep)
    starts = ts[:, None] + np.concatenate([np.zeros((len(path), 1), np.int64), np.cumsum(lens, axis=1)[:, :-1]], axis=1)
    out_ts = starts[rows, piece]
    out_w = lens[rows, piece]
    cause = a["cause"][path]
    out_cause = np.where(piece == 0, cause[rows], np.where(piece == 1, "unexplained", "contention"))
    # An edge's last piece ends at its node (a zero-weight edge spans its time with no weight).
    last = np.ones(len(rows), dtype=bool)
    last[:-1] = rows[1:] != rows[:-1]
    out_end = np.where(last, node_ts[dst][rows], out_ts + out_w)
    return pd.DataFrame({
        "rank": a["rank"][path][rows], "ts": out_ts, "end": out_end, "weight_ns": out_w,
        "cause": out_cause, "edge": np.asarray(EDGE_TYPES, dtype=object)[etype[rows]],
        "name": names[a["what"][path][rows]], "where": where[a["what"][path][rows]],
    })


def _queue_lengths(ts, l_ts, launched, device, stream) -> tuple[np.ndarray, np.ndarray]:
    """Per task, a stream's queue length (launched, not yet started) just after its launch and just
    after its start, as HTA counts it (+1 at a launch call's start, -1 at a task's start)."""
    n = len(ts)
    q_launch = np.full(n, -1, dtype=np.int64)
    q_start = np.full(n, -1, dtype=np.int64)
    lanes = pd.DataFrame({"d": device, "s": stream}).groupby(["d", "s"]).indices
    for idx in lanes.values():
        idx = np.asarray(idx)[launched[np.asarray(idx)]]
        if not len(idx):
            continue
        times = np.concatenate([l_ts[idx], ts[idx]])
        delta = np.concatenate([np.ones(len(idx), np.int64), -np.ones(len(idx), np.int64)])
        order = np.argsort(times, kind="stable")
        level = np.empty(len(times), dtype=np.int64)
        level[order] = np.cumsum(delta[order])
        q_launch[idx] = level[: len(idx)]
        q_start[idx] = level[len(idx):]
    return q_launch, q_start


def _last_other_end(ts, end, device, stream, kind, tasks: np.ndarray) -> np.ndarray:
    """Per task in `tasks`: the task on another stream of its device that ended last at or before
    it started (-1: none)."""
    out = np.full(len(tasks), -1, dtype=np.int64)
    for dev in np.unique(device[tasks]):
        c = np.flatnonzero((device == dev) & (kind != "wait"))
        c = c[np.argsort(end[c], kind="stable")]
        ends = end[c]
        for k in np.flatnonzero(device[tasks] == dev):
            j = int(tasks[k])
            i = int(np.searchsorted(ends, ts[j], side="right")) - 1
            while i >= 0 and stream[c[i]] == stream[j]:
                i -= 1
            out[k] = int(c[i]) if i >= 0 else -1
    return out
