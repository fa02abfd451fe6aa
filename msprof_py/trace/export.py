"""Export a trace table to Chrome JSON that Perfetto and chrome://tracing open correctly.

Timestamps are written relative to the trace origin, in microseconds with exactly three decimals
(exact nanoseconds; no float rounding, hence no Perfetto mis-nesting of absolute-epoch traces).
Metadata (M) rows, flows (s/f) and counters (C) are written as the events they are. The typed
columns and the origin travel in a top-level `msprof_py` block that viewers ignore, so
export -> import gives back the identical table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import msgspec
import pyarrow as pa

from msprof_py.trace import gz
from msprof_py.trace.atomic import atomic_file, parent_dir
from msprof_py.trace.fields import UINT64_MAX, format_us
from msprof_py.trace.importers import EXPORT_KEY
from msprof_py.trace.schema import TYPED_COLUMNS, Trace

_enc = msgspec.json.Encoder()
#: JSON's integer syntax, ASCII digits only; "-0" is no id a decoder gives back as text.
_INT_TEXT = re.compile(r"-?[1-9][0-9]*|0", re.A)
Progress = Callable[[str, int, int], None]


def to_chrome_bytes(trace: Trace, progress: Progress | None = None) -> bytes:
    """The whole trace as one Chrome JSON object (bytes)."""
    t = trace.table
    n = t.num_rows
    ph = t.column("ph").to_pylist()
    name = t.column("name").to_pylist()
    cat = t.column("cat").to_pylist()
    ts = format_us(t.column("ts").to_numpy())
    dur_col = t.column("dur")
    dur_ok = dur_col.is_valid().to_numpy(zero_copy_only=False)
    dur = format_us(dur_col.fill_null(0).to_numpy())
    pid = t.column("pid").to_pylist()
    tid = t.column("tid").to_pylist()
    ids = t.column("id").to_pylist()
    args = t.column("args").to_pylist()
    extra = t.column("extra").to_pylist()

    chunks: list[bytes] = []
    step = max(1, n // 20)
    for i in range(n):
        ex = msgspec.json.decode(extra[i], type=dict[str, msgspec.Raw]) if extra[i] else {}
        parts = [b'{"ph":', _enc.encode(ph[i])]
        if cat[i] is not None:
            parts += [b',"cat":', _enc.encode(cat[i])]
        if name[i] is not None:
            parts += [b',"name":', _enc.encode(name[i])]
        parts += [b',"pid":', bytes(ex.pop("pid")) if "pid" in ex else str(pid[i]).encode()]
        parts += [b',"tid":', bytes(ex.pop("tid")) if "tid" in ex else str(tid[i]).encode()]
        parts += [b',"ts":', ts[i].encode()]
        if dur_ok[i]:
            parts += [b',"dur":', dur[i].encode()]
        if ids[i] is not None:
            parts += [b',"id":', _id_json(ids[i])]
        if args[i] is not None:
            parts += [b',"args":', args[i].encode()]
        for k, v in ex.items():
            parts += [b",", _enc.encode(k), b":", bytes(v)]
        parts.append(b"}")
        chunks.append(b"".join(parts))
        if progress and i % step == 0:
            progress("encode", i, n)

    block: dict[str, Any] = {
        "schema_version": trace.meta.schema_version,
        "origin_ns": trace.meta.origin_ns,
        "source_format": trace.meta.source_format,
        "producer": trace.meta.producer,
        "world_size": trace.meta.world_size,
        "extra": trace.meta.extra,
        "typed": {c: _typed_list(t.column(c)) for c in TYPED_COLUMNS},
    }
    head: dict[str, Any] = {k: v for k, v in trace.meta.source_meta.items() if k not in ("traceEvents", EXPORT_KEY)}
    out = [b"{"]
    for k, v in head.items():
        out += [_enc.encode(k), b":", _enc.encode(v), b",\n"]
    out.append(b'"traceEvents":[\n')
    out.append(b",\n".join(chunks))
    out.append(b'\n],\n"' + EXPORT_KEY.encode() + b'":')
    out.append(_enc.encode(block))
    out.append(b"}\n")
    return b"".join(out)


def _id_json(text: str) -> bytes:
    """An id as the producer wrote it, as far as the table tells: a JSON number when it is the
    canonical text of an integer that JSON readers take as one (-2**63 .. 2**64 - 1), else the
    string it was. torch_npu writes HostToDevice flow ids beyond 2**64 as strings; a bare number
    that wide would be refused or rounded by most readers (double or 64-bit integers)."""
    if _INT_TEXT.fullmatch(text) and -(2**63) <= int(text) <= UINT64_MAX:
        return text.encode()
    return _enc.encode(text)


def _typed_list(col: pa.ChunkedArray) -> list[Any]:
    if pa.types.is_dictionary(col.type):
        col = col.cast(pa.string())
    return col.to_pylist()


def export_chrome(trace: Trace, path: str | Path, progress: Progress | None = None) -> Path:
    """Write Chrome JSON (gzip when the name ends in .gz) atomically."""
    path = Path(path)
    parent_dir(path)
    data = to_chrome_bytes(trace, progress)
    if path.suffix == ".gz":
        data = gz.compress(data)
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return path
