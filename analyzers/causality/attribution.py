"""Conserved attribution of device idle time: every idle nanosecond gets exactly one cause, by
walking back from the task that ended the idle through what it waited for.

For a kernel-idle span [a, b) of a device ended by kernel K at b, the walk asks which release
of K came last (graph.Tasks): the task before it on its stream, the host call that launched
it, or the event a stream wait held it for (exactly the task behind the event's record where the
trace links the wait to it, `event_src`; else, after a stream-wait call, a guess: the task on
another stream that ended as K began). A device task: its running time inside [a, b) is that
task's cause (a copy: the cores waited for data; a collective; an event wait: the task on the
other stream that released it, named), and the walk continues from that task's own start. The launch call: the host was
late, and [a, launch end) is what the launching thread was doing (graph.HostState, each instant
once): launch calls, a synchronize (split by what it waited for on the device: a copy, a
collective, an event, or nothing left but the sync itself), a blocking copy, a launch blocked at a full
stream queue (the queue's: it returned when a task of that stream retired), data loading or
host work, framework calls, or host time no call covers. Where the trace records no release
reaching back to `a`, the rest is `unexplained`. After the device's last kernel, the walk starts
from the task that ran to the end: a collective's wait for a late peer there is a loss (the
peer's), the rest is the pipeline draining (a copy out, the last transfer). A device that runs no
kernel at all is explained the same way from its last task, every cause kept. So per span the causes sum to its length
exactly, a copy cause never exceeds the copy time inside the span, and launch overhead never
exceeds the launch calls' own time plus the dispatch after them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.causality.collectives import parts as collective_parts
from analyzers.causality.graph import HOST_CLASSES, HostState, Tasks, rank_graph, stream_tasks
from analyzers.frames import Frames

#: Every cause an idle nanosecond can have, with its label (the finding's wording).
CAUSE_LABELS = {
    "launch": "launch overhead",
    "host": "host-bound: framework / untraced host time",
    "sync": "host synchronize",
    "blocking_copy": "blocking copy on the host",
    "queue": "host blocked at a full stream queue",
    "compile": "operator compile on the host",
    "data": "data loading / preprocessing",
    "host_idle": "host idle, waiting for work",
    "copy": "waiting on a copy",
    "event": "waiting on another stream (event)",
    "collective": "waiting on a collective",
    "dispatch": "dispatch latency (a task starting after its release)",
    "unexplained": "unexplained",
    "fill": "pipeline fill",
    "drain": "pipeline drain",
}
CAUSES = tuple(CAUSE_LABELS)
#: Causes where the device waited for its host.
HOST_CAUSES = ("launch", "host", "sync", "blocking_copy", "queue", "compile", "data", "host_idle")
#: Causes that are no problem to fix: the pipeline filling before the first kernel and draining
#: after the last, and the device's own turnaround between tasks already queued.
EDGE_CAUSES = ("fill", "drain", "dispatch")
#: A device task's running time inside an idle span, by its kind.
_SPAN_CAUSE = {"memcpy": "copy", "memset": "copy", "collective": "collective", "wait": "event"}
#: Host classes (graph.HOST_CLASSES) -> cause; "sync" is split by what it waited for.
_HOST_CAUSE = {"blocking_copy": "blocking_copy", "queue": "queue", "op_compile": "compile", "launch": "launch", "data_load": "data",
               "host_work": "data", "host_idle": "host_idle",
               "framework": "host"}
_SYNC_ON = ("copy", "collective", "event")
#: Host causes a draining sync's wait could have hidden (see _after_sync), in spending order.
_MOVABLE = ("launch", "host", "data")

#: The longest wait between a task's release and its start that is still dispatch latency (the
#: release's cause keeps it); a longer one has a cause the trace does not record: unexplained.
DISPATCH_NS = 50_000

ATTRIBUTION_COLUMNS = ["rank", "device", "step", "step_start", "step_end", "ts", "end", "idle_ns", "cause", "via",
                       "next_name", "next_corr", "next_stream", "next_dur", "peer"]


def device_windows(frames: Frames) -> dict[tuple[int, int], pd.DataFrame]:
    """Per (rank, device): the device-side step windows (step, start, end), tiling the device's
    timeline. A device op belongs to the step of the launch that created it (the `step`
    column); step N's window runs from where step N-1's device work ended to where step N's
    ends. Without steps, one window (step None) over the device's ops."""
    key = ("causality.windows",)
    if key in frames._cache:
        return frames._cache[key]
    ops = frames.device_ops
    out: dict[tuple[int, int], pd.DataFrame] = {}
    for (rank, device), g in ops.groupby(["rank", "device"], sort=True):
        stepped = g[g["step"].notna()] if "step" in g else g.iloc[:0]
        if stepped.empty:
            out[(int(rank), int(device))] = pd.DataFrame({"step": [None], "start": [int(g["ts"].min())],
                                                          "end": [int(g["end"].max())]})
            continue
        per = stepped.groupby("step").agg(first=("ts", "min"), last=("end", "max")).sort_index()
        bounds = np.maximum.accumulate(per["last"].to_numpy(np.int64))
        starts = np.concatenate([[int(per["first"].iloc[0])], bounds[:-1]])
        out[(int(rank), int(device))] = pd.DataFrame({"step": per.index.astype(np.int64), "start": starts,
                                                      "end": bounds})
    frames._cache[key] = out
    return out


def attribution(frames: Frames, slack_ns: int = 5_000, dispatch_ns: int = DISPATCH_NS) -> pd.DataFrame:
    """Every kernel-idle nanosecond of every device inside its step windows, by cause
    (ATTRIBUTION_COLUMNS): rows are pieces of idle spans split at window edges; a piece the host
    caused has one row per host cause, all with the piece's ts / end and their own idle_ns.
    Per window, idle_ns sums to the window minus its kernels' union. Cached per frames."""
    key = ("causality.attribution", slack_ns, dispatch_ns)
    if key in frames._cache:
        return frames._cache[key]
    tasks_all = stream_tasks(frames)
    windows = device_windows(frames)
    parts = []
    for rank in sorted(tasks_all["rank"].unique()):
        host, tasks = rank_graph(frames, int(rank), slack_ns)
        parts.append(_rank_attribution(int(rank), tasks, host, windows, dispatch_ns))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ATTRIBUTION_COLUMNS)
    out = _name_peers(out, collective_parts(frames))
    out = _drain(out)
    frames._cache[key] = out
    return out


def _rank_attribution(rank: int, T: Tasks, host: HostState, windows: dict, dispatch_ns: int) -> pd.DataFrame:
    segs: list[tuple] = []  # (gap, s, e, cause, via)
    tails: list[int] = []  # gaps after a device's last kernel
    gaps: list[tuple] = []  # (device, a, b, next task index or -1)
    for device in np.unique(T.device):
        key = (rank, int(device))
        if key not in windows:
            continue
        k = np.flatnonzero((T.device == device) & (T.kind == "kernel"))
        w = windows[key]
        w0, w1 = int(w["start"].min()), int(w["end"].max())
        if not len(k):
            # A device that only communicates or copies: all of its time is idle of compute,
            # explained from the task that ran to its end.
            if w1 > w0:
                gaps.append((int(device), w0, w1, -1))
                _trail(T, len(gaps) - 1, w0, w1, int(device), segs, dispatch_ns)
            continue
        k = k[np.argsort(T.ts[k], kind="stable")]
        run_end = np.maximum.accumulate(T.end[k])
        starts = np.concatenate([[w0], run_end])
        stops = np.concatenate([T.ts[k], [w1]])
        nxt = np.concatenate([k, [-1]])
        first = True
        for a, b, n in zip(starts.tolist(), stops.tolist(), nxt.tolist()):
            a, b = max(a, w0), min(b, w1)
            if b <= a:
                first = False
                continue
            g = len(gaps)
            gaps.append((int(device), a, b, n))
            if first:
                segs.append((g, a, b, "fill", -1))
            elif n < 0:
                tails.append(g)
                _trail(T, g, a, b, int(device), segs, dispatch_ns)
            else:
                _walk(T, g, a, b, n, segs, dispatch_ns)
            first = False
    if not segs:
        return pd.DataFrame(columns=ATTRIBUTION_COLUMNS)
    s = pd.DataFrame(segs, columns=["gap", "ts", "end", "cause", "via"])
    s = s[s["end"] > s["ts"]]
    gp = pd.DataFrame(gaps, columns=["device", "a", "b", "next"])
    s = s.join(gp[["device", "next"]], on="gap")
    # `via` names the stream of a device cause; host pieces name their thread instead.
    host_rows = (s["cause"] == "host").to_numpy()
    s["thread"] = np.where(host_rows, s["via"].to_numpy(), -1)
    s.loc[host_rows, "via"] = -1
    s = _in_windows(s, rank, windows)
    s = _host_pieces(s, host)
    nxt = s["next"].to_numpy()
    has = nxt >= 0
    j = np.where(has, nxt, 0)
    out = pd.DataFrame({
        "rank": rank, "device": s["device"].to_numpy(), "step": s["step"].to_numpy(),
        "step_start": s["step_start"].to_numpy(), "step_end": s["step_end"].to_numpy(),
        "ts": s["ts"].to_numpy(np.int64), "end": s["end"].to_numpy(np.int64), "idle_ns": s["idle_ns"].to_numpy(np.int64),
        "cause": s["cause"].to_numpy(), "via": s["via"].to_numpy(),
        "next_name": np.where(has, T.name[j], None), "next_corr": np.where(has, T.corr[j], np.nan),
        "next_stream": np.where(has, T.stream[j], -1), "next_dur": np.where(has, T.end[j] - T.ts[j], 0),
        "tail": np.isin(s["gap"].to_numpy(), tails),
    })
    out = out[out["idle_ns"] > 0]
    out["step"] = out["step"].astype(object)
    return out.sort_values(["device", "ts", "cause"], kind="stable").reset_index(drop=True)


def _walk(T: Tasks, g: int, a: int, b: int, node: int, segs: list, dispatch_ns: int) -> None:
    """Append the causes of idle span [a, b) ended by task `node` (see the module docstring)."""
    t = b
    for _ in range(100_000):  # a chain is finite; the bound only guards against a malformed table
        if t <= a:
            return
        p = int(T.prev[node])
        r_prev = int(T.end[p]) if p >= 0 else None
        le = T.launch_end[node]
        r_launch = min(int(le), int(T.ts[node])) if not np.isnan(le) else None
        if r_prev is None and r_launch is None:
            segs.append((g, a, t, "unexplained", -1))
            return
        r = max(x for x in (r_prev, r_launch) if x is not None)
        src = int(T.event_src[node])
        if src >= 0 and T.end[src] > r:
            # The trace links the stream wait before it to its event: the task behind the
            # event's record released it, ending after its other releases.
            late = t - min(int(T.end[src]), t) > dispatch_ns
            t, node = _through_event(T, g, a, t, src, segs, "unexplained" if late else "dispatch"), src
            continue
        if t - r > dispatch_ns and T.waited[node]:
            # Released long before it started, after its thread issued a stream wait the trace
            # does not link to its event: it waited for an event, i.e. (the guess) for the task
            # on another stream that ended as it began.
            q = T.released_by(node, t - dispatch_ns, t)
            if q >= 0 and T.end[q] > r:
                t, node = _through_event(T, g, a, t, q, segs), q
                continue
        if r_prev is None or (r_launch is not None and r_launch > r_prev):
            r = max(r_launch, a)
            if t > r:
                # Dispatch right after the call is part of the launch's cost (the task cannot
                # be picked up before its launch was processed); a task launched long before
                # it started waited for something the trace does not record.
                late = t - r_launch > dispatch_ns
                segs.append((g, r, t, "unexplained" if late else "launch", -1))
            if r_launch > a:
                th = int(T.thread[node])
                segs.append((g, a, r_launch, "host", th) if th >= 0 else (g, a, r_launch, "unexplained", -1))
            return
        # The task before it on its stream released it.
        kind = T.kind[p]
        q = int(T.producer[p]) if kind == "wait" else -1
        # The device's turnaround after the task that released it (a copy's cost is only
        # its own running time: copy wait never exceeds the copy time).
        slack_cause = "dispatch" if t - r_prev <= dispatch_ns else "unexplained"
        if t > max(r_prev, a):
            segs.append((g, max(r_prev, a), t, slack_cause, int(T.stream[p])))
        t = min(t, r_prev)
        if q >= 0:
            # An event wait released by a task on another stream: the wait lasted as long as
            # that task ran; its time is that task's cause, as seen through the event.
            t, node = _through_event(T, g, a, t, q, segs), q
            continue
        span_cause = _SPAN_CAUSE.get(kind)
        if span_cause is not None and t > max(int(T.ts[p]), a):
            segs.append((g, max(int(T.ts[p]), a), t, span_cause, int(T.stream[p])))
        t = min(t, int(T.ts[p]))
        node = p


def _drain(out: pd.DataFrame) -> pd.DataFrame:
    """After a device's last kernel, the work that ends the pipeline (a copy out, a collective's
    own transfer, the host launching it) is the pipeline draining; only a collective's wait for
    a late peer there is a loss (the peer's)."""
    if "tail" not in out:
        return out
    tail = out["tail"].fillna(False).to_numpy(dtype=bool)
    keep = (out["cause"] == "collective").to_numpy() & (out["peer"].to_numpy() >= 0)
    out.loc[tail & ~keep, "cause"] = "drain"
    out.loc[tail & ~keep, "via"] = -1
    return out.drop(columns="tail")


def _trail(T: Tasks, g: int, a: int, b: int, device: int, segs: list, dispatch_ns: int) -> None:
    """Append the causes of the device's last idle span [a, b), after its last kernel: what the
    device still waited for there (the task running to the end: a collective waiting for its
    peers, a copy out), walked back like any span from that task; only the time after the last
    task ended is the pipeline draining."""
    on = np.flatnonzero((T.device == device) & (T.kind != "kernel") & (T.end > np.maximum(T.ts, a)) & (T.ts < b))
    if not len(on):
        segs.append((g, a, b, "drain", -1))
        return
    q = int(on[np.argmax(T.end[on])])
    qe = min(int(T.end[q]), b)
    if b > qe:
        segs.append((g, qe, b, "drain", -1))
    p = int(T.producer[q]) if T.kind[q] == "wait" else -1
    if p >= 0:
        t, node = _through_event(T, g, a, qe, p, segs), p
    else:
        t0 = max(int(T.ts[q]), a)
        if qe > t0:
            segs.append((g, t0, qe, _SPAN_CAUSE.get(T.kind[q], "event"), int(T.stream[q])))
        t, node = min(qe, int(T.ts[q])), q
    _walk(T, g, a, t, node, segs, dispatch_ns)


def _through_event(T: Tasks, g: int, a: int, t: int, q: int, segs: list, gap_cause: str = "dispatch") -> int:
    """Append the time from task `q`'s end to `t` (`gap_cause`: dispatch) and `q`'s running time
    inside [a, t) (its kind's cause, on its stream): `q`, on another stream, released the task at
    `t` through an event. Returns where the walk goes on from (`q`'s start)."""
    qe = min(int(T.end[q]), t)
    if t > max(qe, a):
        segs.append((g, max(qe, a), t, gap_cause, int(T.stream[q])))
    t = qe
    if t > max(int(T.ts[q]), a):
        segs.append((g, max(int(T.ts[q]), a), t, _SPAN_CAUSE.get(T.kind[q], "event"), int(T.stream[q])))
    return min(t, int(T.ts[q]))


def idle_by_rank(frames: Frames) -> dict[int, dict]:
    """Per rank, the attributed idle the finer time findings draw on (their cost is part of it,
    never added to it): `step_ns` (its devices' step windows), `transfer_ns` (idle while a
    collective moved data after every rank arrived: peer -1), `copy_ns`, and `peer_ns` {rank: idle
    waiting for that rank to reach a collective}. Cached per frames."""
    key = ("causality.idle_by_rank",)
    if key in frames._cache:
        return frames._cache[key]
    table = attribution(frames)
    out: dict[int, dict] = {}
    for (rank, _device), w in device_windows(frames).items():
        row = out.setdefault(int(rank), {"step_ns": 0, "transfer_ns": 0, "copy_ns": 0, "peer_ns": {}})
        row["step_ns"] += int((w["end"] - w["start"]).sum())
    if len(table):
        coll = table[table["cause"] == "collective"]
        for (rank, peer), v in coll.groupby(["rank", "peer"])["idle_ns"].sum().items():
            row = out[int(rank)]
            if peer < 0:
                row["transfer_ns"] += int(v)
            else:
                row["peer_ns"][int(peer)] = row["peer_ns"].get(int(peer), 0) + int(v)
        for rank, v in table[table["cause"] == "copy"].groupby("rank")["idle_ns"].sum().items():
            out[int(rank)]["copy_ns"] += int(v)
    frames._cache[key] = out
    return out


def _name_peers(out: pd.DataFrame, parts: pd.DataFrame) -> pd.DataFrame:
    """`peer` of each `collective` piece: the rank its collective waited for while the piece lay
    before that rank arrived (collectives.parts), else -1 (the transfer itself, or a collective the
    trace holds on one rank). A piece spanning the release is split there, so the time waited for
    a peer is exactly the part before its arrival."""
    out = out.assign(peer=np.int64(-1))
    coll = (out["cause"] == "collective").to_numpy()
    waited = parts[(parts["waited_ns"] > 0) & (parts["ranks"] > 1)]
    if not coll.any() or waited.empty:
        return out
    pieces = out[coll]
    keep = [out[~coll]]
    for rank, g in pieces.groupby("rank", sort=False):
        w = waited[waited["rank"] == rank].sort_values("arrive", kind="stable")
        if w.empty:
            keep.append(g)
            continue
        arrive, release = w["arrive"].to_numpy(np.int64), w["release"].to_numpy(np.int64)
        last = w["last_rank"].to_numpy(np.int64)
        ts, end = g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64)
        k = np.searchsorted(arrive, ts, side="right") - 1
        ok = k >= 0
        k = np.maximum(k, 0)
        hit = ok & (ts < release[k])
        rel = release[k]
        split = hit & (end > rel)
        before = g.copy()
        before["end"] = np.where(split, rel, end)
        before["peer"] = np.where(hit, last[k], -1)
        after = g[split].copy()
        after["ts"] = rel[split]
        keep += [before, after]
    out = pd.concat(keep, ignore_index=True)
    out["idle_ns"] = (out["end"] - out["ts"]).where(out["cause"] == "collective", out["idle_ns"]).astype(np.int64)
    return out.sort_values(["rank", "device", "ts", "cause"], kind="stable").reset_index(drop=True)


def _in_windows(s: pd.DataFrame, rank: int, windows: dict) -> pd.DataFrame:
    """Split each segment at its device's step-window edges; each piece gets its step."""
    parts = []
    for device, g in s.groupby("device", sort=True):
        w = windows[(rank, int(device))]
        edges = w["end"].to_numpy(np.int64)
        first = np.minimum(np.searchsorted(edges, g["ts"].to_numpy(), side="right"), len(w) - 1)
        last = np.minimum(np.searchsorted(edges, g["end"].to_numpy() - 1, side="right"), len(w) - 1)
        reps = last - first + 1
        pieces = g.loc[g.index.repeat(reps)].copy()
        offs = np.arange(len(pieces)) - np.repeat(np.cumsum(reps) - reps, reps)
        widx = np.repeat(first, reps) + offs
        pieces["step"] = w["step"].to_numpy()[widx]
        pieces["step_start"] = w["start"].to_numpy()[widx]
        pieces["step_end"] = w["end"].to_numpy()[widx]
        pieces["ts"] = np.maximum(pieces["ts"].to_numpy(), pieces["step_start"].to_numpy())
        pieces["end"] = np.minimum(pieces["end"].to_numpy(), pieces["step_end"].to_numpy())
        parts.append(pieces[pieces["end"] > pieces["ts"]])
    out = pd.concat(parts, ignore_index=True)
    out["idle_ns"] = out["end"] - out["ts"]
    return out


def _after_sync(s: pd.DataFrame, host: HostState, slack_ns: int = 1_000) -> pd.DataFrame:
    """Host time right after a synchronize that returned as the device went idle is, up to the
    time the sync spent waiting, the sync's: the host was held until the device drained, and
    without the sync it would have launched (and run its framework calls) while the device was
    still busy. Host work and data loading after it move only up to the time the sync waited
    for copies: a sync that serialises copies with the host's work is the serial-copy pattern,
    while host work after a wait for compute is the host's own cost (it must get faster or
    overlap the compute, which the data-loading remedy says)."""
    if not (s["cause"].isin(_MOVABLE).to_numpy() & (s["thread"].to_numpy() >= 0)).any():
        return s
    s = s.reset_index(drop=True)
    wait, copy_wait = _sync_budgets(s, host, slack_ns)
    if not wait.any():
        return s
    # The budgets are per piece: look them up again by piece once the first spending has
    # dropped and appended rows.
    key = _piece_key(s)
    wait_of = pd.Series(wait).groupby(key).max()
    copy_of = pd.Series(copy_wait).groupby(key).max()
    s, spent = _spend(s, ("launch", "host"), wait)
    key = _piece_key(s)
    wait, copy_wait = wait_of.reindex(key).to_numpy(np.int64), copy_of.reindex(key).to_numpy(np.int64)
    s, _ = _spend(s, ("data",), np.minimum(copy_wait, wait - spent))
    keys = ["gap", "ts", "end", "cause", "via", "thread", "device", "next", "step", "step_start", "step_end"]
    return s.groupby(keys, as_index=False, sort=False, dropna=False)["idle_ns"].sum()


def _piece_key(s: pd.DataFrame) -> np.ndarray:
    return (s["gap"].astype(str) + ":" + s["ts"].astype(str)).to_numpy()


def _sync_budgets(s: pd.DataFrame, host: HostState, slack_ns: int) -> tuple[pd.Series, pd.Series]:
    """Per piece (by _piece_key): how long the draining sync before it waited, and how much of
    that it waited for copies on the piece's device (0 where no sync drained the device)."""
    via = s["thread"].to_numpy()
    ts = s["ts"].to_numpy(np.int64)
    end = s["end"].to_numpy(np.int64)
    wait = np.zeros(len(s), dtype=np.int64)
    copy_wait = np.zeros(len(s), dtype=np.int64)
    for th in np.unique(via[via >= 0]):
        calls = host.sync_calls[int(th)]
        calls = calls[calls["klass"] == "sync"].sort_values("end")
        if calls.empty:
            continue
        c_end = calls["end"].to_numpy(np.int64)
        c_ts = calls["ts"].to_numpy(np.int64)
        sel = np.flatnonzero(via == th)
        # The last sync that returned inside the piece (or just before it began).
        j = np.searchsorted(c_end, end[sel], side="right") - 1
        jj = np.maximum(j, 0)
        ok = (j >= 0) & (c_end[jj] >= ts[sel] - slack_ns)
        stop = np.minimum(c_end[jj], ts[sel])
        wait[sel] = np.where(ok, np.maximum(stop - c_ts[jj], 0), 0)
        dev = s["device"].to_numpy()[sel]
        for d in np.unique(dev):
            on = host.sync_on[int(th)].get(int(d))
            if on is None:
                continue
            m = dev == d
            got = on[0].between(c_ts[jj][m], np.maximum(stop[m], c_ts[jj][m]))
            copy_wait[sel[m]] = np.where(ok[m], got, 0)
    key = _piece_key(s)
    return (pd.Series(wait).groupby(key).transform("max").to_numpy(),
            pd.Series(copy_wait).groupby(key).transform("max").to_numpy())


def _spend(s: pd.DataFrame, causes: tuple[str, ...], budget: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """Move up to `budget` ns per piece of its `causes` rows (with a thread) to "sync"; the
    amount moved per row's piece as well."""
    movable = s["cause"].isin(causes).to_numpy() & (s["thread"].to_numpy() >= 0)
    key = _piece_key(s)
    order = np.lexsort((s["cause"].map({c: i for i, c in enumerate(causes)}).fillna(9).to_numpy(), key))
    idle = s["idle_ns"].to_numpy(np.int64)
    take = np.where(movable, idle, 0)[order]
    before = pd.Series(take).groupby(key[order]).cumsum().to_numpy() - take
    moved_sorted = np.clip(np.minimum(take, budget[order] - before), 0, None)
    moved = np.zeros(len(s), dtype=np.int64)
    moved[order] = moved_sorted
    spent = pd.Series(moved).groupby(key).transform("sum").to_numpy()
    if not moved.any():
        return s, spent
    to_sync = s[moved > 0].assign(cause="sync", idle_ns=moved[moved > 0])
    s = s.assign(idle_ns=idle - moved)
    out = pd.concat([s[s["idle_ns"] > 0], to_sync], ignore_index=True)
    # The spent amounts for the rows kept, in the new order.
    kept = np.concatenate([spent[(idle - moved) > 0], spent[moved > 0]])
    return out, kept


def _host_pieces(s: pd.DataFrame, host: HostState) -> pd.DataFrame:
    """Host pieces (cause "host", with their thread) split into one row per host cause, by what the
    thread was doing (each instant once, in its highest-priority class; time no call covers
    stays "host")."""
    is_host = (s["cause"] == "host").to_numpy()
    if not is_host.any():
        return s
    rest = s[~is_host]
    h = s[is_host]
    rows = []
    for th, g in h.groupby("thread", sort=True):
        covers = host.upto[int(th)]
        a = g["ts"].to_numpy(np.int64)
        b = g["end"].to_numpy(np.int64)
        prev = np.zeros(len(g), dtype=np.int64)
        for klass, cover in zip(HOST_CLASSES, covers):
            now = cover.between(a, b)
            part = now - prev
            prev = now
            if klass == "sync":
                # A sync waited for what the device was still doing: a copy, a collective,
                # an event; what is left is the sync itself (the host stopped running ahead).
                left = part.copy()
                done = np.zeros(len(g), dtype=np.int64)
                on = host.sync_on[int(th)]
                for cause, dev_cover in zip(_SYNC_ON, range(3)):
                    got = np.zeros(len(g), dtype=np.int64)
                    for dev, dcovers in on.items():
                        sel = g["device"].to_numpy() == dev
                        if sel.any():
                            got[sel] = dcovers[dev_cover].between(a[sel], b[sel])
                    share = np.minimum(got - done, left)
                    done = got
                    left = left - share
                    rows.append(g.assign(cause=cause, idle_ns=share))
                rows.append(g.assign(cause="sync", idle_ns=left))
            else:
                rows.append(g.assign(cause=_HOST_CAUSE[klass], idle_ns=part))
        rows.append(g.assign(cause="host", idle_ns=(b - a) - prev))
    out = pd.concat([rest, *rows], ignore_index=True)
    return _after_sync(out[out["idle_ns"] > 0], host)
