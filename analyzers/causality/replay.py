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

Device tasks keep their recorded duration unless a remedy changes it (a straggler's kernels, a
slow link's collectives, an under-occupying kernel): a remedy changes a task's weight by what its
evidence says (the other ranks' median, the link's nominal over its best rate, the cores left
idle).

Copies share their link (`Links`): each device's host-to-device and device-to-host PCIe
directions and its memory (device-to-device copies, memsets) are links, shared max-min fair as
the emulator shares them (copies crossing one link at once each get an equal share). A copy's
work is what it would take with the link to itself, read off the trace: its recorded time, each
instant divided by the number of copies on its link then. The replay runs the same processor
sharing forward: a copy that a remedy moves away from another leaves that one the whole link and
both finish by their work, not by their recorded times. Without remedies the sharing is the
recorded one and every copy ends as it did (a model end within `SNAP_NS` of the recorded duration
is the recorded duration: float rounding, not a change).

Every collective gets a release node, the latest of its parts' arrivals: a remedy that lets a
rank arrive earlier releases its peers as soon as the next-to-last one arrived, not when the
recorded last one did.

A remedy may be scoped to ranks (`NAME@1,3`): it edits only what those ranks did.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzers.causality.attribution import attribution
from analyzers.causality.collectives import parts as collective_parts
from analyzers.causality.critical_path import _DEP, _KK, _LAUNCH, _OP, _SYNC, JobGraph, job_graph
from analyzers.frames import Frames
from analyzers.streams import LINK_OF_KIND, copy_kind
from msprof_py.trace.schema import Trace

#: The remedies, each a documented edit of the graph (`Remedy.edit`), by the name the CLI takes.
REMEDY_DOCS = {
    "launch": "fuse launches / capture a graph: every launch call costs at most ARG ns (default 2000) and "
              "its task's launch delay shrinks by what the call saved",
    "data": "prefetch data: data loading and host work (data_load / host_work calls) move to a loader "
            "thread that prepares each batch as soon as it finished the one before (one batch ahead); "
            "the host's next call waits for its batch and for the host, no longer for the loading itself",
    "sync": "defer synchronizes to the end of the step: every synchronize call but the last of its thread "
            "in each step costs nothing and no longer waits for the device; one that waited for a copy of "
            "results to the host stays (the host reads them)",
    "compile": "cache compiled operators: an operator-compile call costs at most a launch (ARG ns, default 2000) "
               "and its task's launch delay shrinks by what the call saved",
    "pinned": "copy from pinned memory: a blocking copy call returns once it issued the copy (its own cost, at "
              "most 5 us) instead of waiting for it; the copy keeps its place on its stream",
    "copy": "double-buffer input copies: on a stream that also runs kernels, each host-to-device copy after "
            "the first is issued one batch ahead on a copy stream: it starts once the copy before it ended and the "
            "first kernel after the copy two back (the reader of the buffer it overwrites) ran, no longer after "
            "its launch call or the task before it; what came after it on its stream still waits for it, and a "
            "synchronize no longer waits for it (an event orders its reader); a device-to-host copy of results "
            "goes out on a stream of its own (after the kernels before it; the next task no longer waits for it); "
            "only copies the device's kernels sat idle through are moved; and the host waits for the batch "
            "before on those streams, not the one it just queued (as `pipeline`)",
    "pipeline": "wait for the batch before: a synchronize that waited for work queued since the thread's "
                "synchronize before it waits for what that one waited for instead (one that already waits for an "
                "older batch keeps its wait; the thread's last keeps everything)",
    "queue": "a deeper stream queue: a launch never blocks at a full queue (it returns at its own cost, at most "
             "5 us)",
    "straggler": "equalise a straggler: the rank's kernels (scope it with @RANK; default the rank with the most "
                 "kernel time) take the other ranks' median kernel time, scaled uniformly",
    "link": "links at nominal bandwidth: for every link whose counters never exceeded half its nominal rate "
            "(as SLOW_LINK), the collectives of the groups its rank is in transfer at nominal: their work after "
            "the release shrinks by best / nominal",
    "spread": "spread kernels over all cores: each kernel that left cores idle while alone on the device takes "
              "the time of filling them (UNDER_OCCUPANCY's saving)",
    "stagger": "stagger transfers: a copy nothing waited for (no kernel or host call that followed it started "
               "within 5 us of its end, e.g. a prefetch) that shared its link with a copy something did wait for "
               "starts after that copy ended, which then has the link to itself (the links' sharing times both)",
}
#: Remedies that take an argument (ns).
TAKES_ARG = ("launch", "compile")
#: What an asynchronous call (a copy from pinned memory, a launch into a queue with room) costs the
#: host at most (ns).
ASYNC_CALL_NS = 5_000
#: A fused or graph-captured launch's cost (ns): what one kernel of a captured graph costs the host.
LAUNCH_FLOOR_NS = 2_000
#: A shared copy's model end this close to its start + its (edited) duration is that: rounding.
SNAP_NS = 2


@dataclass
class Edit:
    """A remedy's edit of the graph: new edge weights (NaN drops an edge; the graph's edges, then
    the structural ones `all_src` -> `all_dst` replay adds), edges added (`src` -> `dst`, their
    weights), and nodes that lose their slack (they no longer wait for what the trace showed)."""

    w: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    add_w: np.ndarray
    no_slack: np.ndarray
    all_src: np.ndarray = None  # type: ignore[assignment]
    all_dst: np.ndarray = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Remedy:
    """One remedy: `name` (a key of REMEDY_DOCS), its argument (None: the default) and the ranks it
    acts on (None: every rank)."""

    name: str
    arg: int | None = None
    ranks: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> Remedy:
        """`NAME[=ARG][@RANK[,RANK...]]` (ARG an integer, ns); ValueError naming the choices otherwise."""
        head, at, scope = text.partition("@")
        name, _, arg = head.partition("=")
        name = name.strip().lower()
        if name not in REMEDY_DOCS:
            raise ValueError(f"unknown remedy {text!r}: choose one of {', '.join(REMEDY_DOCS)}")
        if arg and name not in TAKES_ARG:
            raise ValueError(f"remedy {name!r} takes no argument (got {text!r})")
        try:
            value = int(arg) if arg else None
        except ValueError:
            raise ValueError(f"remedy {text!r}: the argument must be an integer (ns)") from None
        if value is not None and value < 0:
            raise ValueError(f"remedy {text!r}: the argument must be >= 0 ns")
        ranks = None
        if at:
            try:
                ranks = tuple(sorted({int(x) for x in scope.split(",")}))
            except ValueError:
                raise ValueError(f"remedy {text!r}: after @ give ranks as integers, e.g. {name}@3 or {name}@0,2") \
                    from None
            if any(r < 0 for r in ranks):
                raise ValueError(f"remedy {text!r}: ranks are >= 0")
        return cls(name, value, ranks)

    def __str__(self) -> str:
        out = self.name if self.arg is None else f"{self.name}={self.arg}"
        return out if self.ranks is None else out + "@" + ",".join(map(str, self.ranks))

    def edit(self, frames: Frames, jg: JobGraph, e: Edit) -> None:
        """Apply this remedy to the edit `e` of `jg` (in place)."""
        a = jg.arrays
        etype = a["etype"]
        w = e.w[:len(etype)]  # the graph's own edges (a view: edits write through)
        mine = np.ones(len(etype), dtype=bool) if self.ranks is None else np.isin(a["rank"], self.ranks)
        if self.name in ("launch", "compile"):
            _cheapen_launches(jg, e, w, mine, self.name, LAUNCH_FLOOR_NS if self.arg is None else self.arg)
        elif self.name == "data":
            _prefetch(jg, e, self.ranks)
        elif self.name == "sync":
            _defer_syncs(frames, jg, e, self.ranks)
        elif self.name in ("pinned", "queue"):
            _no_wait(jg, e, mine, "blocking_copy" if self.name == "pinned" else "queue", self.ranks)
        elif self.name == "copy":
            _double_buffer(frames, jg, e, self.ranks)
        elif self.name == "pipeline":
            _sync_one_behind(jg, e, _task_frame(jg, self.ranks)["end_node"].to_numpy()
                             if jg.graphs else np.zeros(0, dtype=np.int64), self.ranks)
        elif self.name == "straggler":
            _equalise(jg, w, self.ranks)
        elif self.name == "link":
            _nominal_links(frames, jg, w, self.ranks)
        elif self.name == "spread":
            _spread(frames, jg, w, mine)
        elif self.name == "stagger":
            _stagger(jg, e, self.ranks)


def _cheapen_launches(jg: JobGraph, e: Edit, w: np.ndarray, mine: np.ndarray, cause_name: str, floor: int) -> None:
    """Every call of `cause_name` ("launch", or "compile": an operator compile before a launch)
    costs at most `floor`; its task's launch delay shrinks by what the call saved."""
    a = jg.arrays
    etype, cause = a["etype"], a["cause"]
    calls = (etype == _OP) & (cause == cause_name) & mine
    saved = np.clip(w[calls] - floor, 0, None)
    w[calls] -= saved
    # A task launched into an empty queue hangs off its call's start: the call's saving comes off
    # its launch delay too.
    by_call = pd.Series(saved, index=a["what"][calls]).groupby(level=0).sum()
    call_label, call_end = _launch_of_tasks(jg)  # by task label (an edge into a task is charged to it)
    into = etype == _LAUNCH
    cut = by_call.reindex(call_label.reindex(a["what"][into]).to_numpy()).fillna(0).to_numpy()
    w[into] = np.clip(w[into] - cut, 0, None)
    # A task queued behind the one before it whose gap lasted while its own launch call still ran:
    # the gap was the call's and the dispatch after it. It now starts at the later of the task
    # before it and its call's new end plus that dispatch (the device starts a queued task at once).
    kk = np.flatnonzero((etype == _KK) & mine)
    lab = call_label.reindex(a["what"][kk]).to_numpy()
    has = ~np.isnan(lab) & np.isin(lab, by_call.index.to_numpy())
    kk, lab = kk[has], lab[has]
    end_node = call_end.reindex(a["what"][kk]).to_numpy().astype(np.int64)
    waited = jg.node_ts[end_node] - jg.node_ts[a["src"][kk]]
    ran = waited > 0
    kk, end_node = kk[ran], end_node[ran]
    lag = jg.node_ts[a["dst"][kk]] - jg.node_ts[end_node]
    w[kk] = 0
    _add(e, end_node, a["dst"][kk], np.clip(lag, 0, None))


def _no_wait(jg: JobGraph, e: Edit, mine: np.ndarray, klass: str, ranks) -> None:
    """Calls of `klass` (blocking copies, launches blocked at a full queue) no longer wait for the
    device: their sync edges go, and each costs its own time, at most ASYNC_CALL_NS."""
    a = jg.arrays
    calls = _host_nodes(jg, (klass,), ranks)
    if calls.empty:
        return
    ends = calls["end_node"].to_numpy()
    w = e.w[:len(a["etype"])]
    w[(a["etype"] == _SYNC) & np.isin(a["dst"], ends) & mine] = np.nan
    e.no_slack[ends] = True
    cost = np.minimum(calls["end"].to_numpy() - calls["ts"].to_numpy(), ASYNC_CALL_NS)
    _add(e, calls["start_node"].to_numpy(), ends, cost)


def _task_frame(jg: JobGraph, ranks) -> pd.DataFrame:
    """Every device task: rank, kind, device, stream, ts, dur, its start / end node and its label."""
    parts = []
    for r, g in jg.graphs.items():
        if (ranks is not None and r not in ranks) or not g.D:
            continue
        t = g.tasks
        base = jg.offsets[r] + 2 * g.H
        j = np.arange(g.D)
        parts.append(pd.DataFrame({"rank": r, "kind": t["kind"].to_numpy(), "name": t["name"].astype(str).to_numpy(),
                                   "device": t["device"].to_numpy(np.int64), "stream": t["stream"].to_numpy(np.int64),
                                   "ts": t["ts"].to_numpy(np.int64), "dur": (t["end"] - t["ts"]).to_numpy(np.int64),
                                   "start_node": base + j, "end_node": base + g.D + j,
                                   "label": jg.label_offsets[r] + g.H + j}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _copy_waited(frames: Frames, t: pd.DataFrame) -> np.ndarray:
    """Per task of `t`: whether the device's kernels were idle while it ran (any attributed idle
    overlaps it: the copy is not hidden under compute)."""
    idle = attribution(frames)
    idle = idle[idle["idle_ns"] > 0]
    out = np.zeros(len(t), dtype=bool)
    if idle.empty:
        return out
    ts, end = t["ts"].to_numpy(np.int64), (t["ts"] + t["dur"]).to_numpy(np.int64)
    for (r, d), g in idle.groupby(["rank", "device"]):
        sel = np.flatnonzero((t["rank"].to_numpy() == r) & (t["device"].to_numpy() == d))
        lo = np.sort(g["ts"].to_numpy(np.int64))
        hi = g["end"].to_numpy(np.int64)[np.argsort(g["ts"].to_numpy(np.int64))]
        hi = np.maximum.accumulate(hi)
        # Some idle piece starts before the task ends and ends after it starts.
        k = np.searchsorted(lo, end[sel], side="left") - 1
        ok = k >= 0
        out[sel[ok]] = hi[k[ok]] > ts[sel[ok]]
    return out


def _double_buffer(frames: Frames, jg: JobGraph, e: Edit, ranks) -> None:
    """Copies double-buffered (REMEDY_DOCS["copy"]): on a stream that runs kernels too, each
    host-to-device copy after the first is issued one batch ahead, on a copy stream of its own, and
    each device-to-host copy goes out on a stream of its own."""
    t = _task_frame(jg, ranks)
    if t.empty:
        return
    t = t.sort_values(["rank", "device", "stream", "ts"], kind="stable").reset_index(drop=True)
    is_in = np.zeros(len(t), dtype=bool)
    is_out = np.zeros(len(t), dtype=bool)
    mem = (t["kind"] == "memcpy").to_numpy()
    kinds = copy_kind(t[mem]).to_numpy()
    is_in[mem] = kinds == "Memcpy HtoD"
    is_out[mem] = kinds == "Memcpy DtoH"
    is_kernel = (t["kind"] == "kernel").to_numpy()
    # Only the copies the device waited for (its kernels idle while the copy ran): a copy already
    # overlapped with compute is double-buffered already.
    waited = _copy_waited(frames, t)
    is_in &= waited
    is_out &= waited
    # A copy that started late for no recorded reason, or a task that started late after it, keeps
    # that delay on the stream, so the hoist recovers the copy's own time, never the unexplained.
    unexplained = _Unexplained(jg, e)
    a = jg.arrays
    starts, ends, src, dst, add_w, freed, lane_ends = [], [], [], [], [], [], []

    def edge(u: int, v: int, weight: int = 0) -> None:
        src.append(u)
        dst.append(v)
        add_w.append(weight)

    node_of = t["start_node"].to_numpy(), t["end_node"].to_numpy()
    for _, lane in t.groupby(["rank", "device", "stream"], sort=False).indices.items():
        lane = np.asarray(lane)
        if not is_kernel[lane].any():
            continue
        start, end = node_of[0][lane], node_of[1][lane]
        pos = np.flatnonzero(is_in[lane])
        out = np.flatnonzero(is_out[lane])
        hoisted = np.zeros(len(lane), dtype=bool)
        hoisted[pos[1:]] = True
        if hoisted.any():
            lane_ends.extend(end.tolist())
        for k in range(1, len(pos)):
            i = pos[k]
            starts.append(start[i])
            ends.append(end[i])
            # One batch ahead: after the copy before it ...
            edge(end[pos[k - 1]], start[i])
            # ... once the kernel that read the buffer it overwrites (two copies back) ran.
            if k >= 2:
                after = np.flatnonzero(is_kernel[lane[pos[k - 2] + 1:i]])
                if len(after):
                    edge(end[pos[k - 2] + 1 + after[0]], start[i])
        # Copies out keep their order on their own stream.
        for k in range(1, len(out)):
            edge(end[out[k - 1]], start[out[k]])
        # The stream keeps its order around the copies it no longer holds (each run of them), and
        # the delays nothing recorded: before the first of them, and of the next task after the last.
        gone = hoisted.copy()
        gone[out] = True
        i = 0
        while i < len(lane):
            if not gone[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(lane) and gone[j + 1]:
                j += 1
            if 0 < i and j < len(lane) - 1:
                nxt = start[j + 1]
                edge(end[i - 1], nxt, unexplained(start[i], end[i - 1]) + unexplained(nxt, end[j]))
                for m in range(i, j + 1):
                    if hoisted[m]:
                        edge(end[m], nxt)  # the task after an input copy still reads its input
                if not hoisted[j]:
                    freed.append((end[j], nxt))
            i = j + 1
    if freed:
        f = np.asarray(freed, dtype=np.int64)
        key = e.all_src.astype(np.int64) * len(e.no_slack) + e.all_dst
        e.w[np.isin(key, f[:, 0] * len(e.no_slack) + f[:, 1])] = np.nan
    if not starts:
        _add(e, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), np.asarray(add_w, dtype=np.int64))
        return
    starts_a = np.asarray(starts, dtype=np.int64)
    # The copy no longer waits for its launch call or the task before it on its stream.
    e.w[np.isin(e.all_dst, starts_a)] = np.nan
    e.no_slack[starts_a] = True
    # The host no longer synchronizes on it: an event orders its reader after it.
    w = e.w[:len(a["etype"])]
    w[(a["etype"] == _SYNC) & (a["cause"] == "sync") & np.isin(a["src"], np.asarray(ends, dtype=np.int64))] = np.nan
    # With two buffers the host no longer waits for the batch it just queued on those streams.
    _sync_one_behind(jg, e, np.asarray(lane_ends, dtype=np.int64), ranks)
    _add(e, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), np.asarray(add_w, dtype=np.int64))


class _Unexplained:
    """How much later a node ran than the graph (as recorded, before any edit) explains, apart
    from one predecessor: what a remedy that removes that predecessor must leave in place."""

    def __init__(self, jg: JobGraph, e: Edit) -> None:
        a = jg.arrays
        self.src, self.dst = e.all_src, e.all_dst
        self.w0 = np.concatenate([a["w"], np.zeros(len(e.all_src) - len(a["w"]), dtype=np.int64)])
        self.node_ts = np.concatenate([jg.node_ts, np.zeros(len(e.no_slack) - len(jg.node_ts), dtype=np.int64)])
        self.by_dst = np.argsort(e.all_dst, kind="stable")
        self.dst_sorted = e.all_dst[self.by_dst]

    def __call__(self, node: int, before: int | None = None) -> int:
        """`node`'s time past both `before` (None: nothing) and its other predecessors."""
        lo, hi = np.searchsorted(self.dst_sorted, [node, node + 1])
        k = self.by_dst[lo:hi]
        held = np.iinfo(np.int64).min
        if before is not None:
            k = k[self.src[k] != before]
            held = int(self.node_ts[before])
        if len(k):
            held = max(held, int((self.node_ts[self.src[k]] + self.w0[k]).max()))
        if held == np.iinfo(np.int64).min:
            return 0
        return max(int(self.node_ts[node]) - held, 0)


def _sync_one_behind(jg: JobGraph, e: Edit, task_ends: np.ndarray, ranks) -> None:
    """With two buffers the host waits for the batch before, not the one it just queued: a
    synchronize that waited for tasks of `task_ends` launched since the thread's synchronize
    before it (the batch it just queued) waits for what that one waited for instead; one that
    already waited for an older batch keeps its wait, and the thread's last keeps everything."""
    a = jg.arrays
    w = e.w[:len(a["etype"])]
    calls = _host_nodes(jg, ("sync",), ranks)
    if calls.empty:
        return
    into = np.flatnonzero((a["etype"] == _SYNC) & (a["cause"] == "sync") & np.isin(a["src"], task_ends))
    if not len(into):
        return
    # When each task's launch call began (none: never current).
    launched = np.full(len(e.no_slack), np.iinfo(np.int64).max, dtype=np.int64)
    for r, g in jg.graphs.items():
        if not g.D:
            continue
        launch = g.tasks["launch"].to_numpy(np.int64)
        j = np.flatnonzero(launch >= 0)
        launched[jg.offsets[r] + 2 * g.H + g.D + j] = g.calls["ts"].to_numpy(np.int64)[launch[j]]
    waited = pd.DataFrame({"node": a["dst"][into], "src": a["src"][into], "k": into})
    sources = waited.groupby("node")["src"].apply(np.asarray).to_dict()
    edges = waited.groupby("node")["k"].apply(np.asarray).to_dict()
    src, dst = [], []
    for _, g in calls.sort_values("ts", kind="stable").groupby(["rank", "pid", "tid"], sort=False):
        g = g[g["end_node"].isin(list(sources))]
        nodes, ends_t = g["end_node"].tolist(), g["end"].tolist()
        for i, me in enumerate(nodes[:-1]):
            since = ends_t[i - 1] if i else np.iinfo(np.int64).min
            if not (launched[sources[me]] >= since).any() or (launched[sources[me]] == np.iinfo(np.int64).max).all():
                continue  # it already waits for an older batch
            w[edges[me]] = np.nan
            e.no_slack[me] = True
            if i:
                src.append(sources[nodes[i - 1]])
                dst.append(np.full(len(sources[nodes[i - 1]]), me, dtype=np.int64))
    if src:
        _add(e, np.concatenate(src), np.concatenate(dst))


def _equalise(jg: JobGraph, w: np.ndarray, ranks) -> None:
    """The straggler's kernels scaled to the other ranks' median kernel time (REMEDY_DOCS["straggler"])."""
    t = _task_frame(jg, None)
    if t.empty:
        return
    busy = t[t["kind"] == "kernel"].groupby("rank")["dur"].sum()
    if len(busy) < 2:
        return
    targets = list(ranks) if ranks is not None else [int(busy.idxmax())]
    a = jg.arrays
    for r in targets:
        if r not in busy.index:
            continue
        ratio = float(busy.drop(index=r).median()) / float(busy[r])
        if ratio >= 1:
            continue
        labels = t.loc[(t["rank"] == r) & (t["kind"] == "kernel"), "label"].to_numpy()
        sel = (a["etype"] == _OP) & (a["cause"] == "compute") & np.isin(a["what"], labels)
        w[sel] = np.round(w[sel] * ratio)


def _nominal_links(frames: Frames, jg: JobGraph, w: np.ndarray, ranks) -> None:
    """Every slow link at its nominal rate (REMEDY_DOCS["link"]): the part of a collective of its
    rank during which the link moved data (its counter above 0) takes best / nominal of that time,
    and every part of the same collective on the other ranks saves as much (they move in step)."""
    from analyzers import links
    s = links.summarize(frames)
    slow = [x for _, x in s["links"] if x["busy"] > 0 and x["best"] < links.LinkConfig().slow_ratio * x["nominal"]]
    if ranks is not None:
        slow = [x for x in slow if x["rank"] in ranks]
    p = collective_parts(frames)
    t = _task_frame(jg, None)
    if not slow or p.empty or t.empty:
        return
    c = frames.counters
    p = p.assign(key=p["group"].astype(str) + "/" + p["seq"].astype(str))
    shrink: dict[str, float] = {}
    for link in slow:
        g = c[c["name"].astype(str) == link["link"] + " GB/s"].sort_values("ts", kind="stable")
        ts, val = g["ts"].to_numpy(np.int64), g["value"].to_numpy(np.float64)
        if len(ts) < 2:
            continue
        busy = val[:-1] > 0
        lo, hi = ts[:-1][busy], ts[1:][busy]
        cum = np.concatenate([[0], np.cumsum(hi - lo)])
        own = p[p["rank"] == link["rank"]]
        # Busy time inside [a, b): whole intervals between, clipped ones at the ends.
        for k, a_, b_ in zip(own["key"].tolist(), own["ts"].to_numpy(np.int64).tolist(),
                             own["end"].to_numpy(np.int64).tolist()):
            i = np.searchsorted(hi, a_, side="right")
            j = np.searchsorted(lo, b_, side="left")
            if j <= i:
                continue
            inside = cum[j] - cum[i] - max(0, a_ - lo[i]) - max(0, hi[j - 1] - b_)
            gain = max(inside, 0) * (1 - link["best"] / link["nominal"])
            shrink[k] = max(shrink.get(k, 0.0), gain)
    if not shrink:
        return
    hit = p[p["key"].isin(list(shrink))]
    coll = t[t["kind"] == "collective"].set_index(["rank", "name", "ts"])["label"]
    keys = pd.MultiIndex.from_arrays([hit["rank"].to_numpy(np.int64), hit["name"].astype(str).to_numpy(),
                                      hit["ts"].to_numpy(np.int64)])
    lab = coll.reindex(keys).to_numpy(np.float64)
    ok = ~np.isnan(lab)
    gain = pd.Series([shrink[k] for k in hit["key"]], index=lab).loc[ok]
    gain.index = gain.index.astype(np.int64)
    gain = gain.groupby(level=0).max()
    a = jg.arrays
    sel = (a["etype"] == _OP) & (a["cause"] == "collective") & np.isin(a["what"], gain.index.to_numpy()) & (w > 0)
    w[sel] = np.clip(w[sel] - np.round(gain.reindex(a["what"][sel]).to_numpy()), 0, None)


def _spread(frames: Frames, jg: JobGraph, w: np.ndarray, mine: np.ndarray) -> None:
    """Each under-occupying kernel shortened by the saving of filling its cores (REMEDY_DOCS["spread"])."""
    from analyzers.causality.contention import under_occupancy

    occ = under_occupancy(frames, frames.platform == "ascend")
    t = _task_frame(jg, None)
    if occ.empty or t.empty:
        return
    lab = t.set_index(["rank", "stream", "ts"])["label"]
    keys = pd.MultiIndex.from_arrays([occ["rank"].to_numpy(np.int64), occ["stream"].to_numpy(np.int64),
                                      occ["ts"].to_numpy(np.int64)])
    saving = pd.Series(occ["saving_ns"].to_numpy(np.int64), index=lab.reindex(keys).to_numpy())
    saving = saving[~np.isnan(saving.index.to_numpy(np.float64))]
    saving.index = saving.index.astype(np.int64)
    saving = saving.groupby(level=0).max()
    a = jg.arrays
    sel = (a["etype"] == _OP) & (a["cause"] == "compute") & np.isin(a["what"], saving.index.to_numpy()) & mine
    w[sel] = np.clip(w[sel] - saving.reindex(a["what"][sel]).to_numpy(), 1, None)


#: A kernel or host call that started within this of a copy's end (after an edge from it) waited
#: for the copy: the device's turnaround (analyzers.causality.contention.TURNAROUND_NS).
AWAITED_NS = 5_000


def _stagger(jg: JobGraph, e: Edit, ranks) -> None:
    """Background copies yield their link to awaited ones (REMEDY_DOCS["stagger"])."""
    t = _task_frame(jg, ranks)
    if t.empty:
        return
    t = t.assign(link=copy_kind(t).map(LINK_OF_KIND))
    copies = t[t["kind"].isin(["memcpy", "memset"]).to_numpy() & t["link"].notna().to_numpy()]
    if copies.empty:
        return
    # Awaited: an edge (stream order, an event, a synchronize, the graph's own) leads from its end
    # to something other than a copy (a kernel, the host) that came within AWAITED_NS.
    copy_start = np.zeros(len(jg.node_ts), dtype=bool)
    copy_start[copies["start_node"].to_numpy(np.int64)] = True
    src, dst = e.all_src, e.all_dst
    ok = (dst < len(jg.node_ts)) & (src < len(jg.node_ts))
    src, dst = src[ok], dst[ok]
    tight = ~copy_start[dst] & (jg.node_ts[dst] - jg.node_ts[src] <= AWAITED_NS)
    awaited = np.isin(copies["end_node"].to_numpy(np.int64), src[tight])
    copies = copies.assign(awaited=awaited, end=copies["ts"] + copies["dur"])
    froms, tos = [], []
    for _, g in copies.groupby(["rank", "device", "link"], sort=False):
        a, b = g[g["awaited"]].sort_values("ts"), g[~g["awaited"]]
        if a.empty or b.empty:
            continue
        # Per background copy, the awaited copy on its link that started before it ended and
        # ended last: if that one ended after the background copy started, they shared the link.
        a_ts, a_end = a["ts"].to_numpy(np.int64), a["end"].to_numpy(np.int64)
        best = np.maximum.accumulate(a_end)
        which = np.maximum.accumulate(np.where(a_end == best, np.arange(len(a_end)), -1))
        k = np.searchsorted(a_ts, b["end"].to_numpy(np.int64), "left") - 1
        hit = (k >= 0)
        hit[hit] = best[k[hit]] > b["ts"].to_numpy(np.int64)[hit]
        froms.append(a["end_node"].to_numpy(np.int64)[which[k[hit]]])
        tos.append(b["start_node"].to_numpy(np.int64)[hit])
    if froms:
        _add(e, np.concatenate(froms), np.concatenate(tos))


def _host_nodes(jg: JobGraph, klasses: tuple[str, ...], ranks=None) -> pd.DataFrame:
    """The host calls of `klasses` (of `ranks`, None: every rank): rank, pid, tid, ts, end, start /
    end node, label."""
    parts = []
    for r, g in jg.graphs.items():
        if ranks is not None and r not in ranks:
            continue
        c = g.calls
        i = np.flatnonzero(c["klass"].isin(klasses).to_numpy())
        off = jg.offsets[r]
        parts.append(pd.DataFrame({"rank": r, "pid": c["pid"].to_numpy(np.int64)[i], "tid": c["tid"].to_numpy(np.int64)[i],
                                   "ts": c["ts"].to_numpy(np.int64)[i], "end": c["end"].to_numpy(np.int64)[i],
                                   "start_node": off + i, "end_node": off + g.H + i,
                                   "label": jg.label_offsets[r] + i}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _prefetch(jg: JobGraph, e: Edit, ranks=None) -> None:
    """Data loading on a loader thread, one batch ahead (REMEDY_DOCS["data"])."""
    a = jg.arrays
    calls = _host_nodes(jg, ("data_load", "host_work"), ranks)
    if calls.empty:
        return
    # A loading span inside another moves with it: only the outermost ones are edited.
    calls = calls.sort_values(["rank", "pid", "tid", "ts"], kind="stable")
    reach = calls.groupby(["rank", "pid", "tid"])["end"].transform(lambda x: x.cummax().shift(1))
    calls = calls[~(calls["ts"] < reach).to_numpy()].reset_index(drop=True)
    starts = calls["start_node"].to_numpy()
    ends = calls["end_node"].to_numpy()
    into = np.isin(a["dst"], starts)
    out_of = np.isin(a["src"], ends) & np.isin(a["etype"], (_OP, _DEP))  # the host program after it
    # What the host did before a loading span now leads straight to what it did after it.
    before = pd.DataFrame({"node": a["dst"][into], "src": a["src"][into]})
    after = pd.DataFrame({"node": a["src"][out_of], "dst": a["dst"][out_of]})
    pos = pd.Series(np.arange(len(starts)), index=starts)
    before["k"] = pos.reindex(before["node"]).to_numpy()
    pos = pd.Series(np.arange(len(ends)), index=ends)
    after["k"] = pos.reindex(after["node"]).to_numpy()
    bridge = before.merge(after, on="k")
    # The host time before a loading span that nothing recorded explains stays on the host.
    unexplained = _Unexplained(jg, e)
    bridge_w = np.array([unexplained(int(v)) for v in bridge["node_x"].to_numpy()], dtype=np.int64)
    e.w[:len(a["dst"])][into] = np.nan
    src, dst = [bridge["src"].to_numpy(np.int64)], [bridge["dst"].to_numpy(np.int64)]
    # The loader prepares each batch once it finished the one before.
    weights = [bridge_w]
    for _, g in calls.sort_values("ts", kind="stable").groupby(["rank", "pid", "tid"], sort=False):
        src.append(g["end_node"].to_numpy()[:-1])
        dst.append(g["start_node"].to_numpy()[1:])
        weights.append(np.zeros(len(g) - 1, dtype=np.int64))
    _add(e, np.concatenate(src), np.concatenate(dst), np.concatenate(weights))
    e.no_slack[starts] = True


def _defer_syncs(frames: Frames, jg: JobGraph, e: Edit, ranks=None) -> None:
    """Every synchronize but the last of its thread in each step costs nothing and waits for
    nothing (REMEDY_DOCS["sync"])."""
    a = jg.arrays
    calls = _host_nodes(jg, ("sync",), ranks)
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
    # A synchronize that waited for a copy of results to the host is the host reading them: the
    # program uses what it copied, so it stays.
    t = _task_frame(jg, ranks)
    if not t.empty:
        mem = t[(t["kind"] == "memcpy").to_numpy()]
        out = mem["end_node"].to_numpy()[(copy_kind(mem) == "Memcpy DtoH").to_numpy()]
        reads = a["dst"][(a["etype"] == _SYNC) & np.isin(a["src"], out)]
        gone = gone[~gone["end_node"].isin(reads).to_numpy()]
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


def _releases(frames: Frames, jg: JobGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per collective of several ranks: a release node (numbered after the graph's nodes) at the
    latest of its parts' arrivals, with edges from every part's arrival to it and from it to
    what in each part waited for the release (src, dst, the new nodes' times). A part arrives
    when its collective task starts or, when a device wait opens it (HCCL's Notify_Wait: a wait
    on its stream with its correlation id), when that wait starts; the wait's end, or the
    release node the graph gave a waiting part, is what the release holds. An edge that would
    run back in time (clocks of different hosts) is left out: the graph's own rendezvous edge
    stands."""
    none = np.zeros(0, dtype=np.int64)
    if not jg.joined:
        return none, none, none
    p = collective_parts(frames)
    p = p[(p["ranks"] > 1) & p["rank"].isin(list(jg.graphs))]
    if p.empty:
        return none, none, none
    arrive, held_src, held_dst = [], [], []  # (part, node); (part, node) pairs
    for r, g in jg.graphs.items():
        sub = p[p["rank"] == r]
        if sub.empty or not g.D:
            continue
        base = jg.offsets[r] + 2 * g.H
        t = g.tasks
        waiting = t["waiting"].to_numpy(bool) if "waiting" in t else (t["kind"] == "wait").to_numpy()
        openers = pd.DataFrame({"stream": t["stream"].to_numpy(np.int64)[waiting],
                                "corr": t["corr"].to_numpy(np.float64)[waiting],
                                "j": np.flatnonzero(waiting)})
        rv = dict(zip(zip(g.rv_parts["group"].astype(np.int64).tolist(), g.rv_parts["seq"].astype(np.int64).tolist()),
                      g.rv_node.tolist()))
        by_key = openers.groupby(["stream", "corr"])["j"].apply(list).to_dict() if len(openers) else {}
        for i, group, seq, name, stream, corr, ts in zip(sub.index.tolist(), sub["group"].tolist(), sub["seq"].tolist(),
                                                        sub["name"].tolist(), sub["stream"].tolist(),
                                                        sub["corr"].tolist(), sub["ts"].tolist()):
            u = g.collective_start(str(name), int(ts))
            if u < 0:
                continue
            opened = [j for j in by_key.get((int(stream), float(corr)), []) if t["ts"].iat[j] <= ts] \
                if stream == stream and corr == corr else []
            if opened:
                arrive.append((i, base + min(opened, key=lambda j: t["ts"].iat[j])))
                held_src.extend([i] * len(opened))
                held_dst.extend(base + g.D + j for j in opened)
            else:
                arrive.append((i, jg.offsets[r] + u))
            node = rv.get((int(group), int(seq)))
            if node is not None:
                held_src.append(i)
                held_dst.append(jg.offsets[r] + node)
    if not arrive:
        return none, none, none
    key = (p["group"].astype(str) + "/" + p["seq"].astype(str))
    codes = pd.Series(pd.factorize(key)[0], index=p.index)
    ai = np.array([x[0] for x in arrive])
    an = np.array([x[1] for x in arrive], dtype=np.int64)
    ac = codes.reindex(ai).to_numpy(np.int64)
    n0 = len(jg.node_ts)
    k = int(codes.max()) + 1
    v_ts = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(v_ts, ac, jg.node_ts[an])
    hc = codes.reindex(held_src).to_numpy(np.int64) if held_src else np.zeros(0, dtype=np.int64)
    hd = np.asarray(held_dst, dtype=np.int64)
    ok = jg.node_ts[hd] >= v_ts[hc]
    src = np.concatenate([an, n0 + hc[ok]])
    dst = np.concatenate([n0 + ac, hd[ok]])
    v_ts = np.where(v_ts == np.iinfo(np.int64).min, 0, v_ts)
    return src, dst, v_ts


def _add(e: Edit, src: np.ndarray, dst: np.ndarray, w: np.ndarray | None = None) -> None:
    e.src = np.concatenate([e.src, src.astype(np.int64)])
    e.dst = np.concatenate([e.dst, dst.astype(np.int64)])
    e.add_w = np.concatenate([e.add_w, np.zeros(len(src), dtype=np.int64) if w is None else w.astype(np.int64)])


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
    # Each collective's release: the latest arrival of its parts, a node of its own.
    rv_src, rv_dst, rv_ts = _releases(frames, jg)
    node_ts = np.concatenate([jg.node_ts, rv_ts])
    src = np.concatenate([a["src"], fifo_src, rv_src])
    dst = np.concatenate([a["dst"], fifo_dst, rv_dst])
    w0 = np.concatenate([a["w"], np.zeros(len(fifo_src) + len(rv_src), dtype=np.int64)])
    none = np.zeros(0, dtype=np.int64)
    e = Edit(w0.astype(np.float64), none, none, none, np.zeros(len(node_ts), dtype=bool), src, dst)
    for r in remedies:
        r.edit(frames, jg, e)
    new = retime(node_ts, src, dst, w0, e, _links(jg, src, dst, e.w))[:n]
    # The run's span: first to last device task (all nodes where no task ran).
    dev = _task_nodes(jg)
    dev = dev if len(dev) else np.arange(n)
    span = int(jg.node_ts[dev].max() - jg.node_ts[dev].min())
    new_span = int(new[dev].max() - new[dev].min())
    table = _write(frames, jg, new)
    return ReplayResult(Trace(table, frames.trace.meta), span, new_span, int((new != jg.node_ts).sum()), remedies)


@dataclass
class Links:
    """Copies sharing links (see the module docstring): per copy its start and end node, its link
    (an index), its work (ns with the link to itself, the edit's duration change applied) and the
    edge that carries its duration (the replay's edges, the link stands in for it)."""

    start: np.ndarray
    end: np.ndarray
    link: np.ndarray
    work: np.ndarray
    edge: np.ndarray


def _alone_ns(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per transfer of one link, [ts, end) as recorded: the time it would have taken alone, each
    instant of it divided by the number of transfers on the link then (processor sharing)."""
    times = np.concatenate([ts, end]).astype(np.float64)
    delta = np.concatenate([np.ones(len(ts)), -np.ones(len(end))])
    order = np.lexsort((delta, times))  # ends first at a tie: a copy that ended shares nothing
    times, count = times[order], np.cumsum(delta[order])
    share = np.where(count[:-1] > 0, 1.0 / np.maximum(count[:-1], 1.0), 0.0)
    progress = np.concatenate([[0.0], np.cumsum(np.diff(times) * share)])
    return progress[np.searchsorted(times, end, "left")] - progress[np.searchsorted(times, ts, "left")]


def _links(jg: JobGraph, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> Links | None:
    """The copies of the trace on their links (None: no copy crosses a link the model knows). A
    copy whose duration edge a remedy dropped is left out: nothing times it."""
    t = _task_frame(jg, None)
    if t.empty:
        return None
    t = t[t["kind"].isin(["memcpy", "memset"]).to_numpy() & (t["dur"] > 0).to_numpy()]
    if t.empty:
        return None
    link = copy_kind(t).map(LINK_OF_KIND)
    t = t[link.notna().to_numpy()].assign(link=link[link.notna()])
    m = len(jg.arrays["src"])
    graph = pd.DataFrame({"start_node": src[:m], "end_node": dst[:m], "edge": np.arange(m)})
    graph = graph[jg.arrays["etype"] == _OP]
    t = t.merge(graph, on=["start_node", "end_node"], how="inner")
    t = t[~np.isnan(w[t["edge"].to_numpy()])]
    if t.empty:
        return None
    start, end = t["start_node"].to_numpy(np.int64), t["end_node"].to_numpy(np.int64)
    key = pd.MultiIndex.from_frame(t[["rank", "device", "link"]])
    code, _ = pd.factorize(key)
    work = np.zeros(len(t), dtype=np.float64)
    for k in range(int(code.max()) + 1):
        sel = np.flatnonzero(code == k)
        work[sel] = _alone_ns(jg.node_ts[start[sel]], jg.node_ts[end[sel]])
    edge = t["edge"].to_numpy(np.int64)
    recorded = (jg.node_ts[end] - jg.node_ts[start]).astype(np.float64)
    # A remedy that changed a copy's duration (a straggler's, a link's) changes its work alike.
    work = work * np.where(recorded > 0, w[edge] / np.maximum(recorded, 1.0), 1.0)
    return Links(start, end, code.astype(np.int64), work, edge)


def retime(node_ts: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray, e: Edit | None = None,
           links: Links | None = None) -> np.ndarray:
    """New node times: each node at the latest of its predecessors' new time + new weight (`e`:
    the edit; an edge with a NaN weight is dropped, `e.src` -> `e.dst` added), plus its slack in
    the trace (its time minus the latest of its predecessors' time + weight; none for
    `e.no_slack`); a node whose every edge was dropped keeps its time. A copy of `links` ends when
    its link, shared with the copies on it at the time, has done its work (not at its start + its
    duration edge's weight). Nodes are placed in time order (the links' sharing needs it)."""
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
    # The links stand in for their copies' duration edges: out of the graph's edges.
    shared = np.zeros(len(src), dtype=bool)
    if links is not None:
        shared[links.edge] = True
    src_k = np.concatenate([src[keep & ~shared], e.src])
    dst_k = np.concatenate([dst[keep & ~shared], e.dst])
    w_k = np.concatenate([e.w[keep & ~shared].astype(np.int64), e.add_w])
    order = np.argsort(src_k, kind="stable")
    starts = np.searchsorted(src_k[order], np.arange(n + 1)).tolist()
    dst_o, w_o = dst_k[order].tolist(), w_k[order].tolist()
    # Every edge, dropped or added, orders its nodes.
    src_all, dst_all = np.concatenate([src[~shared], e.src]), np.concatenate([dst[~shared], e.dst])
    all_order = np.argsort(src_all, kind="stable")
    all_starts = np.searchsorted(src_all[all_order], np.arange(n + 1)).tolist()
    all_dst = dst_all[all_order].tolist()
    indeg_a = np.bincount(dst_all, minlength=n)
    sim = None
    if links is not None and len(links.start):
        np.add.at(indeg_a, links.end, 1)  # a copy's end also waits for its link
        sim = _LinkSim(links, e.w[links.edge])
    indeg = indeg_a.tolist()
    arrive: list[int | None] = [None] * n  # the latest new predecessor time + weight, over the kept edges
    out = node_ts.astype(np.int64).tolist()
    slack_l = slack.tolist()
    heap = [(out[u], u, 0) for u in np.flatnonzero(indeg_a == 0).tolist()]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    seen = 0
    while heap:
        tu, u, version = pop(heap)
        if u < 0:  # a link finished a copy (if nothing on it changed since)
            done, nxt = sim.finish(-1 - u, tu, version)
            if nxt is not None:
                push(heap, nxt)
            for v, t in done:
                if arrive[v] is None or t > arrive[v]:
                    arrive[v] = t
                indeg[v] -= 1
                if indeg[v] == 0:
                    push(heap, (out[v] if arrive[v] is None else arrive[v] + slack_l[v], v, 0))
            continue
        seen += 1
        out[u] = tu
        if sim is not None and u in sim.of_start:
            nxt = sim.start(sim.of_start[u], tu)
            if nxt is not None:
                push(heap, nxt)
        for k in range(starts[u], starts[u + 1]):
            v = dst_o[k]
            t = tu + w_o[k]
            if arrive[v] is None or t > arrive[v]:
                arrive[v] = t
        for k in range(all_starts[u], all_starts[u + 1]):
            v = all_dst[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                push(heap, (out[v] if arrive[v] is None else arrive[v] + slack_l[v], v, 0))
    if seen != n:
        raise ValueError(f"the dependency graph has a cycle ({n - seen} nodes left)")
    return np.asarray(out, dtype=np.int64)


class _LinkSim:
    """The links of `Links` run forward: processor sharing by virtual time (each link's clock
    advances at 1 / the copies on it; a copy is done when the clock passed its start + work).
    Events go into the replay's heap as (time, -1 - link, version): an event whose version is not
    the link's latest was overtaken by a copy that started meanwhile."""

    def __init__(self, links: Links, dur: np.ndarray) -> None:
        self.of_start = dict(zip(links.start.tolist(), range(len(links.start))))
        self.end, self.link, self.work = links.end.tolist(), links.link.tolist(), links.work.tolist()
        self.dur = dur.tolist()
        nl = int(links.link.max()) + 1
        self.clock, self.at, self.version = [0.0] * nl, [0.0] * nl, [0] * nl
        self.active: list[list[tuple[float, int]]] = [[] for _ in range(nl)]
        self.started = [0] * len(self.end)

    def _advance(self, li: int, t: float) -> None:
        t = max(t, self.at[li])
        if self.active[li]:
            self.clock[li] += (t - self.at[li]) / len(self.active[li])
        self.at[li] = t

    def _next(self, li: int) -> tuple[int, int, int] | None:
        self.version[li] += 1
        q = self.active[li]
        if not q:
            return None
        t = self.at[li] + (q[0][0] - self.clock[li]) * len(q)
        return (int(round(t)), -1 - li, self.version[li])

    def start(self, i: int, t: int) -> tuple[int, int, int] | None:
        """Copy `i` starts at `t`: the link's next event."""
        li = self.link[i]
        self._advance(li, t)
        self.started[i] = t
        heapq.heappush(self.active[li], (self.clock[li] + self.work[i], i))
        return self._next(li)

    def finish(self, li: int, t: int, version: int) -> tuple[list[tuple[int, int]], tuple[int, int, int] | None]:
        """The link's event at `t`: (end node, time) of each copy it finished (none if stale) and the
        link's next event."""
        if version != self.version[li]:
            return [], None
        self._advance(li, t)
        q = self.active[li]
        head = q[0][0]
        self.clock[li] = max(self.clock[li], head)
        done = []
        while q and q[0][0] <= head + 1e-6:
            _, i = heapq.heappop(q)
            end = t
            by_duration = self.started[i] + self.dur[i]
            if abs(end - by_duration) <= SNAP_NS:  # the recorded sharing: rounding, not a change
                end = int(by_duration)
            done.append((self.end[i], end))
        return done, self._next(li)


def _write(frames: Frames, jg: JobGraph, new: np.ndarray) -> pa.Table:
    """The trace table with every node's row re-timed; host rows without a node (steps,
    annotations) shifted as the thread's last node before them moved; device rows without one
    (counters, memory events, flow ends, accesses) as the device's last task start or end before
    them moved."""
    t = frames.trace.table  # every column (window "all": the same rows as frames.table)
    ts = t.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    dur = t.column("dur").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    has_dur = t.column("dur").is_valid().to_numpy(zero_copy_only=False)
    new_ts, new_end = ts.copy(), ts + dur
    placed = np.zeros(len(ts), dtype=bool)
    host_keys, host_t, host_shift = [], [], []
    dev_keys, dev_t, dev_shift = [], [], []
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
        device = g.tasks["device"].to_numpy(np.int64)
        dev_keys.append(np.stack([np.full(2 * D, r), np.concatenate([device, device])], axis=1))
        dev_t.append(np.concatenate([ts[rows], ts[rows] + dur[rows]]))
        dev_shift.append(shift[off + 2 * H:off + 2 * H + 2 * D])
    if host_keys:
        _shift_host_rows(t, ts, dur, new_ts, new_end, placed, np.concatenate(host_keys), np.concatenate(host_t),
                         np.concatenate(host_shift))
    if dev_keys:
        _shift_device_rows(t, ts, dur, new_ts, new_end, placed, np.concatenate(dev_keys), np.concatenate(dev_t),
                           np.concatenate(dev_shift))
    out = t.set_column(t.schema.get_field_index("ts"), "ts", pa.array(new_ts, type=t.schema.field("ts").type))
    new_dur = np.where(has_dur, new_end - new_ts, 0)
    dur_col = pa.array(new_dur, type=t.schema.field("dur").type, mask=~has_dur)
    return out.set_column(t.schema.get_field_index("dur"), "dur", dur_col)


def _shift_device_rows(t: pa.Table, ts, dur, new_ts, new_end, placed, keys, task_t, shift) -> None:
    """Move each row that is no node and was not moved with a host thread by the shift of its
    device's (a row on no device: its rank's) last task start or end at or before it (its start
    and its end each). Metadata rows stay."""
    device = t.column("device")
    meta = pc.equal(t.column("kind").cast(pa.string()), "meta").fill_null(False).to_numpy(zero_copy_only=False)
    free = ~placed & ~meta & (new_ts == ts) & (new_end == ts + dur)
    if not free.any():
        return
    rows = np.flatnonzero(free)
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    dev = device.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    points = pd.DataFrame({"rank": keys[:, 0], "device": keys[:, 1], "t": task_t, "shift": shift})
    # A row on no device follows all of its rank's devices.
    points = pd.concat([points, points.assign(device=-1)], ignore_index=True)
    points = points.sort_values(["rank", "device", "t"], kind="stable")
    want = pd.DataFrame({"rank": rank, "device": dev}).groupby(["rank", "device"], sort=False).indices
    for (r, d), g in points.groupby(["rank", "device"], sort=False):
        sel = want.get((r, d))
        if sel is None:
            continue
        sel = rows[sel]
        t_arr, s_arr = g["t"].to_numpy(), g["shift"].to_numpy()
        for at, target in ((ts[sel], new_ts), (ts[sel] + dur[sel], new_end)):
            k = np.clip(np.searchsorted(t_arr, at, side="right") - 1, 0, len(t_arr) - 1)
            target[sel] = at + s_arr[k]


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
