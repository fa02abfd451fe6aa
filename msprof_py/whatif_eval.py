"""`msprof-py eval --what-if`: each finding's predicted saving against the program fixed for real.

A pair is a problem program and its fix: a scenario with a problem switch and the same scenario
with the fix applied (the switch off, or the switch on with the remedy's mechanism made real: a
deeper stream queue, a launch at the captured-graph floor), or a problem app of `tests/apps` and
its fixed twin. The prediction comes from the problem trace alone: the analyzers' findings of the
problem's codes whose own remedy saves something (analyzers.whatif), those remedies replayed
together. The real saving is the
problem run's span minus the fixed run's (first to last device task, as the replay measures it).
A pair passes when the two agree within `TOLERANCE` of the real saving.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Group
from rich.table import Table
from rich.text import Text

#: How close a prediction must be to the real saving (a share of it).
TOLERANCE = 0.10
#: The seeds of every scenario pair (the issue's three).
SEEDS = (0, 1, 2)
#: Where the problem apps and their twins live (a source checkout).
APPS = Path(__file__).resolve().parents[1] / "tests" / "apps"


@dataclass(frozen=True)
class Pair:
    """A problem program, its real fix and the finding codes whose fixes the fix is."""

    label: str
    fix: str  # what the fixed program changes
    codes: tuple[str, ...]
    bad: Callable[[], Any] = field(compare=False)
    fixed: Callable[[], Any] = field(compare=False)


def _scenario(name: str, switches: tuple[str, ...], seed: int, params: dict[str, Any] | None = None,
              preset: dict[str, int] | None = None, drop_override: bool = False) -> Callable[[], Any]:
    """A scenario run (its trace); `preset`: preset fields changed after the switches' overrides;
    `drop_override`: the preset without the switches' overrides (the shipped device)."""
    def run():
        from runtime_emu import scenarios

        scenario = scenarios.get(name)
        cfg = scenarios.configure(scenario, switches, seed=seed, params=dict(params or {}))
        # Without switches, configure applies no preset override: the shipped device.
        p = scenarios.configure(scenario, (), seed=seed, params=dict(params or {})).preset if drop_override \
            else cfg.preset
        if preset:
            p = p.with_(**preset)
        if p is not cfg.preset:
            cfg = dataclasses.replace(cfg, preset=p)
        return scenarios.run_configured(scenario, cfg).trace

    return run


def device_span_ns(trace: Any) -> int:
    """A run's span as the replay measures it: first device task's start to the last one's end."""
    from analyzers import Frames

    ops = Frames(trace).device_ops
    return int(ops["end"].max() - ops["ts"].min()) if len(ops) else 0


def _app(name: str, *args: str) -> Callable[[], Any]:
    """A problem app of tests/apps run in this process (its trace, captured at acl.finalize)."""
    def run():
        from runtime_emu import acl

        got: list = []
        hook = got.append
        acl.on_finalize.append(hook)
        argv, path = sys.argv, list(sys.path)
        try:
            sys.argv = [str(APPS / f"{name}.py"), *args]
            sys.path.insert(0, str(APPS))
            runpy.run_path(str(APPS / f"{name}.py"), run_name="__main__")
        finally:
            acl.on_finalize.remove(hook)
            sys.argv, sys.path[:] = argv, path
        if not got:
            raise RuntimeError(f"tests/apps/{name}.py did not finalize the runtime")
        return got[-1].trace

    return run


def pairs(seeds: tuple[int, ...] = SEEDS, quick: bool = False) -> list[Pair]:
    """Every pair: each scenario switch with a mechanical fix, over `seeds`, and every app with a
    fixed twin (when tests/apps is there). `quick`: one seed of a few pairs (CI)."""
    out: list[Pair] = []
    single = ("resnet50-infer", "yolo-pipeline")
    for seed in seeds:
        for name in ("bert-train-dp", "llm-train-2server"):
            out.append(Pair(f"{name} slow-rank seed {seed}", "switch off", ("SLOW_RANK",),
                            _scenario(name, ("slow-rank",), seed), _scenario(name, (), seed)))
            out.append(Pair(f"{name} slow-link seed {seed}", "switch off", ("SLOW_LINK",),
                            _scenario(name, ("slow-link",), seed), _scenario(name, (), seed)))
            out.append(Pair(f"{name} no-overlap seed {seed}", "switch off (buckets reduced under the backward)",
                            ("LOW_OVERLAP",), _scenario(name, ("no-overlap",), seed), _scenario(name, (), seed)))
            # The switch puts the collectives on PCIe; its healthy twin keeps them there.
            twin = {"intra": "pcie"} if name == "bert-train-dp" else {"roce_over_pcie": True}
            out.append(Pair(f"{name} bandwidth-contention seed {seed}",
                            f"switch off ({', '.join(f'{k}={v}' for k, v in twin.items())}: no prefetch on PCIe)",
                            ("BANDWIDTH_CONTENTION",), _scenario(name, ("bandwidth-contention",), seed),
                            _scenario(name, (), seed, twin)))
        for name in single:
            out.append(Pair(f"{name} serial-copies seed {seed}", "switch off (double-buffered)", ("BUBBLE_COPY",),
                            _scenario(name, ("serial-copies",), seed), _scenario(name, (), seed)))
            out.append(Pair(f"{name} queue-congestion seed {seed}", "the shipped queue depth", ("QUEUE_CONGESTION",),
                            _scenario(name, ("queue-congestion",), seed),
                            _scenario(name, ("queue-congestion",), seed, drop_override=True)))
            out.append(Pair(f"{name} launch-bound seed {seed}", "launch at the 2 us floor", ("LAUNCH_BOUND",),
                            _scenario(name, ("launch-bound",), seed),
                            _scenario(name, ("launch-bound",), seed, preset={"launch_overhead_ns": 2_000})))
            out.append(Pair(f"{name} bandwidth-contention seed {seed}", "switch off (no prefetch on the link)",
                            ("BANDWIDTH_CONTENTION",), _scenario(name, ("bandwidth-contention",), seed),
                            _scenario(name, (), seed)))
        out.append(Pair(f"llm-pipeline pipeline-bubble seed {seed}", "switch off (16 micro-batches, 4 per stage)",
                        ("PIPELINE_BUBBLE",), _scenario("llm-pipeline", ("pipeline-bubble",), seed),
                        _scenario("llm-pipeline", (), seed)))
        out.append(Pair(f"yolo-pipeline triple_buffer=false seed {seed}", "triple_buffer=true",
                        ("BUBBLE_DATA", "BUBBLE_COPY"),
                        _scenario("yolo-pipeline", (), seed, {"triple_buffer": False}),
                        _scenario("yolo-pipeline", (), seed)))
    if APPS.is_dir():
        out += [
            Pair("app sync_every_kernel", "no_sync_twin", ("BUBBLE_SYNC",), _app("sync_every_kernel"),
                 _app("no_sync_twin")),
            Pair("app serial_copy", "double_buffer", ("BUBBLE_COPY",), _app("serial_copy"), _app("double_buffer")),
            Pair("app host_preprocess", "overlapped_preprocess --convs 9", ("BUBBLE_DATA",), _app("host_preprocess"),
                 _app("overlapped_preprocess", "--convs", "9")),
            Pair("app narrow_kernels", "wide_kernels", ("UNDER_OCCUPANCY",), _app("narrow_kernels"),
                 _app("wide_kernels")),
            Pair("app core_starvation", "core_priority_twin (preemption)", ("CORE_CONTENTION",),
                 _app("core_starvation"), _app("core_priority_twin")),
            Pair("app allreduce_after_backward", "healthy_allreduce", ("LOW_OVERLAP",),
                 _app("allreduce_after_backward"), _app("healthy_allreduce")),
        ]
    if quick:
        keep = ("bert-train-dp slow-rank seed 0", "resnet50-infer launch-bound seed 0",
                "yolo-pipeline queue-congestion seed 0", "app sync_every_kernel")
        out = [p for p in out if p.label in keep]
    return out


@dataclass
class Row:
    label: str
    fix: str
    remedies: list[str]
    predicted_ns: int
    real_ns: int
    seconds: float
    note: str = ""

    @property
    def error(self) -> float | None:
        """|predicted - real| as a share of the real saving (None: nothing to save)."""
        return abs(self.predicted_ns - self.real_ns) / self.real_ns if self.real_ns > 0 else None

    @property
    def ok(self) -> bool:
        if self.real_ns <= 0:
            return self.predicted_ns <= 0
        return self.error is not None and self.error <= TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.label, "fix": self.fix, "remedies": self.remedies, "predicted_ns": self.predicted_ns,
                "real_ns": self.real_ns, "error": None if self.error is None else round(self.error, 6),
                "ok": self.ok, "seconds": round(self.seconds, 3), "note": self.note}


def check(pair: Pair) -> Row:
    """Predict `pair`'s saving from its problem trace and measure it against the fixed run."""
    import analyzers
    from analyzers import Frames
    from analyzers.causality.replay import replay
    from analyzers.whatif import predict, remedy_for

    t0 = time.perf_counter()
    bad = pair.bad()
    frames = Frames(bad)
    result = analyzers.run(bad, frames=frames)
    predict(frames, result.findings)
    # The findings of the problem's codes whose own fix saves something (a user applies those).
    found = [f for f in result.findings if f.code in pair.codes
             and (f.what_if is None or f.what_if["saving_ns"] > 0)]
    ranks: dict[str, set[int]] = {}
    for f in found:
        ranks.setdefault(f.code, set()).update(r for r in [f.rank, *f.ranks] if r is not None)
    all_ranks = {int(r) for r in frames.table.column("rank").unique().to_pylist()}
    remedies = []
    for f in found:
        rem = remedy_for(f, ranks, all_ranks, frames)
        if rem is not None and rem not in remedies:
            remedies.append(rem)
    base = replay(frames)
    predicted = replay(frames, remedies).saving_ns if remedies else 0
    fixed = replay(Frames(pair.fixed()))
    note = "" if found else f"no {'/'.join(pair.codes)} finding"
    return Row(pair.label, pair.fix, [str(r) for r in remedies], int(predicted), int(base.span_ns - fixed.span_ns),
               time.perf_counter() - t0, note)


def evaluate(todo: list[Pair], progress: Callable[[int, int], None] | None = None) -> list[Row]:
    rows = []
    for i, p in enumerate(todo):
        rows.append(check(p))
        if progress is not None:
            progress(i + 1, len(todo))
    return rows


def render(rows: list[Row]) -> Group:
    from msprof_py.trace.units import ms

    t = Table(title=f"what-if: predicted saving vs the real fix (pass: within {TOLERANCE:.0%})")
    for col in ("pair", "real fix", "remedies", "predicted", "real", "error", ""):
        t.add_column(col, justify="right" if col in ("predicted", "real", "error") else "left")
    for r in rows:
        t.add_row(r.label, r.fix, ", ".join(r.remedies) or "-", ms(r.predicted_ns), ms(r.real_ns),
                  "-" if r.error is None else f"{100 * r.error:.2f}%",
                  Text("ok", style="green") if r.ok else Text("MISS" + (f" ({r.note})" if r.note else ""),
                                                             style="bold red"))
    passed = sum(r.ok for r in rows)
    return Group(t, Text(f"{passed} of {len(rows)} pairs within {TOLERANCE:.0%}"))
