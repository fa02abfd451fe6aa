"""gzip through ISA-L when available: decompression ~3x and compression ~10x faster than zlib
for the same files (measured 9 ms vs 27 ms to inflate queue_16rank_rank0.json.gz)."""

from __future__ import annotations

import gzip as _std
import zlib

try:  # isal ships wheels for the common platforms; the standard module is the fallback.
    from isal import igzip as _gz
    from isal.igzip_lib import IsalError as _IsalError

    CORRUPT_ERRORS: tuple[type[BaseException], ...] = (_std.BadGzipFile, EOFError, zlib.error, _IsalError)
except ImportError:  # pragma: no cover - exercised only where isal has no wheel
    _gz = _std
    CORRUPT_ERRORS = (_std.BadGzipFile, EOFError, zlib.error)

GzipFile = _gz.GzipFile


def compress(data: bytes) -> bytes:
    """gzip bytes with a zero mtime, so the same input gives the same file."""
    if _gz is _std:
        return _std.compress(data, compresslevel=6, mtime=0)
    return _gz.compress(data, compresslevel=2, mtime=0)
