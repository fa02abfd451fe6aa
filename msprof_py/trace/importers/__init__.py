"""Import Chrome-format traces (generic, Kineto, torch_npu/msprof, msprof-py exports) into a Trace.

The format is detected from the content, never from the file name.
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from msprof_py.errors import MsprofError, TraceFormatError
from msprof_py.trace import chrome, gz
from msprof_py.trace.importers import ascend, common, kineto
from msprof_py.trace.raw import RawEvents
from msprof_py.trace.schema import (
    COLUMN_NAMES,
    COLUMNS,
    KINDS,
    TYPED_COLUMNS,
    Trace,
    TraceMeta,
    build_table,
    meta_from_dict,
)

#: Top-level key under which an msprof-py export carries its metadata and typed columns.
EXPORT_KEY = "msprof_py"

Progress = Callable[[str, int, int], None]


def read_bytes(path: str | Path, progress: Progress | None = None) -> bytes | bytearray:
    """The file's bytes, gunzipped when it is gzip (by magic number, not by name)."""
    path = Path(path)
    if not path.exists():
        raise MsprofError(f"{path}: no such file")
    if path.is_dir():
        raise MsprofError(f"{path}: is a directory, expected a trace file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(2)
            if head != b"\x1f\x8b":
                fh.seek(0)
                buf = bytearray(size)  # writable: the decoder batches in place
                n = fh.readinto(buf)
                del buf[n:]
                return buf
            return _gunzip(fh, size, progress)
    except gz.CORRUPT_ERRORS as exc:
        raise TraceFormatError(f"{path}: corrupt gzip stream ({exc})", hint="re-copy the file or pass the uncompressed JSON") from None
    except PermissionError:
        raise MsprofError(f"{path}: permission denied") from None


def _gunzip(fh, size: int, progress: Progress | None) -> bytearray:
    """Decompress into one buffer sized from the gzip trailer: no second copy of the JSON."""
    fh.seek(-4, os.SEEK_END)
    expected = int.from_bytes(fh.read(4), "little")  # ISIZE: uncompressed size mod 2**32
    fh.seek(0)
    # A truncated or corrupt file has a meaningless trailer: trust it only up to a ratio real
    # traces stay under (they compress ~20:1), and grow the buffer if the data goes beyond.
    expected = min(expected, size * 64)
    buf = bytearray(expected + 1)
    view = memoryview(buf)
    filled = 0
    with gz.GzipFile(fileobj=fh) as stream:
        while True:
            if filled == len(buf):  # larger than ISIZE said (>4 GiB or multi-member): grow
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            n = stream.readinto(view[filled:filled + (1 << 20)])
            if not n:
                break
            filled += n
            if progress:
                progress("decompress", fh.tell(), size)
    view.release()
    del buf[filled:]
    return buf


def import_trace(path: str | Path, *, lenient: bool = False, progress: Progress | None = None,
                 analysis_only: bool = False) -> Trace:
    """Read a Chrome/Kineto/torch_npu JSON trace (.json or .json.gz) into a Trace.

    `analysis_only` leaves the verbatim `args` and `extra` columns null (the typed columns
    are derived from args as usual): what analyzers read, as `read_trace(columns=...)` loads
    from Parquet. Such a table is for analysis; it does not export back to the same JSON.
    A torch_npu output folder (`*_ascend_pt/`) means the trace_view.json inside it.
    """
    path = ascend.timeline_path(Path(path))
    data = read_bytes(path, progress)
    if progress:
        progress("parse", 0, 1)
    # Decoded here rather than via import_bytes so that the JSON text is freed before the
    # typed columns and the sorted table are built (a caller's reference would pin it).
    with _gc_paused():
        raw = chrome.decode(data, where=str(path), lenient=lenient, extras=not analysis_only)
        del data
        trace = from_raw(raw, where=str(path), analysis_only=analysis_only, source=Path(path))
    if progress:
        progress("parse", 1, 1)
    return trace


def import_bytes(data: bytes | bytearray, *, where: str = "trace", lenient: bool = False) -> Trace:
    """Import trace JSON already in memory (uncompressed)."""
    # The decode creates ~10 objects per event and none of them form cycles: collector passes
    # over them would cost time for nothing.
    with _gc_paused():
        return from_raw(chrome.decode(data, where=where, lenient=lenient), where=where)


@contextlib.contextmanager
def _gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def detect(raw: RawEvents) -> str:
    if EXPORT_KEY in raw.top:
        return "msprof-py"
    if ascend.looks_like(raw):
        return ascend.FORMAT
    if kineto.looks_like(raw):
        return kineto.FORMAT
    return "chrome"


def from_raw(raw: RawEvents, *, where: str = "trace", analysis_only: bool = False,
             source: Path | None = None) -> Trace:
    """Turn decoded raw events into a typed, sorted table (`analysis_only`: see import_trace).

    `source`: the file the events came from, for facts its profiler keeps beside it (torch_npu's
    output folder: kernels' block dims and core counts)."""
    fmt = detect(raw)
    if fmt == "msprof-py":
        return _from_export(raw, where, analysis_only)
    origin = int(raw.ts_ns[raw.has_ts].min()) if raw.has_ts.any() else 0
    if fmt == ascend.FORMAT:
        typed = ascend.derive(raw, source)
        world = None
    elif fmt == kineto.FORMAT:
        typed = kineto.derive(raw)
        world = kineto.rank_of(raw.top)[1]
    else:
        typed = generic_derive(raw)
        world = None
    meta = TraceMeta(origin_ns=origin, source_format=fmt, producer="msprof-py import",
                     world_size=world, source_meta=raw.top)
    if raw.skipped:
        meta.extra["skipped_events"] = raw.skipped
    # The table's order (build_table's: stable by rank, then ts), applied here while the typed
    # columns are still numpy: cheaper than Arrow's take on nullable columns.
    perm = np.lexsort((np.where(raw.has_ts, raw.ts_ns - origin, 0), typed.rank))
    order = None if np.array_equal(perm, np.arange(len(perm))) else perm
    cols = {**raw_columns(raw, origin, analysis_only, order), **typed.columns(order)}
    raw.release()
    return build_table(cols, meta, sort=False)


def generic_derive(raw: RawEvents) -> common.Typed:
    """Plain Chrome traces: only what the phase says (meta, flow, counter, marker), plus the
    PyTorch-style memory instants and ProfilerStep slices when present."""
    t = common.Typed(raw)
    ph, name, _cat = common.base_kinds(raw, t)
    common.memory_events(raw, t, ph, name)
    common.steps(raw, t, name, np.ones(len(raw), dtype=bool), np.zeros(len(raw), dtype=bool))
    return t


def raw_columns(raw: RawEvents, origin: int, analysis_only: bool = False,
                order: np.ndarray | None = None) -> dict[str, Any]:
    """The raw columns as the table's, in row order `order` (None: as they are)."""
    ts = np.where(raw.has_ts, raw.ts_ns - origin, 0)
    text = {"args": raw.args, "extra": raw.extra}
    if analysis_only:  # not sorted nor kept: nothing downstream reads them
        text = {k: pa.nulls(len(raw), pa.string()) for k in text}
    # The table stores ph, name and cat dictionary-encoded: the importer's encodings serve.
    ph, name, cat = (raw.encoded(k) for k in ("ph", "name", "cat"))
    cols = {
        "ph": ph, "name": name, "cat": cat, "ts": ts, "dur": raw.dur_ns,
        "pid": raw.pid, "tid": raw.tid, "id": raw.id, **text,
    }
    if order is None:
        return cols
    rows = pa.array(order)
    for k, v in cols.items():
        if isinstance(v, np.ndarray):
            cols[k] = v[order]
        else:  # dictionary columns move indices, not strings
            cols[k] = (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v).take(rows)
    return cols


def _from_export(raw: RawEvents, where: str, analysis_only: bool = False) -> Trace:
    """An msprof-py export: typed columns and metadata come back from its `msprof_py` block."""
    block = raw.top.pop(EXPORT_KEY)
    if not isinstance(block, dict) or not isinstance(block.get("typed"), dict):
        raise TraceFormatError(f"{where}: malformed '{EXPORT_KEY}' block")
    typed_cols = block.pop("typed")
    missing = [c for c in TYPED_COLUMNS if c not in typed_cols]
    if missing:
        raise TraceFormatError(f"{where}: '{EXPORT_KEY}' block lacks typed column(s) {', '.join(missing)}")
    n = len(raw)
    typed = {col: _typed_column(typed_cols[col], col, n, where) for col in TYPED_COLUMNS}
    bad = set(typed["kind"].to_pylist()) - set(KINDS)
    if bad:
        raise TraceFormatError(f"{where}: unknown kind(s) {sorted(bad, key=str)}")
    block.pop("source_meta", None)  # the export's own top-level keys are the source's metadata
    meta = meta_from_dict({k: v for k, v in block.items() if k in TraceMeta.__dataclass_fields__}, where=where,
                          what=f"'{EXPORT_KEY}' metadata")
    meta.source_meta = raw.top
    # Event ts in an export are relative to the origin already.
    cols = raw_columns(raw, 0, analysis_only)
    raw.release()
    cols.update(typed)
    return build_table(cols, meta)


def _typed_column(values: Any, col: str, n: int, where: str) -> pa.Array:
    """One typed column of an export's block as Arrow, or a TraceFormatError saying what is wrong."""
    if not isinstance(values, list):
        raise TraceFormatError(f"{where}: typed column {col!r} is not a list")
    if len(values) != n:
        raise TraceFormatError(f"{where}: typed column {col!r} has {len(values)} values for {n} events")
    typ, nullable = next((t, null_ok) for name, t, null_ok in COLUMNS if name == col)
    try:
        arr = pa.array(values, type=pa.string() if pa.types.is_dictionary(typ) else typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{where}: typed column {col!r} holds a value of the wrong type or out of range "
                               f"({reason})") from None
    if arr.null_count and not nullable:
        raise TraceFormatError(f"{where}: typed column {col!r} is null at event {values.index(None)}, "
                               "and this column always has a value")
    return arr


__all__ = ["import_trace", "import_bytes", "read_bytes", "detect", "from_raw", "EXPORT_KEY", "COLUMN_NAMES"]
