"""What fixing a finding saves: each time finding's remedy replayed on the trace.

A finding that costs time and has a mechanical fix (`REMEDY_FOR`) gets `what_if`: the remedy (a
`msprof-py replay --remedy` code), the span the replay of the trace with it applied takes off the
run (`saving_ns`, its share of the run's span, the new span). The remedy acts where the problem
was found: on the ranks that have a finding of the same code (the program is the same on every
rank, and fixing it there is what a user does), a straggler's equalising on its own rank. One
replay per distinct remedy: findings that share one (LAUNCH_BOUND and BUBBLE_HOST_LAUNCH both
mean "launch less") share its saving.

Then the saving is the finding's cost (`Finding.cost`) and its severity follows it by the one
rule of analyzers.severity, as a share of the device's step time like every time cost (the
`saving_share` shown beside it is of the run's span): what the user gets back for fixing
it, not the idle the trace shows (which on pipelines and stragglers is less than a fix
recovers, and elsewhere more). Findings without a mechanical fix (device idle nothing recorded
explains, waits for events, a collective's exposed time) keep their measured cost.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzers.causality import pipeline
from analyzers.causality.replay import Remedy, ReplayResult, replay
from analyzers.finding import Finding
from analyzers.frames import Frames
from analyzers.severity import severity

#: The remedy (a replay remedy's name) that fixes each finding code, where one is mechanical.
REMEDY_FOR: dict[str, str] = {
    "BUBBLE_HOST_LAUNCH": "launch",
    "LAUNCH_BOUND": "launch",
    "BUBBLE_SYNC": "sync",
    "SYNC_STALL": "pipeline",
    "BUBBLE_DATA": "data",
    "BUBBLE_OP_COMPILE": "compile",
    "BUBBLE_BLOCKING_COPY": "pinned",
    "BUBBLE_COPY": "copy",
    "QUEUE_CONGESTION": "queue",
    "SLOW_RANK": "straggler",
    "SLOW_LINK": "link",
    "UNDER_OCCUPANCY": "spread",
    "BANDWIDTH_CONTENTION": "stagger",
    "CORE_CONTENTION": "priority",
    "LOW_OVERLAP": "overlap",
    "PIPELINE_BUBBLE": "microbatches",
}


def remedy_for(finding: Finding, ranks_of_code: dict[str, set[int]], all_ranks: set[int],
               frames: Frames | None = None) -> Remedy | None:
    """The remedy replayed for `finding` (None: no mechanical fix), scoped to the ranks where its
    code was found (unscoped when that is every rank)."""
    name = REMEDY_FOR.get(finding.code)
    if name is None:
        return None
    if name == "straggler":
        return Remedy(name, None, (int(finding.rank),)) if finding.rank is not None else Remedy(name)
    if name == "link":
        return Remedy(name)
    if name == "microbatches":  # the pipeline's own target count, so the fix names it
        pipes = [p for p in pipeline.find(frames) if finding.rank in p.stages] if frames is not None else []
        return Remedy(name, pipeline.default_micro_batches(pipes[0])) if pipes else None
    if name == "priority":  # the starved stream first on its rank's cores
        if finding.rank is None or finding.stream is None:
            return None
        return Remedy(name, int(finding.stream), tuple(sorted({int(finding.rank), *map(int, finding.ranks)})))
    ranks = ranks_of_code.get(finding.code, set())
    if not ranks or ranks >= all_ranks:
        return Remedy(name)
    return Remedy(name, None, tuple(sorted(ranks)))


def predict(frames: Frames, findings: list[Finding]) -> dict[str, dict[str, Any]]:
    """Set `what_if` on every finding with a mechanical fix and re-grade its severity by its
    saving (in place); the replays by remedy (remedy -> what_if dict). `frames` covers the whole
    trace (window "all")."""
    if frames.window != "all":
        frames = Frames(frames.trace)
    all_ranks = {int(r) for r in np.unique(frames.table.column("rank").to_numpy())}
    ranks_of_code: dict[str, set[int]] = {}
    for f in findings:
        for r in [f.rank, *f.ranks] if f.code != "SLOW_RANK" else []:
            if r is not None:
                ranks_of_code.setdefault(f.code, set()).add(int(r))
    done: dict[str, dict[str, Any]] = {}
    for f in findings:
        if f.lost_ns is None:  # costs memory, or its time is another finding's (SYNC_STALL's is BUBBLE_SYNC's)
            continue
        rem = remedy_for(f, ranks_of_code, all_ranks, frames)
        if rem is None:
            continue
        key = str(rem)
        if key not in done:
            res = replay(frames, [rem])
            done[key] = {"remedy": key, "saving_ns": int(max(res.saving_ns, 0)),
                         "saving_share": round(max(res.saving_ns, 0) / res.span_ns, 6) if res.span_ns else 0.0,
                         "span_ns": int(res.span_ns), "new_span_ns": int(res.new_span_ns)}
        f.what_if = dict(done[key])
        f.severity = severity(f.what_if["saving_ns"] / _step_ns(frames, f), f.code)
    return done


def _step_ns(frames: Frames, f: Finding) -> int:
    """The device step time the one severity rule takes a time cost's share of: the finding's
    device's (its rank's largest, any rank's largest without one); the run's span without steps."""
    from analyzers.causality import device_windows

    key = ("whatif.step_ns",)
    if key not in frames._cache:
        frames._cache[key] = {k: int((w["end"] - w["start"]).sum()) for k, w in device_windows(frames).items()}
    steps: dict = frames._cache[key]
    mine = [v for (r, d), v in steps.items() if (f.rank is None or r == f.rank) and (f.device is None or d == f.device)]
    got = max(mine or list(steps.values()) or [0])
    return max(got or (f.what_if or {}).get("span_ns", 0), 1)


def step_table(before: Frames, result: ReplayResult) -> list[dict[str, Any]]:
    """Per step number, the job's step time before and after the replay `result` of `before`'s
    trace (ns): from the earliest rank's start of the step to the latest rank's end; and the run's
    span (first to last device task) as a last row, `step` None. A trace without steps gives the
    span row only."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    b, a = before.steps, Frames(result.trace).steps
    if not b.empty and not a.empty:
        def per_step(s: pd.DataFrame) -> pd.Series:
            s = s.dropna(subset=["step"])
            g = s.groupby("step")
            return g["end"].max() - g["ts"].min()

        old, new = per_step(b), per_step(a)
        for step in old.index:
            o, n = int(old[step]), int(new.get(step, old[step]))
            rows.append({"step": int(step), "before_ns": o, "after_ns": n, "saving_ns": o - n,
                         "saving_share": round((o - n) / o, 6) if o else 0.0})
    o, n = result.span_ns, result.new_span_ns
    rows.append({"step": None, "before_ns": o, "after_ns": n, "saving_ns": o - n,
                 "saving_share": round((o - n) / o, 6) if o else 0.0})
    return rows
