"""Before/after comparison of two reports, and terminal rendering of findings (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

_METRICS = (
    ("throughput_steps_per_s", "throughput (steps/s)", 1.0, True),
    ("step_time_ns_mean", "step time (ms)", 1e-6, False),
    ("device_utilisation_mean", "device utilisation", 1.0, True),
    ("bubble_ratio", "bubble ratio", 1.0, False),
    ("comm_overlap_ratio", "communication hidden", 1.0, True),
    ("peak_memory_bytes", "peak memory (MiB)", 1 / 2**20, False),
    ("span_ns", "span (ms)", 1e-6, False),
)


def compare(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Metric deltas and, per finding code, the time / bytes lost before and after."""
    rows = []
    for key, label, scale, higher_better in _METRICS:
        a, b = base["summary"].get(key), new["summary"].get(key)
        if a is None and b is None:
            continue
        change = None if a in (None, 0) or b is None else (b - a) / abs(a)
        better = None if change is None or change == 0 else (change > 0) == higher_better
        rows.append({"metric": label, "base": None if a is None else a * scale, "new": None if b is None else b * scale,
                     "change": change, "better": better})
    codes: dict[str, dict[str, Any]] = {}
    for side, rep in (("base", base), ("new", new)):
        for f in rep["findings"]:
            c = codes.setdefault(f["code"], {"code": f["code"], "base_lost_ns": 0, "new_lost_ns": 0, "base_count": 0,
                                            "new_count": 0, "base_lost_bytes": 0, "new_lost_bytes": 0})
            c[f"{side}_count"] += 1
            c[f"{side}_lost_ns"] += f.get("lost_ns") or 0
            c[f"{side}_lost_bytes"] += f.get("lost_bytes") or 0
    findings = sorted(codes.values(), key=lambda c: -(c["base_lost_ns"] + c["new_lost_ns"]))
    for c in findings:
        c["status"] = ("fixed" if c["new_count"] == 0 else "new" if c["base_count"] == 0 else
                       "better" if c["new_lost_ns"] < c["base_lost_ns"] else
                       "worse" if c["new_lost_ns"] > c["base_lost_ns"] else "same")
    return {"metrics": rows, "findings": findings}


def render_diff(table: dict[str, Any], base: str, new: str) -> Group:
    t = Table(title=f"{base} -> {new}")
    for col in ("metric", "base", "new", "change"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    for r in table["metrics"]:
        change = "" if r["change"] is None else f"{r['change']:+.1%}"
        style = "" if r["better"] is None else ("green" if r["better"] else "red")
        t.add_row(r["metric"], _num(r["base"]), _num(r["new"]), Text(change, style=style))
    f = Table(title="findings")
    for col in ("code", "base lost ms", "new lost ms", "status"):
        f.add_column(col)
    for c in table["findings"]:
        f.add_row(c["code"], f"{c['base_lost_ns'] / 1e6:.3f}", f"{c['new_lost_ns'] / 1e6:.3f}", c["status"])
    return Group(t, f)


def render_findings(rep: dict[str, Any], title: str) -> Group:
    t = Table(title=f"{title}: findings, most costly first", show_lines=True)
    for col in ("#", "severity", "finding", "where", "lost", "remedy"):
        t.add_column(col, overflow="fold")
    for i, f in enumerate(rep["findings"], 1):
        where = ", ".join(f"{k} {f[k]}" for k in ("rank", "device", "stream") if f.get(k) is not None) or "-"
        lost = (f"{f['lost_ns'] / 1e6:.3f} ms" if f.get("lost_ns") else
                f"{f['lost_bytes'] / 2**20:.1f} MiB" if f.get("lost_bytes") else "-")
        style = {"critical": "bold red", "warning": "yellow"}.get(f["severity"], "")
        remedy = (f.get("lookup") or {}).get("remedy", "")
        t.add_row(str(i), Text(f["severity"], style=style), Text(f"{f['title']} ({f['code']})\n{f['message']}"),
                  where, lost, Text(remedy))
    parts = [t]
    if rep["skipped"]:
        parts.append(Text("skipped: " + "; ".join(f"{k}: {v}" for k, v in rep["skipped"].items()), style="dim"))
    if not rep["findings"]:
        parts.insert(0, Text("No findings.", style="green"))
    return Group(*parts)


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.3f}" if isinstance(v, float) else f"{v:,}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"
