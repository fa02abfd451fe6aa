"""Memory: allocated and reserved memory per device over time, leak suspects with their growth
fit, and the caching allocator's fragmentation at its peak.

Where the numbers come from (typed columns only, so imported and emulated traces agree):

- curves: the alloc/free rows (`Frames.memory`): the allocator's total after each event
  (`value`) and the live bytes (allocs minus frees), plus the memory counters whose names say
  allocated / reserved / memory used (emulated traces; a real Kineto trace has only the
  `[memory]` instants);
- leak suspects: the MEMORY_LEAK findings and the memory analyzer's fit in
  `report["metrics"]["memory"]["r{rank}.d{device}"]` (bytes per step, R^2, live bytes at
  each step's end), the call site from the finding's evidence;
- fragmentation: reserved minus allocated at its peak (the analyzer's measure), the failed
  allocations (kind alloc_fail) with the largest free block they reported, and the
  MEMORY_FRAGMENTATION findings.

Every finding links to the timeline at its window (`/timeline?trace=..&finding=i`).
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from dashboard.data import Dataset
from dashboard.figures_resources import (
    Fragmentation,
    LeakFit,
    allocation_series,
    counter_series,
    device_label,
    fragmentation,
    leak_fits,
    memory_figure,
)
from dashboard.pages import common

PATH = "/memory"
NAME = "Memory"
CODES = ("MEMORY_LEAK", "MEMORY_FRAGMENTATION")
GRAPH_CONFIG = {"displaylogo": False, "scrollZoom": True}


def layout(store, entry, params: dict[str, Any]):
    ds: Dataset = entry.dataset
    ranks = common.ranks_param(params, entry)
    mem = ds.frames.memory
    counters = ds.frames.counters
    failures = ds.frames.alloc_failures
    if ranks is not None:
        mem, counters, failures = (d[d["rank"].isin(ranks)] for d in (mem, counters, failures))
    series = allocation_series(mem) + counter_series(counters)
    findings = [(i, f) for i, f in enumerate(ds.findings)
                if f["code"] in CODES and (ranks is None or f.get("rank") in ranks)]
    fits = [fit for fit in leak_fits(ds.findings, ds.report["metrics"].get("memory") or {}, ds.frames.steps)
            if ranks is None or fit.rank in ranks]
    parts: list[Any] = [common.controls(store, entry, params, ranks=ranks), html.H2("Device memory")]
    if series:
        devices = len({(s.rank, s.device) for s in series})
        parts.append(html.P(
            "Allocated: each alloc/free event's total (solid); live: allocs minus frees since the trace began "
            "(dotted, what the leak fit reads); from memory counters: allocated (long dashes), reserved (dashed) and "
            "memory used (dash-dot). "
            + (f"{devices} devices: the first 4 are drawn, the legend shows the others." if devices > 4 else ""),
            className="hint"))
        parts.append(dcc.Graph(id="mem-curves", figure=memory_figure(series, fits, ds.span[0]), config=GRAPH_CONFIG))
    else:
        parts.append(html.P("No memory events in this trace: no alloc/free events and no memory counters "
                            "(record with memory profiling on, e.g. the PyTorch profiler's profile_memory=True).",
                            className="hint", id="mem-none"))
    parts += [html.H3("Leak suspects"), html.Div(_leaks(entry, fits), id="mem-leaks"),
              html.H3("Fragmentation at the peak"),
              html.Div(_fragmentation(entry, fragmentation(counters, failures, series), findings), id="mem-frag")]
    return html.Div(parts)


def _href(entry, index: int) -> str:
    return "/timeline" + common.query(trace=entry.index, finding=index)


def _leaks(entry, fits: list[LeakFit]):
    if not fits:
        return html.P("No leak suspects: live memory does not grow step after step on any device shown.",
                      className="hint")
    head = html.Tr([html.Th(h) for h in ("finding", "where", "growth per step", "R²", "steps", "leaked in all",
                                         "call site")])
    rows = []
    for fit in fits:
        f = entry.dataset.findings[fit.finding]
        site = f"{fit.site[0]} ({fit.site[1]} × {common.fmt_bytes(fit.site[2])})" if fit.site else "-"
        rows.append(html.Tr([
            html.Td([html.Span(f["severity"], className=f"sev sev-{f['severity']}"),
                     dcc.Link(f"#{fit.finding + 1} {f['code']}", href=_href(entry, fit.finding),
                              id=f"mem-finding-{fit.finding}")]),
            html.Td(device_label(fit.rank, fit.device)),
            html.Td(common.fmt_bytes(round(fit.bytes_per_step))),  # a least-squares slope: whole bytes
            html.Td(f"{fit.r2:.3f}"),
            html.Td(str(fit.steps)),
            html.Td(common.fmt_bytes(fit.lost_bytes)),
            html.Td(site),
        ]))
    return html.Table([html.Thead(head), html.Tbody(rows)], className="kv")


def _fragmentation(entry, frags: list[Fragmentation], findings: list[tuple[int, dict[str, Any]]]):
    parts: list[Any] = []
    measured = [f for f in frags if f.reserved is not None or f.failures]
    if measured:
        worst = max(measured, key=lambda f: (f.failures, f.unallocated or 0.0))
        parts.append(html.P(f"{device_label(worst.rank, worst.device)}"
                            + (f" (the most of {len(measured)} devices)" if len(measured) > 1 else "")
                            + (f" at {common.fmt_ns(worst.at_ns - entry.dataset.span[0])} into the trace"
                               if worst.at_ns is not None else ""), className="hint"))
        parts.append(html.Div(_cards(worst), className="metrics"))
        if len(measured) > 1:
            parts.append(html.Details([html.Summary(f"all {len(measured)} devices"), _frag_table(measured)]))
    elif frags:
        peak = max(frags, key=lambda f: f.peak_allocated or 0.0)
        parts.append(html.Div([common.metric_card("peak allocated (allocator's total)",
                                                  common.fmt_bytes(peak.peak_allocated),
                                                  "mem-peak-allocated")], className="metrics"))
        parts.append(html.P("No reserved-memory counter and no failed allocation in this trace: fragmentation "
                            "cannot be measured.", className="hint"))
    else:
        parts.append(html.P("Nothing to measure fragmentation with in this trace.", className="hint"))
    frag = [(i, f) for i, f in findings if f["code"] == "MEMORY_FRAGMENTATION"]
    if frag:
        parts.append(html.Ol([html.Li([
            html.Span(f["severity"], className=f"sev sev-{f['severity']}"),
            dcc.Link(f"#{i + 1} {f['code']}: {f['title']}", href=_href(entry, i), id=f"mem-finding-{i}"),
            html.Span(f" · {common.where(f)} · costs {common.fmt_cost(f)}", className="hint"),
            html.Div(f["message"], className="message"),
        ]) for i, f in frag], className="findings-list"))
    else:
        parts.append(html.P("No fragmentation finding.", className="hint"))
    return parts


def _cards(f: Fragmentation) -> list[html.Div]:
    cards = [common.metric_card("peak allocated (allocator's total)", common.fmt_bytes(f.peak_allocated),
                                "mem-peak-allocated")]
    if f.reserved is not None:
        cards += [
            common.metric_card("reserved at the peak", common.fmt_bytes(f.reserved), "mem-reserved"),
            common.metric_card("allocated at the peak", common.fmt_bytes(f.allocated), "mem-allocated"),
            common.metric_card("free in the cache (reserved − allocated)", common.fmt_bytes(f.unallocated),
                               "mem-unallocated"),
            common.metric_card("share of reserved not allocated", "-" if f.ratio is None else f"{f.ratio:.1%}",
                               "mem-frag-ratio"),
        ]
    if f.failures:
        cards += [
            common.metric_card("failed allocations", str(f.failures), "mem-failures"),
            common.metric_card("largest failed request", common.fmt_bytes(f.requested), "mem-requested"),
            common.metric_card("largest free block", common.fmt_bytes(f.largest_free), "mem-largest-free"),
        ]
    return cards


def _frag_table(frags: list[Fragmentation]) -> html.Table:
    head = html.Tr([html.Th(h) for h in ("device", "peak allocated", "reserved", "allocated", "free in the cache",
                                         "share", "failed allocations", "largest free block")])
    rows = [html.Tr([html.Td(device_label(f.rank, f.device)), html.Td(common.fmt_bytes(f.peak_allocated)),
                     html.Td(common.fmt_bytes(f.reserved)), html.Td(common.fmt_bytes(f.allocated)),
                     html.Td(common.fmt_bytes(f.unallocated)), html.Td("-" if f.ratio is None else f"{f.ratio:.1%}"),
                     html.Td(str(f.failures)), html.Td(common.fmt_bytes(f.largest_free))]) for f in frags]
    return html.Table([html.Thead(head), html.Tbody(rows)], className="kv")


def register(app, store) -> None:
    return None
