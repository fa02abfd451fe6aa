"""The dependency graph of a trace table, as arrays: what each device task could not start before.

Nodes are device tasks (kernels, copies, memsets, collectives, device-side event waits and
zero-length event records on a stream) and host calls. Edges, each a release time of a task:

- stream FIFO: a task starts after the task before it on its stream ended;
- launch: a task starts after the host call that put it on the stream (same rank and `corr`);
- event record -> wait: a device-side wait task ends when its event fires, i.e. when the task
  it waited for on another stream of the device ended (the wait's own end is that evidence);
- recorded event link: where the trace records which record call a stream wait waited for
  (Kineto's Stream Wait Event: a `wait` row with `value` = the record call's `corr`, the record
  call's `stream` the stream it recorded on), the first task launched on the waiting stream after
  the stream-wait call starts after the task launched last on the recorded stream before the
  record call ended (`Tasks.event_src`). Such a wait row is the runtime's record of the call, at
  the call's time on the host clock, not a device task: it never enters a stream's FIFO order;
- passed event wait: a device-side wait that took no time (its event had fired) and names its
  event is no task but a link: the next task on its stream starts after the task before the
  event's latest record on another stream (`passed_wait_sources`);
- host program order: a launch call starts after the calls before it on its host thread, and
  what the thread did meanwhile is its host state (`HostState`);
- full queue -> launch return: a launch made at a full stream queue blocks until a task on its
  stream retires (analyzers.queue.blocked_at_full_queue): its blocked part is the host class
  `queue`, not launch time, and on the critical path the call returns after that task.

Built from typed columns and `kind` only, so emulated, Kineto and torch_npu tables build alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzers.frames import Cover, Frames, intersect_intervals, merge_intervals

#: Device task kinds that are chain nodes. Markers enter only when zero-length and launched
#: (an event record): a marker with a duration is an annotation spanning other tasks.
TASK_KINDS = ("kernel", "memcpy", "memset", "collective", "wait", "marker")

#: What a host thread can be doing, highest priority first: at any instant the thread is in
#: the first of these whose calls cover it (nested calls count once, as their innermost
#: meaningful kind: a launch inside a Python frame is launch time).
HOST_CLASSES = ("sync", "blocking_copy", "queue", "op_compile", "launch", "data_load", "host_work", "host_idle",
                "framework")


@dataclass
class Tasks:
    """One rank's device tasks as arrays, sorted per (device, stream) by ts."""

    ts: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # str objects
    name: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    corr: np.ndarray  # float, NaN: none
    prev: np.ndarray  # index of the task before on the same stream, -1: first
    launch_ts: np.ndarray  # float, NaN: no launch call found
    launch_end: np.ndarray
    thread: np.ndarray  # index into HostState.threads of the launching thread, -1: none
    producer: np.ndarray  # for wait tasks: the task on another stream whose end released it, -1
    #: The launching thread issued a stream-wait call (kind wait) after the launch of the task
    #: before this one on its stream and before this task's own launch: the task may wait for
    #: an event (the trace records the call, not the device-side wait). Calls whose wait the
    #: trace links to its event's record (`event_src`) do not count.
    waited: np.ndarray
    #: Per device: tasks other than waits sorted by end, and their ends (for `released_by`).
    by_end: dict
    #: The task whose end fired the event a linked stream wait made this task wait for (see
    #: `event_sources`), -1: none. Where the trace records the link the release is exact, and the
    #: call is no reason for `waited`'s guess (`released_by`).
    event_src: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.event_src is None:
            self.event_src = np.full(len(self.ts), -1, dtype=np.int64)

    def released_by(self, node: int, lo: int, hi: int) -> int:
        """The task on another stream of `node`'s device that ended last in [lo, hi], or -1."""
        order, ends = self.by_end.get(int(self.device[node]), (None, None))
        if order is None:
            return -1
        j = int(np.searchsorted(ends, hi, side="right")) - 1
        while j >= 0 and ends[j] >= lo:
            if self.stream[order[j]] != self.stream[node]:
                return int(order[j])
            j -= 1
        return -1


def stream_tasks(frames: Frames) -> pd.DataFrame:
    """Device tasks on streams (kinds TASK_KINDS, ph X, stream >= 0) with `end`, and collective
    parts / waits on a device with no stream, each thread a lane (stream -2 - tid).

    A wait row that names the record call of its event (`value`: Kineto's Stream Wait Event) is
    left out: CUPTI writes it at the stream-wait call's time, on the host clock, so as a task it
    would sit in its stream's FIFO order at a host time and lend the stream's next task a release
    (and an "event" duration) the device never had; its link enters as `Tasks.event_src`."""
    key = ("causality.tasks",)
    if key in frames._cache:
        return frames._cache[key]
    t = frames.table
    has_stream = t.column("stream").is_valid().to_numpy(zero_copy_only=False)
    has_device = t.column("device").is_valid().to_numpy(zero_copy_only=False)
    # Collective parts and waits on a device but on no stream (torch_npu writes HCCL's planes as
    # their own threads): lanes of their own (stream -2 - tid), so they can release a wait.
    planes = frames.kind_mask(("collective", "wait")) & ~has_stream & has_device
    mask = ((frames.kind_mask(TASK_KINDS) & has_stream) | planes) & ~_wait_calls(frames) & ~_passed_waits(frames)
    # value / addr: a kernel's blocks and cores (analyzers.causality.contention).
    sub = t.select(["rank", "ph", "name", "ts", "dur", "kind", "device", "stream", "corr", "tid", "value",
                    "addr"]).filter(pa.array(mask))
    df = sub.to_pandas()
    df["table_row"] = np.flatnonzero(mask)  # the row of the trace table (replay writes it back)
    lane = df["stream"].isna()
    df["stream"] = df["stream"].astype(np.float64).where(~lane, -2.0 - df["tid"].astype(np.float64))
    df = df[(df["ph"] == "X") & ((df["stream"] >= 0) | lane)].drop(columns="tid").copy()
    df["dur"] = df["dur"].fillna(0).astype(np.int64)
    df["kind"] = df["kind"].astype(str)
    marker = df["kind"] == "marker"
    df = df[~marker | ((df["dur"] == 0) & df["corr"].notna())]
    df["end"] = df["ts"] + df["dur"]
    # Device-side waits stay marked as such when they become a collective's (a rendezvous waits
    # for peers: time spent, not work done; the critical path gives it no weight).
    df["waiting"] = (df["kind"] == "wait").to_numpy()
    # A wait launched with a collective (same corr: the collective's notify wait for its
    # peers) is the collective's rendezvous, not an event from another stream.
    coll = df[df["kind"] == "collective"]
    if len(coll):
        waits = df["kind"] == "wait"
        ckey = set(zip(coll["rank"].tolist(), coll["corr"].dropna().tolist()))
        hit = np.array([(r, c) in ckey for r, c in zip(df["rank"].tolist(), df["corr"].tolist())], dtype=bool)
        df.loc[waits & hit, "kind"] = "collective"
    df["device"] = df["device"].fillna(-1).astype(np.int64)
    df["stream"] = df["stream"].astype(np.int64)
    df.loc[_inside_collective_ops(df), "kind"] = "collective"
    df = df.sort_values(["rank", "device", "stream", "ts", "end"], kind="stable").reset_index(drop=True)
    frames._cache[key] = df
    return df


@dataclass
class HostState:
    """Per host thread of one rank, cumulative covers of what it was doing (HOST_CLASSES).

    `upto[i][p]` covers the union of classes 0..p of thread i, so the time thread i spent in
    class p over [a, b) is upto[i][p].between(a, b) - upto[i][p - 1].between(a, b): each
    instant counts once, in its highest-priority class.
    """

    threads: list[tuple[int, int]]  # (pid, tid)
    upto: list[list[Cover]]
    #: Per thread: its sync time intersected with the device's copy / collective / wait time
    #: (cumulative in that order), keyed by device: what a sync was waiting for on the device.
    sync_on: list[dict[int, list[Cover]]]
    #: Per thread: the names of its sync / blocking-copy calls, by start, for evidence.
    sync_calls: list[pd.DataFrame]

    def index(self, pid: int, tid: int) -> int:
        try:
            return self.threads.index((pid, tid))
        except ValueError:
            return -1


def _class_of(calls: pd.DataFrame, tasks: pd.DataFrame) -> np.ndarray:
    """Each call's host class (HOST_CLASSES) from its kind and, for the calls behind a copy
    (same corr as a memcpy / memset task of `tasks`), whether it waited for that copy."""
    kinds = tasks["kind"].to_numpy()
    copies = tasks[np.isin(kinds, ("memcpy", "memset")) & tasks["corr"].notna().to_numpy()]
    copy_end = copies.groupby("corr")["end"].max()
    kind = calls["kind"].astype(str).to_numpy()
    out = np.full(len(calls), "framework", dtype=object)
    # A host stream-wait call (kind wait: cudaStreamWaitEvent, aclrtStreamWaitEvent) only
    # enqueues the wait and returns: it is launch time, not the host blocking.
    out[np.isin(kind, ("launch", "wait"))] = "launch"
    out[kind == "data_load"] = "data_load"
    out[kind == "host_work"] = "host_work"
    out[kind == "host_idle"] = "host_idle"
    # Compiling an operator (torch_npu's aclopCompileAndExecute, single-op mode): host time
    # spent building the kernel before it can launch, whether or not the call launches it.
    out[kind == "op_compile"] = "op_compile"
    sync = kind == "sync"
    out[sync] = "sync"
    # A blocking copy (a synchronous memcpy) is a sync call that is also the copy's launch, or a
    # launch call that returned only after its copy was done (cudaMemcpyAsync from pageable
    # memory, hipMemcpyWithStream: the call waited for the copy, whatever its name says).
    corr = calls["corr"].to_numpy(dtype=np.float64)
    done = copy_end.reindex(corr).to_numpy(dtype=np.float64)
    has_copy = ~np.isnan(done)
    out[sync & has_copy] = "blocking_copy"
    call_end = (calls["ts"] + calls["dur"].fillna(0)).to_numpy(dtype=np.float64)
    out[(out == "launch") & has_copy & (call_end >= done)] = "blocking_copy"
    return out


def host_state(frames: Frames, rank: int, tasks: pd.DataFrame) -> HostState:
    """The host state of `rank`'s threads (see HostState)."""
    t = frames.table
    mask = frames.kind_mask(("api", "launch", "sync", "wait", "host_work", "data_load", "host_idle", "op_compile"))
    mask &= t.column("rank").to_numpy() == rank
    # A wait on a stream is the device's (a wait task, or the runtime's record of a stream-wait
    # call on the waiting stream), never a call of a host thread.
    mask &= ~(frames.kind_mask(("wait",)) & t.column("stream").is_valid().to_numpy(zero_copy_only=False))
    sub = t.select(["ph", "name", "ts", "dur", "pid", "tid", "kind", "corr"]).filter(pa.array(mask)).to_pandas()
    sub = sub[sub["ph"] == "X"]
    sub = sub.assign(end=sub["ts"] + sub["dur"].fillna(0).astype(np.int64))
    sub["klass"] = _class_of(sub, tasks)
    sub = pd.concat([sub, _blocked_parts(frames, rank)], ignore_index=True)
    device_busy: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for device, d in tasks.groupby("device"):
        k = d["kind"].to_numpy()
        parts = []
        acc_ts, acc_end = np.zeros(0, np.int64), np.zeros(0, np.int64)
        for kinds_ in (("memcpy", "memset"), ("collective",), ("wait",)):
            sel = np.isin(k, kinds_)
            acc_ts = np.concatenate([acc_ts, d["ts"].to_numpy(np.int64)[sel]])
            acc_end = np.concatenate([acc_end, d["end"].to_numpy(np.int64)[sel]])
            parts.append(merge_intervals(acc_ts, acc_end))
        device_busy[int(device)] = parts
    threads, upto, sync_on, sync_calls = [], [], [], []
    for (pid, tid), g in sub.groupby(["pid", "tid"], sort=True):
        threads.append((int(pid), int(tid)))
        covers = []
        acc_ts, acc_end = np.zeros(0, np.int64), np.zeros(0, np.int64)
        klass = g["klass"].to_numpy()
        for c in HOST_CLASSES:
            sel = klass == c
            acc_ts = np.concatenate([acc_ts, g["ts"].to_numpy(np.int64)[sel]])
            acc_end = np.concatenate([acc_end, g["end"].to_numpy(np.int64)[sel]])
            covers.append(Cover(acc_ts, acc_end))
        upto.append(covers)
        s = g[klass == "sync"]
        syncs = merge_intervals(s["ts"].to_numpy(np.int64), s["end"].to_numpy(np.int64))
        sync_on.append({dev: [Cover(*intersect_intervals(syncs, part)) for part in parts]
                        for dev, parts in device_busy.items()})
        sc = g[np.isin(klass, ("sync", "blocking_copy"))]
        sync_calls.append(sc[["ts", "end", "name", "klass"]].sort_values("ts").reset_index(drop=True))
    return HostState(threads, upto, sync_on, sync_calls)


def _blocked_parts(frames: Frames, rank: int) -> pd.DataFrame:
    """`rank`'s launches that blocked at a full queue, as host rows of class `queue` over their
    blocked part (the call waits for a slot first, then enqueues as usual)."""
    from analyzers.queue import blocked_at_full_queue

    b = blocked_at_full_queue(frames)
    b = b[b["rank"] == rank]
    ts = b["ts"].to_numpy(np.int64)
    return pd.DataFrame({"ph": "X", "name": b["name"].astype(str).to_numpy(), "ts": ts,
                         "dur": b["blocked_ns"].to_numpy(np.int64), "pid": b["pid"].to_numpy(np.int64),
                         "tid": b["tid"].to_numpy(np.int64), "kind": "launch", "corr": np.nan,
                         "end": ts + b["blocked_ns"].to_numpy(np.int64), "klass": "queue"})


def blocked_corrs(frames: Frames, rank: int) -> np.ndarray:
    """The corr ids of `rank`'s launches that blocked at a full queue."""
    from analyzers.queue import blocked_at_full_queue

    b = blocked_at_full_queue(frames)
    return b.loc[b["rank"] == rank, "corr"].to_numpy(np.float64)


def rank_graph(frames: Frames, rank: int, slack_ns: int) -> tuple[HostState, Tasks]:
    """`rank`'s host state and tasks with their edges, built once per frames (the attribution
    and the happens-before clocks both read them; neither changes them)."""
    key = ("causality.rank_graph", rank, slack_ns)
    if key not in frames._cache:
        tasks = stream_tasks(frames)
        host = host_state(frames, rank, tasks[tasks["rank"] == rank])
        frames._cache[key] = (host, rank_tasks(frames, rank, host, slack_ns))
    return frames._cache[key]


def rank_tasks(frames: Frames, rank: int, host: HostState, slack_ns: int) -> Tasks:
    """`rank`'s tasks with their edges (see Tasks)."""
    df = stream_tasks(frames)
    df = df[df["rank"] == rank].reset_index(drop=True)
    n = len(df)
    device = df["device"].to_numpy(np.int64)
    stream = df["stream"].to_numpy(np.int64)
    same = np.zeros(n, dtype=bool)
    same[1:] = (device[1:] == device[:-1]) & (stream[1:] == stream[:-1])
    prev = _stream_prev(df["end"].to_numpy(np.int64), same)
    launches = frames.launches
    launches = launches[launches["rank"] == rank].drop_duplicates("corr")
    corr = df["corr"].to_numpy(dtype=np.float64)
    launch_ts = np.full(n, np.nan)
    launch_end = np.full(n, np.nan)
    thread = np.full(n, -1, dtype=np.int64)
    if len(launches):
        lc = launches["corr"].to_numpy(dtype=np.float64)
        order = np.argsort(lc, kind="stable")
        lc = lc[order]
        at = np.minimum(np.searchsorted(lc, corr), len(lc) - 1)
        hit = ~np.isnan(corr) & (lc[at] == corr)
        l_ts = launches["ts"].to_numpy(np.float64)[order]
        l_end = l_ts + launches["dur"].fillna(0).to_numpy(np.float64)[order]
        launch_ts[hit] = l_ts[at[hit]]
        launch_end[hit] = l_end[at[hit]]
        keys = list(zip(launches["pid"].to_numpy()[order], launches["tid"].to_numpy()[order]))
        index = {k: i for i, k in enumerate(host.threads)}
        l_thread = np.array([index.get((int(p), int(t)), -1) for p, t in keys], dtype=np.int64)
        thread[hit] = l_thread[at[hit]]
    ts = df["ts"].to_numpy(np.int64)
    end = df["end"].to_numpy(np.int64)
    kind = df["kind"].to_numpy()
    producer = _producers(ts, end, kind, device, stream, slack_ns, _event_ids(df))
    waited = _waited(frames, rank, host, prev, launch_ts, thread)
    by_end = {}
    for dev in np.unique(device):
        c = np.flatnonzero((device == dev) & (kind != "wait"))
        c = c[np.argsort(end[c], kind="stable")]
        by_end[int(dev)] = (c, end[c])
    event_src = event_sources(frames, rank, df, launch_ts)
    return Tasks(ts=ts, end=end, kind=kind, name=df["name"].astype(str).to_numpy(), device=device, stream=stream,
                 corr=corr, prev=prev, launch_ts=launch_ts, launch_end=launch_end, thread=thread, producer=producer,
                 waited=waited, by_end=by_end, event_src=event_src)


def _passed_waits(frames: Frames) -> np.ndarray:
    """Device-side event waits that took no time (the event had fired: the device logs an
    EVENT_WAIT task anyway) and name their event (`addr`): links, not tasks (see
    `passed_wait_sources`)."""
    t = frames.table
    dur = t.column("dur").to_numpy(zero_copy_only=False)
    return (frames.kind_mask(("wait",)) & t.column("stream").is_valid().to_numpy(zero_copy_only=False)
            & t.column("addr").is_valid().to_numpy(zero_copy_only=False) & (np.nan_to_num(dur, nan=1.0) == 0))


def passed_wait_sources(frames: Frames, rank: int, tasks: pd.DataFrame) -> np.ndarray:
    """Per task of `tasks` (one rank's stream_tasks rows, in order): the task whose end fired the
    event a wait that took no time made it wait for, -1: none. Such a wait holds back the next
    task on its stream; its event fired when the task before the event's latest record (a
    zero-length marker naming the same event on another stream of the device, at or before the
    wait) ended. Device times only: the wait and the record are both device rows."""
    n = len(tasks)
    out = np.full(n, -1, dtype=np.int64)
    t = frames.table
    mask = _passed_waits(frames) & (t.column("rank").to_numpy() == rank)
    if not n or not mask.any():
        return out
    w = t.select(["ph", "ts", "device", "stream", "addr"]).filter(pa.array(mask)).to_pandas()
    w = w[w["ph"] == "X"]
    kind = tasks["kind"].to_numpy()
    ts = tasks["ts"].to_numpy(np.int64)
    end = tasks["end"].to_numpy(np.int64)
    device = tasks["device"].to_numpy(np.int64)
    stream = tasks["stream"].to_numpy(np.int64)
    event = _event_ids(tasks)
    lanes = pd.DataFrame({"d": device, "s": stream}).groupby(["d", "s"]).indices
    rec = np.flatnonzero((kind == "marker") & ~np.isnan(event))
    records = pd.DataFrame({"d": device[rec], "e": event[rec], "i": rec}).groupby(["d", "e"]).indices
    none = np.zeros(0, dtype=np.int64)
    for d, s_, at, ev in zip(w["device"].to_numpy(np.int64), w["stream"].to_numpy(np.int64),
                             w["ts"].to_numpy(np.int64), w["addr"].to_numpy(np.float64)):
        lane = np.asarray(lanes.get((d, s_), none))
        k = np.searchsorted(ts[lane], at, "left")  # lanes are in stream order
        cand = rec[np.asarray(records.get((d, ev), none), dtype=np.int64)]
        cand = cand[(ts[cand] <= at) & (stream[cand] != s_)]
        if k >= len(lane) or not len(cand):
            continue
        r = int(cand[np.argmax(ts[cand])])
        # The record fires when the task before it on its stream is done (markers skipped).
        src_lane = np.asarray(lanes[(d, int(stream[r]))])
        before = src_lane[:int(np.flatnonzero(src_lane == r)[0])]  # lanes are in stream order
        before = before[kind[before] != "marker"]
        if not len(before):
            continue
        src, j = int(before[-1]), int(lane[k])
        if out[j] < 0 or end[src] > end[out[j]]:
            out[j] = src
    return out


def _wait_calls(frames: Frames) -> np.ndarray:
    """Rows that record a stream-wait call with the record call of its event: `wait` rows on a
    stream whose `value` names that call (Kineto's Stream Wait Event)."""
    t = frames.table
    return (frames.kind_mask(("wait",)) & t.column("value").is_valid().to_numpy(zero_copy_only=False)
            & t.column("stream").is_valid().to_numpy(zero_copy_only=False))


#: Host call kinds (a stream-wait call is `wait`, an event's record call any of them).
_CALL_KINDS = ("api", "launch", "sync", "wait", "op_compile")
_LINK_COLUMNS = ["device", "stream", "call_ts", "wait_corr", "rec_device", "rec_stream", "rec_ts"]


def event_links(frames: Frames, rank: int) -> pd.DataFrame:
    """`rank`'s stream waits that the table links to the record call of their event
    (_LINK_COLUMNS): the waiting device and stream, the stream-wait call's start (`call_ts`; the
    wait row's own time, the call's on the host clock, where the table holds no call of kind wait
    with its `corr`) and `corr`, and the record call's device, stream and start. A wait whose
    record call is not in the table (or that CUPTI did not see: `value` -1) is not linked.
    Cached per frames."""
    key = ("causality.event_links", rank)
    if key in frames._cache:
        return frames._cache[key]
    t = frames.table
    on_rank = t.column("rank").to_numpy() == rank
    wmask = _wait_calls(frames) & on_rank
    out = pd.DataFrame(columns=_LINK_COLUMNS)
    if wmask.any():
        cols = ["ph", "ts", "kind", "device", "stream", "corr", "value"]
        waits = t.select(cols).filter(pa.array(wmask)).to_pandas()
        waits = waits[(waits["ph"] == "X") & waits["device"].notna()]
        want = np.concatenate([waits["corr"].dropna().to_numpy(np.float64), waits["value"].to_numpy(np.float64)])
        calls = t.select(cols).filter(pa.array(frames.kind_mask(_CALL_KINDS) & on_rank & ~wmask)).to_pandas()
        calls = calls[(calls["ph"] == "X") & calls["corr"].isin(np.unique(want))].sort_values("ts", kind="stable")
        # The stream-wait call (kind wait, on no stream) and the record call (on the stream it
        # recorded the event on), by corr: the first of each.
        wait_at = calls[(calls["kind"].astype(str) == "wait") & calls["stream"].isna()].drop_duplicates("corr")
        wait_at = wait_at.set_index("corr")["ts"]
        records = calls[calls["stream"].notna() & calls["device"].notna()].drop_duplicates("corr").set_index("corr")
        rec = records.reindex(waits["value"].to_numpy(np.float64))
        found = rec["ts"].notna().to_numpy()
        waits, rec = waits[found], rec[found]
        called = wait_at.reindex(waits["corr"].to_numpy(np.float64)).to_numpy(np.float64)
        out = pd.DataFrame({
            "device": waits["device"].to_numpy(np.int64), "stream": waits["stream"].to_numpy(np.int64),
            "call_ts": np.where(np.isnan(called), waits["ts"].to_numpy(np.float64), called),
            "wait_corr": waits["corr"].to_numpy(np.float64), "rec_device": rec["device"].to_numpy(np.int64),
            "rec_stream": rec["stream"].to_numpy(np.int64), "rec_ts": rec["ts"].to_numpy(np.float64)})
    frames._cache[key] = out
    return out


def event_sources(frames: Frames, rank: int, tasks: pd.DataFrame, launch_ts: np.ndarray) -> np.ndarray:
    """Per task of `tasks` (one rank's stream_tasks rows, in order; `launch_ts` their launch
    calls' starts, NaN: none): the task whose end fired the event a linked stream wait
    (`event_links`) made it wait for, -1: none (Tasks.event_src).

    A stream wait holds back the first task launched on its stream at or after the stream-wait
    call began (later tasks follow that one in FIFO order). Its event fires when the work the
    record call's stream had been given before the record call is done: the task launched last
    there before the record call began (none: the event had fired already). A task several
    waits hold back takes the source that ended last. Times compared are the host's launch and
    call times, all on one clock. Waits the device logged that took no time add their links
    (`passed_wait_sources`)."""
    n = len(tasks)
    out = passed_wait_sources(frames, rank, tasks)
    links = event_links(frames, rank)
    if not n or links.empty:
        return out
    end = tasks["end"].to_numpy(np.int64)
    launched = ~np.isnan(launch_ts)
    # Per (device, stream): its launched tasks in stream order (stream_tasks sorts by ts).
    key = pd.DataFrame({"d": tasks["device"].to_numpy(np.int64), "s": tasks["stream"].to_numpy(np.int64)})
    lanes = {k: np.asarray(v)[launched[np.asarray(v)]] for k, v in key.groupby(["d", "s"]).indices.items()}
    none = np.zeros(0, dtype=np.int64)
    for w in links.itertuples(index=False):
        lane = lanes.get((w.device, w.stream), none)
        after = lane[launch_ts[lane] >= w.call_ts]
        if not len(after):
            continue
        j = int(after[0])
        src_lane = lanes.get((w.rec_device, w.rec_stream), none)
        before = src_lane[launch_ts[src_lane] < w.rec_ts]
        if len(before) and (out[j] < 0 or end[before[-1]] > end[out[j]]):
            out[j] = int(before[-1])
    return out


def stream_wait_calls(frames: Frames, rank: int) -> pd.DataFrame:
    """`rank`'s host stream-wait calls (kind wait, on no stream) that no linked wait explains
    (`event_links`): rank, pid, tid, ts. Only these leave the event a task waited for to a guess."""
    calls = frames.host_calls
    calls = calls[(calls["rank"] == rank) & (calls["kind"].astype(str) == "wait")]
    links = event_links(frames, rank)
    if calls.empty or links.empty:
        return calls
    t = frames.table
    mask = frames.kind_mask(("wait",)) & (t.column("rank").to_numpy() == rank)
    mask &= t.column("stream").is_null().to_numpy(zero_copy_only=False)
    mine = t.select(["rank", "ph", "pid", "tid", "ts", "corr"]).filter(pa.array(mask)).to_pandas()
    return mine[(mine["ph"] == "X") & ~mine["corr"].isin(links["wait_corr"].dropna())].reset_index(drop=True)


def _inside_collective_ops(df: pd.DataFrame) -> np.ndarray:
    """Waits on a stream that lie wholly inside a collective op written on no stream (torch_npu's
    hcom_* spans on HCCL's planes): the op's notify waits for its peers, i.e. the collective."""
    out = np.zeros(len(df), dtype=bool)
    ops = df[(df["kind"] == "collective") & (df["stream"] < -1)]
    waits = (df["kind"] == "wait").to_numpy() & (df["stream"] >= 0).to_numpy()
    if ops.empty or not waits.any():
        return out
    for (rank, device), g in ops.groupby(["rank", "device"]):
        g = g.sort_values("ts")
        starts = g["ts"].to_numpy(np.int64)
        reach = np.maximum.accumulate(g["end"].to_numpy(np.int64))
        sel = np.flatnonzero(waits & (df["rank"] == rank).to_numpy() & (df["device"] == device).to_numpy())
        i = np.searchsorted(starts, df["ts"].to_numpy(np.int64)[sel], side="right") - 1
        ok = (i >= 0) & (reach[np.maximum(i, 0)] >= df["end"].to_numpy(np.int64)[sel])
        out[sel[ok]] = True
    return out


def _stream_prev(end: np.ndarray, same: np.ndarray) -> np.ndarray:
    """Per task (rows sorted per stream by ts; `same`: the row before is on the same stream):
    the task before it on its stream that ended last (-1 for a stream's first task). Rows of a
    stream never overlap in a FIFO, but a producer may write a long wait over tasks it ran."""
    n = len(end)
    if not n:
        return np.zeros(0, dtype=np.int64)
    group = np.cumsum(~same) - 1
    span = int(end.max() - end.min()) + 1
    key = group.astype(np.int64) * span + (end - end.min())
    best = np.maximum.accumulate(key)
    holder = np.where(key == best, np.arange(n), 0)
    idx = np.maximum.accumulate(holder)
    prev = np.full(n, -1, dtype=np.int64)
    prev[1:] = np.where(same[1:], idx[:-1], -1)
    return prev


def _waited(frames: Frames, rank: int, host: HostState, prev, launch_ts, thread,
            calls: pd.DataFrame | None = None) -> np.ndarray:
    """Tasks whose launching thread issued a stream-wait call no link explains
    (`stream_wait_calls`; or one of `calls`, with rank, pid, tid and ts) between the launch of
    the task before them on their stream and their own launch (see Tasks.waited)."""
    out = np.zeros(len(prev), dtype=bool)
    if calls is None:
        calls = stream_wait_calls(frames, rank)
    w = calls[calls["rank"] == rank]
    if w.empty:
        return out
    prev_launch = np.where(prev >= 0, launch_ts[np.maximum(prev, 0)], -np.inf)
    prev_launch = np.where(np.isnan(prev_launch), -np.inf, prev_launch)
    for (pid, tid), g in w.groupby(["pid", "tid"]):
        th = host.index(int(pid), int(tid))
        sel = np.flatnonzero((thread == th) & ~np.isnan(launch_ts))
        if th < 0 or not len(sel):
            continue
        starts = np.sort(g["ts"].to_numpy(np.float64))
        n_before = np.searchsorted(starts, launch_ts[sel], side="left")
        n_after_prev = np.searchsorted(starts, prev_launch[sel], side="right")
        out[sel] = n_before > n_after_prev
    return out


def _producers(ts, end, kind, device, stream, slack_ns: int, event: np.ndarray | None = None) -> np.ndarray:
    """For each device-side wait task with a duration: what released it. Where the wait and the
    records name their event (`event`: a wait's or zero-length record's `addr`), the record of
    that event on another stream of its device that fired last at or before the wait's end;
    else the task on another stream that ended last at or before the wait's end (within
    `slack_ns`): an event fires when the work recorded before it on the other stream is done.
    -1 where neither is found."""
    out = np.full(len(ts), -1, dtype=np.int64)
    waits = np.flatnonzero((kind == "wait") & (end > ts))
    if not len(waits):
        return out
    if event is not None:
        waits = waits[~_by_event(out, waits, ts, end, kind, device, stream, event)]
    cand = np.flatnonzero(kind != "wait")
    for dev in np.unique(device[waits]):
        c = cand[device[cand] == dev]
        if not len(c):
            continue
        order = c[np.lexsort((-(end[c] - ts[c]), end[c]))]  # by end; the longest first among equal ends
        ends = end[order]
        for w in waits[device[waits] == dev]:
            hi = np.searchsorted(ends, end[w], side="right")
            j = hi - 1
            # Skip tasks on the wait's own stream and zero-length records already passed.
            while j >= 0 and end[w] - ends[j] <= slack_ns and stream[order[j]] == stream[w]:
                j -= 1
            if j >= 0 and end[w] - ends[j] <= slack_ns and stream[order[j]] != stream[w]:
                out[w] = order[j]
    return out


def _by_event(out, waits, ts, end, kind, device, stream, event) -> np.ndarray:
    """Set out[w] for each wait in `waits` whose event a record on another stream of its device
    names (the record that fired last at or before the wait's end); which waits were set."""
    done = np.zeros(len(waits), dtype=bool)
    rec = np.flatnonzero((kind == "marker") & (end == ts) & ~np.isnan(event))
    named = ~np.isnan(event[waits])
    if not len(rec) or not named.any():
        return done
    rec = rec[np.lexsort((ts[rec], event[rec], device[rec]))]
    keys = {}
    for r in rec.tolist():
        keys.setdefault((int(device[r]), float(event[r])), []).append(r)
    for i in np.flatnonzero(named).tolist():
        w = int(waits[i])
        cand = keys.get((int(device[w]), float(event[w])))
        if not cand:
            continue
        j = int(np.searchsorted(ts[cand], end[w], side="right")) - 1
        while j >= 0 and stream[cand[j]] == stream[w]:
            j -= 1
        if j >= 0:
            out[w] = cand[j]
            done[i] = True
    return done


def _event_ids(df: pd.DataFrame) -> np.ndarray:
    """Per task, the event a wait or a record names (`addr` of kinds wait / marker), NaN elsewhere."""
    kind = df["kind"].to_numpy()
    ev = df["addr"].to_numpy(np.float64, na_value=np.nan) if "addr" in df else np.full(len(df), np.nan)
    return np.where(np.isin(kind, ("wait", "marker")), ev, np.nan)
