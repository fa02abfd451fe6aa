"""Per-stream numbers: busy and idle time, queue length, copy bandwidth (vectorised, HTA-style).

These are the measurements behind several analyzers and the JSON report's `streams` and
`copies` lists; they use the same definitions as Holistic Trace Analysis so the numbers can
be checked against it on the same traces:
- idle time of a stream = the gaps between consecutive device ops on it (sorted by start);
- queue length = +1 at each launch, -1 when the launched op starts, cumulated per stream;
  statistics over the points of that step function (as HTA's `describe()`);
- copy rate = bytes / duration per copy (`copy_bandwidth`); the bandwidth in use over time, as
  HTA defines it (overlapping copies summed, statistics over its samples), is `analyzers.memcpy`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.frames import Frames, gaps

STREAM_KEY = ["rank", "device", "stream"]


def _groups(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by `keys`: a mask of each group's first row, and the first rows' indices."""
    n = len(keys[0])
    first = np.ones(n, dtype=bool)
    if n > 1:
        first[1:] = np.logical_or.reduce([k[1:] != k[:-1] for k in keys])
    return first, np.flatnonzero(first)


def _sizes(starts: np.ndarray, n: int) -> np.ndarray:
    """Rows per group, from the groups' first-row indices (see _groups) and the row count."""
    return np.diff(np.append(starts, n)).astype(np.int64)


def _key_ids(*keys: np.ndarray) -> np.ndarray:
    """A dense id per distinct combination of `keys` (row-aligned arrays)."""
    order = np.lexsort(keys[::-1])
    first, _ = _groups(*(k[order] for k in keys))
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(first) - 1
    return ids


def _per_group_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sum of `values` restarting at every group's first row."""
    total = np.cumsum(values)
    before = total - values  # the sum before each row; at a group's first row, its offset
    offset = np.maximum.accumulate(np.where(first, np.arange(len(values)), 0))
    return total - before[offset]


def stream_time(frames: Frames) -> pd.DataFrame:
    """rank, device, stream, ops, busy_ns, idle_ns, first_ns, last_ns per stream."""
    ops = frames.device_ops
    if ops.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "ops", "busy_ns", "idle_ns", "first_ns", "last_ns"])
    ts = ops["ts"].to_numpy()
    end = ops["end"].to_numpy()
    rank, device, stream = (ops[c].to_numpy() for c in STREAM_KEY)
    new_group, starts = _groups(rank, device, stream)
    group = np.cumsum(new_group) - 1
    # Running max of ends restarts per stream: offset each group far above the previous one.
    offset = group.astype(np.int64) * (int(end.max()) - int(ts.min()) + 1)
    idle = gaps(ts + offset, end + offset)
    idle[new_group] = 0
    idle_ns = np.add.reduceat(idle, starts)
    first_ns = np.minimum.reduceat(ts, starts)
    last_ns = np.maximum.reduceat(end, starts)
    return pd.DataFrame({"rank": rank[starts], "device": device[starts], "stream": stream[starts],
                         "ops": _sizes(starts, len(ts)),
                         "busy_ns": last_ns - first_ns - idle_ns, "idle_ns": idle_ns, "first_ns": first_ns,
                         "last_ns": last_ns})


def queue_series(frames: Frames, *, fan_out: bool = False) -> pd.DataFrame:
    """Queue length per stream over time: ts, rank, device, stream, queue_length (one row per change).

    A launch whose correlation id several device ops share is left out unless `fan_out`: it
    has no one-to-one launch for those ops (as in Holistic Trace Analysis). Cached per frames
    (the queue and overview analyzers and the dependency graph's full-queue edges read it).
    """
    key = ("streams.queue_series", fan_out)
    if key not in frames._cache:
        frames._cache[key] = _queue_series(frames, fan_out)
    return frames._cache[key]


def _queue_series(frames: Frames, fan_out: bool) -> pd.DataFrame:
    ops = frames.device_ops
    launches = frames.launches
    cols = ["ts", *STREAM_KEY, "queue_length"]
    if ops.empty or launches.empty:
        return pd.DataFrame(columns=cols)
    launched = ops[ops["corr"].notna()]
    if fan_out:
        matched = launches[["rank", "corr", "ts"]].merge(launched[["rank", "corr", "device", "stream", "ts"]],
                                                         on=["rank", "corr"], suffixes=("", "_op"))
        up_ts, op_ts = matched["ts"].to_numpy(), matched["ts_op"].to_numpy()
        key = [matched[c].to_numpy() for c in STREAM_KEY]
    else:
        # Ops with a correlation id of their own, each matched to the launches carrying that id.
        op_rank, op_corr = launched["rank"].to_numpy(), launched["corr"].to_numpy().astype(np.int64)
        l_rank, l_corr = launches["rank"].to_numpy(), launches["corr"].to_numpy().astype(np.int64)
        ids = _key_ids(np.concatenate([op_rank, l_rank]), np.concatenate([op_corr, l_corr]))
        op_ids, l_ids = ids[:len(op_rank)], ids[len(op_rank):]
        counts = np.bincount(op_ids, minlength=int(ids.max()) + 1)
        op_of_key = np.full(len(counts), -1, dtype=np.int64)
        single = counts[op_ids] == 1
        op_of_key[op_ids[single]] = np.flatnonzero(single)
        op_index = op_of_key[l_ids]
        hit = op_index >= 0
        if not hit.any():
            return pd.DataFrame(columns=cols)
        op_index = op_index[hit]
        up_ts = launches["ts"].to_numpy()[hit]
        op_ts = launched["ts"].to_numpy()[op_index]
        key = [launched[c].to_numpy()[op_index] for c in STREAM_KEY]
    if len(up_ts) == 0:
        return pd.DataFrame(columns=cols)
    ts = np.concatenate([up_ts, op_ts])
    delta = np.concatenate([np.ones(len(up_ts), np.int64), np.full(len(op_ts), -1, np.int64)])
    rank, device, stream = (np.concatenate([k, k]) for k in key)
    # Launch before start at equal times, so a queue never dips below zero.
    order = np.lexsort((-delta, ts, stream, device, rank))
    ts, delta, rank, device, stream = ts[order], delta[order], rank[order], device[order], stream[order]
    first, _ = _groups(rank, device, stream)
    return pd.DataFrame({"ts": ts, "rank": rank, "device": device, "stream": stream,
                         "queue_length": _per_group_cumsum(delta, first)})


def queue_summary(series: pd.DataFrame) -> pd.DataFrame:
    """count, mean, max queue length per stream (statistics over the change points)."""
    if series.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "count", "mean", "max"])
    keys = [series[c].to_numpy() for c in STREAM_KEY]
    q = series["queue_length"].to_numpy()
    order = np.lexsort(keys[::-1])
    if (np.diff(order) != 1).any():
        keys, q = [k[order] for k in keys], q[order]
    _, starts = _groups(*keys)
    count = _sizes(starts, len(q))
    return pd.DataFrame({"rank": keys[0][starts], "device": keys[1][starts], "stream": keys[2][starts],
                         "count": count, "mean": np.add.reduceat(q, starts) / count,
                         "max": np.maximum.reduceat(q, starts)})


COPY_NAMES = {"H2D": "Memcpy HtoD", "D2H": "Memcpy DtoH", "D2D": "Memcpy DtoD"}


#: The link a copy of each kind crosses on its device (per direction for PCIe).
LINK_OF_KIND = {"Memcpy HtoD": "pcie_h2d", "Memcpy DtoH": "pcie_d2h", "Memcpy DtoD": "hbm", "Memset": "hbm"}


def copy_kind(ops: pd.DataFrame) -> pd.Series:
    """'Memcpy HtoD' / 'Memcpy DtoH' / 'Memcpy DtoD' / 'Memset' / 'Memcpy Unknown' per copy row."""
    # Labels are worked out once per distinct name, then spread to the rows by code.
    codes, names = pd.factorize(ops["name"].astype(object), use_na_sentinel=False)
    labels = np.full(len(names), "Memcpy Unknown", dtype=object)
    text = pd.Series(np.asarray(names, dtype=object)).astype(str)
    for pattern, label in (("HtoD|H2D", "Memcpy HtoD"), ("DtoH|D2H", "Memcpy DtoH"), ("DtoD|D2D", "Memcpy DtoD"),
                           ("PtoP|P2P", "Memcpy PtoP")):
        labels[text.str.contains(pattern, regex=True).to_numpy()] = label
    kind = ops["kind"].astype(object).to_numpy()
    out = np.where(kind == "memset", "Memset", np.where(kind == "memcpy", labels[codes], "Memcpy Unknown"))
    return pd.Series(out, index=ops.index, dtype=object)


def copy_bandwidth(frames: Frames) -> pd.DataFrame:
    """Per copy row: rank, device, stream, kind, ts, end, bytes, gbps (bytes per ns)."""
    ops = frames.device_ops
    copies = ops[ops["kind"].isin(["memcpy", "memset"]).to_numpy() & ops["bytes"].notna().to_numpy()]
    if copies.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "kind", "ts", "end", "bytes", "gbps"])
    nbytes = copies["bytes"].to_numpy(dtype=np.float64)
    value = copies["value"].to_numpy(dtype=np.float64)
    dur = np.maximum(copies["dur"].to_numpy(), 1)
    # The producer's own figure when it gave one (profilers time copies more finely than `dur`).
    gbps = np.where(np.isnan(value), nbytes / dur, value)
    return pd.DataFrame({"rank": copies["rank"].to_numpy(), "device": copies["device"].to_numpy(),
                         "stream": copies["stream"].to_numpy(), "kind": copy_kind(copies).to_numpy(),
                         "ts": copies["ts"].to_numpy(), "end": copies["end"].to_numpy(),
                         "bytes": copies["bytes"].to_numpy(), "gbps": gbps})


