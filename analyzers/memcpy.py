"""Memcpy / memset bandwidth in use over time, as Holistic Trace Analysis defines it.

HTA (`TraceCounters.get_memory_bw_time_series` / `get_memory_bw_summary`) builds, per rank and
copy kind ("Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD", "Memcpy PtoP", "Memset"; every device of
the rank together), a step function of the bandwidth in use:
- each copy adds its own rate (the profiler's "memory bandwidth (GB/s)" figure) at its start and
  takes it back at its end (start + duration; a zero-duration copy lasts 1 us);
- the points are sorted by time and cumulated, so copies running at once add up;
- its statistics (`describe()`: count, mean, std, min, quartiles, max) are over the points of
  that series whose value is > 0. So "count" is a number of samples, not of copies, and the mean
  is a mean over change points, not a time-weighted one and not a mean over copies.

Two places where HTA's figure depends on accidents of arithmetic rather than on the trace, and
what is done here instead (on traces without either, the figures are HTA's exactly):
- several points at the same time (a copy starting when another ends, two copies starting
  together): HTA keeps one sample per point in whatever order its unstable sort leaves them, so
  it may report the two back-to-back copies' rates summed although they never ran together.
  Here a time holds one sample, the bandwidth in use after every change at that time.
- HTA's running float sum leaves residues (1e-13 GB/s) where no copy runs, and counts the
  positive ones as samples. Here the sum restarts at every moment no copy of the kind runs, and
  is exactly 0 there.

A rate per copy (bytes / duration, or the profiler's figure) is the *per-copy rate*
(`analyzers.streams.copy_bandwidth`'s `gbps`); it is what tells a slow copy, but it is not the
bandwidth in use, and the two are named apart everywhere they are shown.
Units: GB/s = 1e9 bytes/s = bytes/ns.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: HTA rounds zero-duration copies up to 1 us so that the end point follows the start.
ZERO_DUR_NS = 1_000
SERIES_COLUMNS = ["rank", "kind", "ts", "gbps", "running"]
SUMMARY_COLUMNS = ["rank", "kind", "copies", "count", "gbps_mean", "gbps_std", "gbps_min", "gbps_p25",
                   "gbps_p50", "gbps_p75", "gbps_max"]


def bandwidth_in_use(copies: pd.DataFrame) -> pd.DataFrame:
    """The bandwidth in use per (rank, copy kind): one row per time it changes, with the copies
    running after it (`running`) and their rates summed (`gbps`), sorted by rank, kind, ts.

    `copies` has one row per copy: rank, kind, ts, end (ns), gbps (per-copy rate), as
    `analyzers.streams.copy_bandwidth` returns."""
    if copies.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "kind" else np.int64) for c in SERIES_COLUMNS}
                            ).astype({"gbps": np.float64})
    kinds, code = np.unique(copies["kind"].to_numpy().astype(str), return_inverse=True)
    start = copies["ts"].to_numpy(dtype=np.int64)
    end = copies["end"].to_numpy(dtype=np.int64)
    end = np.where(end > start, end, start + ZERO_DUR_NS)
    rate = copies["gbps"].to_numpy(dtype=np.float64)
    rank = np.tile(copies["rank"].to_numpy(dtype=np.int64), 2)
    code = np.tile(code.reshape(-1), 2)
    ts = np.concatenate([start, end])
    delta = np.concatenate([rate, -rate])
    step = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(start), np.int64)])
    order = np.lexsort((ts, code, rank))
    rank, code, ts, delta, step = rank[order], code[order], ts[order], delta[order], step[order]
    n = len(ts)
    new_series = np.ones(n, dtype=bool)
    new_series[1:] = (rank[1:] != rank[:-1]) | (code[1:] != code[:-1])
    # Copies running after each point: a per-series cumulative count (exact in integers).
    running = _segmented_cumsum(step, new_series)
    # The rate sum restarts wherever the series starts or the previous point left nothing running,
    # so float residue never outlives a busy period and idle moments are exactly 0.
    restart = new_series.copy()
    restart[1:] |= running[:-1] == 0
    gbps = np.where(running > 0, _segmented_cumsum(delta, restart), 0.0)
    # One sample per time: the value after the last change at that time.
    last = np.ones(n, dtype=bool)
    last[:-1] = new_series[1:] | (ts[1:] != ts[:-1])
    return pd.DataFrame({"rank": rank[last], "kind": kinds[code[last]].astype(object), "ts": ts[last],
                         "gbps": gbps[last], "running": running[last]})


def bandwidth_summary(copies: pd.DataFrame) -> pd.DataFrame:
    """HTA's memory bandwidth summary per (rank, copy kind): statistics (GB/s) over the samples of
    `bandwidth_in_use` with copies running (`count` of them); `copies` counts the copies."""
    series = bandwidth_in_use(copies)
    series = series[(series["running"] > 0) & (series["gbps"] > 0)]
    rows = []
    n_copies = copies.groupby(["rank", "kind"]).size() if not copies.empty else {}
    for (rank, kind), g in series.groupby(["rank", "kind"], sort=True):
        v = g["gbps"].to_numpy(dtype=np.float64)
        p25, p50, p75 = np.percentile(v, [25, 50, 75])  # linear interpolation, as describe()
        rows.append({"rank": int(rank), "kind": str(kind), "copies": int(n_copies[(rank, kind)]), "count": len(v),
                     "gbps_mean": float(v.mean()), "gbps_std": float(v.std(ddof=1)) if len(v) > 1 else float("nan"),
                     "gbps_min": float(v.min()), "gbps_p25": float(p25), "gbps_p50": float(p50),
                     "gbps_p75": float(p75), "gbps_max": float(v.max())})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def gbps_text(gbps: float) -> str:
    """A bandwidth for people: 3 significant digits, no exponent (5.06, 24.5, 1230, 0.000123)."""
    if not math.isfinite(gbps) or gbps == 0:
        return f"{gbps:g}"
    rounded = gbps
    for _ in range(2):  # once more when rounding carried into a new digit (99.96 -> 100)
        digits = 2 - math.floor(math.log10(abs(rounded)))
        rounded = round(gbps, digits)
    return f"{rounded:.{max(digits, 0)}f}"


def _segmented_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sum of `values` restarting at every row where `first` is set (row 0 always)."""
    total = np.cumsum(values)
    before = total - values  # the sum before each row; at a segment's first row, its offset
    offset = np.maximum.accumulate(np.where(first, np.arange(len(values)), 0))
    return total - before[offset]
