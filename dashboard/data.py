"""The dashboard's data layer: the traces named on the command line, loaded once, analysed once.

`Store.open(paths)` loads every trace and runs the analyzers on it (a `Dataset`); a trace that
cannot be read becomes an entry with a one-line `error` instead, so the app still serves the
others and shows the reason. Nothing here ever opens a path that came from a request: pages ask
for a trace by its index in the store.

A `Dataset` keeps the table (columns projected), the analyzers' report and, built on first use,
the timeline's lane index (`dashboard.lod.LaneIndex`) and the counter series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from analyzers.frames import Frames
from msprof_py import loading, prof_dir, report
from msprof_py.errors import MsprofError
from msprof_py.trace import Trace

#: Columns the dashboard reads (args only for the hover text of drawn events).
COLUMNS = ("rank", "ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "kind", "device", "stream", "corr",
           "bytes", "addr", "value", "step")

Progress = Callable[[str], None]


def load_trace(path: Path) -> Trace:
    """Read one trace the way every other command does: a PROF_* dir, a Parquet table or JSON."""
    if prof_dir.is_prof_dir(path):
        return prof_dir.read_raw(path)
    return loading.load_any(path)


@dataclass
class Dataset:
    """One loaded, analysed trace."""

    trace: Trace
    frames: Frames
    report: dict[str, Any]

    @classmethod
    def from_trace(cls, trace: Trace) -> "Dataset":
        frames = Frames(trace)
        rep = report.build(trace, frames=frames, timelines=0)
        return cls(trace, frames, rep)

    @cached_property
    def table(self) -> pa.Table:
        names = [c for c in COLUMNS if c in self.trace.table.column_names]
        return self.trace.table.select(names)

    @cached_property
    def span(self) -> tuple[int, int]:
        """First and last nanosecond of real events (metadata excluded)."""
        a, b = self.frames.span
        return (a, b) if b > a else (a, a + 1)

    @cached_property
    def ranks(self) -> list[int]:
        col = self.table.column("rank")
        return sorted(int(r) for r in np.unique(col.to_numpy(zero_copy_only=False)))

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.report["findings"]

    @cached_property
    def lanes(self):
        from dashboard.lod import LaneIndex

        return LaneIndex(self.table)

    @cached_property
    def communication_matrix(self) -> dict[str, Any]:
        """communication_matrix.json of the trace: the links of every op, from the one computation
        communication.json's figures come from (msprof_py.communication)."""
        from msprof_py import communication
        from msprof_py.summaries import Rows

        return communication.summaries(Rows(self.trace))[1]

    @cached_property
    def pipeline(self) -> list[dict[str, Any]]:
        """The pipeline's stage x micro-batch hand-overs (analyzers.causality.pipeline.view_cells),
        empty when the trace records no pipeline: what `msprof-py cluster` prints."""
        from analyzers.causality import pipeline

        return pipeline.view_cells(pipeline.view(pipeline.own_transfers(self.frames)))

    @cached_property
    def counters(self):
        from dashboard.lod import CounterIndex

        return CounterIndex(self.table)


@dataclass
class Entry:
    """A trace named on the command line: its dataset, or why it could not be opened."""

    index: int
    path: Path
    label: str
    dataset: Dataset | None = None
    error: str | None = None


@dataclass
class Store:
    entries: list[Entry] = field(default_factory=list)
    #: Most shapes one timeline view sends to the browser (see dashboard.lod).
    max_shapes: int = 20_000

    @classmethod
    def open(cls, paths: list[str | Path], progress: Progress | None = None) -> "Store":
        store = cls()
        labels = _labels([Path(p) for p in paths])
        for i, (path, label) in enumerate(zip((Path(p) for p in paths), labels)):
            if progress:
                progress(label)
            entry = Entry(i, path, label)
            try:
                entry.dataset = Dataset.from_trace(load_trace(path))
            except MsprofError as exc:
                entry.error = exc.one_line()
            except OSError as exc:
                entry.error = f"{exc.filename or path}: {exc.strerror or exc}"
            except Exception as exc:  # noqa: BLE001 - a corrupt file may fail anywhere in a reader
                entry.error = f"{path}: cannot be read as a trace ({type(exc).__name__}: {_first_line(exc)})"
            store.entries.append(entry)
        return store

    @classmethod
    def of(cls, datasets: dict[str, Dataset]) -> "Store":
        """A store over datasets already in memory (tests, notebooks)."""
        return cls([Entry(i, Path(k), k, d) for i, (k, d) in enumerate(datasets.items())])

    def entry(self, index: Any) -> Entry:
        """The entry a page asked for; anything that is not a valid index means the first."""
        try:
            i = int(index)
        except (TypeError, ValueError):
            i = 0
        return self.entries[i] if 0 <= i < len(self.entries) else self.entries[0]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _labels(paths: list[Path]) -> list[str]:
    """Short, distinct names: the last path part, or more of the path where two would clash."""
    out = []
    for p in paths:
        parts = p.resolve().parts
        name = p.name or str(p)
        if name in ("trace", "data") and len(parts) > 1:
            name = f"{parts[-2]}/{name}"
        out.append(name)
    seen: dict[str, int] = {}
    for i, name in enumerate(out):
        if name in seen:
            out[i] = f"{name} ({i + 1})"
        seen[name] = i
    return out
