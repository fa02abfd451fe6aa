"""Link traffic from the link-rate counters: the one integration every communication figure uses.

A link-rate counter ("r0->r1.hccs GB/s" names its peer; "r8.roce_tx GB/s", "r0.d0.pcie_d2h GB/s"
are a rank's own port) is a step function of the rate in use. `link_series` turns each into
cumulative bytes and busy time at every change, so `window` integrates any stretch with two
lookups. communication.json, communication_matrix.json (msprof_py.communication), the dashboard's
link matrices (which read the matrix) and the SLOW_LINK finding (analyzers.links) all take their
bytes and busy time from here, so they agree by construction.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: A rank-to-rank link's rate counter ("r0->r1.hccs GB/s"): it names its peer.
LINK = re.compile(r"^r(\d+)->r(\d+)\.(\w+) GB/s$")
#: A rank's own port ("r8.roce_tx GB/s", "r0.d0.pcie_d2h GB/s"): it names no peer.
PORT = re.compile(r"^r(\d+)(?:\.d\d+)?\.(roce_tx|roce_rx|pcie_d2h|pcie_h2d) GB/s$")

Series = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def series_key(name: str) -> tuple | None:
    """(src, dst, TRANSPORT) for a rank-to-rank link's counter, (port, rank) for a port's, else None."""
    if m := LINK.match(name):
        return int(m.group(1)), int(m.group(2)), m.group(3).upper()
    if m := PORT.match(name):
        return m.group(2), int(m.group(1))
    return None


def link_series(counters: pd.DataFrame) -> dict[tuple, Series]:
    """Link rate counters (columns name, ts, value; GB/s = bytes per ns): `series_key` ->
    (ts, rate, cumulative bytes, cumulative busy ns) at each change."""
    if counters.empty:
        return {}
    names = counters["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # a counter table as Arrow's dictionary gives it
        cats = names.cat.categories.astype(str)
        c = counters[names.isin(cats[cats.str.endswith(" GB/s")])]
        groups = c.groupby(c["name"], sort=False, observed=True)
    else:
        c = counters[names.astype(str).str.endswith(" GB/s", na=False)]
        groups = c.groupby(c["name"].astype(str), sort=False)
    out: dict[tuple, Series] = {}
    for name, s in groups:
        key = series_key(str(name))
        if key is None:
            continue
        out[key] = one_series(s["ts"].to_numpy(np.int64), s["value"].to_numpy(np.float64))
    return out


def one_series(ts: np.ndarray, rate: np.ndarray) -> Series:
    """One counter's samples as (ts, rate, cumulative bytes, cumulative busy ns), time ordered."""
    o = np.argsort(ts, kind="stable")
    ts, rate = np.asarray(ts, np.int64)[o], np.asarray(rate, np.float64)[o]
    span = np.diff(ts)
    cum_bytes = np.concatenate(([0.0], np.cumsum(rate[:-1] * span)))
    cum_busy = np.concatenate(([0], np.cumsum(np.where(rate[:-1] > 0, span, 0))))
    return ts, rate, cum_bytes, cum_busy


def integral(series: Series, at: int) -> tuple[float, int]:
    """Bytes and busy ns of a series from its first sample up to `at`."""
    ts, rate, cum_bytes, cum_busy = series
    i = int(np.searchsorted(ts, at, side="right")) - 1
    if i < 0:
        return 0.0, 0
    dt = at - int(ts[i])
    return float(cum_bytes[i] + rate[i] * dt), int(cum_busy[i] + (dt if rate[i] > 0 else 0))


def window(series: Series, start: int, end: int) -> tuple[int, int]:
    """Bytes (whole) and busy ns of a link over [start, end)."""
    b0, t0 = integral(series, start)
    b1, t1 = integral(series, end)
    return round(b1 - b0), t1 - t0
