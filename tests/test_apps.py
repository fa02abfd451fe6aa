"""Programs written the way users write them, profiled the way users profile them.

Each program in tests/apps/ is a plain script against `runtime_emu.acl` with one problem or none.
The tests run `msprof-py --application="python tests/apps/NAME.py" --output=DIR` (every program
once, in parallel), read the PROF directory back, run the analyzers and check the diagnosis:

- the most costly warning-or-worse finding has the code of the program's problem (a healthy
  program has no warning-or-worse finding at all);
- that finding names the right place (rank; device and stream where the problem has one);
- its cost (`lost_ns` / `lost_bytes`) is within 20% of the loss measured from the trace by the
  independent calculations in tests/apps/measure.py.

The expected codes come from what each problem is, not from what any analyzer does.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

import analyzers
from analyzers.finding import AnalysisResult, Finding, Severity
from msprof_py import prof_dir

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "apps"
MSPROF = str(Path(sys.executable).parent / "msprof-py")
sys.path.insert(0, str(APPS))

import measure  # noqa: E402  (tests/apps/measure.py)

TOLERANCE = 0.20
GiB = 1 << 30


@dataclass(frozen=True)
class Problem:
    """What a program's diagnosis should be."""

    app: str
    codes: tuple[str, ...]  # acceptable codes for the top finding
    rank: int = 0
    device: int | None = 0
    device_required: bool = True  # False: the finding may leave the device out
    stream: int | None = None  # the stream the finding must name when it names one
    stream_required: bool = False  # True: the finding must name `stream`
    others: tuple[int, ...] = ()  # SLOW_RANK: the ranks that wait for the straggler
    measure: Callable[[pd.DataFrame], int] | None = None  # the loss, from the trace
    unit: str = "ns"

    def __str__(self) -> str:
        return self.app


PROBLEMS = [
    Problem("serial_copy", ("BUBBLE_COPY",), stream=1, measure=measure.copy_bubble_ns),
    Problem("sync_every_kernel", ("BUBBLE_SYNC", "SYNC_STALL"), stream=1, measure=measure.sync_bubble_ns),
    Problem("straggler", ("SLOW_RANK",), rank=2, device=2, device_required=False, others=(0, 1, 3),
            measure=lambda df: measure.straggler_and_wait_ns(df)[1]),
    Problem("slow_device_rank", ("SLOW_RANK",), rank=1, device=1, device_required=False, others=(0, 2, 3),
            measure=lambda df: measure.straggler_and_wait_ns(df)[1]),
    Problem("queue_flood", ("QUEUE_CONGESTION",), stream=1, stream_required=True,
            measure=lambda df: measure.blocked_launch_ns(df, 0, 0, 1)),
    Problem("copy_contention", ("BANDWIDTH_CONTENTION",), measure=measure.contention_stall_ns),
    Problem("leak_loop", ("MEMORY_LEAK",), measure=measure.leaked_bytes, unit="bytes"),
    Problem("missing_event_wait", ("MISSING_SYNC",), stream=2, stream_required=True),
    Problem("tiny_kernel_flood", ("LAUNCH_BOUND", "BUBBLE_HOST_LAUNCH"), stream=1, measure=measure.launch_wait_ns),
    Problem("fragmentation", ("MEMORY_FRAGMENTATION",), measure=lambda df: measure.stranded_free_bytes(df, 0)[0],
            unit="bytes"),
    Problem("host_preprocess", ("BUBBLE_DATA",), stream=1,
            measure=lambda df: measure.host_work_bubble_ns(df, ("decode_jpeg", "resize"))),
    Problem("core_starvation", ("CORE_CONTENTION",), stream=2, stream_required=True,
            measure=lambda df: measure.core_wait_ns(df, 2)),
]
HEALTHY = ["double_buffer", "no_sync_twin", "overlapped_preprocess", "healthy_training", "healthy_allreduce"]
ALL_APPS = [p.app for p in PROBLEMS] + HEALTHY


@dataclass
class Profiled:
    app: str
    returncode: int
    output: str
    prof: Path | None
    _df: pd.DataFrame | None = field(default=None, repr=False)
    _result: AnalysisResult | None = field(default=None, repr=False)

    @property
    def df(self) -> pd.DataFrame:
        if self._df is None:
            self._df = prof_dir.read_raw(self.prof).table.to_pandas()
        return self._df

    @property
    def result(self) -> AnalysisResult:
        if self._result is None:
            self._result = analyzers.run(prof_dir.read_raw(self.prof))
        return self._result

    def warnings(self) -> list[Finding]:
        """Warning-or-worse findings, most costly first."""
        return [f for f in self.result.ranked() if f.severity >= Severity.WARNING]


def _profile(app: str, out: Path) -> Profiled:
    proc = subprocess.run([MSPROF, f"--application=python tests/apps/{app}.py", f"--output={out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    runs = prof_dir.prof_dirs(out) if out.is_dir() else []
    return Profiled(app, proc.returncode, proc.stdout + proc.stderr, runs[-1] if runs else None)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> dict[str, Profiled]:
    """Every app profiled once through the CLI, a few at a time."""
    base = tmp_path_factory.mktemp("apps")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {app: pool.submit(_profile, app, base / app) for app in ALL_APPS}
        return {app: f.result() for app, f in futures.items()}


def _run(profiled: dict[str, Profiled], app: str) -> Profiled:
    run = profiled[app]
    assert run.returncode == 0 and run.prof is not None, f"{app} failed under msprof-py:\n{run.output[-2000:]}"
    return run


def _describe(fs: list[Finding]) -> str:
    return "; ".join(f"{f.code}({f.severity}, rank {f.rank}, dev {f.device}, stream {f.stream}, "
                     f"lost_ns {f.lost_ns}, lost_bytes {f.lost_bytes})" for f in fs[:6]) or "none"


def _expected_finding(run: Profiled, p: Problem) -> Finding:
    """The most costly warning-or-worse finding with one of the expected codes."""
    matching = [f for f in run.warnings() if f.code in p.codes]
    assert matching, f"{p.app}: no warning-or-worse {'/'.join(p.codes)} finding; found: {_describe(run.warnings())}"
    return matching[0]


# ---------------------------------------------------------------------------- the programs run
@pytest.mark.parametrize("app", ALL_APPS)
def test_app_profiles_completely(profiled, app):
    run = _run(profiled, app)
    assert prof_dir.read_status(run.prof)["status"] == "complete"


# ---------------------------------------------------------------------------- diagnosis
@pytest.mark.parametrize("p", PROBLEMS, ids=str)
def test_top_finding_names_the_problem(profiled, p):
    run = _run(profiled, p.app)
    found = run.warnings()
    assert found, f"{p.app}: no warning-or-worse finding"
    assert found[0].code in p.codes, (
        f"{p.app}: top finding {found[0].code}, expected {'/'.join(p.codes)}; ranked: {_describe(found)}")


@pytest.mark.parametrize("p", PROBLEMS, ids=str)
def test_finding_location(profiled, p):
    run = _run(profiled, p.app)
    f = _expected_finding(run, p)
    where = f"{p.app}: {f.code} at rank {f.rank} device {f.device} stream {f.stream}"
    assert f.rank == p.rank, where + f", expected rank {p.rank}"
    if p.device is not None and (p.device_required or f.device is not None):
        assert f.device == p.device, where + f", expected device {p.device}"
    if p.stream is not None and (p.stream_required or f.stream is not None):
        assert f.stream == p.stream, where + f", expected stream {p.stream}"
    if p.others:
        assert sorted(f.ranks) == sorted(p.others), where + f": names waiting ranks {f.ranks}, expected {list(p.others)}"
        same = [g for g in run.warnings() if g.code == f.code]
        assert len(same) == 1, f"{p.app}: {len(same)} {f.code} findings where one grouped finding is expected"


@pytest.mark.parametrize("p", [p for p in PROBLEMS if p.measure is not None], ids=str)
def test_finding_cost_matches_the_measured_loss(profiled, p):
    run = _run(profiled, p.app)
    f = _expected_finding(run, p)
    measured = p.measure(run.df)
    assert measured > 0, f"{p.app}: the program shows no loss to measure"
    cost = f.lost_ns if p.unit == "ns" else f.lost_bytes
    assert cost is not None, f"{p.app}: {f.code} carries no cost in {p.unit} (lost_ns {f.lost_ns}, lost_bytes {f.lost_bytes})"
    assert abs(cost - measured) <= TOLERANCE * measured, (
        f"{p.app}: {f.code} costs {cost:,} {p.unit}, measured {measured:,} {p.unit} ({cost / measured:.2f}x)")


@pytest.mark.parametrize("app", HEALTHY)
def test_healthy_program_has_no_warning(profiled, app):
    run = _run(profiled, app)
    assert not run.warnings(), f"{app}: {_describe(run.warnings())}"


# ---------------------------------------------------------------------------- the measurements themselves
@pytest.mark.parametrize("app, twin, loss", [
    ("sync_every_kernel", "no_sync_twin", measure.sync_bubble_ns),
    ("copy_contention", "double_buffer", measure.contention_stall_ns),
])
def test_measured_loss_is_what_the_healthy_twin_saves(profiled, app, twin, loss):
    """The twin is the same program without the problem: its run is shorter by about the loss."""
    bad, good = _run(profiled, app), _run(profiled, twin)
    saved = measure.run_span_ns(bad.df) - measure.run_span_ns(good.df)
    measured = loss(bad.df)
    assert abs(measured - saved) <= TOLERANCE * saved, f"{app}: measured {measured:,} ns, twin saves {saved:,} ns"


def test_the_programs_have_their_problems(profiled):
    """Sanity of the programs: the problem is really there, where the program puts it."""
    straggler, wait = measure.straggler_and_wait_ns(_run(profiled, "straggler").df)
    assert straggler == 2 and wait > 0
    straggler, wait = measure.straggler_and_wait_ns(_run(profiled, "slow_device_rank").df)
    assert straggler == 1 and wait > 0
    # in the healthy job the ranks arrive together
    _, wait = measure.straggler_and_wait_ns(_run(profiled, "healthy_allreduce").df)
    assert wait < 0.01 * measure.run_span_ns(profiled["healthy_allreduce"].df)
    frag = _run(profiled, "fragmentation")
    assert "workspace allocation failed" in frag.output
    stranded, largest = measure.stranded_free_bytes(frag.df, 0)
    assert largest < GiB < stranded  # more than enough free memory, no hole large enough
    assert measure.copy_bubble_ns(_run(profiled, "double_buffer").df) == 0
    assert measure.launch_wait_ns(_run(profiled, "no_sync_twin").df) == 0
    assert measure.host_work_bubble_ns(_run(profiled, "overlapped_preprocess").df, ("decode_jpeg", "resize")) == 0
