"""Named, seeded workloads for the emulator, each with switches that inject the problems analyzers hunt.

    from runtime_emu import scenarios
    result = scenarios.run("resnet50-infer", switches=["leak"], seed=3)
    result.ground_truth["problems"]   # where / when / expected of each injected problem
    result.save("out/")               # trace/ + ground_truth.json

Every scenario also runs healthy (no switch); then it records no problem. Multi-rank scenarios
(`multi_rank=True`, a `runtime_options` giving the Topology) register the same way.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable

from runtime_emu.presets import PRESETS, Preset
from runtime_emu.presets import preset as get_preset
from runtime_emu.recorder import Switches
from runtime_emu.runtime import EmuResult, Runtime
from runtime_emu.scenarios import bert_train_dp, llm_pipeline, llm_train_2server, resnet50_infer, yolo_pipeline
from runtime_emu.scenarios.cluster_problems import MULTI_RANK_SWITCHES
from runtime_emu.scenarios.problems import PRESET_OVERRIDES, SWITCHES
from runtime_emu.scenarios.scenario import Config, Param, Scenario

__all__ = ["ALIASES", "MULTI_RANK_SWITCHES", "SCENARIOS", "SWITCHES", "Config", "Param", "Scenario", "get",
           "list_scenarios", "parse_params", "run", "run_configured"]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (resnet50_infer.SCENARIO, yolo_pipeline.SCENARIO,
                                                       bert_train_dp.SCENARIO, llm_train_2server.SCENARIO,
                                                       llm_pipeline.SCENARIO)}

#: Switch pairs no program can honour together (one stream has no cross-stream dependency to miss).
CONFLICTS = (frozenset({"serial-copies", "missing-sync"}),)
#: Other names of scenarios whose name says more than the workload (`llm-train` takes `servers`).
ALIASES = {"llm-train": "llm-train-2server"}
#: Parameters every scenario takes besides its own.
COMMON_PARAMS = {"preset": Param(str, "910B3", f"device preset: {', '.join(PRESETS)}")}


def list_scenarios() -> list[Scenario]:
    """The registered scenarios, by name."""
    return [SCENARIOS[name] for name in sorted(SCENARIOS)]


def get(name: str) -> Scenario:
    """The scenario called `name` (or one of its ALIASES); ValueError lists the known ones."""
    scenario = SCENARIOS.get(ALIASES.get(name, name))
    if scenario is None:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(sorted(SCENARIOS))}")
    return scenario


def all_params(scenario: Scenario) -> dict[str, Param]:
    """Every parameter `scenario` takes: its own and the common ones, by name."""
    return dict(sorted({**COMMON_PARAMS, **scenario.params}.items()))


def parse_params(scenario: Scenario, texts: dict[str, str]) -> dict[str, Any]:
    """Command-line texts (`triple_buffer="no"`) as the typed values `scenario` declares."""
    known = all_params(scenario)
    _check_known(scenario, texts, known)
    return {name: known[name].parse(name, text) for name, text in texts.items()}


def _check_known(scenario: Scenario, params: dict[str, Any], known: dict[str, Param]) -> None:
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for scenario {scenario.name!r}; choose from "
                         f"{', '.join(known)}")


def run(name: str, *, switches: Iterable[str] = (), seed: int = 0, steps: int | None = None,
        ranks: int | None = None, record: Switches | None = None, trace_path: str | Path | None = None,
        trace_cut_tasks: int | None = None, **params: Any) -> EmuResult:
    """Run scenario `name` with `switches` (the problems to inject) on; returns the trace and the
    ground truth.

    `record`: what to record (msprof's --task-time, --runtime-api, ... switches; default all).
    `trace_path` streams the trace into that Parquet directory (or file, one rank) while the
    scenario runs (Runtime's `trace_path`, `trace_cut_tasks`)."""
    scenario = get(name)
    cfg = configure(scenario, switches, seed=seed, steps=steps, ranks=ranks, params=params)
    return run_configured(scenario, cfg, record=record, trace_path=trace_path, trace_cut_tasks=trace_cut_tasks)


def run_configured(scenario: Scenario, cfg: Config, *, record: Switches | None = None,
                   trace_path: str | Path | None = None, trace_cut_tasks: int | None = None,
                   ground_truth: bool = True, on_step_end: Callable[[int, int], None] | None = None) -> EmuResult:
    """Run `scenario` as `configure` set it up (`cfg`); the rest as `run` takes it.
    `ground_truth=False` keeps none (Runtime's option; problems need it, so none may be on).
    `on_step_end(rank, n)`: called as each thread ends its step n (Runtime.on_step_end)."""
    if not ground_truth and cfg.switches:
        raise ValueError("a run without ground truth cannot inject problems (they are described from it): "
                         f"drop {', '.join(sorted(cfg.switches))} or keep the ground truth")
    options = scenario.runtime_options(cfg) if scenario.runtime_options else {}
    if not scenario.multi_rank:
        options.setdefault("ranks", cfg.ranks)
    if trace_path is not None:
        options["trace_path"] = trace_path
        if trace_cut_tasks is not None:
            options["trace_cut_tasks"] = trace_cut_tasks
    rt = Runtime(seed=cfg.seed, preset=cfg.preset, switches=record, ground_truth=ground_truth, **options)
    if on_step_end is not None:
        rt.on_step_end.append(on_step_end)
    scenario.program(rt, cfg)
    cfg.problems.flush(rt)
    return rt.finish()


def configure(scenario: Scenario, switches: Iterable[str], *, seed: int = 0, steps: int | None = None,
              ranks: int | None = None, params: dict[str, Any] | None = None) -> Config:
    """Validate one run's choices against what `scenario` supports."""
    switches = frozenset([switches] if isinstance(switches, str) else switches)
    for switch in sorted(switches):
        if switch not in scenario.switches:
            kind = "unsupported" if switch in SWITCHES or switch in MULTI_RANK_SWITCHES else "unknown"
            raise ValueError(f"{kind} switch {switch!r} for scenario {scenario.name!r}; choose from "
                             f"{', '.join(sorted(scenario.switches))}")
    for pair in CONFLICTS:
        if pair <= switches:
            raise ValueError(f"switches {' and '.join(sorted(pair))} cannot be on together")
    known = all_params(scenario)
    given = dict(params or {})
    _check_known(scenario, given, known)
    for name, value in given.items():
        if not (name == "preset" and isinstance(value, Preset)):
            given[name] = known[name].validate(name, value)
    values = {**{name: p.default for name, p in known.items()}, **given}
    steps = scenario.default_steps if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if ranks is None:
        ranks = scenario.ranks_for(values) if scenario.ranks_for is not None else scenario.ranks
    if not scenario.multi_rank and ranks != 1:
        raise ValueError(f"scenario {scenario.name!r} is single-rank; ranks must be 1, got {ranks}")
    # Defaults that follow the world size (the rank a problem acts on) are filled in only now,
    # and only where not given: a default never makes a valid --ranks invalid.
    for name, p in known.items():
        if p.auto is not None and values[name] is None:
            values[name] = p.auto(ranks, values)
    preset = get_preset(values.pop("preset"))
    overrides = {k: v for switch in sorted(switches) for k, v in PRESET_OVERRIDES.get(switch, {}).items()}
    if overrides:
        preset = preset.with_(**overrides)
    cfg = Config(scenario=scenario.name, switches=switches, steps=steps, seed=seed, ranks=ranks, preset=preset,
                 params=MappingProxyType(values))
    if scenario.check is not None:
        scenario.check(cfg)
    return cfg
