"""Profiling from inside a program, in torch.profiler's shape.

    import msprof_py
    from runtime_emu import acl

    acl.init(); acl.rt.set_device(0)
    with msprof_py.profile(output="profiling",
                           schedule=msprof_py.schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(8):
            with acl.prof.step():
                train_step()
            prof.step()
    print(prof.path)        # profiling/PROF_.../ holding steps 2, 3 and 4 only

How steps outside `active` stay out: the runtime records only while a step is active. The
profile switches the runtime's recording (its `Switches`) on at the start of an active window
and off at its end; at both edges it first waits for the device to drain, as torch.profiler
synchronizes the device when tracing starts and stops, so every device task belongs wholly to
the window its launch was in. Rows the runtime writes whatever its switches say (step
annotations, buffer accesses) are then cut to the windows. Wait and warmup steps record
nothing (starting the emulator's recorder costs nothing, so warmup has nothing to warm).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from msprof_py import __version__, prof_dir
from msprof_py.errors import MsprofError
from msprof_py.trace import Trace


class ProfilerAction(str, Enum):
    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"


@dataclass(frozen=True)
class Schedule:
    """Step number -> action, cycling wait, warmup, active (`repeat` times; 0: forever) after
    `skip_first` steps, as torch.profiler.schedule does."""

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    skip_first: int = 0

    def __post_init__(self) -> None:
        if self.active < 1 or min(self.wait, self.warmup, self.repeat, self.skip_first) < 0:
            raise MsprofError(f"invalid schedule {self}: active must be >= 1 and the others >= 0")

    def __call__(self, step: int) -> ProfilerAction:
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step // cycle >= self.repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < self.wait:
            return ProfilerAction.NONE
        return ProfilerAction.WARMUP if pos < self.wait + self.warmup else ProfilerAction.RECORD


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """A wait / warmup / active step schedule (torch.profiler.schedule's arguments)."""
    return Schedule(wait, warmup, active, repeat, skip_first)


class profile:  # noqa: N801 - named like torch.profiler.profile, which it mirrors
    """Record the active steps of the runtime (default: `acl.current()`) into a PROF dir under
    `output` when the block ends. Without a schedule every step is active."""

    def __init__(self, output: str | Path = "profiling", *, schedule: Schedule | None = None,
                 switches: Any = None, runtime: Any = None) -> None:
        self.output = Path(output)
        self.schedule = schedule
        self.wanted = switches
        self.runtime = runtime
        self.step_num = 0
        self.windows: list[tuple[int, int]] = []
        self.path: Path | None = None
        self._recording = False
        self._start_ns = 0
        self._final: Trace | None = None

    # -------------------------------------------------------------- lifetime
    def __enter__(self) -> "profile":
        from runtime_emu import acl
        from runtime_emu.errors import AclError

        prof_dir.check_output(self.output)
        try:
            self.rt = self.runtime if self.runtime is not None else acl.current()
        except AclError:
            raise MsprofError("no runtime to profile: call acl.init() before entering msprof_py.profile") from None
        self._saved = asdict(self.rt.sw)
        self.wanted = asdict(self.wanted) if self.wanted is not None else dict(self._saved)
        acl.on_finalize.append(self._on_finalize)
        self._set_switches(off=True)
        self._apply(self._action(0))
        return self

    def step(self) -> None:
        """Mark the end of a step: the next one starts with its scheduled action."""
        self.step_num += 1
        self._apply(self._action(self.step_num))

    def __exit__(self, *exc: Any) -> None:
        from runtime_emu import acl

        if self._recording:
            self._stop()
        for k, v in self._saved.items():
            setattr(self.rt.sw, k, v)
        if self._on_finalize in acl.on_finalize:
            acl.on_finalize.remove(self._on_finalize)
        if exc[0] is None or self.windows:
            self._write(None if exc[0] is None else f"the profiled block raised {exc[0].__name__}: {exc[1]}")

    # -------------------------------------------------------------- windows
    def _action(self, step: int) -> ProfilerAction:
        return self.schedule(step) if self.schedule is not None else ProfilerAction.RECORD

    def _apply(self, action: ProfilerAction) -> None:
        if action is ProfilerAction.RECORD and not self._recording:
            self._drain()  # earlier work finishes unrecorded
            self._set_switches(off=False)
            self._start_ns, self._recording = self._now(), True
        elif action is not ProfilerAction.RECORD and self._recording:
            self._stop()

    def _stop(self) -> None:
        # Host-side recording off first, so the profiler's own synchronize is not in the trace;
        # device recording stays on until the window's tasks have finished.
        self.rt.sw.runtime_api = self.rt.sw.memory = False
        self._drain()
        self.windows.append((self._start_ns, self._now()))
        self._set_switches(off=True)
        self._recording = False

    def _drain(self) -> None:
        from runtime_emu.errors import AclError

        if self.rt.finished:
            return
        try:
            self.rt.synchronize_device()
        except AclError:  # no device set yet: nothing can be running
            pass

    def _now(self) -> int:
        if self.rt.finished:
            return int(np.iinfo(np.int64).max)
        return self.rt.now()

    def _set_switches(self, *, off: bool) -> None:
        for f in fields(self.rt.sw):
            setattr(self.rt.sw, f.name, False if off else self.wanted[f.name])

    def _on_finalize(self, result: Any) -> None:
        if result is not None and getattr(self, "rt", None) is not None and self.rt.finished:
            self._final = result.trace

    # -------------------------------------------------------------- output
    def _write(self, failure: str | None) -> None:
        trace = self._final if self._final is not None else self.rt.snapshot()
        trace = in_windows(trace, self.windows)
        prof = prof_dir.new_prof_dir(self.output)
        prof_dir.write_status(prof, {"source": "profile", "command": "msprof_py.profile", "msprof_py": __version__,
                                     "switches": self.wanted, "schedule": None if self.schedule is None
                                     else asdict(self.schedule), "windows_ns": self.windows,
                                     "started": prof_dir.now_iso()})
        self.path = prof_dir.finish(prof, trace, status=prof_dir.INCOMPLETE if failure else prof_dir.COMPLETE,
                                    reasons=[failure] if failure else [])


def in_windows(trace: Trace, windows: list[tuple[int, int]]) -> Trace:
    """The rows whose time falls in one of the (sorted, disjoint, half-open) windows, plus metadata."""
    t = trace.table
    ts = t.column("ts").to_numpy()
    kinds = t.column("kind").cast(pa.string()).to_numpy(zero_copy_only=False)
    starts = np.array([w[0] for w in windows], dtype=np.int64)
    ends = np.array([w[1] for w in windows], dtype=np.int64)
    i = np.searchsorted(starts, ts, side="right") - 1
    keep = (kinds == "meta") | ((i >= 0) & (ts < ends[np.maximum(i, 0)] if len(ends) else False))
    return Trace(table=t.filter(pa.array(keep)), meta=trace.meta)
