"""Pipeline bubbles: stages of a pipeline-parallel job idle while the pipeline fills and drains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzers.bubbles import BubbleConfig, device_gaps, device_windows
from analyzers.causality import pipeline as pl
from analyzers.finding import Finding, register
from analyzers.frames import Frames
from analyzers.severity import severity
from msprof_py.trace.units import ms, pct


@dataclass
class PipelineConfig:
    #: Micro-batches per stage the fix aims at (Megatron-LM's M >= 4 P).
    per_stage: int = pl.PER_STAGE


@register("pipeline", PipelineConfig)
def analyze(frames: Frames, cfg: PipelineConfig):
    """Pipeline bubble.

    Pattern: ranks that hand micro-batches on with point-to-point transfers (a chain of send /
    receive pairs: analyzers.causality.pipeline) idle at the start and the end of every step,
    waiting for the stage before them (forward) or after them (backward).

    Algorithm: the pipeline's stages, micro-batches per step (M) and schedule come from the
    transfers the trace records; each stage's bubble is its device idle that the causal
    attribution gives to a collective (the receive it waited for). The cost is what M' = max(4 P, M)
    micro-batches (the same batch in smaller pieces) would save: the pipeline's schedule modelled
    from each stage's kernel time and transfers, with M and with M', per step
    (analyzers.causality.pipeline.schedule_ns); never more than any stage's device idle in those
    steps (each stage's step shrinks by it). A
    pipeline already at M' micro-batches costs nothing (its bubble is the schedule's floor) and
    is reported at info when its bubble is above 5% of the step; a job without a pipeline has no
    finding. Severity by the one rule. Cross-rank: each partition `summarize`s, `reduce` matches
    the transfers across them (analyzers.partitioned).
    """
    return reduce([summarize(frames)], cfg)


def summarize(frames: Frames) -> dict[str, Any]:
    """What the pipeline analysis needs of some ranks (one partition or the whole trace): their
    point-to-point parts, per step their kernel time, and per rank its device idle the causal
    attribution gives to a collective (where, when, how long) and its device step time."""
    gaps = device_gaps(frames, BubbleConfig())
    g = gaps[gaps["cause"] == "collective"]
    idle = []
    for rank, mine in g.groupby("rank"):
        streams = mine["next_stream"].mode()
        idle.append({"rank": int(rank), "device": int(mine["device"].iloc[0]),
                     "stream": int(streams.iloc[0]) if len(streams) else None, "ts": int(mine["ts"].min()),
                     "end": int(mine["end"].max()), "idle_ns": int(mine["idle_ns"].sum())})
    step_ns: dict[int, int] = {}
    for (rank, _), w in device_windows(frames).items():
        step_ns[int(rank)] = step_ns.get(int(rank), 0) + int((w["end"] - w["start"]).sum())
    return {"own": pl.own_transfers(frames), "work": pl.stage_work(frames), "idle": idle, "step_ns": step_ns}


def reduce(summaries: list[dict[str, Any]], cfg: PipelineConfig):
    """The PIPELINE_BUBBLE findings and metrics from the `summarize` outputs of all partitions."""
    own = [s["own"] for s in summaries if len(s["own"])]
    work = [s["work"] for s in summaries if len(s["work"])]
    pipes = pl.build(pd.concat(own, ignore_index=True), pd.concat(work, ignore_index=True)) if own and work else []
    by_rank = {r["rank"]: r for s in summaries for r in s["idle"]}
    step_ns = {r: n for s in summaries for r, n in s["step_ns"].items()}
    findings, metrics = [], []
    for pipe in pipes:
        k = pl.default_micro_batches(pipe, cfg.per_stage)
        sav = pl.savings(pipe, k)
        stages = list(pipe.stages)
        idle = pd.Series({r: by_rank[r]["idle_ns"] if r in by_rank else 0 for r in stages})
        share = {r: idle[r] / step_ns[r] if step_ns.get(r) else 0.0 for r in stages}
        # Every stage's step shrinks by the saving only if each stage idled at least that long.
        st = pipe.steps
        phase = (st.groupby("step")["end"].transform("max") - st.groupby("step")["start"].transform("min"))
        slack = (phase - st["work_ns"]).groupby(st["rank"]).sum()
        saving = int(min(sav["saving_ns"].sum(), max(0, int(slack.min()))))
        worst = max(stages, key=lambda r: idle[r])
        metrics.append({"stages": stages, "micro_batches": pipe.micro_batches, "schedule": pipe.schedule,
                        "ideal_bubble_share": round(pipe.bubble_share, 4), "target_micro_batches": k,
                        "bubble_ns": {int(r): int(idle[r]) for r in stages}, "saving_ns": saving})
        mean_share = float(np.mean([share[r] for r in stages]))
        if saving <= 0 and mean_share < 0.05:
            continue
        sev = severity(saving / step_ns[worst] if step_ns.get(worst) else 0.0, "PIPELINE_BUBBLE")
        fix = (f"{k} micro-batches instead of {pipe.micro_batches} would save about {ms(saving)}"
               if saving > 0 else f"{pipe.micro_batches} micro-batches already meet {cfg.per_stage} per stage")
        steps = len(sav)
        occ = [{"rank": int(r), "stage": n, "device": by_rank[r]["device"], "stream": by_rank[r]["stream"],
                "ts_ns": by_rank[r]["ts"], "dur_ns": by_rank[r]["end"] - by_rank[r]["ts"], "lost_ns": int(idle[r])}
               for n, r in enumerate(stages) if r in by_rank]
        findings.append(Finding(
            code="PIPELINE_BUBBLE", severity=sev, title="Pipeline bubble: stages idle while the pipeline fills and drains",
            message=(f"pipeline of {len(stages)} stages (ranks {', '.join(map(str, stages))}), {pipe.micro_batches} "
                     f"micro-batches per step ({pipe.schedule}): the stages idled {pct(mean_share)} of their step time "
                     f"on average waiting for a neighbour's hand-over (the schedule's ideal bubble "
                     f"(P - 1) / (M + P - 1) is {pct(pipe.bubble_share)}); over {steps} step(s) {fix}"),
            rank=int(worst), ranks=[int(r) for r in stages if r != worst], device=None, stream=None,
            ts_ns=int(sav["start"].min()), dur_ns=int(sav["end"].max() - sav["start"].min()),
            metric="bubble_share", value=round(mean_share, 6), threshold=None, lost_ns=saving,
            evidence=[{"rank": int(r), "stage": s, "bubble_ns": int(idle[r]), "bubble_share": round(share[r], 4)}
                      for s, r in enumerate(stages)]
            + [{"step": int(row.step), "modelled_ns": int(row.model_ns), "with_more_micro_batches_ns":
                int(row.new_model_ns)} for row in sav.itertuples()],
            occurrences=occ))
    return findings, {"pipelines": metrics}
