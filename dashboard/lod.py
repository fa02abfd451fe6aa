"""Level of detail for the timeline: what of a window the browser receives.

The browser never gets more than `MAX_SHAPES` shapes. `LaneIndex` sorts the trace's slices once
into lanes (a host thread, or a rank / device / stream) and keeps each lane's `ts` and `end` as
sorted NumPy arrays, so the events of a zoom window are two binary searches per lane. For each
lane of the window, `LaneIndex.window` decides:

- *events*: the lane has few enough events in the window to draw each one (within its share of
  the budget, and at most `LANE_EVENTS`: more would be thinner than a pixel on average);
- *occupancy*: otherwise the window is cut into pixel buckets and the lane sends, per bucket,
  the share of time covered by its events and how many start there (computed from the lane's
  merged intervals with prefix sums: a search per bucket edge, never a scan of the events).

The shape budget is shared by water-filling: lanes are visited from the emptiest, each may take
an equal share of what is left, and what a quiet lane does not use goes to the busy ones; the
lanes shown as occupancy then share what is left equally (the same buckets for all of them).

`CounterIndex` does the same for counter tracks: each series sorted once, cut to the window by
binary search, and reduced to about two points per pixel with MinMax-LTTB (tsdownsample), which
keeps the peaks that matter in memory and queue-depth curves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzers.frames import DEVICE_KINDS, Cover, dictionary_codes

#: Most shapes (slices + non-empty occupancy buckets) one timeline view may hold by default.
MAX_SHAPES = 20_000
#: Pixel buckets across the timeline (about the plot's width in pixels).
BUCKETS = 1_000
#: Most events one lane draws one by one; above that its events are thinner than a pixel on
#: average and the lane shows occupancy instead.
LANE_EVENTS = BUCKETS
#: Kinds that are not slices on a lane.
_NOT_SLICES = ("meta", "counter", "flow", "step")


@dataclass
class Lane:
    id: int
    rank: int
    device_side: bool
    #: (pid, tid) for host lanes, (device, stream) for device lanes.
    key: tuple[int, int]
    label: str
    lo: int
    hi: int
    max_dur: int


@dataclass
class LaneView:
    """What one lane shows in a window: event indices, or occupancy buckets."""

    lane: Lane
    events: np.ndarray | None = None
    edges: np.ndarray | None = None
    busy: np.ndarray | None = None
    counts: np.ndarray | None = None

    @property
    def drawn(self) -> np.ndarray:
        """Buckets with anything in them (time covered, or an event starting there)."""
        return (self.busy > 0) | (self.counts > 0)


class LaneIndex:
    """The trace's slices sorted by lane and time (see the module docstring)."""

    def __init__(self, table: pa.Table) -> None:
        ph, ph_names = dictionary_codes(table.column("ph"))
        kind, kind_names = dictionary_codes(table.column("kind"))
        x = [i for i, p in enumerate(ph_names) if p == "X"]
        skip = [i for i, k in enumerate(kind_names) if k in _NOT_SLICES]
        mask = np.isin(ph, x) & ~np.isin(kind, skip)
        rows = np.flatnonzero(mask)

        def col(name: str, fill: int = -1) -> np.ndarray:
            c = table.column(name)
            return np.asarray(c.fill_null(fill).to_numpy(zero_copy_only=False))[rows].astype(np.int64)

        ts, dur = col("ts", 0), np.maximum(col("dur", 0), 0)
        rank, pid, tid, device, stream = col("rank", 0), col("pid"), col("tid"), col("device"), col("stream")
        stream_valid = np.asarray(table.column("stream").is_valid().to_numpy(zero_copy_only=False))[rows]
        dev_codes = [i for i, k in enumerate(kind_names) if k in DEVICE_KINDS]
        device_kind = np.isin(kind[rows], dev_codes) & stream_valid
        # Other slices of a device stream's thread (event records and waits run as stream tasks)
        # belong on that stream's lane too.
        threads = pd.MultiIndex.from_arrays([rank, pid, tid])
        on_device = stream_valid & (device_kind | threads.isin(threads[device_kind].unique()))
        a = np.where(on_device, device, pid)
        b = np.where(on_device, stream, tid)
        keys = np.stack([rank, on_device.astype(np.int64), a, b], axis=1)
        uniq, lane_of = np.unique(keys, axis=0, return_inverse=True)
        lane_of = lane_of.reshape(-1)
        order = np.lexsort((ts, lane_of))
        self.ts = ts[order]
        self.end = (ts + dur)[order]
        self.row = rows[order]
        self.kind = kind[rows][order].astype(np.int16)
        self.corr = col("corr")[order]
        self.kind_names = kind_names
        names, name_values = dictionary_codes(table.column("name"))
        self.name = names[rows][order]
        self.name_values = name_values
        self._table = table
        bounds = np.searchsorted(lane_of[order], np.arange(len(uniq) + 1))
        thread_names = _thread_names(table)
        self.lanes: list[Lane] = []
        for i, (r, dev, ka, kb) in enumerate(uniq.tolist()):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            md = int((self.end[lo:hi] - self.ts[lo:hi]).max()) if hi > lo else 0
            if dev:
                label = f"r{r} dev {ka} stream {kb}"
            else:
                name = thread_names.get((r, ka, kb))
                label = f"r{r} {name} ({kb})" if name else f"r{r} pid {ka} tid {kb}"
            self.lanes.append(Lane(i, int(r), bool(dev), (int(ka), int(kb)), label, lo, hi, md))
        self._covers: dict[int, Cover] = {}

    def __len__(self) -> int:
        return len(self.ts)

    def lanes_of(self, ranks: list[int] | None) -> list[Lane]:
        """Lanes of these ranks (all when None), host threads before device streams per rank."""
        return [ln for ln in self.lanes if ranks is None or ln.rank in ranks]

    def cover(self, lane: Lane) -> Cover:
        if lane.id not in self._covers:
            self._covers[lane.id] = Cover(self.ts[lane.lo:lane.hi], self.end[lane.lo:lane.hi])
        return self._covers[lane.id]

    def in_window(self, lane: Lane, t0: int, t1: int) -> np.ndarray:
        """Indices (into the sorted arrays) of the lane's events that overlap [t0, t1]."""
        ts = self.ts[lane.lo:lane.hi]
        i0 = int(np.searchsorted(ts, t0 - lane.max_dur, side="left"))
        i1 = int(np.searchsorted(ts, t1, side="right"))
        idx = np.arange(lane.lo + i0, lane.lo + i1)
        return idx[self.end[idx] >= t0]

    def window(self, lanes: list[Lane], t0: int, t1: int, *, budget: int = MAX_SHAPES,
               buckets: int = BUCKETS) -> list[LaneView]:
        """Each lane's view of [t0, t1] within `budget` shapes in all (see the module docstring)."""
        t1 = max(t1, t0 + 1)
        found = {ln.id: self.in_window(ln, t0, t1) for ln in lanes}
        shown: dict[int, np.ndarray] = {}
        left, todo = budget, len(lanes)
        for ln in sorted(lanes, key=lambda ln: len(found[ln.id])):
            share = left // max(todo, 1)
            idx = found[ln.id]
            if len(idx) <= min(share, LANE_EVENTS):
                shown[ln.id] = idx
                left -= len(idx)
            else:
                left -= max(min(buckets, share), 1)
            todo -= 1
        # Every occupancy lane gets the same buckets (one heatmap draws them all), within what the
        # lanes drawn event by event left of the budget.
        busy = len(lanes) - len(shown)
        n = max(min(buckets, (budget - sum(len(v) for v in shown.values())) // max(busy, 1)), 1)
        return [LaneView(ln, events=shown[ln.id]) if ln.id in shown else self._occupancy(ln, t0, t1, n)
                for ln in lanes]

    def _occupancy(self, lane: Lane, t0: int, t1: int, n: int) -> LaneView:
        edges = np.linspace(t0, t1, n + 1).astype(np.int64)
        width = np.maximum(np.diff(edges), 1)
        busy = self.cover(lane).between(edges[:-1], edges[1:]) / width
        ts = self.ts[lane.lo:lane.hi]
        counts = np.diff(np.searchsorted(ts, edges))
        return LaneView(lane, edges=edges, busy=np.clip(busy, 0.0, 1.0), counts=counts)

    # What hover and details show of an event (only for events sent to the browser).
    def names(self, idx: np.ndarray) -> list[str]:
        values = self.name_values
        return [values[c] if c >= 0 else "" for c in self.name[idx].tolist()]

    def kinds(self, idx: np.ndarray) -> list[str]:
        return [self.kind_names[c] for c in self.kind[idx].tolist()]

    def column(self, name: str, idx: np.ndarray) -> list[Any]:
        if name not in self._table.column_names:
            return [None] * len(idx)
        return self._table.column(name).take(pa.array(self.row[idx])).to_pylist()

    def position(self, row: int) -> int | None:
        """Index in the sorted arrays of the table row `row` (None if it is not a slice)."""
        hit = np.flatnonzero(self.row == row)
        return int(hit[0]) if len(hit) else None

    def linked(self, pos: int) -> list[int]:
        """Positions of the slices that share `pos`'s correlation id (a launch and its task), itself first."""
        c = int(self.corr[pos])
        if c < 0:
            return [pos]
        return [pos] + [int(p) for p in np.flatnonzero(self.corr == c) if p != pos]

    def lane_at(self, pos: int) -> Lane:
        starts = np.array([ln.lo for ln in self.lanes])
        return self.lanes[int(np.searchsorted(starts, pos, side="right") - 1)]


def _thread_names(table: pa.Table) -> dict[tuple[int, int, int], str]:
    """(rank, pid, tid) -> thread_name from the trace's metadata events."""
    import json

    kind, names = dictionary_codes(table.column("name"))
    hit = [i for i, n in enumerate(names) if n == "thread_name"]
    rows = np.flatnonzero(np.isin(kind, hit))
    if not len(rows) or "args" not in table.column_names:
        return {}
    sub = table.select(["rank", "pid", "tid", "args"]).take(pa.array(rows)).to_pylist()
    out = {}
    for r in sub:
        try:
            name = json.loads(r["args"] or "{}").get("name")
        except (ValueError, AttributeError):
            continue
        if isinstance(name, str) and r["pid"] is not None and r["tid"] is not None:
            out[(int(r["rank"] or 0), int(r["pid"]), int(r["tid"]))] = name
    return out


class CounterIndex:
    """Counter series (kind counter) per (rank, name), sorted by time, cut and downsampled per window."""

    def __init__(self, table: pa.Table) -> None:
        kind, names = dictionary_codes(table.column("kind"))
        hit = [i for i, k in enumerate(names) if k == "counter"]
        rows = np.flatnonzero(np.isin(kind, hit))
        sub = table.select(["rank", "name", "ts", "value"]).take(pa.array(rows))
        rank = np.asarray(sub.column("rank").fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        codes, values = dictionary_codes(sub.column("name"))
        ts = np.asarray(sub.column("ts").to_numpy(zero_copy_only=False), np.int64)
        value = np.asarray(sub.column("value").to_numpy(zero_copy_only=False), np.float64)
        ok = ~np.isnan(value) & (codes >= 0)
        rank, codes, ts, value = rank[ok], codes[ok], ts[ok], value[ok]
        order = np.lexsort((ts, codes, rank))
        rank, codes, ts, value = rank[order], codes[order], ts[order], value[order]
        self.series: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        if len(ts):
            cut = np.flatnonzero((np.diff(rank) != 0) | (np.diff(codes) != 0)) + 1
            for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(ts)]):
                self.series[(int(rank[lo]), values[codes[lo]])] = (ts[lo:hi], value[lo:hi])

    def keys(self, ranks: list[int] | None = None) -> list[tuple[int, str]]:
        return sorted(k for k in self.series if ranks is None or k[0] in ranks)

    def window(self, key: tuple[int, str], t0: int, t1: int, n_out: int = 2 * BUCKETS
               ) -> tuple[np.ndarray, np.ndarray]:
        """The series' points in [t0, t1] (plus the one before, so a step curve starts right),
        at most about `n_out` of them."""
        ts, value = self.series[key]
        i0 = max(int(np.searchsorted(ts, t0, side="left")) - 1, 0)
        i1 = int(np.searchsorted(ts, t1, side="right")) + 1
        x, y = ts[i0:i1], value[i0:i1]
        if len(x) > n_out:
            from tsdownsample import MinMaxLTTBDownsampler

            keep = MinMaxLTTBDownsampler().downsample(x, y, n_out=max(n_out - n_out % 2, 4))
            x, y = x[keep], y[keep]
        return x, y
