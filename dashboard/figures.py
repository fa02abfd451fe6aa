"""Pure figure builders: data in, plotly figure out (no Dash, no I/O).

Every text that comes from a trace (event, thread, counter and kernel names, args) is escaped
before it reaches plotly, whose labels understand a little HTML: a kernel named
`<img src=x onerror=alert(1)>` is shown as those characters.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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
COUNTER_PX = 110
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


def timeline_figure(ds, ranks: list[int] | None, t0: int, t1: int, *, counters: list[tuple[int, str]] = (),
                    highlight: Highlight | None = None, selected: int | None = None,
                    budget: int = MAX_SHAPES, buckets: int = BUCKETS) -> go.Figure:
    """Lanes of `ranks` (host threads, then device streams) over [t0, t1] ns, counter tracks under
    them, step markers, a finding's highlight and the selected event with its launch flow.

    `layout.meta` tells what was sent: the window in ns, the shape count and how many lanes
    show events or occupancy (the browser tests and the benchmark read it)."""
    index = ds.lanes
    origin = ds.span[0]
    lanes = index.lanes_of(ranks)
    views = index.window(lanes, t0, t1, budget=budget, buckets=buckets)
    counters = [k for k in counters if k in ds.counters.series]
    rows = 1 + len(counters)
    lane_h = max(LANE_PX * len(lanes), 120)
    heights = [lane_h] + [COUNTER_PX] * len(counters)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=min(0.04, 24 / sum(heights)),
                        row_heights=[h / sum(heights) for h in heights])
    shapes = _slices(fig, index, views, origin)
    shapes += _occupancy(fig, views, origin)
    _steps(fig, ds, ranks, t0, t1, origin, len(lanes))
    if selected is not None:
        _selected(fig, index, lanes, selected, origin)
    for k, key in enumerate(counters):
        x, y = ds.counters.window(key, t0, t1, n_out=2 * buckets)
        fig.add_trace(go.Scattergl(x=(x - origin) / 1e6, y=y, mode="lines", line_shape="hv", name=text(key[1], 80),
                                   line=dict(width=1.5), showlegend=False,
                                   hovertemplate="%{y:,.4~g}<extra>" + text(f"r{key[0]} {key[1]}", 80) + "</extra>"),
                      row=2 + k, col=1)
        fig.update_yaxes(title_text=text(_short_counter(key), 40), title_font_size=10, row=2 + k, col=1,
                         fixedrange=True, rangemode="tozero")
    if highlight is not None:
        _highlight(fig, highlight, origin)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(lanes))), ticktext=[text(ln.label, 60) for ln in lanes],
                     range=[len(lanes) - 0.5, -0.5], fixedrange=True, showgrid=False, zeroline=False,
                     automargin=True, row=1, col=1)
    fig.update_xaxes(range=[ms(t0, origin), ms(t1, origin)], showspikes=False)
    fig.update_xaxes(title_text="time since trace start (ms)", row=rows, col=1)
    n_events = sum(1 for v in views if v.events is not None)
    fig.update_layout(
        template="plotly_white", height=sum(heights) + 90, margin=dict(l=10, r=10, t=30, b=50),
        dragmode="zoom", hovermode="closest", showlegend=True, uirevision=None,
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
        meta={"window_ns": [int(t0), int(t1)], "shapes": int(shapes), "lanes_events": n_events,
              "lanes_occupancy": len(views) - n_events, "budget": budget},
    )
    return fig


def _slices(fig: go.Figure, index, views: list[LaneView], origin: int) -> int:
    """One WebGL line trace per kind: each slice a thick segment; hover points at their middles."""
    pos = [(v.events, y) for y, v in enumerate(views) if v.events is not None and len(v.events)]
    if not pos:
        return 0
    idx = np.concatenate([p for p, _ in pos])
    lane_y = np.concatenate([np.full(len(p), y, np.float64) for p, y in pos])
    kinds = index.kind[idx]
    total = 0
    for code in np.unique(kinds).tolist():
        sel = kinds == code
        e, y = idx[sel], lane_y[sel]
        kind = index.kind_names[code]
        colour = KIND_COLOURS.get(kind, OTHER_COLOUR)
        a, b = ms(index.ts[e], origin), ms(index.end[e], origin)
        xs = np.column_stack([a, b, np.full(len(e), np.nan)]).ravel()
        ys = np.column_stack([y, y, np.full(len(e), np.nan)]).ravel()
        fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", line=dict(width=SLICE_PX, color=colour), name=kind,
                                   legendgroup=kind, hoverinfo="skip", connectgaps=False), row=1, col=1)
        fig.add_trace(go.Scattergl(x=(a + b) / 2, y=y, mode="markers", name=kind, legendgroup=kind, showlegend=False,
                                   marker=dict(size=SLICE_PX, color="rgba(0,0,0,0)", symbol="square"),
                                   customdata=index.row[e], hovertext=_hover(index, e, kind),
                                   hoverinfo="text", hoverlabel=dict(bgcolor=colour)), row=1, col=1)
        total += len(e)
    return total


def _hover(index, e: np.ndarray, kind: str) -> list[str]:
    names = index.names(e)
    dur = (index.end[e] - index.ts[e]) / 1e3
    nbytes = index.column("bytes", e)
    args = index.column("args", e)
    out = []
    for n, d, b, a in zip(names, dur.tolist(), nbytes, args):
        line = f"<b>{text(n, 120)}</b><br>{kind} · {d:,.3f} us"
        if b is not None:
            line += f" · {int(b):,} B"
        if a:
            line += "<br>" + "<br>".join(text(part, 100) for part in _arg_lines(a))
        out.append(line)
    return out


def _arg_lines(args: str, limit: int = 6) -> list[str]:
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


def _occupancy(fig: go.Figure, views: list[LaneView], origin: int) -> int:
    """Lanes too busy to draw event by event: one heatmap row each, shaded by the share of each
    pixel bucket their events cover."""
    total = 0
    first = True
    for y, v in enumerate(views):
        if v.events is not None:
            continue
        drawn = v.drawn
        mid = ms((v.edges[:-1] + v.edges[1:]) / 2, origin)
        z = np.where(drawn, np.maximum(v.busy, 0.04), np.nan)
        hover = [f"{text(v.lane.label, 60)}<br>{b:.0%} busy · {c:,} events" if d else ""
                 for b, c, d in zip(v.busy.tolist(), v.counts.tolist(), drawn.tolist())]
        fig.add_trace(go.Heatmap(x=mid, y=[y], z=[z], zmin=0, zmax=1, showscale=False, xgap=0,
                                 colorscale=[[0, "#c6dbef"], [1, "#08306b"]], hoverinfo="text", hovertext=[hover],
                                 name="occupancy", legendgroup="occupancy", showlegend=first), row=1, col=1)
        first = False
        total += int(np.count_nonzero(drawn))
    return total


def _steps(fig: go.Figure, ds, ranks, t0: int, t1: int, origin: int, n_lanes: int) -> None:
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
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#444", width=1, dash="dot"), name="step",
                             hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=np.full(len(x), -0.5), mode="text", text=label, textposition="bottom right",
                             textfont=dict(size=9, color="#444"), showlegend=False, hoverinfo="skip"), row=1, col=1)


def _selected(fig: go.Figure, index, lanes, row: int, origin: int) -> None:
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
        fig.add_trace(go.Scatter(x=[a, b], y=[y, y], mode="lines", line=dict(color=HIGHLIGHT, width=SLICE_PX + 6),
                                 opacity=0.5, name="selected", showlegend=False, hoverinfo="skip"), row=1, col=1)
    host = [p for p in pts if not p[0]]
    dev = [p for p in pts if p[0]]
    for h in host:
        for d in dev:
            fig.add_annotation(x=d[1], y=d[3], ax=h[2], ay=h[3], xref="x", yref="y", axref="x", ayref="y",
                               showarrow=True, arrowhead=3, arrowwidth=1.5, arrowcolor=HIGHLIGHT, text="")


def _highlight(fig: go.Figure, h: Highlight, origin: int) -> None:
    style = dict(xref="x", yref="paper", y0=0, y1=1, layer="below")
    for a, b in h.occurrences[:50]:
        fig.add_shape(type="rect", x0=ms(a, origin), x1=ms(max(b, a + 1), origin),
                      fillcolor="rgba(214,39,40,0.10)", line=dict(width=0), **style)
    fig.add_shape(type="rect", x0=ms(h.start_ns, origin), x1=ms(max(h.end_ns, h.start_ns + 1), origin),
                  fillcolor="rgba(214,39,40,0.08)", line=dict(color=HIGHLIGHT, width=1.5, dash="dot"), **style)
    if h.label:
        fig.add_annotation(x=ms(h.start_ns, origin), y=1, xref="x", yref="paper", yanchor="bottom", xanchor="left",
                           text=text(h.label, 80), showarrow=False, font=dict(color=HIGHLIGHT, size=11))


def _short_counter(key: tuple[int, str]) -> str:
    return f"r{key[0]} {key[1]}"
