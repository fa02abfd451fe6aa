"""Core contention and under-occupancy: time a kernel lost to the device's cores, not to idle.

A kernel row carries its block count (`value`) and the cores of its kind on its device (`addr`),
as every producer fills them (the emulator's block dim and Cube / Vector pool; Kineto's grid and
the device's SMs / CUs; torch_npu's Block Dim where the output folder records the core counts).

- **Core contention.** A kernel is *ready* once every release the graph records for it has come
  (the task before it on its stream ended, its launch call returned, the event it waited for
  fired). Waiting past that while a *saturating* kernel of another stream (one that launched at
  least as many blocks as there are cores of its kind) ran on its device is waiting for cores:
  the time in [ready + TURNAROUND_NS, start) that saturating kernels cover. The evidence bounds
  it: never more than the wait, never more than the saturating kernels' own time. Of it, the
  rest of the wave that was running when the wait began is no priority's to recover (blocks in
  flight finish first); what is left is what the stream's priority would give back. The device is
  busy meanwhile, so this is latency of one stream, not device idle (the attribution never sees
  it); it costs the run only where it lies on the critical path.
- **Under-occupancy.** A kernel of b blocks on c cores that each run one block at a time keeps
  cores idle: ceil(b / c) waves with room for ceil(b / c) * c blocks, so a share
  b / (ceil(b / c) * c) of the core time is used. Where the platform runs several blocks per core
  at once (CUDA / ROCm SMs), only b < c is evidence (the tail of a wave depends on occupancy the
  table does not hold). The saving is the kernel's time with no other kernel on its device (other
  kernels may use the idle cores otherwise) times the unused share, and never brings a kernel
  below MIN_KERNEL_NS (a tiny kernel is bound by its fixed latency, not by its cores).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.causality.graph import Tasks, rank_graph, stream_tasks
from analyzers.frames import Cover, Frames

#: A kernel's turnaround after its release that is the device's, not contention (the slack the
#: attribution allows an event's release, graph.SLACK). DEFAULT, not vendor-documented.
TURNAROUND_NS = 5_000
#: The shortest time a kernel takes whatever its block count (launch into the cores, one wave of
#: the smallest block). DEFAULT, not vendor-documented.
MIN_KERNEL_NS = 5_000

WAIT_COLUMNS = ["rank", "device", "stream", "name", "corr", "ts", "end", "ready", "contended_ns", "in_wave_ns",
                "holder"]


def _shape(frames: Frames, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, cores) of `rank`'s tasks in graph order (NaN where the trace does not say)."""
    df = stream_tasks(frames)
    df = df[df["rank"] == rank]
    kernel = (df["kind"] == "kernel").to_numpy()
    blocks = np.where(kernel, df["value"].to_numpy(np.float64, na_value=np.nan), np.nan)
    cores = np.where(kernel, df["addr"].to_numpy(np.float64, na_value=np.nan), np.nan)
    return blocks, cores


def ready_times(T: Tasks) -> np.ndarray:
    """Per task, when its last recorded release came (NaN: the trace records none)."""
    n = len(T.ts)
    ready = np.full(n, np.nan)
    has_prev = T.prev >= 0
    ready[has_prev] = T.end[T.prev[has_prev]]
    le = T.launch_end
    ok = ~np.isnan(le)
    ready[ok] = np.fmax(ready[ok], np.minimum(le[ok], T.ts[ok]))
    # A task launched after a stream-wait call waited for the event: the task on another stream
    # that ended last before it began released it (as the attribution and the path take it).
    for j in np.flatnonzero(T.waited & ~np.isnan(ready)):
        q = T.released_by(int(j), int(ready[j]), int(T.ts[j]))
        if q >= 0:
            ready[j] = max(ready[j], float(T.end[q]))
    return ready


def contended_rows(frames: Frames) -> np.ndarray:
    """Per row of graph.stream_tasks: its wait for cores in ns (see `contended`). Cached."""
    return _waits(frames)[0]


def core_waits(frames: Frames) -> pd.DataFrame:
    """Every kernel that waited for cores held by other streams' saturating kernels (WAIT_COLUMNS):
    `contended_ns` the wait the saturating kernels cover, `holder` the stream whose saturating
    kernels covered most of it. Cached per frames."""
    return _waits(frames)[1]


def _waits(frames: Frames) -> tuple[np.ndarray, pd.DataFrame]:
    key = ("causality.core_waits",)
    if key in frames._cache:
        return frames._cache[key]
    tasks = stream_tasks(frames)
    per_row = np.zeros(len(tasks), dtype=np.int64)
    rank_of = tasks["rank"].to_numpy()
    parts = []
    has_cores = tasks["addr"].notna().to_numpy() & (tasks["kind"] == "kernel").to_numpy()
    for rank in sorted(np.unique(rank_of[has_cores]).tolist()):
        T = rank_graph(frames, int(rank), TURNAROUND_NS)[1]
        blocks, cores = _shape(frames, int(rank))
        ready = ready_times(T)
        c, stuck = contended(T, blocks, cores, ready)
        per_row[np.flatnonzero(rank_of == rank)] = c  # a rank's rows are one block, in graph order
        hit = np.flatnonzero(c > 0)
        if not len(hit):
            continue
        parts.append(pd.DataFrame({
            "rank": int(rank), "device": T.device[hit], "stream": T.stream[hit], "name": T.name[hit],
            "corr": T.corr[hit], "ts": T.ts[hit], "end": T.end[hit], "ready": ready[hit].astype(np.int64),
            "contended_ns": c[hit], "in_wave_ns": stuck[hit], "holder": _holders(T, blocks, cores, hit, ready)}))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=WAIT_COLUMNS)
    frames._cache[key] = (per_row, out)
    return per_row, out


def release_waits(frames: Frames) -> pd.DataFrame:
    """Every kernel whose time from its release to its start saturating kernels covered (rank,
    stream, ts, wait_ns), the turnaround after the release included: the whole wait a model of
    the cores makes again (analyzers.causality.replay), where `core_waits` leaves the turnaround
    to the device. Cached per frames."""
    key = ("causality.release_waits",)
    if key in frames._cache:
        return frames._cache[key]
    tasks = stream_tasks(frames)
    rank_of = tasks["rank"].to_numpy()
    has_cores = tasks["addr"].notna().to_numpy() & (tasks["kind"] == "kernel").to_numpy()
    parts = []
    for rank in sorted(np.unique(rank_of[has_cores]).tolist()):
        T = rank_graph(frames, int(rank), TURNAROUND_NS)[1]
        blocks, cores = _shape(frames, int(rank))
        wait = contended(T, blocks, cores, ready_times(T) - TURNAROUND_NS)[0]
        hit = np.flatnonzero(wait > 0)
        parts.append(pd.DataFrame({"rank": int(rank), "stream": T.stream[hit], "ts": T.ts[hit], "wait_ns": wait[hit]}))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["rank", "stream", "ts", "wait_ns"])
    frames._cache[key] = out
    return out


def _saturating(T: Tasks, blocks: np.ndarray, cores: np.ndarray) -> np.ndarray:
    return (T.kind == "kernel") & ~np.isnan(cores) & (cores > 0) & (blocks >= cores)


def contended(T: Tasks, blocks: np.ndarray, cores: np.ndarray, ready: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per task of one rank (graph order): its wait for cores (see the module docstring), 0 for a
    task that is no kernel, has no core count or no recorded release; and the part of it no
    priority recovers: a saturating kernel already running when the wait began keeps its cores
    until its current wave ends (blocks in flight are never interrupted; a wave is its time over
    ceil(blocks / cores))."""
    out = np.zeros(len(T.ts), dtype=np.int64)
    stuck = np.zeros(len(T.ts), dtype=np.int64)
    ready = ready_times(T) if ready is None else ready
    sat = _saturating(T, blocks, cores)
    want = (T.kind == "kernel") & ~np.isnan(cores) & ~np.isnan(ready)
    if not sat.any() or not want.any():
        return out, stuck
    for (dev, n) in {(int(d), float(c)) for d, c in zip(T.device[sat], cores[sat])}:
        pool = np.flatnonzero(sat & (T.device == dev) & (cores == n))
        pool = pool[np.argsort(T.ts[pool], kind="stable")]
        cov = Cover(T.ts[pool], T.end[pool])
        sel = np.flatnonzero(want & (T.device == dev) & (cores == n))
        a = np.minimum(ready[sel] + TURNAROUND_NS, T.ts[sel]).astype(np.int64)
        out[sel] = cov.between(a, T.ts[sel])
        # The saturating kernel that started last at or before the wait began, if still running.
        i = np.searchsorted(T.ts[pool], a, side="right") - 1
        h = pool[np.maximum(i, 0)]
        running = (i >= 0) & (T.end[h] > a)
        wave = np.maximum((T.end[h] - T.ts[h]) / np.ceil(blocks[h] / cores[h]), 1.0)
        boundary = T.ts[h] + (np.floor((a - T.ts[h]) / wave) + 1) * wave
        stuck[sel] = np.where(running, np.minimum(np.minimum(boundary, T.end[h]), T.ts[sel]) - a, 0).astype(np.int64)
    return out, np.minimum(stuck, out)


def _holders(T: Tasks, blocks: np.ndarray, cores: np.ndarray, hit: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """Per task in `hit`: the stream whose saturating kernels covered most of its wait."""
    sat = _saturating(T, blocks, cores)
    best = np.full(len(hit), -1, dtype=np.int64)
    most = np.zeros(len(hit), dtype=np.int64)
    a = np.minimum(ready[hit] + TURNAROUND_NS, T.ts[hit]).astype(np.int64)
    for dev, stream in {(int(d), int(s)) for d, s in zip(T.device[sat], T.stream[sat])}:
        pool = sat & (T.device == dev) & (T.stream == stream)
        mine = (T.device[hit] == dev) & (T.stream[hit] != stream)
        if not mine.any():
            continue
        got = np.where(mine, Cover(T.ts[pool], T.end[pool]).between(a, T.ts[hit]), 0)
        better = got > most
        best[better], most[better] = stream, got[better]
    return best


OCCUPANCY_COLUMNS = ["rank", "device", "stream", "name", "ts", "end", "blocks", "cores", "used_share", "alone_ns",
                     "saving_ns"]


def under_occupancy(frames: Frames, one_block_per_core: bool) -> pd.DataFrame:
    """Kernels that left cores idle (OCCUPANCY_COLUMNS), with the saving of filling them (see the
    module docstring). `one_block_per_core`: a core runs one block at a time (Ascend AI Cores),
    so a partly filled last wave counts too."""
    key = ("causality.under_occupancy", one_block_per_core)
    if key in frames._cache:
        return frames._cache[key]
    tasks = stream_tasks(frames)
    k = tasks[(tasks["kind"] == "kernel") & tasks["value"].notna() & tasks["addr"].notna()]
    k = k[(k["addr"] > 0) & (k["value"] > 0)]
    if k.empty:
        out = pd.DataFrame(columns=OCCUPANCY_COLUMNS)
        frames._cache[key] = out
        return out
    parts = []
    for _key, g in tasks[tasks["kind"] == "kernel"].groupby(["rank", "device"], sort=True):
        alone = _alone(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64))
        parts.append(pd.Series(alone, index=g.index))
    alone = pd.concat(parts)
    b = k["value"].to_numpy(np.float64)
    c = k["addr"].to_numpy(np.float64)
    waves = np.ceil(b / c) if one_block_per_core else np.ones(len(b))
    used = np.where(one_block_per_core, b / (waves * c), np.minimum(b / c, 1.0))
    a = alone.reindex(k.index).to_numpy(np.int64)
    ideal = np.maximum(a * used, MIN_KERNEL_NS)
    saving = np.maximum(a - ideal, 0).astype(np.int64)
    out = pd.DataFrame({"rank": k["rank"].to_numpy(), "device": k["device"].to_numpy(), "stream": k["stream"].to_numpy(),
                        "name": k["name"].astype(str).to_numpy(), "ts": k["ts"].to_numpy(np.int64),
                        "end": k["end"].to_numpy(np.int64), "blocks": b.astype(np.int64), "cores": c.astype(np.int64),
                        "used_share": used, "alone_ns": a, "saving_ns": saving})
    out = out[out["saving_ns"] > 0].reset_index(drop=True)
    frames._cache[key] = out
    return out


def _alone(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval: its time during which no other interval is open (linear after a sort: the
    stretches where exactly one interval is open belong to the one that is)."""
    n = len(ts)
    if not n:
        return np.zeros(0, dtype=np.int64)
    times = np.concatenate([ts, end])
    delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before starts
    t, d = times[order], delta[order]
    level = np.cumsum(d)
    seg_a, seg_b = t[:-1], t[1:]
    one = (level[:-1] == 1) & (seg_b > seg_a)
    cov = Cover(seg_a[one], seg_b[one])
    return cov.between(ts, end).astype(np.int64)
