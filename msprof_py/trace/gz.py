"""gzip through ISA-L when available: decompression ~3x and compression ~10x faster than zlib
for the same files (measured 9 ms vs 27 ms to inflate queue_16rank_rank0.json.gz)."""

from __future__ import annotations

import gzip as _std
import zlib

try:  # isal ships wheels for the common platforms; the standard module is the fallback.
    from isal import igzip as _gz
    from isal.igzip_lib import DECOMP_GZIP, IgzipDecompressor
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


#: The largest output inflate_single takes on: it holds the inflated bytes and the caller's
#: writable copy at once, which for larger traces is memory better left to the stream.
SINGLE_MAX_BYTES = 256 << 20


def inflate_single(data: bytes, size: int) -> bytes | None:
    """The inflated text of `data`, a whole gzip file of one member whose trailer says it
    inflates to `size` bytes, in one call into a buffer of that size (twice as fast as a
    stream read in blocks); None when the file is anything else (several members, bytes
    after the member, truncated, corrupt, or larger than SINGLE_MAX_BYTES): the stream
    reader then decides, and words any error."""
    if size > SINGLE_MAX_BYTES:
        return None
    try:
        if _gz is _std:
            dec = zlib.decompressobj(wbits=31)
        else:
            dec = IgzipDecompressor(flag=DECOMP_GZIP)  # checks the trailer's CRC and size
        out = dec.decompress(data, size + 1)
    except CORRUPT_ERRORS:
        return None
    return out if dec.eof and not dec.unused_data and len(out) == size else None
