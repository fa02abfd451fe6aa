"""Before/after comparison of two reports, and terminal rendering of findings (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from msprof_py.trace.units import mib, ms, pct, sig

_METRICS = (
    # summary key, label, scale, higher is better, unit shown
    ("throughput_steps_per_s", "throughput (steps/s)", 1.0, True, ""),
    ("step_time_ns_mean", "step time (ms)", 1e-6, False, ""),
    ("device_utilisation_mean", "device utilisation", 1.0, True, "%"),
    ("idle_ratio", "device idle", 1.0, False, "%"),
    ("bubble_ratio", "bubble ratio", 1.0, False, "%"),
    ("comm_overlap_ratio", "communication hidden", 1.0, True, "%"),
    ("peak_memory_bytes", "peak memory (MiB)", 1 / 2**20, False, ""),
    ("span_ns", "span (ms)", 1e-6, False, ""),
)


def compare(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Metric deltas and, per finding code and cost unit, the count and cost before and after.

    A finding's cost is in its own unit (`cost_unit`: "ns" for time, "bytes" for memory, ""
    for none), so a code's row adds up costs of one unit only: time and memory never mix.
    Status: "fixed" (gone), "new" (not there before), else "better" / "worse" / "same" by the
    cost (by the count, for findings without a cost)."""
    rows = []
    for key, label, scale, higher_better, unit in _METRICS:
        a, b = _num_or_none(base["summary"].get(key)), _num_or_none(new["summary"].get(key))
        if a is None and b is None:
            continue
        change = None if a in (None, 0) or b is None else (b - a) / abs(a)
        better = None if change is None or change == 0 else (change > 0) == higher_better
        rows.append({"metric": label, "base": None if a is None else a * scale, "new": None if b is None else b * scale,
                     "change": change, "better": better, "unit": unit})
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for side, rep in (("base", base), ("new", new)):
        for f in rep["findings"]:
            unit = _unit(f)
            c = groups.setdefault((f["code"], unit), {"code": f["code"], "unit": unit, "base_count": 0, "new_count": 0,
                                                      "base_cost": 0, "new_cost": 0})
            c[f"{side}_count"] += 1
            c[f"{side}_cost"] += _cost(f, unit)
    findings = sorted(groups.values(), key=lambda c: (_UNIT_ORDER.get(c["unit"], 3),
                                                      -max(c["base_cost"], c["new_cost"]), c["code"]))
    for c in findings:
        if c["new_count"] == 0:
            c["status"] = "fixed"
        elif c["base_count"] == 0:
            c["status"] = "new"
        else:
            a, b = (c["base_cost"], c["new_cost"]) if c["unit"] else (c["base_count"], c["new_count"])
            c["status"] = "better" if b < a else "worse" if b > a else "same"
    return {"metrics": rows, "findings": findings}


_UNIT_ORDER = {"ns": 0, "bytes": 1, "": 2}


def _unit(f: dict[str, Any]) -> str:
    unit = f.get("cost_unit")
    if unit is not None:
        return unit
    return "ns" if f.get("lost_ns") is not None else "bytes" if f.get("lost_bytes") is not None else ""


def _cost(f: dict[str, Any], unit: str) -> int | float:
    if unit == "ns":
        return f.get("lost_ns") or 0
    if unit == "bytes":
        return f.get("lost_bytes") or 0
    return 0


def _num_or_none(v: Any) -> float | None:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        return None
    return v


def fix_text(f: dict[str, Any]) -> str:
    """A finding's predicted fix as people read it ('fix: launch -> saves 1.20 ms (6.1%)'); ''
    when it has none (analyzers.whatif)."""
    w = f.get("what_if")
    if not w:
        return ""
    return f"fix: {w['remedy']} -> saves {ms(w['saving_ns'])} ({pct(w['saving_share'])})"


def cost_text(cost: Any, unit: str) -> str:
    """A cost in its unit, as people read it: time in ms, memory in MiB; '-' without a unit."""
    if cost is None or not unit:
        return "-"
    return ms(cost) if unit == "ns" else mib(cost)


def render_diff(table: dict[str, Any], base: str, new: str) -> Group:
    t = Table(title=f"{base} -> {new}")
    for col in ("metric", "base", "new", "change"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    for r in table["metrics"]:
        change = "" if r["change"] is None else pct(r["change"], signed=True)
        style = "" if r["better"] is None else ("green" if r["better"] else "red")
        fmt = pct if r.get("unit") == "%" else _num
        t.add_row(r["metric"], fmt(r["base"]), fmt(r["new"]), Text(change, style=style))
    f = Table(title="findings (cost: time in ms, memory in MiB)")
    for col in ("code", "findings", "base cost", "new cost", "status"):
        f.add_column(col, justify="left" if col in ("code", "status") else "right")
    for c in table["findings"]:
        style = {"fixed": "green", "better": "green", "new": "red", "worse": "red"}.get(c["status"], "")
        f.add_row(c["code"], f"{c['base_count']} -> {c['new_count']}",
                  cost_text(c["base_cost"], c["unit"]) if c["base_count"] else "-",
                  cost_text(c["new_cost"], c["unit"]) if c["new_count"] else "-", Text(c["status"], style=style))
    return Group(t, f)


def render_findings(rep: dict[str, Any], title: str) -> Group:
    t = Table(title=f"{title}: findings, most costly first", show_lines=True)
    for col in ("#", "severity", "finding", "where", "lost", "remedy"):
        t.add_column(col, overflow="fold")
    for i, f in enumerate(rep["findings"], 1):
        where = ", ".join(f"{k} {f[k]}" for k in ("rank", "device", "stream") if f.get(k) is not None) or "-"
        unit = _unit(f)
        lost = cost_text(_cost(f, unit), unit) if _cost(f, unit) or unit != "ns" or not f.get("what_if") else "-"
        style = {"critical": "bold red", "warning": "yellow"}.get(f["severity"], "")
        remedy = (f.get("lookup") or {}).get("remedy", "")
        fix = fix_text(f)
        t.add_row(str(i), Text(f["severity"], style=style),
                  Text(f"{f['title']} ({f['code']})\n{f['message']}" + (f"\n{fix}" if fix else "")),
                  where, lost, Text(remedy))
    parts = [t]
    if rep["skipped"]:
        parts.append(Text("skipped: " + "; ".join(f"{k}: {v}" for k, v in rep["skipped"].items()), style="dim"))
    if not rep["findings"]:
        parts.insert(0, Text("No findings.", style="green"))
    return Group(*parts)


def _num(v: Any) -> str:
    """A metric for people: 3 significant digits (JSON keeps full precision); counts as they are."""
    if v is None:
        return "-"
    return sig(v) if isinstance(v, float) else f"{v:,}"
