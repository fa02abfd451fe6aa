"""The outcome of one emulation, as `Runtime.finish()` and `acl.finalize()` return it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from msprof_py.trace.schema import Trace


class EmuResult:
    """What one emulation produced: the trace table and the ground truth (for tests only).

    A run streamed to Parquet (`Runtime(trace_path=...)`) has its table on disk at
    `trace_path`; `trace` reads it back on first use. `stream_fallback` says why streaming
    had to stop early, if it did (the output is complete and sorted either way). The ground
    truth may be given as the function that makes it: it is made on first use (most runs are
    profiled, not scored)."""

    def __init__(self, trace: Trace | None = None,
                 ground_truth: "dict[str, Any] | Callable[[], dict[str, Any]] | None" = None, *,
                 trace_path: Path | None = None, stream_fallback: str | None = None) -> None:
        self._trace = trace
        self._ground_truth = ground_truth if ground_truth is not None else {}
        self.trace_path = trace_path
        self.stream_fallback = stream_fallback

    @property
    def ground_truth(self) -> dict[str, Any]:
        made = self._ground_truth
        if callable(made):
            made = self._ground_truth = made()
        return made

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            from msprof_py.trace import read_trace

            assert self.trace_path is not None, "an emulation result has its trace or its trace path"
            self._trace = read_trace(self.trace_path)
        return self._trace

    def save(self, directory: str | Path) -> Path:
        """Write `trace/` (Parquet, partitioned by rank) and `ground_truth.json` into directory
        (with msprof_py.trace's writers: the emulator's core writes no files)."""
        from msprof_py.trace import write_trace
        from msprof_py.trace.ground_truth import write_ground_truth

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_trace(self.trace, directory / "trace")
        write_ground_truth(self.ground_truth, directory)
        return directory
