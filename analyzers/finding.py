"""Findings, the analyzer registry, and the problem-lookup table.

An analyzer is a pure function `analyze(frames, config) -> list[Finding]` registered under a
name with its config dataclass. It raises `Skipped(reason)` when the trace lacks what it
needs; `run()` records the reason and carries on. Analyzers never plot, print or read files.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import IntEnum
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

from analyzers.frames import Frames
from msprof_py.trace.schema import Trace


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class LookupEntry:
    """One row of the problem-lookup table: what users see, why, and what to change."""

    code: str
    symptom: str
    cause: str
    remedy: str
    references: tuple[str, ...] = ()


@dataclass
class Finding:
    code: str
    severity: Severity
    title: str
    message: str
    analyzer: str = ""
    rank: int | None = None
    device: int | None = None
    stream: int | None = None
    ts_ns: int | None = None
    dur_ns: int | None = None
    step: int | None = None
    metric: str = ""
    value: float | None = None
    threshold: float | None = None
    lost_ns: int | None = None
    lost_bytes: int | None = None
    #: References to trace events: dicts with ts/corr/name/stream, most telling first.
    evidence: list[dict[str, Any]] = field(default_factory=list)
    lookup: LookupEntry | None = None
    #: When one finding groups several separate occurrences of the problem (several bubbles,
    #: several slowed copies, several ranks), each one: dicts with rank / device / stream /
    #: ts_ns / dur_ns / lost_ns (whichever apply). Empty: the finding is one occurrence, at
    #: (ts_ns, dur_ns).
    occurrences: list[dict[str, Any]] = field(default_factory=list)
    #: Ranks a cross-rank finding names besides `rank` (e.g. the ranks that waited).
    ranks: list[int] = field(default_factory=list)
    #: What fixing it saves, predicted by replaying the trace with its remedy (analyzers.whatif):
    #: {"remedy", "saving_ns", "saving_share", "span_ns", "new_span_ns"}; None: not predicted.
    what_if: dict[str, Any] | None = None

    @property
    def cost_unit(self) -> str:
        """'ns' when the finding costs time, 'bytes' when it costs memory, '' when neither."""
        if self.lost_ns is not None or self.what_if is not None:
            return "ns"
        return "bytes" if self.lost_bytes is not None else ""

    @property
    def cost(self) -> float:
        """What the finding costs in its own unit (`cost_unit`): the predicted saving of its fix
        when there is one (`what_if`), else what the trace measured."""
        if self.what_if is not None:
            return float(self.what_if["saving_ns"])
        return float(self.lost_ns if self.lost_ns is not None else self.lost_bytes or 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d


class Skipped(Exception):
    """The trace lacks what this analyzer needs (the message says what)."""


@dataclass
class AnalyzerSpec:
    name: str
    fn: Callable[[Frames, Any], list[Finding]]
    config_cls: type

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()


REGISTRY: dict[str, AnalyzerSpec] = {}


def register(name: str, config_cls: type) -> Callable:
    """Decorator: make `fn(frames, config)` available to `run()` under `name`."""
    def wrap(fn: Callable) -> Callable:
        REGISTRY[name] = AnalyzerSpec(name, fn, config_cls)
        return fn

    return wrap


@dataclass
class AnalysisResult:
    findings: list[Finding]
    skipped: dict[str, str]
    #: Numbers behind the findings, per analyzer (tables as lists of dicts), for reports.
    metrics: dict[str, Any]

    #: The platform the trace ran on ("ascend", "cuda", "rocm" or "unknown"): it picks the lookup text.
    platform: str = "unknown"

    def ranked(self) -> list[Finding]:
        """Most severe first, then most costly. Severity follows a finding's cost as a share of
        the run by one rule (analyzers.severity), so it compares time with memory; within a
        severity, critical findings without a cost (a race: wrong results) come first, then
        findings that cost time by time lost, then findings that cost memory by bytes, then the
        rest."""
        def key(f: Finding):
            unit = f.cost_unit
            group = (0 if not unit and f.severity >= Severity.CRITICAL else 1 if unit == "ns" else
                     2 if unit == "bytes" else 3)
            return (-int(f.severity), group, -f.cost)

        return sorted(self.findings, key=key)


def run(trace: Trace, names: list[str] | None = None, configs: dict[str, Any] | None = None,
        frames: Frames | None = None) -> AnalysisResult:
    """Run the named analyzers (all registered ones by default) on a trace."""
    _load_all()
    configs = configs or {}
    unknown = [n for n in (names or []) if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown analyzer(s) {', '.join(unknown)}; choose from {', '.join(sorted(REGISTRY))}")
    frames = frames or Frames(trace)
    platform = frames.platform
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    metrics: dict[str, Any] = {}
    for name in names or sorted(REGISTRY):
        spec = REGISTRY[name]
        cfg = configs.get(name) or spec.config_cls()
        try:
            out = spec.fn(frames, cfg)
        except Skipped as exc:
            skipped[name] = str(exc)
            continue
        if isinstance(out, tuple):
            out, metrics[name] = out
        findings.extend(attributed(group_across_ranks(out), name, platform))
    return AnalysisResult(findings, skipped, metrics, platform)


def group_across_ranks(findings: list[Finding]) -> list[Finding]:
    """One finding per problem across ranks (analyzers.grouping)."""
    from analyzers.grouping import group_across_ranks as group

    return group(findings)


def attributed(findings: list[Finding], analyzer: str, platform: str) -> list[Finding]:
    """`findings` marked with the analyzer that made them and, where they have none, the
    problem-lookup entry of their code on `platform`."""
    for f in findings:
        f.analyzer = analyzer
        if f.lookup is None:
            f.lookup = lookup(f.code, platform)
    return findings


def _load_all() -> None:
    # Importing the analyzer modules registers them.
    from analyzers import bandwidth, bubbles, cores, launch, links, memory, pipeline, queue, ranks, sync  # noqa: F401


PLATFORMS = ("ascend", "cuda", "rocm", "unknown")


@lru_cache(maxsize=len(PLATFORMS))
def lookup_table(platform: str = "unknown") -> dict[str, LookupEntry]:
    """The problem-lookup table (analyzers/data/problems.toml), by finding code, in the words of
    `platform`: an entry's `[CODE.cuda]` (or `.ascend`, `.rocm`) sub-table overrides its fields
    there; `unknown` keeps the platform-neutral text."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; choose from {', '.join(PLATFORMS)}")
    text = resources.files("analyzers").joinpath("data/problems.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    out = {}
    for code, row in data.items():
        row = {**{k: v for k, v in row.items() if not isinstance(v, dict)}, **row.get(platform, {})}
        out[code] = LookupEntry(code=code, symptom=row["symptom"], cause=row["cause"], remedy=row["remedy"],
                                references=tuple(row.get("references", ())))
    return out


def lookup(code: str, platform: str = "unknown") -> LookupEntry:
    table = lookup_table(platform)
    if code not in table:
        raise KeyError(f"finding code {code!r} has no entry in analyzers/data/problems.toml")
    return table[code]


def config_fields(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)} if is_dataclass(cfg) else {}


def analyzer_names() -> list[str]:
    """The registered analyzers' names, sorted: what `run(names=...)` accepts."""
    _load_all()
    return sorted(REGISTRY)
