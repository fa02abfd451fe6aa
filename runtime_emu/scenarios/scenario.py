"""What a scenario is: a seeded program, the problem switches it can inject, and their record.

A problem a switch injects is written down while the program runs, in the terms an analyzer
would report it (where, when, what it should measure). Some of that is known only once the
device has run (when a consumer kernel really started, how long a shared copy really took), so a
report may carry a `resolve` function that fills those fields from the finished tasks; `run()`
calls them after the program and before the trace is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

from runtime_emu.device import COLLECTIVE, KERNEL, MEMCPY, MEMSET, Kernel, Stream
from runtime_emu.presets import Preset

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime


class TaskTimes(NamedTuple):
    corr: int
    rank: int
    device: int
    stream: int
    kind: str
    name: str
    start_ns: int
    end_ns: int


#: Device task kinds that occupy cores or links (event records and waits do not).
BUSY_KINDS = (KERNEL, MEMCPY, MEMSET, COLLECTIVE)


class TaskIndex:
    """The finished tasks of a run by correlation id, for resolving problem reports."""

    def __init__(self, rt: "Runtime") -> None:
        self.by_corr = {t[0]: TaskTimes(t[0], t[1], t[2], t[3], t[4], t[5], t[9], t[10]) for t in rt.gt_tasks}

    def __getitem__(self, corr: int) -> TaskTimes:
        task = self.by_corr.get(corr)
        if task is None:
            raise RuntimeError(f"task {corr} never finished: a scenario program must end with its device drained")
        return task

    def busy_ns(self, rank: int, device: int, start_ns: int, end_ns: int) -> int:
        """Time within [start_ns, end_ns) during which the device ran anything (union of tasks)."""
        spans = sorted((max(t.start_ns, start_ns), min(t.end_ns, end_ns)) for t in self.by_corr.values()
                       if t.rank == rank and t.device == device and t.kind in BUSY_KINDS
                       and t.end_ns > start_ns and t.start_ns < end_ns)
        busy, reach = 0, start_ns
        for s, e in spans:
            if e > reach:
                busy += e - max(s, reach)
                reach = e
        return busy


def task_dict(task: TaskTimes) -> dict[str, Any]:
    return {"corr": task.corr, "name": task.name, "stream": task.stream, "start_ns": task.start_ns,
            "end_ns": task.end_ns}


def where(stream: Stream, **extra: Any) -> dict[str, Any]:
    """The `where` of a problem on `stream` (plus call_site / buffer / link names)."""
    return {"rank": stream.device.rank, "device": stream.device.id, "stream": stream.id, **extra}


class ProblemLog:
    """Problems injected during one run, completed from device times at the end."""

    def __init__(self) -> None:
        self._pending: list[tuple[dict[str, Any], Callable[[TaskIndex], dict[str, Any]] | None]] = []

    def add(self, problem: str, *, where: dict[str, Any], detail: str, when: dict[str, int] | None = None,
            expected: dict[str, Any] | None = None,
            resolve: Callable[[TaskIndex], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Record one injected problem; `resolve(tasks)` may return fields known only after the run."""
        entry = {"problem": problem, "where": where, "when": when, "expected": expected or {}, "detail": detail}
        self._pending.append((entry, resolve))
        return entry

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self, rt: "Runtime") -> None:
        """Resolve every report against the finished tasks and append it to `rt.problems`."""
        tasks = TaskIndex(rt)
        for entry, resolve in self._pending:
            if resolve is not None:
                for key, value in resolve(tasks).items():
                    if key == "expected":
                        entry["expected"].update(value)
                    else:
                        entry[key] = value
            when = entry["when"]
            if not when or not 0 <= when["start_ns"] <= when["end_ns"]:
                raise RuntimeError(f"problem {entry['problem']!r} has no valid 'when' window: {when}")
            rt.problems.append(entry)
        self._pending = []


@dataclass(frozen=True)
class Config:
    """One run's choices: what the program reads to decide what to do."""

    scenario: str
    switches: frozenset[str]
    steps: int
    seed: int
    ranks: int
    preset: Preset
    params: Mapping[str, Any]
    problems: ProblemLog = field(default_factory=ProblemLog, compare=False)

    def on(self, switch: str) -> bool:
        return switch in self.switches

    def __getitem__(self, name: str) -> Any:
        return self.params[name]


#: How a boolean parameter may be written on a command line, in any case.
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "1"), ("false", "no", "0")
#: The word for an optional parameter left to the scenario (None in Python).
AUTO = "auto"


@dataclass(frozen=True)
class Param:
    """One scenario parameter: its type and default, so that a command line's text parses to the
    value the program expects (`triple_buffer=False` is the boolean, not a non-empty string).

    `default=None` with `optional=True` means "the scenario decides" (written `auto`);
    `auto(ranks, values)` computes such a default from the run's other choices instead, so a
    default never makes an otherwise valid world size invalid.
    """

    type: type
    default: Any
    help: str
    choices: Sequence[Any] = ()
    optional: bool = False
    minimum: int | None = None
    auto: Callable[[int, Mapping[str, Any]], Any] | None = None

    def type_name(self) -> str:
        if self.choices:
            return "|".join(map(str, self.choices))
        return {bool: "bool", int: "int", float: "float", str: "str"}.get(self.type, self.type.__name__)

    def default_text(self) -> str:
        return self.text(self.default)

    def text(self, value: Any) -> str:
        """`value` as a command line writes it (what `parse` reads back)."""
        if value is None:
            return AUTO
        return str(value).lower() if isinstance(value, bool) else str(getattr(value, "name", value))

    def parse(self, name: str, text: str) -> Any:
        """The value `text` (from a command line) stands for; ValueError names what is accepted."""
        word = text.strip().lower()
        if (self.optional or self.auto is not None) and word in (AUTO, "none"):
            return None
        if self.type is bool:
            if word in TRUE_WORDS or word in FALSE_WORDS:
                return word in TRUE_WORDS
            raise ValueError(f"{name} must be true or false (or yes/no, 1/0), got {text!r}")
        value: Any
        if self.type in (int, float):
            try:
                value = self.type(text)
            except ValueError:
                raise ValueError(f"{name} must be {'an integer' if self.type is int else 'a number'}, "
                                 f"got {text!r}") from None
        else:
            value = text
        return self.validate(name, value)

    def validate(self, name: str, value: Any) -> Any:
        """`value` when it has this parameter's type (ints stand for floats), else ValueError."""
        if value is None and (self.optional or self.auto is not None):
            return None
        ok = isinstance(value, self.type) and (self.type is bool or not isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            what = {bool: "true or false", int: "an integer", float: "a number"}.get(self.type, "a string")
            raise ValueError(f"{name} must be {what}, got {value!r}")
        if self.choices and value not in self.choices:
            *rest, last = (repr(c) for c in self.choices)
            allowed = f"{', '.join(rest)} or {last}" if rest else last
            raise ValueError(f"{name} must be {allowed}{f' (or {AUTO})' if self.optional else ''}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{name} must be >= {self.minimum}, got {value}")
        return value


@dataclass(frozen=True)
class Scenario:
    """A named workload: `program(rt, cfg)` drives a Runtime; `description` is its module docstring."""

    name: str
    description: str
    program: Callable[["Runtime", Config], None]
    switches: frozenset[str]
    default_steps: int
    #: The scenario's own parameters, typed, with their defaults (`run(name, batch=32)`).
    params: Mapping[str, Param] = field(default_factory=dict)
    #: Default world size; single-rank scenarios accept only 1.
    ranks: int = 1
    #: The default world size for the given parameters, when it follows them (8 NPUs per server).
    ranks_for: Callable[[Mapping[str, Any]], int] | None = None
    multi_rank: bool = False
    #: Raises ValueError for parameter / switch combinations the program cannot run.
    check: Callable[[Config], None] | None = None
    #: Extra Runtime keyword arguments (a Topology for multi-rank jobs).
    runtime_options: Callable[[Config], dict[str, Any]] | None = None
    #: About how many trace events a healthy run records (from measured runs), so that a caller
    #: can say before a long run that it will be long.
    size: Callable[[Config], int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "__doc__", self.description)  # help(scenario) shows its paragraph


# ---------------------------------------------------------------------- kernels
def op_kernel(rt: "Runtime", name: str, total_ns: float, core: str = "cube", blocks: int | None = None,
              jitter: float = 0.03, *, op_type: str = "") -> tuple[Kernel, int]:
    """A kernel that takes about `total_ns` on an idle device with `blocks` blocks (default: one
    wave on every core of its type), with seeded run-to-run jitter of +-`jitter` (DEFAULT 3%).
    `name` is the instance (op type + graph index, as torch_npu names kernels, e.g. MatMulV212),
    `op_type` the operator (MatMulV2), which the trace records as msprof's "OP Type"."""
    cores = rt.preset.cube_cores if core == "cube" else rt.preset.vector_cores
    blocks = blocks or cores
    waves = -(-blocks // cores)
    ns = total_ns * (1.0 + jitter * (2.0 * rt.rng.random() - 1.0))
    return Kernel(name, max(1, round(ns / waves)), core, op_type=op_type), blocks


def launch_op(rt: "Runtime", stream: Stream, name: str, total_ns: float, core: str = "cube",
              blocks: int | None = None, jitter: float = 0.03, *, op_type: str = "", reads: tuple[int, ...] = (),
              writes: tuple[int, ...] = ()) -> int:
    """Launch one operator's kernel on `stream` (reading / writing the given device buffers, which
    the trace records as mem_read / mem_write rows); returns its correlation id."""
    kernel, blocks = op_kernel(rt, name, total_ns, core, blocks, jitter, op_type=op_type)
    return rt.launch_kernel(kernel, blocks, stream, reads=reads, writes=writes)


def jittered(rt: "Runtime", ns: float, jitter: float) -> int:
    """`ns` +- `jitter` (a fraction), from the run's seeded RNG."""
    return max(0, round(ns * (1.0 + jitter * (2.0 * rt.rng.random() - 1.0))))
