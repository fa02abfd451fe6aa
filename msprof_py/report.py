"""Bottleneck reports: findings ranked by what they cost, with lookup entries and the numbers
behind them, as Markdown, self-contained HTML (works offline) or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analyzers import Frames, Severity, run
from analyzers.overview import overview
from msprof_py.errors import MsprofError
from msprof_py.trace import Trace
from msprof_py.trace.atomic import atomic_file

FORMATS = ("md", "html", "json")


def build(trace: Trace, names: list[str] | None = None, *, window: str = "all") -> dict[str, Any]:
    """Run the analyzers and collect everything a report shows (a plain, JSON-able dict)."""
    frames = Frames(trace, window=window)
    result = run(trace, names, frames=frames)
    summary = overview(frames, result)
    return {
        "schema": 1,
        "source_format": trace.meta.source_format,
        "summary": {k: v for k, v in summary.items() if k not in ("streams", "copies", "devices")},
        "devices": summary.get("devices", []),
        "streams": summary.get("streams", []),
        "copies": summary.get("copies", []),
        "findings": [f.to_dict() for f in result.ranked()],
        "skipped": result.skipped,
        "metrics": _jsonable(result.metrics),
    }


def worst(report: dict[str, Any]) -> Severity | None:
    sev = [Severity[f["severity"].upper()] for f in report["findings"]]
    return max(sev) if sev else None


def write(report: dict[str, Any], path: str | Path, fmt: str) -> Path:
    if fmt not in FORMATS:
        raise MsprofError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    text = {"md": to_markdown, "html": to_html, "json": to_json}[fmt](report)
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=_default) + "\n"


def to_markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = ["# msprof-py bottleneck report", "", "## Summary", "", "| metric | value |", "|---|---|"]
    for label, value in _summary_rows(s):
        lines.append(f"| {label} | {value} |")
    lines += ["", "## Findings (most costly first)", ""]
    if not report["findings"]:
        lines.append("No findings.")
    for i, f in enumerate(report["findings"], 1):
        where = _where(f)
        lines += [f"### {i}. [{f['severity']}] {_md(f['title'])} ({f['code']})", "",
                  f"{_md(f['message'])}", "",
                  f"- where: {where}; lost: {_lost(f)}",
                  f"- metric: {f['metric']} = {f['value']} (threshold {f['threshold']})"]
        lk = f.get("lookup")
        if lk:
            lines += [f"- symptom: {_md(lk['symptom'])}", f"- cause: {_md(lk['cause'])}",
                      f"- remedy: {_md(lk['remedy'])}"]
        lines.append("")
    if report["skipped"]:
        lines += ["## Analyzers skipped", ""] + [f"- {k}: {v}" for k, v in report["skipped"].items()] + [""]
    lines += ["## Streams", "", "| rank | device | stream | busy ms | idle ms | queue max | queue mean |",
              "|---|---|---|---|---|---|---|"]
    for r in report["streams"]:
        lines.append(f"| {r['rank']} | {r['device']} | {r['stream']} | {r['busy_ns'] / 1e6:.3f} | "
                     f"{r['idle_ns'] / 1e6:.3f} | {r['queue_len_max']} | {r['queue_len_mean']} |")
    if report["copies"]:
        lines += ["", "## Copies", "", "| rank | kind | count | GB/s mean | GB/s max |", "|---|---|---|---|---|"]
        for r in report["copies"]:
            lines.append(f"| {r['rank']} | {r['kind']} | {r['count']} | {r['gbps_mean']:.3f} | {r['gbps_max']:.3f} |")
    return "\n".join(lines) + "\n"


def to_html(report: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(_HTML)
    figures = _figures(report)
    return template.render(report=report, summary=_summary_rows(report["summary"]), figures=figures,
                           where=_where, lost=_lost)


def _figures(report: dict[str, Any]) -> list:
    """Plotly charts as HTML fragments; plotly.js is inlined once so the page works offline."""
    import plotly.graph_objects as go
    from markupsafe import Markup

    figs = []
    per_step = report["metrics"].get("bubbles", {}).get("per_step", [])
    if per_step:
        fig = go.Figure()
        by_dev: dict[str, list] = {}
        for r in per_step:
            by_dev.setdefault(f"rank {r['rank']} device {r['device']}", []).append(r)
        for label, rows in by_dev.items():
            fig.add_bar(name=label, x=[str(r["step"]) for r in rows], y=[r["bubble_ratio"] for r in rows])
        fig.update_layout(title="Bubble ratio per step", xaxis_title="step", yaxis_tickformat=".0%", height=320)
        figs.append(fig)
    lost = [(f["code"], (f.get("lost_ns") or 0) / 1e6) for f in report["findings"] if f.get("lost_ns")]
    if lost:
        fig = go.Figure(go.Bar(x=[v for _, v in lost], y=[f"{i + 1}. {c}" for i, (c, _) in enumerate(lost)],
                               orientation="h"))
        fig.update_layout(title="Time lost per finding (ms)", yaxis_autorange="reversed", height=120 + 24 * len(lost))
        figs.append(fig)
    out = []
    for i, fig in enumerate(figs):
        html = fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
        # Names end up inside <script>: keep a "</" in them from closing the element.
        out.append(Markup(html.replace("</script", "</scr\\ipt").replace("<\\/scr\\ipt", "</script")
                          if False else _safe_script(html)))
    return out


def _safe_script(html: str) -> str:
    """Escape '</' inside the JSON payloads of plotly's script blocks (not the closing tags)."""
    parts = html.split("</script>")
    return "</script>".join(p.replace("</", "<\\/") if "<script" in p else p for p in parts)


def _summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("span", f"{s.get('span_ns', 0) / 1e6:.3f} ms"), ("events", f"{s.get('events', 0):,}"),
            ("ranks", str(s.get("ranks", 0)))]
    if "steps" in s:
        rows += [("steps", str(s["steps"])), ("step time (mean)", f"{s['step_time_ns_mean'] / 1e6:.3f} ms"),
                 ("throughput", f"{s['throughput_steps_per_s']:.2f} steps/s")]
    if "device_utilisation_mean" in s:
        rows.append(("device utilisation", f"{s['device_utilisation_mean']:.1%}"))
    if "bubble_ratio" in s:
        rows.append(("bubble ratio", f"{s['bubble_ratio']:.1%}"))
    if s.get("comm_overlap_ratio") is not None:
        rows.append(("communication hidden under compute", f"{s['comm_overlap_ratio']:.1%}"))
    if s.get("peak_memory_bytes") is not None:
        rows.append(("peak device memory", f"{s['peak_memory_bytes'] / 2**20:.1f} MiB"))
    return rows


def _where(f: dict[str, Any]) -> str:
    parts = [f"{k} {f[k]}" for k in ("rank", "device", "stream") if f.get(k) is not None]
    if f.get("ts_ns") is not None:
        parts.append(f"at {f['ts_ns'] / 1e6:.3f} ms")
    return ", ".join(parts) or "whole trace"


def _lost(f: dict[str, Any]) -> str:
    if f.get("lost_ns"):
        return f"{f['lost_ns'] / 1e6:.3f} ms"
    if f.get("lost_bytes"):
        return f"{f['lost_bytes'] / 2**20:.1f} MiB"
    return "-"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _jsonable(o: Any) -> Any:
    return json.loads(json.dumps(o, default=_default))


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>msprof-py report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
.critical{color:#b00020}.warning{color:#b36b00}.info{color:#555}.finding{border-left:4px solid #ccc;padding-left:1em;margin:1em 0}
</style></head><body>
<h1>msprof-py bottleneck report</h1>
<h2>Summary</h2>
<table>{% for k, v in summary %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
{% for fig in figures %}<div class="figure">{{ fig }}</div>{% endfor %}
<h2>Findings (most costly first)</h2>
{% if not report.findings %}<p>No findings.</p>{% endif %}
{% for f in report.findings %}
<div class="finding"><h3 class="{{ f.severity }}">{{ loop.index }}. [{{ f.severity }}] {{ f.title }} <small>({{ f.code }})</small></h3>
<p>{{ f.message }}</p>
<p>where: {{ where(f) }}; lost: {{ lost(f) }}; {{ f.metric }} = {{ f.value }} (threshold {{ f.threshold }})</p>
{% if f.lookup %}<table><tr><th>symptom</th><td>{{ f.lookup.symptom }}</td></tr>
<tr><th>cause</th><td>{{ f.lookup.cause }}</td></tr><tr><th>remedy</th><td>{{ f.lookup.remedy }}</td></tr></table>{% endif %}
</div>{% endfor %}
{% if report.skipped %}<h2>Analyzers skipped</h2><ul>{% for k, v in report.skipped.items() %}<li>{{ k }}: {{ v }}</li>{% endfor %}</ul>{% endif %}
<h2>Streams</h2>
<table><tr><th>rank</th><th>device</th><th>stream</th><th>busy ms</th><th>idle ms</th><th>queue max</th><th>queue mean</th></tr>
{% for r in report.streams %}<tr><td>{{ r.rank }}</td><td>{{ r.device }}</td><td>{{ r.stream }}</td><td>{{ "%.3f"|format(r.busy_ns / 1e6) }}</td><td>{{ "%.3f"|format(r.idle_ns / 1e6) }}</td><td>{{ r.queue_len_max }}</td><td>{{ r.queue_len_mean }}</td></tr>{% endfor %}
</table>
{% if report.copies %}<h2>Copies</h2><table><tr><th>rank</th><th>kind</th><th>count</th><th>GB/s mean</th><th>GB/s max</th></tr>
{% for r in report.copies %}<tr><td>{{ r.rank }}</td><td>{{ r.kind }}</td><td>{{ r.count }}</td><td>{{ "%.3f"|format(r.gbps_mean) }}</td><td>{{ "%.3f"|format(r.gbps_max) }}</td></tr>{% endfor %}</table>{% endif %}
</body></html>
"""
