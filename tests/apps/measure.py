"""Losses measured straight from a trace table, to check the analyzers' costs against.

Each function reads the table's typed columns (kind, ts, dur, rank, device, stream, corr, bytes,
addr, step) with pandas / numpy and measures one kind of loss the way an engineer reading the
timeline would. None of them uses the analyzers.

Idle time is AI-Core idle: time with no kernel running on the device. It is counted only
between the device's first kernel start and its last kernel end: the pipeline fill before the
first kernel (the first batch has to be prepared and copied in before anything can run) and
the drain after the last one are there in a perfect program too, so fixing a problem does not
recover them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Device task rows that run on a stream.
DEVICE_TASKS = ("kernel", "memcpy", "memset", "collective")

Intervals = tuple[np.ndarray, np.ndarray]


# ---------------------------------------------------------------------------- intervals
def union(starts, ends) -> Intervals:
    """Merge [start, end) intervals into disjoint sorted ones."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    out_s, out_e = [s[0]], [e[0]]
    for a, b in zip(s[1:], e[1:]):
        if a <= out_e[-1]:
            out_e[-1] = max(out_e[-1], b)
        else:
            out_s.append(a)
            out_e.append(b)
    return np.array(out_s, dtype=np.int64), np.array(out_e, dtype=np.int64)


def total(iv: Intervals) -> int:
    return int((iv[1] - iv[0]).sum())


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two disjoint sorted interval sets."""
    out_s, out_e = [], []
    i = j = 0
    while i < len(a[0]) and j < len(b[0]):
        lo, hi = max(a[0][i], b[0][j]), min(a[1][i], b[1][j])
        if lo < hi:
            out_s.append(lo)
            out_e.append(hi)
        if a[1][i] < b[1][j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=np.int64), np.array(out_e, dtype=np.int64)


def complement(iv: Intervals, lo: int, hi: int) -> Intervals:
    """[lo, hi) minus a disjoint sorted interval set."""
    starts = np.concatenate([[lo], iv[1]])
    ends = np.concatenate([iv[0], [hi]])
    return union(np.maximum(starts, lo), np.minimum(ends, hi))


def covers(iv: Intervals, t: int) -> bool:
    """True when time t lies inside one of the (closed) intervals."""
    k = np.searchsorted(iv[0], t, side="right") - 1
    return bool(k >= 0 and iv[1][k] >= t)


def spans(rows: pd.DataFrame) -> Intervals:
    """The union of the rows' [ts, ts + dur) intervals."""
    ts = rows["ts"].to_numpy(np.int64)
    return union(ts, ts + rows["dur"].fillna(0).to_numpy(np.int64))


# ---------------------------------------------------------------------------- selections
def on_device(df: pd.DataFrame, rank: int, device: int, kinds=DEVICE_TASKS) -> pd.DataFrame:
    return df[(df["kind"].isin(kinds)) & (df["rank"] == rank) & (df["device"] == device) & (df["ph"] == "X")]


def kernels(df: pd.DataFrame, rank: int = 0, device: int = 0) -> pd.DataFrame:
    return on_device(df, rank, device, ("kernel",))


def kernel_idle(df: pd.DataFrame, rank: int = 0, device: int = 0) -> Intervals:
    """Times with no kernel running on the device, between its first kernel start and its last
    kernel end (see the module docstring for why fill and drain are left out)."""
    k = kernels(df, rank, device)
    busy = spans(k)
    return complement(busy, int(busy[0][0]), int(busy[1][-1]))


def host_rows(df: pd.DataFrame, rank: int, kinds) -> pd.DataFrame:
    return df[(df["rank"] == rank) & (df["kind"].isin(kinds)) & (df["ph"] == "X")]


def run_span_ns(df: pd.DataFrame) -> int:
    """Wall time of the job: first to last device task, over all ranks."""
    dev = df[df["kind"].isin(DEVICE_TASKS) & (df["ph"] == "X")]
    return int((dev["ts"] + dev["dur"]).max() - dev["ts"].min())


# ---------------------------------------------------------------------------- losses
def copy_bubble_ns(df: pd.DataFrame, rank: int = 0, device: int = 0) -> int:
    """AI-Core idle time while a copy (memcpy task) is running on the device.

    With copy and compute serialised on one stream, the cores have nothing to do while every
    copy runs; overlapping the copies with compute (double buffering) gives that time back,
    so the idle time covered by copies is what the serialisation costs.
    """
    copies = spans(on_device(df, rank, device, ("memcpy",)))
    return total(intersect(kernel_idle(df, rank, device), copies))


def sync_bubble_ns(df: pd.DataFrame, rank: int = 0, device: int = 0) -> int:
    """Length of the kernel-idle gaps that begin while the host is blocked in a synchronize call.

    When the host synchronizes after a kernel, it cannot submit the next one until the kernel
    has finished and the call has returned: the device then idles for the return from the
    synchronize, the next launch call and its way to the device. The whole gap is caused by
    the synchronize (without it the next kernel would already be queued), so every gap that
    starts inside a host synchronize call counts in full.
    """
    syncs = spans(host_rows(df, rank, ("sync",)))
    idle = kernel_idle(df, rank, device)
    return int(sum(e - s for s, e in zip(*idle) if covers(syncs, int(s))))


def launch_wait_ns(df: pd.DataFrame, rank: int = 0, device: int = 0) -> int:
    """Kernel-idle gaps in which the device waited for the host to launch the next kernel.

    A gap counts when the launch call of the kernel that ends it finished after the gap began
    (the device had run dry: the next task was not submitted yet) and the host was not blocked
    in a synchronize at the gap's start (that gap is the synchronize's). The whole gap counts:
    with launches fast enough, the next kernel would have been queued and started at once.
    """
    k = kernels(df, rank, device)
    launches = df[(df["rank"] == rank) & (df["kind"] == "launch") & df["corr"].notna()]
    launch_end = dict(zip(launches["corr"].astype(np.int64), (launches["ts"] + launches["dur"]).astype(np.int64)))
    first_at = k.groupby("ts")["corr"].first()
    syncs = spans(host_rows(df, rank, ("sync",)))
    lost = 0
    for s, e in zip(*kernel_idle(df, rank, device)):
        corr = first_at.get(e)
        if corr is None or pd.isna(corr):
            continue
        if launch_end.get(int(corr), -1) > s and not covers(syncs, int(s)):
            lost += int(e - s)
    return lost


def host_work_bubble_ns(df: pd.DataFrame, names, rank: int = 0, device: int = 0) -> int:
    """AI-Core idle time while the host runs the named host-side work (decode, resize, ...).

    The host prepares a batch while the device has nothing queued; overlapping that work with
    the device's computation (a loader thread, or preparing batch i+1 before waiting for i)
    would give the idle time back.
    """
    work = df[(df["rank"] == rank) & df["name"].isin(list(names)) & (df["ph"] == "X")]
    return total(intersect(kernel_idle(df, rank, device), spans(work)))


def contention_stall_ns(df: pd.DataFrame, rank: int = 0, device: int = 0) -> int:
    """AI-Core idle time while host-to-device copies are in flight, after the first kernel.

    In a double-buffered pipeline whose copies alone are shorter than the compute they overlap
    (tests/apps/double_buffer.py), the cores never wait for a copy after the pipeline fill.
    When another transfer shares the link, the copies slow down and compute waits for them:
    that wait is the extra time the contention puts on the critical path.
    """
    h2d = on_device(df, rank, device, ("memcpy",))
    h2d = h2d[h2d["name"].astype(str).str.contains("H2D|HtoD", regex=True)]
    return total(intersect(kernel_idle(df, rank, device), spans(h2d)))


def core_wait_ns(df: pd.DataFrame, stream: int, rank: int = 0, device: int = 0) -> int:
    """Time `stream`'s kernels waited, ready, for another stream's kernel, past its running wave.

    A kernel is ready once the task before it on its stream has ended and its launch call has
    returned. If it starts later while a kernel of another stream is running, it waited for the
    cores that kernel held. Blocks already running are never interrupted, so the wait up to the
    end of the other kernel's current wave (its time over ceil(Block Dim / cores)) is lost in any
    case; the rest is what giving the stream the cores first gives back.
    """
    rows = on_device(df, rank, device, ("kernel", "memcpy", "memset", "wait")).sort_values("ts")
    mine = rows[rows["stream"] == stream]
    others = rows[(rows["stream"] != stream) & (rows["kind"] == "kernel")]
    launch_end = df[(df["rank"] == rank) & (df["kind"] == "launch")].set_index("corr")
    launch_end = launch_end["ts"] + launch_end["dur"]
    prev_end = None
    lost = 0
    for r in mine.itertuples():
        ready = max(x for x in (prev_end, launch_end.get(r.corr)) if x is not None)
        running = others[(others["ts"] <= ready) & (others["ts"] + others["dur"] > ready)]
        if r.kind == "kernel" and r.ts > ready and len(running):
            o = running.iloc[-1]
            wave = o["dur"] / np.ceil(o["value"] / o["addr"])
            wave_end = o["ts"] + (np.floor((ready - o["ts"]) / wave) + 1) * wave
            lost += int(max(r.ts - max(wave_end, ready), 0))
        prev_end = r.ts + r.dur
    return lost


def blocked_launch_ns(df: pd.DataFrame, rank: int, device: int, stream: int) -> int:
    """Host time spent inside launch calls to `stream` beyond the normal cost of a launch.

    A launch call into a full stream queue does not return until a task retires; the normal
    cost is the shortest launch call to that stream (one that never waited). Everything above
    it is the host thread stuck because the queue was full.
    """
    launches = df[(df["rank"] == rank) & (df["kind"] == "launch") & (df["device"] == device)
                  & (df["stream"] == stream) & (df["ph"] == "X")]
    dur = launches["dur"].to_numpy(np.int64)
    return int((dur - dur.min()).sum())


def collective_arrivals(df: pd.DataFrame) -> pd.DataFrame:
    """When each rank reached each collective: a table ranks x collective number.

    A rank reaches its k-th collective when its stream starts the collective's first device
    task (the Notify_Wait it waits in for the other ranks, or the transfer itself). Collectives
    are matched across ranks by their order on each rank (every rank issues the same ones).
    """
    dev = df[(df["ph"] == "X") & df["corr"].notna()]
    coll = dev[dev["kind"] == "collective"]
    rows = {}
    for rank, g in coll.groupby("rank"):
        corrs = g.sort_values("ts")["corr"].drop_duplicates().to_numpy()
        mine = dev[(dev["rank"] == rank) & dev["corr"].isin(corrs) & ~dev["kind"].isin(("launch", "api", "flow"))]
        first = mine.groupby("corr")["ts"].min()
        rows[int(rank)] = [int(first[c]) for c in corrs]
    return pd.DataFrame.from_dict(rows, orient="index")


def straggler_and_wait_ns(df: pd.DataFrame) -> tuple[int, int]:
    """(the rank the others wait for, how long each of the other ranks waited for it in total).

    In every collective a rank waits from its own arrival until the last rank arrives. The
    straggler is the rank that arrives last most often. Its cost is the time the other ranks
    spend waiting, as the mean over them of their summed waits: each of them is held up that
    long, and the job's steps get that much shorter once the straggler keeps up.
    """
    arr = collective_arrivals(df)
    wait = arr.max(axis=0) - arr
    last = arr.idxmax(axis=0).value_counts()
    straggler = int(last.index[0])
    others = [r for r in arr.index if r != straggler]
    return straggler, int(wait.loc[others].sum(axis=1).mean())


def leaked_bytes(df: pd.DataFrame, rank: int = 0, device: int = 0) -> int:
    """Bytes allocated inside training steps and never freed.

    Allocations and frees are matched by address in time order; an allocation made within a
    step that is still live at the end of the trace is a leak (the step's working memory is
    freed by then in a correct program). Summed over all steps: bytes leaked per step x steps.
    """
    mem = df[(df["rank"] == rank) & (df["device"] == device) & df["kind"].isin(("alloc", "free"))]
    mem = mem.sort_values("ts", kind="stable")
    live: dict[int, tuple[int, bool]] = {}
    for kind, addr, nbytes, step in zip(mem["kind"], mem["addr"], mem["bytes"], mem["step"]):
        if kind == "alloc":
            live[int(addr)] = (int(nbytes), not pd.isna(step))
        else:
            live.pop(int(addr), None)
    return sum(n for n, in_step in live.values() if in_step)


def stranded_free_bytes(df: pd.DataFrame, step: int, rank: int = 0, device: int = 0) -> tuple[int, int]:
    """(free bytes left in holes by the frees of `step`, the largest of those holes).

    The blocks freed during the step (and not allocated again) are holes between blocks that
    stay allocated; adjacent freed blocks merge into one hole. When the largest hole is smaller
    than a request, all of that free memory is unusable for it: that is what fragmentation
    costs at the failed allocation.
    """
    mem = df[(df["rank"] == rank) & (df["device"] == device) & df["kind"].isin(("alloc", "free"))]
    in_step = mem[mem["step"] == step].sort_values("ts", kind="stable")
    holes: dict[int, int] = {}
    for kind, addr, nbytes in zip(in_step["kind"], in_step["addr"], in_step["bytes"]):
        if kind == "free":
            holes[int(addr)] = int(nbytes)
        else:
            holes.pop(int(addr), None)
    merged = union(list(holes), [a + n for a, n in holes.items()])
    sizes = merged[1] - merged[0]
    return int(sizes.sum()), int(sizes.max()) if len(sizes) else 0
