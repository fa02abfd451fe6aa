"""RawEvents: the raw columns of a decoded Chrome trace, before typed columns are derived."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class RawEvents:
    """The raw columns of a decoded Chrome trace (timestamps in absolute ns of the source clock)."""

    ph: pa.Array | pa.ChunkedArray  # string
    name: pa.Array | pa.ChunkedArray  # string
    cat: pa.Array | pa.ChunkedArray  # string
    pid: np.ndarray  # int64
    tid: np.ndarray  # int64
    ts_ns: np.ndarray  # int64, 0 where the event has no ts
    has_ts: np.ndarray  # bool
    dur_ns: pa.Array  # int64 with nulls
    id: pa.Array  # string
    args: pa.Array  # string (verbatim JSON)
    extra: pa.Array  # string (JSON object)
    #: Top-level keys of an object-form trace other than traceEvents, parsed.
    top: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.ph)

    @classmethod
    def concat(cls, pieces: list["RawEvents"]) -> "RawEvents":
        if len(pieces) == 1:
            return pieces[0]
        arrow = ("ph", "name", "cat", "dur_ns", "id", "args", "extra")
        numpy = ("pid", "tid", "ts_ns", "has_ts")
        # The bulky verbatim columns stay chunked (a copy would briefly double them); the
        # small ones the importers scan are made contiguous, which makes their scans cheaper.
        out = {k: pa.chunked_array([getattr(p, k) for p in pieces]) for k in ("args", "extra")}
        out.update({k: pa.concat_arrays([getattr(p, k) for p in pieces])
                    for k in arrow if k not in ("args", "extra")})
        out.update({k: np.concatenate([getattr(p, k) for p in pieces]) for k in numpy})
        return cls(**out, skipped=sum(p.skipped for p in pieces))

    def is_in(self, column: str, allowed: tuple[str, ...]) -> np.ndarray:
        """Boolean mask of rows whose `column` (ph, name, cat) is one of `allowed`.

        Each column is dictionary-encoded once and cached: masks are then numpy lookups on
        small integer codes instead of string comparisons over every row.
        """
        codes, values = self._codes(column)
        hit = np.array([v in allowed for v in values] + [False], dtype=bool)
        return hit[codes]

    def _codes(self, column: str) -> tuple[np.ndarray, list[Any]]:
        cache = self.__dict__.setdefault("_code_cache", {})
        if column not in cache:
            enc = self.encoded(column)
            values = enc.dictionary.to_pylist()
            # Nulls point past the dictionary, at the trailing False of every mask.
            cache[column] = (enc.indices.fill_null(len(values)).to_numpy().astype(np.int64), values)
        return cache[column]

    def encoded(self, column: str) -> pa.DictionaryArray:
        """`column` (ph, name, cat) dictionary-encoded, once: the masks above and the table's
        own dictionary column are both made from it."""
        cache = self.__dict__.setdefault("_encoded", {})
        if column not in cache:
            enc = pc.dictionary_encode(getattr(self, column))
            if isinstance(enc, pa.ChunkedArray):
                enc = enc.unify_dictionaries().combine_chunks()
            cache[column] = enc
        return cache[column]

    def release(self) -> None:
        """Drop the columns (the table now owns them), so their memory can go early."""
        for k in ("ph", "name", "cat", "dur_ns", "id", "args", "extra", "pid", "tid", "ts_ns", "has_ts"):
            setattr(self, k, None)
        self.__dict__.pop("_code_cache", None)
        self.__dict__.pop("_encoded", None)

    def take(self, column: str, idx: np.ndarray | list[int]) -> pa.Array:
        """Rows `idx` of an Arrow-backed column (ph, name, cat, id, args, extra); ph, name and
        cat come dictionary-encoded (their encoding is made once: a take moves indices, and
        tests on the values run once per distinct value)."""
        rows = pa.array(np.asarray(idx, dtype=np.int64))
        if column in ("ph", "name", "cat"):
            return self.encoded(column).take(rows)
        return getattr(self, column).take(rows)

    def args_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        """The verbatim `args` JSON text of rows `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        return [v for part in self._args_parts(idx) for v in part.to_pylist()]

    def _args_parts(self, idx: np.ndarray) -> list[pa.Array]:
        """The `args` of rows `idx` taken chunk by chunk (a take on the chunked column would
        first join its chunks: a copy of all of them), in chunk order; `idx` usually ascends."""
        chunks = self.args.chunks if isinstance(self.args, pa.ChunkedArray) else [self.args]
        bounds = np.cumsum([0] + [len(c) for c in chunks])
        ascending = bool((idx[1:] >= idx[:-1]).all())
        if not ascending and len(chunks) > 1:
            # One array, not a chunked one: callers join the parts as arrays (Ascend's device rows,
            # hardware tasks then HCCL's, do not ascend).
            return [self.args.take(pa.array(idx)).combine_chunks()]
        # Each chunk's rows: a slice of idx when it ascends (it does when made by flatnonzero).
        cuts = np.searchsorted(idx, bounds) if ascending else np.array([0, len(idx)])
        parts = []
        for k, (c, lo) in enumerate(zip(chunks, bounds[:-1])):
            sel = idx[cuts[k]:cuts[k + 1]] - lo
            if len(sel):
                parts.append(c.take(pa.array(sel)))
        return parts

    def args_array_json(self, idx: np.ndarray | list[int]) -> bytes | bytearray:
        """The `args` of rows `idx` as one JSON array text (`{}` for rows without args), built
        in Arrow without a Python string per row: msgspec then decodes all of them at once."""
        idx = np.asarray(idx, dtype=np.int64)
        if not len(idx):
            return b"[]"
        parts = [p.fill_null("{}") if p.null_count else p for p in self._args_parts(idx)]
        # The join's text is one value: large_string when it may pass 2 GiB (or a chunk is one).
        large = (sum(p.nbytes for p in parts) + len(idx) >= 2**31 - 1
                 or any(p.type != pa.string() for p in parts))
        if large:
            parts = [p.cast(pa.large_string()) for p in parts]
        texts = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        lists = (pa.LargeListArray if large else pa.ListArray).from_arrays(
            pa.array([0, len(texts)], pa.int64() if large else pa.int32()), texts)
        # All of them as one list, joined by ',' in one Arrow call; then '[' ... ']' around.
        joined = pc.binary_join(lists, pa.scalar(",", texts.type))
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64 if large else np.int32)
        first, last = int(offsets[joined.offset]), int(offsets[joined.offset + 1])
        return b"".join((b"[", memoryview(joined.buffers()[2])[first:last], b"]"))

    def ids_of(self, idx: np.ndarray | list[int]) -> list[str | None]:
        return self.id.take(pa.array(np.asarray(idx, dtype=np.int64))).to_pylist()
