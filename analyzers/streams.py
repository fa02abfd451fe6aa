"""Per-stream numbers: busy and idle time, queue length, copy bandwidth (vectorised, HTA-style).

These are the measurements behind several analyzers and the JSON report's `streams` and
`copies` lists; they use the same definitions as Holistic Trace Analysis so the numbers can
be checked against it on the same traces:
- idle time of a stream = the gaps between consecutive device ops on it (sorted by start);
- queue length = +1 at each launch, -1 when the launched op starts, cumulated per stream;
  statistics over the points of that step function (as HTA's `describe()`);
- copy bandwidth = bytes / duration per copy, summed over overlapping copies of one kind
  (+bw at start, -bw at end, cumulated), statistics over the positive points.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers.frames import Frames, gaps

STREAM_KEY = ["rank", "device", "stream"]


def stream_time(frames: Frames) -> pd.DataFrame:
    """rank, device, stream, ops, busy_ns, idle_ns, first_ns, last_ns per stream."""
    ops = frames.device_ops
    if ops.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "ops", "busy_ns", "idle_ns", "first_ns", "last_ns"])
    ts = ops["ts"].to_numpy()
    end = ops["end"].to_numpy()
    key = ops[STREAM_KEY].to_numpy()
    new_group = np.ones(len(ops), dtype=bool)
    new_group[1:] = (key[1:] != key[:-1]).any(axis=1)
    group = np.cumsum(new_group) - 1
    # Running max of ends restarts per stream: offset each group far above the previous one.
    offset = group.astype(np.int64) * (int(end.max()) - int(ts.min()) + 1)
    idle = gaps(ts + offset, end + offset)
    idle[new_group] = 0
    frame = pd.DataFrame({"g": group, "idle": idle, "dur": ops["dur"].to_numpy(), "ts": ts, "end": end})
    agg = frame.groupby("g").agg(ops=("dur", "size"), idle_ns=("idle", "sum"), first_ns=("ts", "min"),
                                 last_ns=("end", "max"))
    busy = agg["last_ns"] - agg["first_ns"] - agg["idle_ns"]
    firsts = ops.loc[new_group, STREAM_KEY].reset_index(drop=True)
    out = pd.concat([firsts, agg.reset_index(drop=True)], axis=1)
    out.insert(4, "busy_ns", busy.to_numpy())
    return out


def queue_series(frames: Frames, *, fan_out: bool = False) -> pd.DataFrame:
    """Queue length per stream over time: ts, rank, device, stream, queue_length (one row per change).

    A launch whose correlation id several device ops share is left out unless `fan_out`: it
    has no one-to-one launch for those ops (as in Holistic Trace Analysis).
    """
    ops = frames.device_ops
    launches = frames.launches
    cols = ["ts", *STREAM_KEY, "queue_length"]
    if ops.empty or launches.empty:
        return pd.DataFrame(columns=cols)
    launched = ops[ops["corr"].notna()][["rank", "corr", "device", "stream", "ts"]]
    if not fan_out:
        launched = launched[~launched.duplicated(["rank", "corr"], keep=False)]
    matched = launches[["rank", "corr", "ts"]].merge(launched, on=["rank", "corr"], suffixes=("", "_op"))
    if matched.empty:
        return pd.DataFrame(columns=cols)
    ups = matched[["ts", *STREAM_KEY]].assign(delta=1)
    downs = matched[["ts_op", *STREAM_KEY]].rename(columns={"ts_op": "ts"}).assign(delta=-1)
    series = pd.concat([ups, downs], ignore_index=True)
    # Launch before start at equal times, so a queue never dips below zero.
    series = series.sort_values([*STREAM_KEY, "ts", "delta"], ascending=[True, True, True, True, False],
                                kind="stable")
    series["queue_length"] = series.groupby(STREAM_KEY, sort=False)["delta"].cumsum()
    return series[cols].reset_index(drop=True)


def queue_summary(series: pd.DataFrame) -> pd.DataFrame:
    """count, mean, max queue length per stream (statistics over the change points)."""
    if series.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "count", "mean", "max"])
    g = series.groupby(STREAM_KEY)["queue_length"]
    return g.agg(count="size", mean="mean", max="max").reset_index()


COPY_NAMES = {"H2D": "Memcpy HtoD", "D2H": "Memcpy DtoH", "D2D": "Memcpy DtoD"}


def copy_kind(ops: pd.DataFrame) -> pd.Series:
    """'Memcpy HtoD' / 'Memcpy DtoH' / 'Memcpy DtoD' / 'Memset' / 'Memcpy Unknown' per copy row."""
    names = ops["name"].astype(str)
    kind = pd.Series("Memcpy Unknown", index=ops.index, dtype=object)
    kind[ops["kind"].astype(str) == "memset"] = "Memset"
    for pattern, label in (("HtoD|H2D", "Memcpy HtoD"), ("DtoH|D2H", "Memcpy DtoH"), ("DtoD|D2D", "Memcpy DtoD"),
                           ("PtoP|P2P", "Memcpy PtoP")):
        kind[(ops["kind"].astype(str) == "memcpy") & names.str.contains(pattern, regex=True)] = label
    return kind


def copy_bandwidth(frames: Frames) -> pd.DataFrame:
    """Per copy row: rank, device, stream, kind, ts, end, bytes, gbps (bytes per ns)."""
    ops = frames.device_ops
    copies = ops[ops["kind"].astype(str).isin(["memcpy", "memset"]) & ops["bytes"].notna()].copy()
    if copies.empty:
        return pd.DataFrame(columns=[*STREAM_KEY, "kind", "ts", "end", "bytes", "gbps"])
    copies["kind"] = copy_kind(copies)
    dur = copies["dur"].clip(lower=1)
    # The producer's own figure when it gave one (profilers time copies more finely than `dur`).
    copies["gbps"] = copies["value"].where(copies["value"].notna(), copies["bytes"].astype(np.float64) / dur)
    return copies[[*STREAM_KEY, "kind", "ts", "end", "bytes", "gbps"]].reset_index(drop=True)


def bandwidth_series(copies: pd.DataFrame) -> pd.DataFrame:
    """Bandwidth in use per (rank, copy kind) over time: +gbps at start, -gbps at end, cumulated."""
    if copies.empty:
        return pd.DataFrame(columns=["rank", "kind", "ts", "gbps"])
    up = copies[["rank", "kind", "ts", "gbps"]]
    down = copies[["rank", "kind", "end", "gbps"]].rename(columns={"end": "ts"}).assign(gbps=-copies["gbps"])
    s = pd.concat([up, down], ignore_index=True).sort_values(["rank", "kind", "ts"], kind="stable")
    s["gbps"] = s.groupby(["rank", "kind"], sort=False)["gbps"].cumsum()
    return s.reset_index(drop=True)


def bandwidth_summary(copies: pd.DataFrame) -> pd.DataFrame:
    """count, mean, max bandwidth in use per (rank, copy kind), over the positive points."""
    s = bandwidth_series(copies)
    s = s[s["gbps"] > 1e-12]
    if s.empty:
        return pd.DataFrame(columns=["rank", "kind", "count", "gbps_mean", "gbps_max"])
    return s.groupby(["rank", "kind"])["gbps"].agg(count="size", gbps_mean="mean", gbps_max="max").reset_index()
