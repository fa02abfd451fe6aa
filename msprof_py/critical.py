"""`msprof-py critical-path`: what set a run's (or a step's) time, rank by rank.

A view of analyzers.causality.critical_path: per rank, the region, the critical path's length
(the recorded activity on it, as Holistic Trace Analysis measures it), its time per cause (the
region's time off the path is `untraced`, so the causes sum to the region), and the ops that
made it up; across ranks, the rank whose path is longest, and the job's path: the ranks' paths
joined where each collective released its ranks, so it runs on whichever rank the others waited
for and says how much of the time each rank set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from analyzers.causality.critical_path import CP_CAUSE_LABELS, CP_CAUSES, CriticalPath, critical_paths
from analyzers.frames import Frames
from msprof_py.errors import MsprofError
from msprof_py.trace.schema import Trace
from msprof_py.trace.units import sig


def summarize(trace: Trace, ranks: list[int] | None = None, step: int | None = None, top: int = 10) -> dict[str, Any]:
    """The critical path of each of `ranks` (default: all) over the run or over `step`, as a dict."""
    return paths(Frames(trace), ranks, step, top)


def paths(frames: Frames, ranks: list[int] | None = None, step: int | None = None, top: int = 10) -> dict[str, Any]:
    """`summarize` over frames already built (the report's). `job` is the job's path across the
    ranks (None when no collective joins two of them, or one rank is asked for)."""
    present = sorted({int(r) for r in np.unique(frames.table.column("rank").to_numpy())})
    _check_ranks(ranks, present)
    regions: dict[int, tuple[int, int]] | None = None
    if step is not None:
        steps = frames.steps
        regions = {}
        for rank in ranks or present:
            row = steps[(steps["rank"] == rank) & (steps["step"] == step)]
            if row.empty:
                have = sorted(int(s) for s in steps.loc[steps["rank"] == rank, "step"].dropna().unique())
                raise MsprofError(f"rank {rank} has no step {step}",
                                  hint=f"its steps are {', '.join(map(str, have))}" if have
                                  else "the trace records no steps; leave out --step")
            regions[rank] = (int(row["ts"].min()), int(row["end"].max()))
    elif ranks:
        regions = {r: (None, None) for r in ranks}  # type: ignore[misc]
    per, job = critical_paths(frames, regions)
    out = []
    for rank, cp in per.items():
        out.append({"rank": rank, **_path(cp, top),
                    "by_edge_ns": {k: int(v) for k, v in cp.by_edge().items()}})
    longest = max(out, key=lambda r: (r["length_ns"], -r["rank"])) if out else None
    return {"step": step, "ranks": out, "longest_rank": longest["rank"] if longest else None,
            "job": None if job is None else {**_path(job, top), **_ranks_of(job)}}


def _path(cp: CriticalPath, top: int) -> dict[str, Any]:
    blame = cp.blame()
    return {"start_ns": cp.start, "end_ns": cp.end, "region_ns": cp.region_ns, "length_ns": cp.length_ns,
            "blame_ns": {c: int(blame[c]) for c in CP_CAUSES},
            "top_ops": [{"rank": int(r.rank), "name": r.name, "where": r.where, "cause": r.cause, "ns": int(r.ns),
                         "count": int(r.count)} for r in cp.top_ops(top).itertuples()]}


def _ranks_of(job: CriticalPath) -> dict[str, Any]:
    """Which ranks the job's path ran on (ns each, most first), the rank with most of it, and how
    often it crossed from a waiting rank into the rank it waited for."""
    by = job.by_rank()
    seg = job.segments
    crossings = int((seg["where"].astype(str).str.startswith("waiting for rank")).sum()) if len(seg) else 0
    return {"by_rank_ns": {str(int(r)): int(ns) for r, ns in by.items()},
            "top_rank": int(by.index[0]) if len(by) else None, "crossings": crossings}


def per_step(trace: Trace, ranks: list[int] | None = None) -> dict[str, Any]:
    """Per step (ProfilerStep# / the step slices), each rank's critical path over it: its length, the
    step's length, its costliest cause and op; the rank whose path is longest; and the job's path
    over the step (which rank set the step's time) when collectives join the ranks."""
    frames = Frames(trace)
    present = sorted({int(r) for r in np.unique(frames.table.column("rank").to_numpy())})
    _check_ranks(ranks, present)
    steps = frames.steps.dropna(subset=["step"])
    if steps.empty:
        raise MsprofError("the trace records no steps", hint="leave out --per-step for the whole run")
    out = []
    for step, g in steps.groupby("step", sort=True):
        regions = {int(r): (int(x["ts"].min()), int(x["end"].max())) for r, x in g.groupby("rank")
                   if ranks is None or int(r) in ranks}
        if not regions:
            continue
        paths_, job = critical_paths(frames, regions)
        per = [{"rank": rank, **_headline(cp)} for rank, cp in paths_.items()]
        longest = max(per, key=lambda r: (r["length_ns"], -r["rank"]))
        out.append({"step": int(step), "ranks": per, "longest_rank": longest["rank"],
                    "job": None if job is None else {**_headline(job), **_ranks_of(job)}})
    return {"steps": out}


def _headline(cp: CriticalPath) -> dict[str, Any]:
    blame = cp.blame().drop("untraced")
    top = cp.top_ops(1)
    return {"region_ns": cp.region_ns, "length_ns": cp.length_ns,
            "top_cause": str(blame.idxmax()) if blame.max() > 0 else None, "top_cause_ns": int(blame.max()),
            "top_op": top["name"].iloc[0] if len(top) else None, "top_op_ns": int(top["ns"].iloc[0]) if len(top) else 0}


def _check_ranks(ranks: list[int] | None, present: list[int]) -> None:
    if ranks:
        missing = sorted(set(ranks) - set(present))
        if missing:
            raise MsprofError(f"no rank {', '.join(map(str, missing))} in the trace",
                              hint=f"its ranks are {', '.join(map(str, present)) or 'none'}")


def render_steps(summary: dict[str, Any], title: str) -> RenderableType:
    job = any(s.get("job") for s in summary["steps"])
    t = Table(title=f"critical path per step of {title}", title_justify="left")
    for col, just in (("step", "right"), ("rank", "right"), ("path ms", "right"), ("step ms", "right"),
                      ("costliest cause", "left"), ("ms", "right"), ("costliest op", "left"), ("op ms", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in summary["steps"]:
        if s.get("job"):
            r = s["job"]
            rank = ", ".join(f"{k} ({100 * v / max(r['length_ns'], 1):.0f}%)" for k, v in list(r["by_rank_ns"].items())[:3])
        else:
            r = next(x for x in s["ranks"] if x["rank"] == s["longest_rank"])
            rank = str(r["rank"])
        t.add_row(Text(str(s["step"])), Text(rank), Text(_ms(r["length_ns"])), Text(_ms(r["region_ns"])),
                  Text(CP_CAUSE_LABELS.get(r["top_cause"], "-") if r["top_cause"] else "-"), Text(_ms(r["top_cause_ns"])),
                  Text((r["top_op"] or "-")[:60]), Text(_ms(r["top_op_ns"])))
    note = ("rank: the ranks the job's critical path over the step ran on (its share), through each collective "
            "into the rank it waited for" if job else "rank: the rank whose path over the step is longest")
    return Group(t, Text(note))


def _ms(ns: int) -> str:
    """ns as ms for a column headed in ms, 3 significant digits (the one time format of text output)."""
    return sig(ns / 1e6)


def rows(summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per rank of `paths`' summary, for reading: title, the causes with time (label, ms, share) and
    the top ops (name, where, cause, ms, count); what the CLI, the Markdown and the HTML report show."""
    out = []
    job = (summary or {}).get("job")
    items = ([("job", job)] if job else []) + [(f"rank {r['rank']}", r) for r in (summary or {}).get("ranks", [])]
    for label, r in items:
        region = max(r["region_ns"], 1)
        title = f"{label}: path {_ms(r['length_ns'])} ms of {_ms(r['region_ns'])} ms"
        if label == "job":
            on = ", ".join(f"rank {k} {_ms(v)} ms" for k, v in list(r["by_rank_ns"].items())[:6])
            title += f", on {on}; {r['crossings']} crossing{'s' if r['crossings'] != 1 else ''} into a rank waited for"
        out.append({
            "title": title,
            "causes": [(CP_CAUSE_LABELS[c], _ms(ns), f"{100 * ns / region:.1f}%")
                       for c, ns in r["blame_ns"].items() if ns],
            "ops": [(o["name"], (f"rank {o['rank']} " if label == "job" else "") + o["where"], o["cause"], _ms(o["ns"]),
                     str(o["count"])) for o in r["top_ops"]],
        })
    return out


def render(summary: dict[str, Any], title: str) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"critical path of {title}" + (f", step {summary['step']}" if summary["step"] is not None else ""),
             style="bold")]
    for r in rows(summary):
        t = Table(title=r["title"], title_justify="left")
        for col, just in (("cause", "left"), ("ms", "right"), ("share", "right")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        for c in r["causes"]:
            t.add_row(*map(Text, c))
        ops = Table(title=r["title"].split(":")[0] + ": ops on the path", title_justify="left")
        for col, just in (("op", "left"), ("where", "left"), ("cause", "left"), ("ms", "right"), ("count", "right")):
            ops.add_column(col, justify=just)  # type: ignore[arg-type]
        for o in r["ops"]:
            ops.add_row(Text(o[0][:80]), *map(Text, o[1:]))
        parts += [t, ops]
    if len(summary["ranks"]) > 1:
        parts.append(Text(f"longest path: rank {summary['longest_rank']}"))
    return Group(*parts)
