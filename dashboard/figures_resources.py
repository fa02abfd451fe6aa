"""Figure builders for the resource pages (memory, communication): data in, arrays or plotly
figure out (no Dash, no I/O), as in `dashboard.figures`.

The series come from the trace's typed columns only (kind, bytes, value, ts, device, stream),
so emulated and imported traces draw the same way. Every curve reaches the browser with at
most `MAX_POINTS` points: long series are reduced with MinMax-LTTB (tsdownsample), which keeps
the peaks that matter in memory and bandwidth curves. Curves are steps (`line_shape="hv"`): a
memory total or a link rate holds its value until the next event. Memory curves are WebGL
(`Scattergl`); bandwidth curves are too once a figure holds many points (`WEBGL_POINTS`), SVG
below that, where a software-rendered WebGL context costs more than the few points it draws.

Names that come from a trace (counter, link and call-site names) are escaped with
`dashboard.figures.text` before they reach a plotly label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dashboard.figures import text

#: Most points one curve sends to the browser.
MAX_POINTS = 4_000
#: Most points one figure sends in all: many curves share it (never below `MIN_POINTS` each).
FIGURE_POINTS = 200_000
MIN_POINTS = 200
#: Bandwidth figures with more points than this are drawn with WebGL; below it SVG draws faster
#: (many short link curves cost a WebGL context more than they save).
WEBGL_POINTS = 20_000
MiB = float(1 << 20)
GiB = float(1 << 30)
SLOW = "#d62728"
#: Curve colours: D3's, without its red (kept for slow links and leak fits).
PALETTE = [c for c in qualitative.D3 if c.lower() != SLOW]
#: Memory counters worth a curve: the caching allocator's allocated / reserved, driver memory used.
MEMORY_COUNTER = re.compile(r"\b(?:allocated|reserved)\b|\bmemory\b.*\bused\b", re.IGNORECASE)
#: Line style per memory quantity (the colour is the device's).
DASH = {"allocated": "solid", "live": "dot", "allocated counter": "longdash", "reserved": "dash", "used": "dashdot"}
#: A link-rate counter (GB/s in use): "r0->r1.hccs GB/s", "r0.d0.pcie_h2d GB/s", "r8.roce_tx GB/s".
LINK_COUNTER = re.compile(r"^(?P<link>.+)\.(?P<type>[A-Za-z0-9_]+) GB/s$")
#: The rank a link's name starts with.
LINK_OWNER = re.compile(r"^r(?P<rank>\d+)[.-]")
#: A rank-to-rank link (the ones a rank x rank matrix can hold).
PEER_LINK = re.compile(r"^r(?P<src>\d+)->r(?P<dst>\d+)\.(?P<type>[A-Za-z0-9_]+) GB/s$")
LINK_GROUPS = {"hccs": "HCCS (rank → rank)", "roce_tx": "RoCE NIC", "roce_rx": "RoCE NIC",
               "pcie_h2d": "PCIe (host ↔ device)", "pcie_d2h": "PCIe (host ↔ device)", "hbm": "HBM"}
#: Device op kinds whose bytes / duration is a transfer rate (the fallback without link counters).
TRANSFER_KINDS = ("collective", "memcpy")


@dataclass
class Series:
    """One curve: x in ns (trace clock), y in the quantity's unit (bytes, GB/s)."""

    rank: int
    device: int | None
    #: What it measures: allocated / live (alloc/free events), allocated counter / reserved / used
    #: (memory counters), the link group (bandwidth).
    quantity: str
    #: Its label (may hold text from the trace: escaped when drawn).
    name: str
    x: np.ndarray
    y: np.ndarray


def device_label(rank: int, device: int | None) -> str:
    return f"r{rank} dev {device}" if device is not None and device >= 0 else f"r{rank} host"


def downsample(x: np.ndarray, y: np.ndarray, n_out: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about `n_out` points of a sorted series, its extremes kept (MinMax-LTTB)."""
    if len(x) <= n_out:
        return x, y
    from tsdownsample import MinMaxLTTBDownsampler

    keep = MinMaxLTTBDownsampler().downsample(np.ascontiguousarray(x), np.ascontiguousarray(y, dtype=np.float64),
                                              n_out=max(n_out - n_out % 2, 4))
    return x[keep], y[keep]


def point_budget(n_curves: int, max_points: int = MAX_POINTS) -> int:
    """Points each of `n_curves` curves may send: `max_points`, less when many share a figure."""
    return int(min(max_points, max(MIN_POINTS, FIGURE_POINTS // max(n_curves, 1))))


def _device_of(values: pd.Series) -> np.ndarray:
    return values.astype("float64").fillna(-1).to_numpy().astype(np.int64)


# ---------------------------------------------------------------- memory: data


def allocation_series(memory: pd.DataFrame) -> list[Series]:
    """Per (rank, device), from the alloc/free rows (`Frames.memory`):

    - *allocated*: the allocator's own total after each event (`value`, "Total Allocated");
    - *live*: allocs minus frees summed in time order, the quantity the memory analyzer fits
      a line to (it starts at zero: memory allocated before the trace began is not in it).

    With one allocator the two are parallel; where a trace mixes allocators (driver and caching
    allocator), each event's total is its own allocator's, and only the live curve adds them up."""
    if memory.empty:
        return []
    d = memory.assign(dev=_device_of(memory["device"]))
    d = d.sort_values(["rank", "dev", "ts"], kind="stable")
    out = []
    for (rank, dev), g in d.groupby(["rank", "dev"], sort=True):
        ts = g["ts"].to_numpy(np.int64)
        device = None if dev < 0 else int(dev)
        value = g["value"].to_numpy(np.float64)
        ok = ~np.isnan(value)
        if ok.any():
            out.append(Series(int(rank), device, "allocated", "allocated ([memory] events)", ts[ok], value[ok]))
        nbytes = g["bytes"].astype("float64").fillna(0).to_numpy()
        delta = np.where(g["kind"].astype(str).to_numpy() == "alloc", nbytes, -nbytes)
        out.append(Series(int(rank), device, "live", "live bytes (allocs − frees)", ts, np.cumsum(delta)))
    return out


def counter_series(counters: pd.DataFrame) -> list[Series]:
    """Memory counters (`MEMORY_COUNTER`: allocated, reserved, memory used) per (rank, device, name)."""
    if counters.empty:
        return []
    names = counters["name"].astype(str)
    rows = counters[names.str.contains(MEMORY_COUNTER)]
    if rows.empty:
        return []
    rows = rows.assign(dev=_device_of(rows["device"]), label=names[rows.index])
    out = []
    for (rank, dev, name), g in rows.groupby(["rank", "dev", "label"], sort=True):
        g = g.sort_values("ts", kind="stable")
        value = g["value"].to_numpy(np.float64)
        ok = ~np.isnan(value)
        if not ok.any():
            continue
        low = name.lower()
        quantity = "reserved" if "reserved" in low else "allocated counter" if "allocated" in low else "used"
        out.append(Series(int(rank), None if dev < 0 else int(dev), quantity, name,
                          g["ts"].to_numpy(np.int64)[ok], value[ok]))
    return out


@dataclass
class LeakFit:
    """A MEMORY_LEAK finding with the memory analyzer's straight line through the live bytes
    at each step's end."""

    finding: int
    rank: int
    device: int | None
    bytes_per_step: float
    r2: float
    steps: int
    intercept: float
    step_end_ns: np.ndarray
    observed: np.ndarray
    lost_bytes: float | None
    #: The call site most of the unfreed bytes came from: (name, count, bytes each).
    site: tuple[str, int, int] | None

    @property
    def fitted(self) -> np.ndarray:
        return self.intercept + self.bytes_per_step * np.arange(len(self.observed), dtype=np.float64)


def leak_fits(findings: list[dict[str, Any]], memory_metrics: dict[str, Any], steps: pd.DataFrame) -> list[LeakFit]:
    """The MEMORY_LEAK findings' fits: slope, R^2 and the live bytes at step ends from the
    report's memory metrics (`r{rank}.d{device}`), the steps' ends from `Frames.steps`. The
    intercept is the least-squares one for the analyzer's slope (the line passes through the
    mean point)."""
    out = []
    for i, f in enumerate(findings):
        if f.get("code") != "MEMORY_LEAK" or f.get("rank") is None:
            continue
        rank, device = int(f["rank"]), f.get("device")
        m = (memory_metrics or {}).get(f"r{rank}.d{-1 if device is None else int(device)}") or {}
        observed = np.asarray(m.get("live_at_step_end") or [], dtype=np.float64)
        if not len(observed):
            continue
        ends = steps.loc[steps["rank"] == rank, "end"].to_numpy(np.int64)[:len(observed)]
        if len(ends) < len(observed):
            continue
        slope = float(m.get("bytes_per_step", f.get("value") or 0.0))
        k = np.arange(len(observed), dtype=np.float64)
        intercept = float(observed.mean() - slope * k.mean())
        ev = [e for e in f.get("evidence") or [] if isinstance(e, dict) and e.get("name") is not None]
        site = (str(ev[0]["name"]), int(ev[0].get("count") or 0), int(ev[0].get("bytes") or 0)) if ev else None
        out.append(LeakFit(i, rank, None if device is None else int(device), slope, float(m.get("r2", 0.0)),
                           int(m.get("steps", len(observed))), intercept, ends, observed, f.get("cost"), site))
    return out


@dataclass
class Fragmentation:
    """A device's caching allocator at its fragmentation peak (reserved minus allocated at its
    largest, as the memory analyzer measures it) and its failed allocations."""

    rank: int
    device: int | None
    peak_allocated: float | None
    peak_allocated_ns: int | None
    at_ns: int | None = None
    reserved: float | None = None
    allocated: float | None = None
    #: Reserved but not handed out at the peak: the free memory the cache holds (its holes).
    unallocated: float | None = None
    failures: int = 0
    #: The largest failed request, and the largest free block any failure reported.
    requested: int | None = None
    largest_free: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.unallocated / self.reserved if self.reserved and self.unallocated is not None else None


def fragmentation(counters: pd.DataFrame, failures: pd.DataFrame, series: list[Series] = ()) -> list[Fragmentation]:
    """Per (rank, device): the peak of "Device memory reserved" minus "Device memory allocated"
    (allocated as of each reserved sample, merge-asof as the analyzer does), the peak of
    allocated (the "Device memory allocated" counter, else the alloc/free events' totals), and the failed
    allocations (kind alloc_fail: bytes requested, value the largest free block when known)."""
    names = counters["name"].astype(str) if not counters.empty else pd.Series(dtype=str)

    def by_device(name: str) -> dict[tuple[int, int], pd.DataFrame]:
        rows = counters[names == name]
        rows = rows.assign(dev=_device_of(rows["device"]))
        return {(int(r), int(d)): g.sort_values("ts", kind="stable")[["ts", "value"]]
                for (r, d), g in rows.groupby(["rank", "dev"])}

    reserved, allocated = by_device("Device memory reserved"), by_device("Device memory allocated")
    fails = failures.assign(dev=_device_of(failures["device"])) if not failures.empty else failures
    keys = set(reserved) | set(allocated) | {(int(r.rank), int(r.dev)) for r in fails.itertuples()}
    keys |= {(s.rank, -1 if s.device is None else s.device) for s in series if s.quantity == "allocated"}
    out = []
    for rank, dev in sorted(keys):
        a = allocated.get((rank, dev))
        peak_a, peak_ts = None, None
        if a is not None and len(a):
            i = int(a["value"].to_numpy().argmax())
            peak_a, peak_ts = float(a["value"].iloc[i]), int(a["ts"].iloc[i])
        else:
            mine = [s for s in series if s.quantity == "allocated" and s.rank == rank
                    and (-1 if s.device is None else s.device) == dev and len(s.y)]
            if mine:
                i = int(mine[0].y.argmax())
                peak_a, peak_ts = float(mine[0].y[i]), int(mine[0].x[i])
        fr = Fragmentation(rank, None if dev < 0 else dev, peak_a, peak_ts)
        r = reserved.get((rank, dev))
        if r is not None and len(r):
            m = pd.merge_asof(r, a if a is not None else r.iloc[:0], on="ts", suffixes=("_res", "_alloc"))
            frag = (m["value_res"] - m["value_alloc"].fillna(0)).to_numpy(np.float64)
            i = int(frag.argmax())
            fr.at_ns, fr.reserved = int(m["ts"].iloc[i]), float(m["value_res"].iloc[i])
            fr.allocated = float(0 if pd.isna(m["value_alloc"].iloc[i]) else m["value_alloc"].iloc[i])
            fr.unallocated = float(frag[i])
        if not fails.empty:
            g = fails[(fails["rank"] == rank) & (fails["dev"] == dev)]
            if len(g):
                fr.failures = len(g)
                fr.requested = int(g["bytes"].max())
                largest = g["value"].dropna()
                fr.largest_free = float(largest.max()) if len(largest) else None
        out.append(fr)
    return out


# ---------------------------------------------------------------- memory: figure


def memory_figure(series: list[Series], fits: list[LeakFit], origin: int, *, visible_devices: int = 4,
                  max_points: int = MAX_POINTS) -> go.Figure:
    """Memory per device over time (MiB): one colour per (rank, device), one line style per
    quantity, each leak finding's fitted line over its steps in red. Devices after the first
    `visible_devices` start hidden (their legend entries show them), unless a leak fit is on them."""
    fig = go.Figure()
    devices = sorted({(s.rank, -1 if s.device is None else s.device) for s in series})
    colour = {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(devices)}
    shown = set(devices[:visible_devices]) | {(f.rank, -1 if f.device is None else f.device) for f in fits}
    budget = point_budget(len(series), max_points)
    for s in series:
        key = (s.rank, -1 if s.device is None else s.device)
        label = device_label(s.rank, s.device)
        x, y = downsample(s.x, s.y, budget)
        fig.add_trace(go.Scattergl(
            x=(x - origin) / 1e6, y=y / MiB, mode="lines", line_shape="hv", name=text(s.name, 60),
            line=dict(color=colour[key], width=1.8, dash=DASH.get(s.quantity, "solid")),
            legendgroup=label, legendgrouptitle_text=label,
            visible=True if key in shown else "legendonly",
            hovertemplate="%{y:,.2f} MiB<extra>" + text(f"{label} {s.name}", 80) + "</extra>"))
    for fit in fits:
        label = device_label(fit.rank, fit.device)
        x = (fit.step_end_ns - origin) / 1e6
        name = f"#{fit.finding + 1} leak fit {label}: +{fit.bytes_per_step / MiB:,.2f} MiB/step (R² {fit.r2:.3f})"
        fig.add_trace(go.Scatter(x=x, y=fit.fitted / MiB, mode="lines", name=name, legendgroup=f"fit{fit.finding}",
                                 line=dict(color=SLOW, width=2.5, dash="dash"),
                                 hovertemplate="fit %{y:,.2f} MiB<extra>" + name + "</extra>"))
        fig.add_trace(go.Scatter(x=x, y=fit.observed / MiB, mode="markers", name=f"live at step ends ({label})",
                                 legendgroup=f"fit{fit.finding}", marker=dict(color=SLOW, size=8, symbol="x"),
                                 hovertemplate="step end %{y:,.2f} MiB<extra>" + label + "</extra>"))
    fig.update_layout(
        template="plotly_white", height=480, margin=dict(l=10, r=10, t=30, b=50), hovermode="closest",
        legend=dict(groupclick="toggleitem"), xaxis_title="time since trace start (ms)", yaxis_title="MiB",
        meta={"curves": len(series), "points_per_curve": budget, "fits": len(fits)})
    fig.update_yaxes(rangemode="tozero", automargin=True)
    return fig


# ---------------------------------------------------------------- communication: data


def link_series(series: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
                ranks: list[int] | None = None) -> list[Series]:
    """The link-rate counters ("... GB/s") of `ranks` (all when None) from `CounterIndex.series`,
    grouped by link type (HCCS, RoCE, PCIe, HBM). A link belongs to the rank its name starts
    with ("r3->r5.hccs": rank 3), whichever rank's table the counter was recorded in."""
    out = []
    for (rank, name), (ts, value) in sorted(series.items()):
        m = LINK_COUNTER.match(name)
        if not m:
            continue
        owner = LINK_OWNER.match(name)
        rank = int(owner["rank"]) if owner else int(rank)
        if ranks is not None and rank not in ranks:
            continue
        out.append(Series(rank, None, LINK_GROUPS.get(m["type"], m["type"]), name[:-len(" GB/s")], ts, value))
    return sorted(out, key=lambda s: (s.quantity, s.rank, s.name))


def rate_steps(ts: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The transfer rate in use over time (GB/s = bytes per ns) of transfers [ts, end) carrying
    `nbytes` each: each adds bytes / duration while it runs (overlapping ones add up). A step
    curve: the value at x holds until the next x."""
    ts, end = np.asarray(ts, np.int64), np.asarray(end, np.int64)
    rate = np.asarray(nbytes, np.float64) / np.maximum(end - ts, 1)
    x = np.concatenate([ts, end])
    d = np.concatenate([rate, -rate])
    order = np.argsort(x, kind="stable")
    x, y = x[order], np.cumsum(d[order])
    last = np.r_[x[1:] != x[:-1], True]  # several changes at one instant: the state after them all
    x, y = x[last], y[last]
    y[np.abs(y) < 1e-9 * max(float(rate.max()), 1.0)] = 0.0
    return x, y


def op_rate_series(device_ops: pd.DataFrame, ranks: list[int] | None = None) -> list[Series]:
    """Bandwidth in use per (rank, device, stream) computed from its collectives and copies with
    a byte count (bytes / duration while each runs): for traces without link counters."""
    ops = device_ops
    if ops.empty:
        return []
    kinds = ops["kind"].astype(str)
    sel = ops[kinds.isin(TRANSFER_KINDS) & (ops["bytes"].fillna(0) > 0) & (ops["dur"] > 0)]
    if ranks is not None:
        sel = sel[sel["rank"].isin(ranks)]
    out = []
    for (rank, device, stream), g in sel.groupby(["rank", "device", "stream"], sort=True):
        x, y = rate_steps(g["ts"].to_numpy(), g["end"].to_numpy(), g["bytes"].to_numpy(np.float64))
        what = " + ".join(sorted(set(g["kind"].astype(str)), key=TRANSFER_KINDS.index))
        group = "collectives" if what == "collective" else "copies" if what == "memcpy" else "collectives and copies"
        out.append(Series(int(rank), None if device < 0 else int(device), group,
                          f"{device_label(int(rank), None if device < 0 else int(device))} stream {stream} ({what})",
                          x, y))
    return out


@dataclass
class Matrix:
    """A rank x rank matrix: z[i][j] is from ranks[i] to ranks[j] (NaN: nothing to say)."""

    kind: str
    ranks: list[int]
    z: np.ndarray
    title: str
    unit: str
    #: A hover line with %{y} (row rank label), %{x} (column rank label) and %{z} (the value).
    hover: str


def link_matrices(matrix: dict[str, Any], ranks: list[int]) -> dict[str, Matrix]:
    """Bytes each rank-to-rank link carried and its bandwidth (bytes over transit time, MB/ms as
    msprof-analyze gives it), summed over every op of `matrix` (communication_matrix.json as
    `msprof_py.communication.summaries` makes it: the same links communication.json's figures sum,
    the NIC's shared out among the peers across servers)."""
    pos = {r: i for i, r in enumerate(ranks)}
    size = np.zeros((len(ranks), len(ranks)))
    time = np.zeros((len(ranks), len(ranks)))
    seen = False
    for steps in matrix.values():
        for kinds in steps.values():
            for ops in kinds.values():
                for pairs in ops.values():
                    for pair, link in pairs.items():
                        src, _, dst = pair.partition("-")
                        if int(src) not in pos or int(dst) not in pos:
                            continue
                        i, j = pos[int(src)], pos[int(dst)]
                        size[i, j] += link["Transit Size(MB)"]
                        time[i, j] += link["Transit Time(ms)"]
                        seen = True
    if not seen:
        return {}
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(time > 0, size / time, np.nan)
    return {
        "bytes": Matrix("bytes", ranks, np.where(size > 0, size / 1024, np.nan),
                        "Bytes sent per rank-to-rank link (communication_matrix.json)", "GiB",
                        "%{y} → %{x}: %{z:,.3f} GiB"),
        "bandwidth": Matrix("bandwidth", ranks, rate,
                            "Bandwidth per rank-to-rank link: bytes / transit time (communication_matrix.json)",
                            "GB/s", "%{y} → %{x}: %{z:,.2f} GB/s (MB/ms) while sending"),
    }


def wait_matrix(instances: pd.DataFrame, ranks: list[int]) -> Matrix | None:
    """Time each rank waited for each other rank in matched collectives: per collective (the
    `instance` of `analyzers.ranks.match_collectives`), every member waits from its arrival
    until the last member arrives, and that wait is put on the last member's column."""
    if instances.empty:
        return None
    d = instances[["instance", "rank", "arrival_ns"]].sort_values(["instance", "arrival_ns"], kind="stable")
    last = d.groupby("instance").tail(1).set_index("instance")
    d = d.assign(late=d["instance"].map(last["rank"]), wait=d["instance"].map(last["arrival_ns"]) - d["arrival_ns"])
    d = d[d["rank"] != d["late"]]
    pos = {r: i for i, r in enumerate(ranks)}
    z = np.zeros((len(ranks), len(ranks)))
    for (r, late), w in d.groupby(["rank", "late"])["wait"].sum().items():
        if int(r) in pos and int(late) in pos:
            z[pos[int(r)], pos[int(late)]] += float(w)
    np.fill_diagonal(z, np.nan)
    return Matrix("wait", ranks, z / 1e6, "Time each rank waited for another in collectives", "ms",
                  "%{y} waited %{z:,.3f} ms for %{x}")


# ---------------------------------------------------------------- communication: figures


def bandwidth_figure(series: list[Series], origin: int, *, slow: Iterable[str] = (),
                     nominal: dict[str, float] | None = None, max_points: int = MAX_POINTS) -> go.Figure:
    """Bandwidth in use over time (GB/s), one panel per link group sharing the time axis. Links
    named by a slow-link finding are drawn red and thick; each panel shows the nominal rate of
    its links (from the links analyzer's metrics) as a dotted line. WebGL once the curves hold
    more than `WEBGL_POINTS` points in all, SVG below."""
    slow = set(slow)
    nominal = nominal or {}
    groups = list(dict.fromkeys(s.quantity for s in series))
    rows = max(len(groups), 1)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 0.3 / rows),
                        subplot_titles=[text(g, 60) for g in groups])
    budget = point_budget(len(series), max_points)
    legend = len(series) <= 24
    curve = go.Scattergl if sum(min(len(s.x), budget) for s in series) > WEBGL_POINTS else go.Scatter
    for row, group in enumerate(groups, start=1):
        mine = [s for s in series if s.quantity == group]
        for k, s in enumerate(mine):
            x, y = downsample(s.x, s.y, budget)
            is_slow = s.name in slow
            fig.add_trace(curve(
                x=(x - origin) / 1e6, y=y, mode="lines", line_shape="hv", name=text(s.name, 60),
                line=dict(color=SLOW if is_slow else PALETTE[k % len(PALETTE)], width=2.5 if is_slow else 1.2),
                opacity=1.0 if is_slow else 0.75, showlegend=legend or is_slow, legendgroup=text(s.name, 60),
                hovertemplate="%{y:,.2f} GB/s<extra>" + text(s.name, 80) + "</extra>"), row=row, col=1)
        nom = [nominal[s.name] for s in mine if nominal.get(s.name)]
        drawn = [s for s in mine if len(s.x)]
        if nom and drawn:
            a = (min(float(s.x[0]) for s in drawn) - origin) / 1e6
            b = (max(float(s.x[-1]) for s in drawn) - origin) / 1e6
            label = f"nominal {max(nom):g} GB/s"
            fig.add_trace(go.Scatter(x=[a, b], y=[max(nom)] * 2, mode="lines", name=label, legendgroup="nominal",
                                     line=dict(color="#555", width=1, dash="dot"), showlegend=False,
                                     hovertemplate=label + "<extra></extra>"), row=row, col=1)
        fig.update_yaxes(title_text="GB/s", rangemode="tozero", automargin=True, row=row, col=1)
    fig.update_xaxes(title_text="time since trace start (ms)", row=rows, col=1)
    fig.update_layout(template="plotly_white", height=90 + 240 * rows, margin=dict(l=10, r=10, t=40, b=50),
                      hovermode="closest", meta={"curves": len(series), "points_per_curve": budget,
                                                 "groups": groups, "slow": sorted(slow),
                                                 "webgl": curve is go.Scattergl})
    return fig


def matrix_figure(m: Matrix) -> go.Figure:
    """A rank x rank heatmap, rank labels on both axes, the first rank at the top left."""
    labels = [f"r{r}" for r in m.ranks]
    z = np.where(np.isnan(m.z), None, m.z).tolist()
    top = float(np.nanmax(m.z)) if np.isfinite(m.z).any() else 0.0
    # Every matrix holds amounts (bytes, rates, waits): the scale starts at zero, so equal cells
    # (a healthy mesh) read as what they are rather than as the middle of an arbitrary range.
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, colorscale="Blues", hoverongaps=False, zmin=0,
                               zmax=top if top > 0 else 1.0,
                               colorbar=dict(title=dict(text=m.unit)),
                               hovertemplate=m.hover + "<extra></extra>"))
    side = max(360, min(900, 40 * len(labels) + 160))
    fig.update_layout(template="plotly_white", title=dict(text=m.title, font=dict(size=14)), height=side,
                      width=side + 120, margin=dict(l=10, r=10, t=50, b=40), meta={"kind": m.kind})
    fig.update_xaxes(title_text="to" if m.kind != "wait" else "waited for", type="category", side="bottom")
    fig.update_yaxes(title_text="from" if m.kind != "wait" else "rank", type="category", autorange="reversed")
    return fig
