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
        if _num_or_none(base["summary"].get(key)) is None and _num_or_none(new["summary"].get(key)) is None:
            continue
        rows.append(_metric_row(base, new, key, label, scale, higher_better, unit))
    many = any((r["summary"].get("rank_steps") or 0) > (r["summary"].get("steps") or 0) for r in (base, new))
    if many:
        # Job steps (one step number across ranks) on a multi-rank run: their count, and the slowest.
        at = next((i + 1 for i, r in enumerate(rows) if r["metric"] == "step time (ms)"), len(rows))
        rows[at:at] = [_metric_row(base, new, *m) for m in _JOB_METRICS
                       if _num_or_none(base["summary"].get(m[0])) is not None
                       or _num_or_none(new["summary"].get(m[0])) is not None]
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
    return {"metrics": rows, "findings": findings, "steps": _job_step_rows(base, new), "multi_rank": many}


#: Metric rows of a multi-rank run's job steps (summary key, label, scale, higher is better or None, unit).
_JOB_METRICS = (("steps", "job steps", 1, None, ""), ("step_time_ns_max", "slowest job step (ms)", 1e-6, False, ""))


def _metric_row(base: dict[str, Any], new: dict[str, Any], key: str, label: str, scale: float,
                higher_better: bool | None, unit: str) -> dict[str, Any]:
    a, b = _num_or_none(base["summary"].get(key)), _num_or_none(new["summary"].get(key))
    change = None if a in (None, 0) or b is None else (b - a) / abs(a)
    better = None if change is None or change == 0 or higher_better is None else (change > 0) == higher_better
    return {"metric": label, "base": None if a is None else a * scale, "new": None if b is None else b * scale,
            "change": change, "better": better, "unit": unit}


def _job_step_rows(base: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per job step number of either report (`job_steps`): its time before and after (ns; None
    where a run has no such step), the change, and the slowest rank of each run."""
    a = {j["step"]: j for j in base.get("job_steps") or []}
    b = {j["step"]: j for j in new.get("job_steps") or []}
    out = []
    for step in sorted(a.keys() | b.keys()):
        x, y = a.get(step), b.get(step)
        ns_a, ns_b = (x or {}).get("step_ns"), (y or {}).get("step_ns")
        out.append({"step": step, "base_ns": ns_a, "new_ns": ns_b,
                    "change": None if not ns_a or ns_b is None else (ns_b - ns_a) / ns_a,
                    "base_slowest_rank": (x or {}).get("slowest_rank"), "new_slowest_rank": (y or {}).get("slowest_rank")})
    return out


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
    parts = [t]
    if table.get("multi_rank") and table.get("steps"):
        s = Table(title="job steps (ms, first rank's start to last rank's end)")
        for col in ("step", "base", "new", "change", "slowest rank"):
            s.add_column(col, justify="right")
        for r in table["steps"]:
            change = "" if r["change"] is None else pct(r["change"], signed=True)
            style = "" if not r["change"] else ("green" if r["change"] < 0 else "red")
            slowest = f"{_or_dash(r['base_slowest_rank'])} -> {_or_dash(r['new_slowest_rank'])}"
            s.add_row(str(r["step"]), _num(None if r["base_ns"] is None else r["base_ns"] / 1e6),
                      _num(None if r["new_ns"] is None else r["new_ns"] / 1e6), Text(change, style=style), slowest)
        parts.append(s)
    return Group(*parts, f)


def _or_dash(v: Any) -> str:
    return "-" if v is None else str(v)


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
