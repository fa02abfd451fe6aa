"""Replay: re-time a trace through its dependency graph, with remedies applied or none.

The graph is the critical path's (analyzers.causality.critical_path, Holistic Trace Analysis'
convention): the start and end of every host call and device task, every rank in one node space,
joined where a collective released its ranks. Each node gets a new time: the latest of its
predecessors' new times plus the edges' weights, plus the node's own slack, how much later than
that it happened in the trace (what the trace does not explain: host time between calls, the
device's dispatch, a delay nothing recorded). Without remedies every node keeps its time, so the
replay reproduces the trace exactly, which `tests/test_replay.py` checks on every scenario and
shared real trace (a node whose predecessors would put it later than it ran is an inconsistent
graph, and fails it); only kernels that contended for cores to the nanosecond come back within
a small error (below). A remedy edits edge weights: a launch call's cost, a data-loading span, a
synchronize's wait; the change travels along the recorded dependencies, so what waited for the
edited work moves and what did not stays; an edge a remedy drops is no dependency at all. Nodes
are placed in time order, as the resources' models need, on the simulation core the emulator runs
on (`simcore`: its event loop, its max-min links, its core pools; one simulator, not two). The saving is the span the
replay takes off the run (off its own replay without remedies where that is not exact).

A synchronize that names its stream (its row has one) waits for that stream only: the graph joins
a blocking call to every stream's last task that ran while it waited, because most producers do
not say what a synchronize waited for; where the call says, the others are no dependency.

Device tasks keep their recorded duration unless a remedy changes it (a straggler's kernels, a
slow link's collectives, an under-occupying kernel): a remedy changes a task's weight by what its
evidence says (the other ranks' median, the link's nominal over its best rate, the cores left
idle).

Copies share their link (`Links`): each device's host-to-device and device-to-host PCIe
directions and its memory (device-to-device copies, memsets) are links, shared max-min fair by
the emulator's model, simcore.links (copies crossing one link at once each get an equal share). A copy's
work is what it would take with the link to itself, read off the trace: its recorded time, each
instant divided by the number of copies on its link then. The replay runs the same processor
sharing forward: a copy that a remedy moves away from another leaves that one the whole link and
both finish by their work, not by their recorded times. Without remedies the sharing is the
recorded one and every copy ends as it did (a model end within `SNAP_NS` of the recorded duration
is the recorded duration: float rounding, not a change).

Kernels share their device's cores (`Cores`) where the platform runs one block per core at a time
(Ascend's AI Cores; kernels that record their blocks and the cores of their kind): a pool per
(rank, device, cores of the kind), run as the device runs it (simcore.cores, the rules the emulator runs): a
kernel's blocks go to free cores one core at a time, each takes the kernel's block time (its time
over its waves where it ran with its cores to itself, else the median of its name's), kernels in
line by (started first, priority, arrival), a finished kernel's end first lets its stream's next
kernel in line and only then its cores go out, and with a remedy's preemption a higher priority
takes cores at every block boundary. Stream priorities are the trace's where the stream-creating
call records one (`Priority`). A kernel's recorded wait for cores (from its release, the time
saturating kernels covered: analyzers.causality.contention.release_waits) comes out of its slack
and the edges into its start, and the pools make the wait again; a kernel that started as it
arrived and lasts its duration within a nanosecond per wave keeps its recorded duration. Without
remedies this reproduces every trace whose kernels never waited for cores exactly, and the
queue-congestion scenarios (1-block checks beside 40-block kernels) within 0.03% of the span.

Every collective gets a release node, the latest of its parts' arrivals: a remedy that lets a
rank arrive earlier releases its peers as soon as the next-to-last one arrived, not when the
recorded last one did.

A remedy may be scoped to ranks (`NAME@1,3`): it edits only what those ranks did.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzers.causality import pipeline
from analyzers.causality.attribution import attribution
from analyzers.causality.collectives import parts as collective_parts
from analyzers.causality.critical_path import _DEP, _KK, _LAUNCH, _OP, _SYNC, JobGraph, job_graph
from analyzers.frames import Frames
from analyzers.streams import LINK_OF_KIND, copy_kind
from msprof_py.trace.schema import Trace
from simcore.cores import CorePool, Job
from simcore.engine import Engine
from simcore.links import Link, Network

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
    "priority": "raise a stream's priority: the stream (ARG; default on each rank the stream whose kernels "
                "waited longest for cores other streams held) comes first on its device's cores, and a waiting "
                "kernel of it takes cores at the next block boundary (preemption) instead of after the running "
                "kernel's last block; the cores' model times everything else",
    "stagger": "stagger transfers: a copy nothing waited for (no kernel or host call that followed it started "
               "within 5 us of its end, e.g. a prefetch) that shared its link with a copy something did wait for "
               "starts after that copy ended, which then has the link to itself (the links' sharing times both); "
               "where the topology routes collectives over PCIe, such a copy yields the link to them: the time it "
               "ran past its time alone (its bytes at the preset's rate) goes back to the collectives it "
               "overlapped, as much as it took from them (max-min), on every rank of each",
    "overlap": "overlap gradient reduction with the backward (buckets on a communication stream): collectives "
               "that all waited for one kernel and ran back to back while that kernel's stream ran nothing (every "
               "bucket held until the backward ended) start as their gradients are ready instead, in issue order "
               "after the one before on their stream: each at the end of its layer's backward (layers read from "
               "the backward's repeated op-type sequence, buckets from the collectives' sizes), the last at that "
               "kernel; without a repeated sequence, the i-th of n at i/(n-1) of the backward (the last 2/3 of "
               "the stream's kernel time in the step: backward costs twice the forward), the last two at that "
               "kernel",
    "microbatches": "more micro-batches for a pipeline: each pipeline's step (a chain of ranks handing micro-batches "
                    "on with point-to-point transfers) runs its batch in ARG micro-batches (default 4 per stage, at "
                    "least as many as recorded) of proportionally less compute and transfer each; the pipeline's "
                    "schedule (GPipe or 1F1B, as recorded) is modelled with both counts from each stage's kernel "
                    "time and transfers (analyzers.causality.pipeline), and each step of the pipeline's ranks "
                    "shrinks by the difference, its rows compressed evenly and later steps moved up (the new "
                    "micro-batches' own rows are not drawn)",
}
#: Remedies that take an argument (ns; `priority`: a stream id; `microbatches`: a count).
TAKES_ARG = ("launch", "compile", "priority", "microbatches")
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
    #: Streams a remedy raised ((rank, stream) -> priority, lower first): their pools let a waiting
    #: kernel of higher priority take cores at every block boundary (preemption).
    priority: dict = field(default_factory=dict)
    #: Edges that are no dependency at all (neither time nor order): a synchronize that names its
    #: stream does not wait for the other streams' tasks the graph joined it to.
    unlink: np.ndarray | None = None


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
        unit = {"priority": "a stream id", "microbatches": "a count of micro-batches"}.get(name, "ns")
        try:
            value = int(arg) if arg else None
        except ValueError:
            raise ValueError(f"remedy {text!r}: the argument must be an integer ({unit})") from None
        least = 1 if name == "microbatches" else 0
        if value is not None and value < least:
            raise ValueError(f"remedy {text!r}: the argument must be >= {least}" + (" ns" if unit == "ns" else ""))
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
            _stagger(frames, jg, e, self.ranks)
        elif self.name == "priority":
            _raise_priority(frames, jg, e, self.arg, self.ranks)
        elif self.name == "overlap":
            _overlap_buckets(frames, jg, e, self.ranks)
        # microbatches acts after the re-timing (_more_micro_batches): it edits no edge.


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
    """Every device task: rank, kind, device, stream, ts, dur, its start / end node, its label and
    (kernels) its blocks and the cores of its kind (NaN: not recorded)."""
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
                                   "label": jg.label_offsets[r] + g.H + j,
                                   "row": t["table_row"].to_numpy(np.int64),
                                   "blocks": t["value"].to_numpy(np.float64, na_value=np.nan),
                                   "cores": t["addr"].to_numpy(np.float64, na_value=np.nan)}))
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
    _shrink_collectives(jg, w, p, t, shrink)


def _shrink_collectives(jg: JobGraph, w: np.ndarray, p: pd.DataFrame, t: pd.DataFrame,
                        shrink: dict[str, float]) -> None:
    """Every rank's part of each collective `shrink` names (by its "group/seq" key in `p`, the
    collective parts with a `key` column) does its work after the release that much faster (they
    move in step); `t` is the graph's task frame."""
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


def _raise_priority(frames: Frames, jg: JobGraph, e: Edit, stream: int | None, ranks) -> None:
    """The stream's kernels first on their cores, with preemption (REMEDY_DOCS["priority"])."""
    from analyzers.causality.contention import core_waits

    if stream is not None:
        for r in jg.graphs if ranks is None else ranks:
            e.priority[(int(r), int(stream))] = -1
        return
    waits = core_waits(frames)
    if waits.empty:
        return
    if ranks is not None:
        waits = waits[waits["rank"].isin(ranks)]
    per = waits.groupby(["rank", "stream"])["contended_ns"].sum().reset_index()
    for _, g in per.groupby("rank"):
        top = g.loc[g["contended_ns"].idxmax()]
        e.priority[(int(top["rank"]), int(top["stream"]))] = -1


#: A kernel or host call that started within this of a copy's end (after an edge from it) waited
#: for the copy: the device's turnaround (analyzers.causality.contention.TURNAROUND_NS).
AWAITED_NS = 5_000


def _stagger(frames: Frames, jg: JobGraph, e: Edit, ranks) -> None:
    """Background copies yield their link to awaited ones and to the collectives crossing it
    (REMEDY_DOCS["stagger"])."""
    copies = _copies_awaited(jg, e, ranks)
    if copies is None:
        return
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
    from analyzers.bandwidth import collectives_share_copy_links

    if collectives_share_copy_links(frames):
        _collectives_first(frames, jg, e, copies)


def _copies_awaited(jg: JobGraph, e: Edit, ranks) -> pd.DataFrame | None:
    """The copies on a link the model knows (the task frame with `link`, `end` and `awaited`:
    an edge (stream order, an event, a synchronize, the graph's own) leads from its end to
    something other than a copy (a kernel, the host) that came within AWAITED_NS); None: none."""
    t = _task_frame(jg, ranks)
    if t.empty:
        return None
    t = t.assign(link=copy_kind(t).map(LINK_OF_KIND))
    copies = t[t["kind"].isin(["memcpy", "memset"]).to_numpy() & t["link"].notna().to_numpy()]
    if copies.empty:
        return None
    copy_start = np.zeros(len(jg.node_ts), dtype=bool)
    copy_start[copies["start_node"].to_numpy(np.int64)] = True
    src, dst = e.all_src, e.all_dst
    ok = (dst < len(jg.node_ts)) & (src < len(jg.node_ts))
    src, dst = src[ok], dst[ok]
    tight = ~copy_start[dst] & (jg.node_ts[dst] - jg.node_ts[src] <= AWAITED_NS)
    awaited = np.isin(copies["end_node"].to_numpy(np.int64), src[tight])
    return copies.assign(awaited=awaited, end=copies["ts"] + copies["dur"])


def _collectives_first(frames: Frames, jg: JobGraph, e: Edit, copies: pd.DataFrame) -> None:
    """Where the topology routes collectives over their device's PCIe links, the background copies
    there yield to them. Two flows on a link share it evenly (max-min), so while a copy and a
    collective shared one the copy lost as much time as it took from the collective: each
    background copy's time past its time alone (its bytes at the preset's nominal rate, plus the
    copy latency) goes back to the collectives of its rank it overlapped (after their release),
    shared by overlap, the part of it spent beside other copies left out; no more than the time
    each overlapped. Every rank's part of a collective moves in step (its largest saving counts).
    The copies keep their times. Without the preset's rates nothing is given back."""
    from analyzers.bandwidth import nominal_gbps

    preset = frames.trace.meta.extra.get("preset") or {}
    p = collective_parts(frames)
    bg = copies[copies["link"].astype(str).str.startswith("pcie").to_numpy() & ~copies["awaited"].to_numpy()]
    if not preset or p.empty or bg.empty or "bytes" not in frames.table.column_names:
        return
    rate = copy_kind(bg).map(nominal_gbps(preset)).to_numpy(np.float64)
    nbytes = frames.table.column("bytes").to_numpy(zero_copy_only=False)[bg["row"].to_numpy(np.int64)]
    alone = float(preset.get("copy_latency_ns", 0) or 0) + np.asarray(nbytes, dtype=np.float64) / rate
    extra = np.nan_to_num(np.clip(bg["dur"].to_numpy(np.float64) - alone, 0, None))
    p = p.assign(key=p["group"].astype(str) + "/" + p["seq"].astype(str))
    shrink: dict[str, float] = {}
    for rank, mine in bg.assign(extra=extra).groupby("rank", sort=False):
        own = p[p["rank"] == rank]
        if own.empty:
            continue
        lo = np.maximum(own["ts"].to_numpy(np.int64), own["release"].to_numpy(np.int64))
        hi = own["end"].to_numpy(np.int64)
        by_lo = np.argsort(lo, kind="stable")
        lo_s, longest = lo[by_lo], int((hi - lo).max())
        gain = np.zeros(len(own))
        cap = np.zeros(len(own))
        # Time each background copy spent beside other copies on its link (they took their share
        # of its extra time too): the integral of the link's other open copies over its life.
        beside = np.zeros(len(mine))
        others = copies[(copies["rank"] == rank).to_numpy()]
        for (dev, link), g in others.groupby(["device", "link"], sort=False):
            m = ((mine["device"] == dev) & (mine["link"] == link)).to_numpy()
            if m.any() and len(g) > 1:
                beside[m] = _open_time(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64),
                                       mine["ts"].to_numpy(np.int64)[m], mine["end"].to_numpy(np.int64)[m])
        for i, c in enumerate(mine.itertuples(index=False)):
            # The collectives that overlap the copy: those released before it ended, at most the
            # longest collective's length before it started.
            cand = by_lo[np.searchsorted(lo_s, c.ts - longest, "left"):np.searchsorted(lo_s, c.end, "left")]
            ov = np.clip(np.minimum(hi[cand], c.end) - np.maximum(lo[cand], c.ts), 0, None).astype(np.float64)
            total = ov.sum()
            if not total or not c.extra:
                continue
            share = total / (total + max(beside[i] - c.dur, 0.0))
            gain[cand] += c.extra * share * ov / total
            cap[cand] += ov
        gain = np.minimum(gain, cap)
        for k, v in zip(own["key"].tolist(), gain.tolist()):
            if v > 0:
                shrink[k] = max(shrink.get(k, 0.0), v)
    _shrink_collectives(jg, e.w[:len(jg.arrays["etype"])], p, _task_frame(jg, None), shrink)


def _open_time(ts: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi): the integral over it of how many of the intervals (ts, end) are
    open (an interval inside its own window counts its own length)."""
    b = np.unique(np.concatenate([ts, end]))
    if len(b) < 2:
        return np.zeros(len(lo))
    mid = (b[:-1] + b[1:]) / 2
    n_open = (np.searchsorted(np.sort(ts), mid, "right") - np.searchsorted(np.sort(end), mid, "right")).astype(np.float64)
    cum = np.concatenate([[0.0], np.cumsum(n_open * np.diff(b))])

    def at(x: np.ndarray) -> np.ndarray:
        x = np.clip(x, b[0], b[-1])
        i = np.minimum(np.searchsorted(b, x, "right") - 1, len(n_open) - 1)
        return cum[i] + n_open[i] * (x - b[i])

    return at(hi) - at(lo)


#: The backward's share of a training step's compute (backward costs twice the forward: 4N of the
#: 6N FLOPs per token and parameter).
BACKWARD_SHARE = 2 / 3


#: The longest per-layer kernel sequence the overlap remedy looks for (kernels).
PERIOD_CAP = 4096


def _overlap_buckets(frames: Frames, jg: JobGraph, e: Edit, ranks) -> None:
    """Gradient buckets reduced under the backward (REMEDY_DOCS["overlap"])."""
    a = jg.arrays
    w = e.w[:len(a["etype"])]
    sync = a["etype"] == _SYNC
    release = pd.Series(a["src"][sync], index=a["dst"][sync])  # a task's start (or a wait's end) <- a producer's end
    release = release[~release.index.duplicated(keep="last")]
    steps = frames.steps
    nbytes = frames.table.column("bytes").to_numpy(zero_copy_only=False) if "bytes" in frames.table.column_names \
        else None
    for r, g in jg.graphs.items():
        if (ranks is not None and r not in ranks) or not g.D:
            continue
        t = g.tasks
        base = jg.offsets[r] + 2 * g.H
        kind = t["kind"].to_numpy()
        waiting = t["waiting"].to_numpy(bool) if "waiting" in t else kind == "wait"
        lanes = t["device"].to_numpy(np.int64) * (1 << 32) + t["stream"].to_numpy(np.int64)
        ts, end = t["ts"].to_numpy(np.int64), t["end"].to_numpy(np.int64)
        size = (nbytes[t["table_row"].to_numpy(np.int64)].astype(np.float64) if nbytes is not None
                else np.full(len(t), np.nan))
        ops = pd.factorize(t["name"].astype(str).str.replace(r"\d+$", "", regex=True).to_numpy())[0]
        mine = steps[steps["rank"] == r] if not steps.empty else steps
        since: dict[int, int] = {}  # per lane: the gate of its run before (the step before, without markers)
        typed = t["addr"].notna().to_numpy() & t["value"].notna().to_numpy()
        for gate, wait, colls in _deferred_runs(kind, waiting & ~typed | ((kind == "collective") & ~typed), lanes,
                                                release, base, g.D):
            lane = np.flatnonzero((lanes == lanes[gate]) & (kind == "kernel"))
            after = lane[ts[lane] >= end[gate]]
            held = len(after) and ts[after[0]] >= end[colls[-2]]  # the stream waited for them all
            window = lane[(end[lane] <= end[gate]) & (lane > since.get(lanes[gate], -1))]
            since[lanes[gate]] = gate
            if not held:
                continue
            s = mine[(mine["ts"] <= ts[gate]) & (mine["end"] >= end[gate])] if not mine.empty else mine
            if not s.empty:
                window = window[ts[window] >= int(s["ts"].max())]
            ready = _ready_kernels(window, ops, end - ts, size[colls])
            if ready is None:
                continue
            first_dst = base + g.D + wait if wait is not None else base + colls[0]
            dsts = np.concatenate([[first_dst], base + np.asarray(colls[1:], dtype=np.int64)])
            w[sync & np.isin(a["dst"], dsts) & (a["src"] == base + g.D + gate)] = np.nan
            e.no_slack[dsts] = True
            _add(e, base + g.D + np.asarray(ready, dtype=np.int64), dsts)


def _deferred_runs(kind, waiting, lanes, release: pd.Series, base: int, D: int) -> list[tuple[int, int | None, list[int]]]:
    """Per stream in time order, the runs of two or more collectives after one kernel: (the
    kernel whose end released them, the wait task before the run or None, the collectives' task
    indices). `waiting` marks a collective's pieces that are not the operation itself (its
    waits, the tasks HCCL splits it into: rows without the communicator and sequence number
    that type an operation), which belong to the run without counting. A collective's gate is
    its own release's producer, else the run's: the wait before it, or the collective before it
    with nothing else between."""
    order = np.lexsort((np.arange(len(kind)), lanes))
    producer = np.full(len(kind), -1, dtype=np.int64)
    key = np.where(kind == "wait", base + D + np.arange(len(kind)), base + np.arange(len(kind)))
    src = release.reindex(key).to_numpy()
    has = ~np.isnan(src)
    producer[has] = src[has].astype(np.int64) - base - D
    producer[(producer < 0) | (producer >= D)] = -1
    out: list[tuple[int, int | None, list[int]]] = []
    gate, wait, lane = -1, None, None
    colls: list[int] = []

    def close() -> None:
        if gate >= 0 and len(colls) >= 2 and kind[gate] == "kernel":
            out.append((gate, wait, list(colls)))

    for j in order.tolist():
        if lanes[j] != lane:
            close()
            gate, wait, colls, lane = -1, None, [], lanes[j]
        if kind[j] == "wait":
            close()
            gate, wait, colls = int(producer[j]), j, []
        elif kind[j] == "collective":
            if producer[j] >= 0 and producer[j] != gate:
                close()
                gate, wait, colls = int(producer[j]), None, []
            if not waiting[j]:
                colls.append(j)
        else:
            close()
            gate, wait, colls = -1, None, []
    close()
    return out


def _ready_kernels(window: np.ndarray, ops: np.ndarray, dur: np.ndarray, size: np.ndarray) -> list[int] | None:
    """Where each of a run's collectives has its gradients: the kernel (a task index) it waits
    for, the last one the backward's last kernel (`window[-1]`, the gate). `window` is the gate's
    stream's kernels in the step up to the gate; `ops` every task's op type (its name without a
    trailing index), `size` the collectives' bytes.

    The layers: the collectives of the most common size, m >= 2 of them one after another, are one
    layer each, and the backward of a layer is one kernel sequence (P kernels) repeated m times;
    the run of m repetitions nearest the gate gives each layer's last kernel (the one issued first
    is the last layer, the first in the backward). A collective issued before them waits for the
    kernel before the first layer's backward, one after them for the gate. Without such a run:
    the backward is the last BACKWARD_SHARE of the window's kernel time and the i-th of n
    collectives waits for the kernel that ends i/(n-1) of it (the last two, the first layers' and
    the embeddings' whose backward is the last and cheapest, for the gate)."""
    n = len(size)
    if len(window) < n:
        return None
    layers = _layer_ends(window, ops, size)
    if layers is not None:
        first, ends, lo, hi = layers
        return [first if i < lo else ends[i - lo] if i < hi else int(window[-1]) for i in range(n)]
    busy = np.cumsum(dur[window])
    total = busy[-1]
    start = total * (1 - BACKWARD_SHARE)
    marks = start + (total - start) * np.minimum(np.arange(1, n + 1) / (n - 1), 1.0)
    k = np.minimum(np.searchsorted(busy, marks - 0.5, side="left"), len(window) - 1)
    out = [int(j) for j in window[k]]
    out[-1] = int(window[-1])
    return out


def _layer_ends(window: np.ndarray, ops: np.ndarray, size: np.ndarray) -> tuple[int, list[int], int, int] | None:
    """(the kernel before the first layer's backward, each layer's last kernel in issue order, the
    layer collectives' first and past-last position in the run) or None (see `_ready_kernels`)."""
    known = size[~np.isnan(size)]
    if len(known) < 2:
        return None
    values, counts = np.unique(known, return_counts=True)
    common = values[np.argmax(counts)]
    pos = np.flatnonzero(size == common)
    m = len(pos)
    if m < 2 or pos[-1] - pos[0] != m - 1:
        return None
    seq = ops[window]
    L = len(seq)
    best: tuple[int, int] | None = None  # (kernels covered, end) of the chosen period's last run
    period = 0
    for P in range(1, min(L // m, PERIOD_CAP) + 1):
        eq = np.concatenate([[False], seq[P:] == seq[:-P], [False]])
        edges = np.flatnonzero(np.diff(eq.astype(np.int8)))
        starts, stops = edges[::2], edges[1::2]
        ok = stops - starts >= (m - 1) * P
        if not ok.any():
            continue
        a, b = starts[ok][-1], stops[ok][-1]
        cover = b + P - a
        if best is None or (cover, b + P) > best:  # the most kernels repeated; of those, the latest
            best, period = (cover, b + P), P
    if best is None:
        return None
    stop = best[1]  # one past the last kernel of the repeated run
    ends = [int(window[stop - 1 - (m - 1 - k) * period]) for k in range(m)]
    before = stop - 1 - m * period
    first = int(window[max(before, 0)])
    return first, ends, int(pos[0]), int(pos[-1]) + 1


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
    arrive: list[tuple[int, int]] = []  # (part, node)
    held_src: list[int] = []  # parts ...
    held_dst: list[int] = []  # ... and the node each holds
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
    #: The replay's span without remedies (the recorded span but where the cores' model could not
    #: reproduce kernels that contended; the saving is measured from it).
    base_span_ns: int | None = None

    @property
    def saving_ns(self) -> int:
        return (self.span_ns if self.base_span_ns is None else self.base_span_ns) - self.new_span_ns


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
    unlink = np.zeros(len(src), dtype=bool)
    unlink[:len(a["src"])] = _foreign_syncs(frames, jg)

    def unedited() -> Edit:
        none = np.zeros(0, dtype=np.int64)
        return Edit(w0.astype(np.float64), none, none, none, np.zeros(len(node_ts), dtype=bool), src, dst,
                    unlink=unlink)

    e = unedited()
    for r in remedies:
        r.edit(frames, jg, e)
    resources = _resources(frames, jg, src, dst, e)
    new = retime(node_ts, src, dst, w0, e, resources)[:n]
    for r in remedies:
        if r.name == "microbatches":
            new = _more_micro_batches(frames, jg, new, r)
    # The run's span: first to last device task (all nodes where no task ran).
    dev = _task_nodes(jg)
    dev = dev if len(dev) else np.arange(n)
    span = int(jg.node_ts[dev].max() - jg.node_ts[dev].min())
    new_span = int(new[dev].max() - new[dev].min())
    base_span = span
    if remedies and any(isinstance(r, Cores) and r.shared for r in resources):
        # The cores' model does not reproduce a run whose kernels contended to the nanosecond: the
        # saving is measured against its own replay without remedies, so its error cancels.
        e0 = unedited()
        base = retime(node_ts, src, dst, w0, e0, _resources(frames, jg, src, dst, e0))[:n]
        base_span = int(base[dev].max() - base[dev].min())
    table = _write(frames, jg, new)
    return ReplayResult(Trace(table, frames.trace.meta), span, new_span, int((new != jg.node_ts).sum()), remedies,
                        base_span)


def _more_micro_batches(frames: Frames, jg: JobGraph, new: np.ndarray, remedy: Remedy) -> np.ndarray:
    """`new` with each pipeline's steps shortened by what more micro-batches save
    (REMEDY_DOCS["microbatches"]): on its ranks, time within a step's phase compressed evenly,
    time after it moved up by the steps' savings so far."""
    node_rank = np.full(len(new), -1, dtype=np.int64)
    for r, g in jg.graphs.items():
        node_rank[jg.offsets[r]:jg.offsets[r] + 2 * g.H + 2 * g.D] = r
    out = new.copy()
    for pipe in pipeline.find(frames):
        if remedy.ranks is not None and not set(pipe.stages) & set(remedy.ranks):
            continue
        sav = pipeline.savings(pipe, remedy.arg if remedy.arg is not None else pipeline.default_micro_batches(pipe))
        if not sav["saving_ns"].any():
            continue
        knots = np.maximum.accumulate(sav[["start", "end"]].to_numpy(np.float64).ravel())
        total = np.cumsum(sav["saving_ns"].to_numpy(np.float64))
        moved = np.column_stack([np.concatenate([[0.0], total[:-1]]), total]).ravel()
        mine = np.isin(node_rank, pipe.stages)
        out[mine] = new[mine] - np.round(np.interp(new[mine], knots, moved)).astype(np.int64)
    return out


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


def _resources(frames: Frames, jg: JobGraph, src: np.ndarray, dst: np.ndarray, e: Edit) -> list[Resource]:
    """The shared resources the replay models: copies on their links, and where the platform runs
    one block per core at a time (Ascend's AI Cores), kernels on their cores."""
    t = _task_frame(jg, None)
    if t.empty:
        return []
    w = e.w
    m = len(jg.arrays["src"])
    graph = pd.DataFrame({"start_node": src[:m], "end_node": dst[:m], "edge": np.arange(m)})
    graph = graph[jg.arrays["etype"] == _OP]
    # A task whose duration edge a remedy dropped is left out: nothing times it.
    t = t[t["dur"].to_numpy() > 0].merge(graph, on=["start_node", "end_node"], how="inner")
    t = t[~np.isnan(w[t["edge"].to_numpy()])]
    out: list[Resource] = []
    links = _links(jg, t, w)
    if links is not None:
        out.append(links)
    if frames.platform == "ascend":
        cores = _cores(frames, t, e.priority)
        if cores is not None:
            out.append(cores)
    return out


def _cores(frames: Frames, t: pd.DataFrame, raised: dict) -> Cores | None:
    """Kernels that record their blocks and their device's cores, on a pool per (rank, device,
    cores of the kind). A block's time: the kernel's time over its waves where no other kernel of
    its pool ran beside it; else the median of that of the kernels of its name, blocks and cores
    that ran alone; else its own time over its waves. Its recorded wait for cores: the part of its
    wait past its release that saturating kernels of other streams covered
    (analyzers.causality.contention)."""
    from analyzers.causality.contention import release_waits

    k = t[(t["kind"] == "kernel").to_numpy() & (t["blocks"] > 0).to_numpy() & (t["cores"] > 0).to_numpy()]
    if k.empty:
        return None
    k = k.reset_index(drop=True)
    blocks, cores = k["blocks"].to_numpy(np.int64), k["cores"].to_numpy(np.int64)
    ts, end = k["ts"].to_numpy(np.int64), (k["ts"] + k["dur"]).to_numpy(np.int64)
    pool, _ = pd.factorize(pd.MultiIndex.from_arrays([k["rank"].to_numpy(), k["device"].to_numpy(), cores]))
    # Alone: no other kernel of the pool overlaps it (sorted by start, the ends so far).
    alone = np.ones(len(k), dtype=bool)
    order = np.lexsort((ts, pool))
    for_pool, ts_o, end_o = pool[order], ts[order], end[order]
    for g in np.split(np.arange(len(order)), np.flatnonzero(np.diff(for_pool)) + 1):
        reach = np.maximum.accumulate(end_o[g])
        before = np.concatenate([[np.iinfo(np.int64).min], reach[:-1]])  # the latest end of those before
        nxt = np.concatenate([ts_o[g][1:], [np.iinfo(np.int64).max]])
        alone[order[g]] = (before <= ts_o[g]) & (end_o[g] <= nxt)
    waves = -(-blocks // cores)
    per_wave = k["dur"].to_numpy(np.float64) / waves
    key = pd.MultiIndex.from_arrays([k["name"].to_numpy(), blocks, cores])
    typical = pd.Series(per_wave[alone], index=key[alone]).groupby(level=[0, 1, 2]).median()
    block_ns = np.where(alone, per_wave, typical.reindex(key).to_numpy())
    block_ns = np.where(np.isnan(block_ns), per_wave, block_ns)
    waits = release_waits(frames)
    wait = np.zeros(len(k), dtype=np.int64)
    if len(waits):
        got = pd.Series(waits["wait_ns"].to_numpy(np.int64),
                        index=pd.MultiIndex.from_frame(waits[["rank", "stream", "ts"]].astype(np.int64)))
        got = got[~got.index.duplicated()]
        idx = pd.MultiIndex.from_arrays([k["rank"].to_numpy(), k["stream"].to_numpy(), ts])
        wait = got.reindex(idx).fillna(0).to_numpy(np.int64)
    priority = np.zeros(len(k), dtype=np.int64)
    lanes = pd.MultiIndex.from_arrays([k["rank"].to_numpy(np.int64), k["stream"].to_numpy(np.int64)])
    recorded = _stream_priorities(frames)
    if recorded:
        priority = pd.Series(recorded).reindex(lanes).fillna(0).to_numpy(np.int64).copy()
    preempt = np.zeros(int(pool.max()) + 1, dtype=bool)
    for (rank, stream), prio in raised.items():
        sel = (k["rank"].to_numpy() == rank) & (k["stream"].to_numpy() == stream)
        priority[sel] = prio
        preempt[np.unique(pool[sel])] = True
    return Cores(k["start_node"].to_numpy(np.int64), k["end_node"].to_numpy(np.int64), pool.astype(np.int64), blocks,
                 cores, block_ns, priority, k["dur"].to_numpy(np.float64), k["edge"].to_numpy(np.int64), wait,
                 preempt, bool(wait.any() or not alone.all()))


def _foreign_syncs(frames: Frames, jg: JobGraph) -> np.ndarray:
    """Per edge of the graph: whether it joins a synchronize that names its stream (the call's row
    has a stream) to a task of another stream. The graph joins a blocking call to every stream's
    last task that ran while it waited (most producers do not say what a synchronize waited for);
    where the call says, a task of another stream was no dependency."""
    a = jg.arrays
    out = np.zeros(len(a["src"]), dtype=bool)
    cand = (a["etype"] == _SYNC) & (a["cause"] == "sync")
    if not cand.any():
        return out
    stream = frames.trace.table.column("stream")
    for r, g in jg.graphs.items():
        sel = np.flatnonzero(cand & (a["rank"] == r))
        if not len(sel) or not g.D or g.calls.empty:
            continue
        i = a["what"][sel] - jg.label_offsets[r]
        j = a["src"][sel] - jg.offsets[r] - 2 * g.H - g.D
        ok = (i >= 0) & (i < g.H) & (j >= 0) & (j < g.D)
        sel, i, j = sel[ok], i[ok], j[ok]
        rows = g.calls["table_row"].to_numpy(np.int64)[i]
        called = stream.take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(np.float64)
        ran = g.tasks["stream"].to_numpy(np.float64)[j]
        out[sel[~np.isnan(called) & (called != ran)]] = True
    return out


def _stream_priorities(frames: Frames) -> dict[tuple[int, int], int]:
    """(rank, stream) -> priority (0 highest) where the trace records it: the `Priority` argument of
    the call that created the stream (aclrtCreateStreamWithConfig / cudaStreamCreateWithPriority
    rows that carry it). Streams without one rank as 0."""
    t = frames.trace.table
    if "args" not in t.column_names:
        return {}
    mask = pc.fill_null(pc.match_substring(t.column("args"), '"Priority"'), False)
    rows = t.filter(mask).select(["rank", "stream", "args"]).to_pylist()
    out = {}
    for r in rows:
        try:
            value = json.loads(r["args"]).get("Priority")
        except (TypeError, ValueError, AttributeError):
            continue
        if r["stream"] is not None and isinstance(value, int):
            out[(int(r["rank"]), int(r["stream"]))] = value
    return out


def _links(jg: JobGraph, t: pd.DataFrame, w: np.ndarray) -> Links | None:
    """The copies of `t` (the tasks with their duration edges) on their links (None: no copy
    crosses a link the model knows)."""
    t = t[t["kind"].isin(["memcpy", "memset"]).to_numpy()]
    if t.empty:
        return None
    link = copy_kind(t).map(LINK_OF_KIND)
    t = t[link.notna().to_numpy()].assign(link=link[link.notna()])
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
           resources: list[Resource] | None = None) -> np.ndarray:
    """New node times: each node at the latest of its predecessors' new time + new weight (`e`:
    the edit; an edge with a NaN weight is dropped, `e.src` -> `e.dst` added), plus its slack in
    the trace (its time minus the latest of its predecessors' time + weight; none for
    `e.no_slack`); a node whose every edge was dropped keeps its time. A task of a `resources`
    model (a copy on its link, a kernel on its cores) ends when the model says (not at its start
    + its duration edge's weight), and a kernel starts when its cores take its first blocks.
    Nodes are placed in time order (the models' sharing needs it)."""
    n = len(node_ts)
    if e is None:
        none = np.zeros(0, dtype=np.int64)
        e = Edit(w.astype(np.float64), none, none, none, np.zeros(n, dtype=bool))
    if e.unlink is not None and e.unlink.any():
        linked = ~e.unlink
        src, dst, w = src[linked], dst[linked], w[linked]
        e = Edit(e.w[linked], e.src, e.dst, e.add_w, e.no_slack)
        index = np.cumsum(linked) - 1  # an edge's place once the unlinked are out
        resources = [dataclasses.replace(r, edge=index[r.edge]) for r in resources or [] if linked[r.edge].all()]
    lo = np.iinfo(np.int64).min
    best = np.full(n, lo, dtype=np.int64)
    np.maximum.at(best, dst, node_ts[src] + w)
    slack = np.where(best > lo, node_ts - best, 0)
    if (slack < 0).any():
        raise ValueError(f"the dependency graph puts {int((slack < 0).sum())} node(s) later than they ran")
    slack[e.no_slack] = 0
    keep = ~np.isnan(e.w)
    resources = [r for r in resources or [] if len(r.start)]
    # The models stand in for their tasks' duration edges: out of the graph's edges.
    shared = np.zeros(len(src), dtype=bool)
    for r in resources:
        shared[r.edge] = True
    src_k = np.concatenate([src[keep & ~shared], e.src])
    dst_k = np.concatenate([dst[keep & ~shared], e.dst])
    w_k = np.concatenate([e.w[keep & ~shared].astype(np.int64), e.add_w])
    # A kernel's recorded wait for cores is the cores' model's to make again: out of its slack
    # first, the rest out of the weights of the edges into its start (never below 0).
    cut = np.zeros(n, dtype=np.int64)
    for r in resources:
        if isinstance(r, Cores):
            from_slack = np.minimum(r.wait, slack[r.start])
            slack[r.start] -= from_slack
            cut[r.start] = r.wait - from_slack
    if cut.any():
        w_k = np.maximum(w_k - cut[dst_k], 0)
    # The kept and added edges time and order the nodes: a dropped edge is no dependency (a node
    # placed after what it no longer waits for would be placed out of time order, which the
    # resources' models cannot take).
    order = np.argsort(src_k, kind="stable")
    indeg_a = np.bincount(dst_k, minlength=n)
    for r in resources:
        np.add.at(indeg_a, r.end, 1)  # a task's end also waits for its model
    run = _Run(n, np.searchsorted(src_k[order], np.arange(n + 1)).tolist(), dst_k[order].tolist(),
               w_k[order].tolist(), indeg_a.tolist(), node_ts.astype(np.int64).tolist(), slack.tolist())
    for r in resources:
        if isinstance(r, Cores):
            _CoreModel(run, r, e.w[r.edge])
        else:
            _LinkModel(run, r, e.w[r.edge])
    return run.run(np.flatnonzero(indeg_a == 0).tolist())


class _Run:
    """`retime`'s forward run on the simulation core the emulator runs on (simcore: its event loop,
    its links, its core pools). A node is placed when all its predecessors are: at the latest of
    their new times + the edges' weights, plus its slack; a copy's start puts it on its link
    (`_LinkModel`), a kernel's start node is ready for its cores and placed when they take its
    first blocks (`_CoreModel`), and a task of a model ends when the model says."""

    def __init__(self, n: int, starts: list[int], dst: list[int], w: list[int], indeg: list[int], out: list[int],
                 slack: list[int]) -> None:
        self.engine = Engine()
        self.n, self.starts, self.dst, self.w, self.indeg, self.out, self.slack = n, starts, dst, w, indeg, out, slack
        self.arrive: list[int | None] = [None] * n  # the latest new predecessor time + weight
        #: A node a model starts: start node -> the model's callback (a copy's: when it is placed; a
        #: kernel's: when it is ready, and the model places it).
        self.on_start: dict[int, tuple[Callable[[int, int], None], int]] = {}
        self.gated: set[int] = set()
        self.later: list[Callable[[], None]] = []
        self.seen = 0

    def run(self, roots: list[int]) -> np.ndarray:
        at, out, place, ready, gated = self.engine.at, self.out, self._place, self._ready, self.gated
        for u in roots:  # in node order: ties placed as the nodes are numbered; a kernel to its cores
            at(out[u], ready if u in gated else place, (u, out[u]))
        self.engine.run()
        if self.seen != self.n:
            raise ValueError(f"the dependency graph has a cycle ({self.n - self.seen} nodes left)")
        return np.asarray(out, dtype=np.int64)

    def _place(self, job: tuple[int, int]) -> None:
        u, tu = job  # its own time (the clock may be a few ns past it: a model's snapped end)
        self.place(u, tu)

    def place(self, u: int, tu: int) -> None:
        self.seen += 1
        self.out[u] = tu
        if u in self.on_start and u not in self.gated:  # a copy onto its link
            fn, i = self.on_start[u]
            fn(i, tu)
        arrive, indeg, dst, w = self.arrive, self.indeg, self.dst, self.w
        for k in range(self.starts[u], self.starts[u + 1]):
            v = dst[k]
            t = tu + w[k]
            got = arrive[v]
            if got is None or t > got:
                arrive[v] = t
            indeg[v] -= 1
            if indeg[v] == 0:
                self._release(v)

    def end(self, v: int, t: int) -> None:
        """A model finished the task whose end node is `v`, at `t`."""
        got = self.arrive[v]
        if got is None or t > got:
            self.arrive[v] = t
        self.indeg[v] -= 1
        if self.indeg[v] == 0:
            self._release(v)

    def _release(self, v: int) -> None:
        """All of `v`'s predecessors are placed: `v` goes in line (a kernel: to its cores)."""
        got = self.arrive[v]
        t = self.out[v] if got is None else got + self.slack[v]
        if v in self.gated:
            self.engine.at(t, self._ready, (v, t))
        else:
            self.engine.at(t, self._place, (v, t))

    def _ready(self, job: tuple[int, int]) -> None:
        v, t = job
        fn, i = self.on_start[v]
        fn(i, t)

    def after_now(self, fn: Callable[[], None]) -> None:
        """Call `fn` at this time, after every node placed at it (a finished kernel's cores go out
        once what its end released went in line, as the device does it)."""
        self.later.append(fn)
        if len(self.later) == 1:
            self.engine.at(self.engine.now, self._flush, None)

    def _flush(self, _arg: object) -> None:
        if self.engine.next_time() == self.engine.now:  # more at this time: after them
            self.engine.at(self.engine.now, self._flush, None)
            return
        todo, self.later = self.later, []
        for fn in todo:
            fn()


class _LinkModel:
    """The copies of `Links` on their links (simcore.links: max-min shared, as the emulator shares
    them), each a link of 1 byte/ns that a copy crosses with its work (ns alone) in bytes. A copy
    that ends within `SNAP_NS` of its start + its (edited) duration takes that: the recorded
    sharing, rounding, not a change."""

    def __init__(self, run: _Run, links: Links, dur: np.ndarray) -> None:
        self.run, self.end_node, self.dur = run, links.end.tolist(), dur.tolist()
        self.work = np.maximum(np.rint(links.work), 0).astype(np.int64).tolist()
        self.net = Network(run.engine)
        self.path = [(Link(f"link {li}", 1.0),) for li in range(int(links.link.max()) + 1)]
        self.link = links.link.tolist()
        self.started = [0] * len(self.end_node)
        run.on_start.update(zip(links.start.tolist(), ((self.start, i) for i in range(len(self.end_node)))))

    def start(self, i: int, t: int) -> None:
        self.started[i] = t
        self.net.transfer(self.path[self.link[i]], self.work[i], self._done, i)

    def _done(self, i: int) -> None:
        end = self.run.engine.now
        by_duration = self.started[i] + self.dur[i]
        if abs(end - by_duration) <= SNAP_NS:
            end = int(by_duration)
        self.run.end(self.end_node[i], end)


class _Kernel(Job):
    """A kernel of `Cores` as a job of its pool."""

    __slots__ = ("index",)

    def __init__(self, index: int, blocks: int, block_ns: int, priority: int) -> None:
        super().__init__(blocks, block_ns, priority)
        self.index = index


class _Pool(CorePool):
    """A pool of `Cores` (simcore.cores: the emulator's rules): a kernel's first blocks place its
    start node, its last one's end ends it, and its cores go out after what that released."""

    def __init__(self, model: _CoreModel, total: int, preempt: bool) -> None:
        super().__init__(model.run.engine, total)
        self.model = model
        self.preemption = preempt

    def started(self, job: Job) -> None:
        self.model.began(job.index, self.engine.now)  # type: ignore[attr-defined]

    def finished(self, job: Job) -> None:
        self.model.ended(job.index, self.engine.now)  # type: ignore[attr-defined]

    def freed(self) -> None:
        self.model.run.after_now(self.dispatch)


class _CoreModel:
    """The kernels of `Cores` on their pools, as the device runs them: a kernel goes to its pool
    when it is ready plus its slack in the trace less its recorded wait for cores (the pools make
    their own wait), starts when its cores take its first blocks and ends when its last block does.
    A kernel the pools start as it arrives and time within a nanosecond per wave of its (edited)
    duration takes that duration: rounding, not a change, so without remedies a kernel that had
    its cores keeps its recorded times."""

    def __init__(self, run: _Run, cores: Cores, dur: np.ndarray) -> None:
        self.run = run
        self.start_node, self.end_node = cores.start.tolist(), cores.end.tolist()
        self.dur = dur.tolist()
        scale = np.where(cores.dur0 > 0, dur / np.maximum(cores.dur0, 1), 1.0)
        block_ns = np.maximum(np.rint(cores.block_ns * scale), 1).astype(np.int64).tolist()
        self.waves = (-(-cores.blocks // cores.cores)).tolist()
        total = dict(zip(cores.pool.tolist(), cores.cores.tolist()))
        self.pools = [_Pool(self, total[p], bool(cores.preempt[p])) for p in range(int(cores.pool.max()) + 1)]
        self.pool = cores.pool.tolist()
        self.jobs = [_Kernel(i, b, t, pr) for i, (b, t, pr) in
                     enumerate(zip(cores.blocks.tolist(), block_ns, cores.priority.tolist()))]
        self.submitted = [0] * len(self.start_node)
        self.began_at = [0] * len(self.start_node)
        run.on_start.update(zip(self.start_node, ((self.ready, i) for i in range(len(self.start_node)))))
        run.gated.update(self.start_node)

    def ready(self, i: int, t: int) -> None:
        """Kernel `i` is ready at `t` (the recorded wait for cores taken out of its slack and its
        edges by `retime`)."""
        self.submitted[i] = t
        self.pools[self.pool[i]].submit(self.jobs[i])

    def began(self, i: int, t: int) -> None:
        t = max(t, self.submitted[i])
        self.began_at[i] = t
        self.run.place(self.start_node[i], t)

    def ended(self, i: int, t: int) -> None:
        if self.began_at[i] == self.submitted[i] and abs(t - self.began_at[i] - self.dur[i]) <= self.waves[i]:
            t = self.began_at[i] + int(round(self.dur[i]))
        self.run.end(self.end_node[i], t)


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


@dataclass
class Cores:
    """Kernels on their device's cores (see the module docstring): per kernel its start and end
    node, its pool (an index: rank, device, cores of its kind), blocks, the pool's cores, block
    time (ns, a float), priority (0 highest; a remedy may raise a stream's), recorded duration,
    the edge that carries it, and its recorded wait for cores."""

    start: np.ndarray
    end: np.ndarray
    pool: np.ndarray
    blocks: np.ndarray
    cores: np.ndarray
    block_ns: np.ndarray
    priority: np.ndarray
    dur0: np.ndarray
    edge: np.ndarray
    wait: np.ndarray
    preempt: np.ndarray  # per pool: a waiting kernel of higher priority takes cores at block boundaries
    #: Whether any kernel shared its cores or waited for them in the trace (else the pools give
    #: back every kernel's recorded times).
    shared: bool = True


Resource = Links | Cores


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
