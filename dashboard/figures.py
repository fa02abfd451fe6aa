"""Pure figure builders: data in, plotly figure out (no Dash, no I/O).

Every text that comes from a trace (event, thread, counter and kernel names, args) is escaped
before it reaches plotly, whose labels understand a little HTML: a kernel named
`<img src=x onerror=alert(1)>` is shown as those characters.
"""

from __future__ import annotations

import functools
import html
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dashboard.lod import BUCKETS, MAX_SHAPES, LaneView

KIND_COLOURS = {
    "kernel": "#4c78a8", "memcpy": "#f58518", "memset": "#ffbf79", "collective": "#b279a2",
    "api": "#9d9d9d", "launch": "#54a24b", "sync": "#e45756", "wait": "#ff9da6", "host_work": "#8c564b",
    "data_load": "#17becf", "marker": "#bab0ac", "alloc": "#72b7b2", "free": "#72b7b2",
}
OTHER_COLOUR = "#7f7f7f"
HIGHLIGHT = "rgba(214,39,40,0.85)"
#: Lane row height in pixels, and the line width that draws a slice on it.
LANE_PX, SLICE_PX = 22, 12
#: Half a slice rectangle's height, in lanes.
SLICE_HALF = 0.3
COUNTER_PX = 110
#: Views with at most this many events put the events' args in their hover text.
HOVER_ARGS_EVENTS = 2_000
#: Step markers drawn at most (more would be a grey wall).
MAX_STEP_MARKERS = 200


def text(value: Any, limit: int = 200) -> str:
    """A trace-supplied value as safe label text (escaped, cut to `limit` characters)."""
    s = "" if value is None else str(value)
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    return html.escape(s, quote=False)


def ms(ns: float, origin: int) -> float:
    return (ns - origin) / 1e6


@dataclass
class Highlight:
    """What a finding marks on the timeline: its window and the occurrences' windows (ns)."""

    start_ns: int
    end_ns: int
    occurrences: list[tuple[int, int]] = field(default_factory=list)
    label: str = ""
    #: The finding's evidence references (dicts with ts / dur and corr, or name): outlined on
    #: the lane they name.
    evidence: list[dict[str, Any]] = field(default_factory=list)


_REVISIONS = itertools.count(1)


@dataclass
class Marker:
    """A finding on the findings lane: its index in the ranked findings, window (ns), severity."""

    index: int
    start_ns: int
    end_ns: int
    severity: str
    label: str


SEVERITY_COLOURS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
#: Evidence items outlined at most per finding.
MAX_EVIDENCE = 50
#: Rows the findings lane packs overlapping findings into (more overlap on the last row).
FINDING_ROWS = 4


def timeline_figure(ds, ranks: list[int] | None, t0: int, t1: int, *, counters: list[tuple[int, str]] = (),
                    highlight: Highlight | None = None, selected: int | None = None,
                    findings: list[Marker] = (), budget: int = MAX_SHAPES, buckets: int = BUCKETS
                    ) -> dict[str, Any]:
    """Lanes of `ranks` (host threads, then device streams) over [t0, t1] ns, counter tracks under
    them, step markers, a finding's highlight and the selected event with its launch flow. With
    `findings`, a lane above the others shows each finding's window (click one to open it).

    The figure is a plain dict (plotly's JSON form), not a `go.Figure`: validating tens of
    thousands of values per zoom would cost more than computing them. `layout.meta` tells what
    was sent: the window in ns, the shapes (slices sent + occupancy cells), the rectangles drawn
    after merging slices closer than a pixel, and how many lanes show events or occupancy."""
    index = ds.lanes
    origin = ds.span[0]
    lanes = index.lanes_of(ranks)
    findings = [m for m in findings if m.start_ns <= t1 and m.end_ns >= t0]
    evidence = _evidence_boxes(index, lanes, highlight.evidence if highlight else [], t0, t1)
    views = index.window(lanes, t0, t1, budget=max(budget - len(findings) - len(evidence), 0), buckets=buckets)
    counters = [k for k in counters if k in ds.counters.series]
    fig = _Figure(max(LANE_PX * len(lanes), 120), len(counters))
    shapes, drawn = _slices(fig, index, views, origin, (t1 - t0) / 1e6 / buckets)
    cells = _occupancy(fig, views, origin)
    marks = _findings_lane(fig, findings, t0, t1, origin) + _outline(fig, evidence, origin)
    shapes, drawn = shapes + cells + marks, drawn + cells + marks
    _steps(fig, ds, ranks, t0, t1, origin, len(lanes))
    if selected is not None:
        _selected(fig, index, lanes, selected, origin)
    for k, key in enumerate(counters):
        x, y = ds.counters.window(key, t0, t1, n_out=2 * buckets)
        fig.add({"type": "scatter", "x": (x - origin) / 1e6, "y": y, "mode": "lines", "line": {"width": 1.5,
                 "shape": "hv"}, "name": text(key[1], 80), "showlegend": False, "meta": "counter",
                 "hovertemplate": "%{y:,.4~g}<extra>" + text(f"r{key[0]} {key[1]}", 80) + "</extra>"}, row=2 + k)
        fig.yaxis(2 + k).update(title={"text": text(f"r{key[0]} {key[1]}", 40), "font": {"size": 10}},
                                fixedrange=True, rangemode="tozero")
    if highlight is not None:
        _highlight(fig, highlight, origin)
    top = -1 if findings else 0
    fig.yaxis(1).update(tickmode="array", tickvals=list(range(top, len(lanes))),
                        ticktext=["findings"] * (top < 0) + [text(ln.label, 60) for ln in lanes],
                        range=[len(lanes) - 0.5, top - 0.5],
                        fixedrange=True, showgrid=False, zeroline=False, automargin=True)
    n_events = sum(1 for v in views if v.events is not None)
    fig.layout.update(meta={"window_ns": [int(t0), int(t1)], "shapes": int(shapes), "drawn": int(drawn),
                            "lanes_events": n_events,
                            "lanes_occupancy": len(views) - n_events, "budget": budget},
                      # One value per figure the server makes. When a zoom makes the graph write the new
                      # axis range back into its figure and re-plot it, an unchanged datarevision tells
                      # plotly the data arrays are the same, so it redraws without recomputing them.
                      datarevision=next(_REVISIONS))
    return fig.done([ms(t0, origin), ms(t1, origin)])


class _Figure:
    """A figure as plotly JSON: the lanes' plot on top, one counter track per row under it, one
    shared x axis (the bottom one carries the tick labels)."""

    GAP_PX = 18

    def __init__(self, lanes_px: int, counters: int) -> None:
        self.rows = 1 + counters
        heights = [lanes_px] + [COUNTER_PX] * counters
        total = sum(heights) + self.GAP_PX * counters
        self.data: list[dict[str, Any]] = []
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        self.layout: dict[str, Any] = {
            "template": _template(), "height": total + 90, "margin": {"l": 10, "r": 10, "t": 30, "b": 50},
            "dragmode": "zoom", "hovermode": "closest", "showlegend": True,
            "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
        }
        top = 1.0
        for r, h in enumerate(heights, start=1):
            bottom = max(top - h / total, 0.0)
            self.layout[self._axis("x", r)] = {"anchor": self._ref("y", r), "domain": [0, 1], "showspikes": False,
                                               **({} if r == 1 else {"matches": "x"}),
                                               "showticklabels": r == self.rows, "ticklabeloverflow": "allow"}
            self.layout[self._axis("y", r)] = {"anchor": self._ref("x", r), "domain": [round(bottom, 6), round(top, 6)],
                                               "ticklabeloverflow": "allow"}
            top = bottom - self.GAP_PX / total
        self.layout[self._axis("x", self.rows)]["title"] = {"text": "time since trace start (ms)"}

    @staticmethod
    def _axis(letter: str, row: int) -> str:
        return f"{letter}axis" if row == 1 else f"{letter}axis{row}"

    @staticmethod
    def _ref(letter: str, row: int) -> str:
        return letter if row == 1 else f"{letter}{row}"

    def yaxis(self, row: int) -> dict[str, Any]:
        return self.layout[self._axis("y", row)]

    def add(self, trace: dict[str, Any], row: int = 1) -> None:
        trace["xaxis"], trace["yaxis"] = self._ref("x", row), self._ref("y", row)
        self.data.append(trace)

    def done(self, x_range: list[float]) -> dict[str, Any]:
        for r in range(1, self.rows + 1):
            self.layout[self._axis("x", r)]["range"] = x_range
        self.layout["shapes"], self.layout["annotations"] = self.shapes, self.annotations
        return {"data": self.data, "layout": self.layout}


@functools.lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


def _slices(fig: _Figure, index, views: list[LaneView], origin: int, px_ms: float) -> tuple[int, int]:
    """Per kind, one filled-polygon trace drawing the slices as rectangles, and one trace that draws
    nothing (mode 'none') with a point at each slice's middle carrying its hover text and table
    row (plotly finds the hovered point by a spatial search, so hover costs no element per slice).

    Slices of a lane closer than a pixel (`px_ms`) are drawn as one rectangle, as Perfetto does:
    it looks the same and costs the browser a tenth of the drawing, while hover and click still
    tell each slice apart. SVG, not WebGL: WebGL costs a context and shader compiles per view,
    seconds on software-rendered browsers (headless, remote desktops, VMs).

    Returns (slices sent, rectangles drawn)."""
    pos = [(v.events, y) for y, v in enumerate(views) if v.events is not None and len(v.events)]
    if not pos:
        return 0, 0
    idx = np.concatenate([p for p, _ in pos])
    lane_y = np.concatenate([np.full(len(p), y, np.float64) for p, y in pos])
    kinds = index.kind[idx]
    with_args = len(idx) <= HOVER_ARGS_EVENTS
    sent = drawn = 0
    for code in np.unique(kinds).tolist():
        sel = kinds == code
        e, y = idx[sel], lane_y[sel]
        kind = index.kind_names[code]
        colour = KIND_COLOURS.get(kind, OTHER_COLOUR)
        a, b = ms(index.ts[e], origin), ms(index.end[e], origin)
        ra, rb, ry = merge_runs(a, b, y, px_ms)
        rb = np.maximum(rb, ra + px_ms / 2)
        nan = np.full(len(ra), np.nan)
        fig.add({"type": "scatter", "x": np.column_stack([ra, rb, rb, ra, nan]).ravel(),
                 "y": np.column_stack([ry - SLICE_HALF, ry - SLICE_HALF, ry + SLICE_HALF, ry + SLICE_HALF,
                                       nan]).ravel(),
                 "mode": "none", "fill": "toself", "fillcolor": colour, "line": {"width": 0, "color": colour},
                 "name": kind, "legendgroup": kind, "hoverinfo": "skip", "meta": "slices"})
        order = np.lexsort(((a + b) / 2, y))
        fig.add({"type": "scatter", "x": ((a + b) / 2)[order], "y": y[order], "mode": "none", "name": kind,
                 "legendgroup": kind, "showlegend": False, "line": {"width": 0, "color": colour},
                 "hovertext": _hover(index, e[order], kind, with_args), "hoverinfo": "text",
                 "customdata": index.row[e[order]], "hoverlabel": {"bgcolor": colour}, "meta": "hover"})
        sent += len(e)
        drawn += len(ra)
    return sent, drawn


def merge_runs(a: np.ndarray, b: np.ndarray, lane: np.ndarray, gap: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals [a, b) on lanes, with those of a lane less than `gap` apart merged into one run:
    (run starts, run ends, run lanes), sorted by lane then start."""
    if len(a) == 0:
        return a, b, lane
    order = np.lexsort((a, lane))
    a, b, lane = a[order], b[order], lane[order]
    # Offsetting each lane past the previous one's values lets one running maximum serve all lanes.
    width = float(max(b.max(), a.max()) - min(a.min(), b.min())) + 2 * gap + 1.0
    shift = lane * width
    reach = np.maximum.accumulate(b + shift)
    new = np.ones(len(a), bool)
    new[1:] = (lane[1:] != lane[:-1]) | (a[1:] + shift[1:] - reach[:-1] >= gap)
    starts = np.flatnonzero(new)
    return a[starts], np.maximum.reduceat(b, starts), lane[starts]


def _hover(index, e: np.ndarray, kind: str, with_args: bool) -> list[str]:
    """Name, kind, duration and bytes; the first args too when the view is zoomed in far enough
    that their text is a small part of what is sent (`with_args`). Clicking shows all args."""
    names = index.names(e)
    dur = (index.end[e] - index.ts[e]) / 1e3
    nbytes = index.column("bytes", e)
    args = index.column("args", e) if with_args else [None] * len(e)
    out = []
    for n, d, b, a in zip(names, dur.tolist(), nbytes, args):
        line = f"<b>{text(n, 100)}</b><br>{kind} · {d:,.3f} us"
        if b is not None:
            line += f" · {int(b):,} B"
        if a:
            line += "<br>" + "<br>".join(text(part, 60) for part in _arg_lines(a))
        out.append(line)
    return out


def _arg_lines(args: str, limit: int = 3) -> list[str]:
    try:
        d = json.loads(args)
    except ValueError:
        return [args[:100]]
    if not isinstance(d, dict):
        return [args[:100]]
    items = [f"{k}: {v}" for k, v in list(d.items())[:limit]]
    if len(d) > limit:
        items.append(f"… {len(d) - limit} more")
    return items


def _evidence_boxes(index, lanes, evidence: list[dict[str, Any]], t0: int, t1: int
                    ) -> list[tuple[int, int, int]]:
    """(start ns, end ns, lane y) of the evidence items that fall in the window on a shown lane.

    An item with a `corr` is on the lane of the device task with that correlation id (a bubble's
    evidence is the gap before that task); one with a `name` is the slice of that name starting
    at its `ts`."""
    y_of = {ln.id: y for y, ln in enumerate(lanes)}
    out = []
    for e in evidence[:MAX_EVIDENCE]:
        ts, dur = e.get("ts"), e.get("dur") or 0
        if not isinstance(ts, (int, float)) or ts > t1 or ts + dur < t0:
            continue
        if isinstance(e.get("corr"), int):
            hits = np.flatnonzero(index.corr == e["corr"])
        elif isinstance(e.get("name"), str):
            hits = np.flatnonzero(index.ts == int(ts))
            hits = [h for h in hits if index.names(np.array([h]))[0] == e["name"]]
        else:
            continue
        lanes_hit = [index.lane_at(int(h)) for h in hits]
        ys = [y_of[ln.id] for ln in sorted(lanes_hit, key=lambda ln: not ln.device_side) if ln.id in y_of]
        if ys:
            out.append((int(ts), int(ts + dur), ys[0]))
    return out


def _outline(fig: _Figure, boxes: list[tuple[int, int, int]], origin: int) -> int:
    """The evidence boxes as red outlines around their lane."""
    if not boxes:
        return 0
    a = np.array([ms(b[0], origin) for b in boxes])
    b = np.array([ms(b[1], origin) for b in boxes])
    y = np.array([float(b[2]) for b in boxes])
    nan = np.full(len(a), np.nan)
    fig.add({"type": "scatter", "x": np.column_stack([a, b, b, a, a, nan]).ravel(),
             "y": np.column_stack([y - 0.45, y - 0.45, y + 0.45, y + 0.45, y - 0.45, nan]).ravel(),
             "mode": "lines", "line": {"color": HIGHLIGHT, "width": 2}, "name": "evidence", "hoverinfo": "skip",
             "meta": "evidence"})
    return len(boxes)


def _findings_lane(fig: _Figure, markers: list[Marker], t0: int, t1: int, origin: int) -> int:
    """The findings lane (around y = -1): a bar per finding over its window, coloured by severity;
    findings whose windows overlap get rows of their own (up to `FINDING_ROWS`)."""
    shown = sorted(markers, key=lambda m: (m.start_ns, -m.end_ns))  # the caller kept those in the window
    if not shown:
        return 0
    ends: list[int] = []
    row_of = {}
    for m in shown:
        free = next((r for r, e in enumerate(ends) if e <= m.start_ns), None)
        if free is None:
            free = min(len(ends), FINDING_ROWS - 1)
            if free == len(ends):
                ends.append(m.end_ns)
        ends[free] = max(m.end_ns, ends[free]) if free < len(ends) else m.end_ns
        row_of[m.index] = free
    height = 0.9 / len(ends)
    px = (t1 - t0) / 1e6 / BUCKETS
    for sev in ("info", "warning", "critical"):
        ms_ = [m for m in shown if m.severity == sev]
        if not ms_:
            continue
        a = np.array([ms(m.start_ns, origin) for m in ms_])
        b = np.maximum(np.array([ms(m.end_ns, origin) for m in ms_]), a + px)
        top = np.array([-1.45 + row_of[m.index] * height for m in ms_])
        bottom = top + height * 0.85
        nan = np.full(len(a), np.nan)
        colour = SEVERITY_COLOURS[sev]
        fig.add({"type": "scatter", "x": np.column_stack([a, b, b, a, nan]).ravel(),
                 "y": np.column_stack([top, top, bottom, bottom, nan]).ravel(), "mode": "none", "fill": "toself",
                 "fillcolor": colour, "opacity": 0.75, "line": {"width": 0, "color": colour},
                 "name": f"{sev} finding", "legendgroup": f"finding-{sev}", "hoverinfo": "skip", "meta": "findings"})
        # Hover at the middle of each bar's visible part.
        lo, hi = np.maximum(a, ms(t0, origin)), np.minimum(b, ms(t1, origin))
        fig.add({"type": "scatter", "x": (lo + hi) / 2, "y": (top + bottom) / 2, "mode": "none",
                 "name": "findings", "legendgroup": f"finding-{sev}", "showlegend": False,
                 "hovertext": [text(m.label, 160) + "<br>click to open it" for m in ms_], "hoverinfo": "text",
                 "customdata": [["finding", m.index] for m in ms_], "hoverlabel": {"bgcolor": colour},
                 "meta": "hover"})
    return len(shown)


def _occupancy(fig: _Figure, views: list[LaneView], origin: int) -> int:
    """Lanes too busy to draw event by event, as one heatmap: a row per lane (empty for lanes that
    show events), shaded by the share of each pixel bucket their events cover."""
    busy = [v for v in views if v.events is None]
    if not busy:
        return 0
    n = len(busy[0].busy)
    edges = busy[0].edges
    z = np.full((len(views), n), np.nan)
    counts = np.zeros((len(views), n), np.int64)
    total = 0
    for y, v in enumerate(views):
        if v.events is None:
            drawn = v.drawn
            z[y] = np.where(drawn, np.maximum(v.busy, 0.04), np.nan)
            counts[y] = v.counts
            total += int(np.count_nonzero(drawn))
    fig.add({"type": "heatmap", "x": ms((edges[:-1] + edges[1:]) / 2, origin), "y": np.arange(len(views)), "z": z,
             "customdata": counts, "zmin": 0, "zmax": 1, "showscale": False, "name": "occupancy",
             "colorscale": [[0, "#c6dbef"], [1, "#08306b"]], "showlegend": True, "meta": "occupancy",
             "hovertemplate": "%{z:.0%} busy · %{customdata:,} events<extra>occupancy</extra>"})
    return total


def _steps(fig: _Figure, ds, ranks, t0: int, t1: int, origin: int, n_lanes: int) -> None:
    steps = ds.frames.steps
    if steps.empty:
        return
    s = steps[(steps["ts"] <= t1) & (steps["end"] >= t0)]
    if ranks is not None:
        s = s[s["rank"].isin(ranks)]
    s = s.drop_duplicates("ts").head(MAX_STEP_MARKERS)
    if s.empty:
        return
    x = ms(s["ts"].to_numpy(np.float64), origin)
    xs = np.column_stack([x, x, np.full(len(x), np.nan)]).ravel()
    ys = np.tile([-0.5, n_lanes - 0.5, np.nan], len(x))
    label = [text(n, 40) for n in s["name"].astype(str)]
    fig.add({"type": "scatter", "x": xs, "y": ys, "mode": "lines", "line": {"color": "#444", "width": 1,
             "dash": "dot"}, "name": "step", "hoverinfo": "skip", "meta": "steps"})
    fig.add({"type": "scatter", "x": x, "y": np.full(len(x), -0.5), "mode": "text", "text": label,
             "textposition": "bottom right", "textfont": {"size": 9, "color": "#444"}, "showlegend": False,
             "hoverinfo": "skip", "meta": "steps"})


def _selected(fig: _Figure, index, lanes, row: int, origin: int) -> None:
    """Outline the selected event and draw its launch -> task flow (events sharing its corr)."""
    pos = index.position(row)
    if pos is None:
        return
    y_of = {ln.id: y for y, ln in enumerate(lanes)}
    pts = []
    for p in index.linked(pos):
        lane = index.lane_at(p)
        if lane.id not in y_of:
            continue
        y = y_of[lane.id]
        a, b = ms(index.ts[p], origin), ms(index.end[p], origin)
        pts.append((lane.device_side, a, b, y))
        fig.add({"type": "scatter", "x": [a, b], "y": [y, y], "mode": "lines", "opacity": 0.5, "name": "selected",
                 "line": {"color": HIGHLIGHT, "width": SLICE_PX + 6}, "showlegend": False, "hoverinfo": "skip",
                 "meta": "selected"})
    host = [p for p in pts if not p[0]]
    dev = [p for p in pts if p[0]]
    for h in host:
        for d in dev:
            fig.annotations.append({"x": d[1], "y": d[3], "ax": h[2], "ay": h[3], "xref": "x", "yref": "y",
                                    "axref": "x", "ayref": "y", "showarrow": True, "arrowhead": 3, "arrowwidth": 1.5,
                                    "arrowcolor": HIGHLIGHT, "text": "", "name": "flow"})


def _highlight(fig: _Figure, h: Highlight, origin: int) -> None:
    style = {"xref": "x", "yref": "paper", "y0": 0, "y1": 1, "layer": "below", "type": "rect"}
    for a, b in h.occurrences[:50]:
        fig.shapes.append({"x0": ms(a, origin), "x1": ms(max(b, a + 1), origin), "fillcolor": "rgba(214,39,40,0.10)",
                           "line": {"width": 0}, **style})
    fig.shapes.append({"x0": ms(h.start_ns, origin), "x1": ms(max(h.end_ns, h.start_ns + 1), origin),
                       "fillcolor": "rgba(214,39,40,0.08)", "line": {"color": HIGHLIGHT, "width": 1.5, "dash": "dot"},
                       "name": "finding", **style})


