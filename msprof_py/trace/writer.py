"""Writing a trace to Parquet while its producer runs, as msprof writes its data as it goes.

The producer (the emulated runtime) hands the writer chunks of rows no later row can precede:
it cuts them out of its recording below a watermark (see runtime_emu.cuts). Each chunk is
queued for a writer thread here, which builds and sorts it into a table and appends that to
the Parquet output while the producer goes on. The output holds the rows
`write_trace(whole_trace, path)` would write, in the same order; at the end the producer
hands over the last chunk (and whatever the writer has not got to: the producer's thread,
idle by then, builds those chunks beside it). A chunk is any object whose `to_trace(meta,
canonical=False)` gives its rows as a sorted trace: this module knows nothing of who made it.

The writer thread runs alongside the producer on another core for what Arrow and Parquet do
without the GIL (the table parts are one Acero projection each, the sort one take, the write
one call). Between those calls it needs the GIL back, and CPython hands the GIL to a waiting
thread only every `sys.getswitchinterval()` (5 ms by default), which would leave it idle most
of the time; so while a writer is open the interval is SWITCH_INTERVAL_S, restored when the
last open writer closes. Compiled code checks for a switch only when it calls interpreted
code, so the producer calls `TraceWriter.pulse` every so often while it waits (the emulator's
engine does, every few hundred callbacks while a host thread waits on the device).

The table is sorted by (rank, ts), so one `.parquet` file is streamed only for a one-rank job; a
multi-rank job streams into a rank-partitioned directory, one file per rank. Should a row turn
up after a chunk with an earlier ts (a stream or thread created and named mid-run, say), the
producer stops streaming and says why (`fallback` to `close`): the rows written so far are read
back and sorted with the rest, so the output is still complete and sorted (rows with equal ts
may then come in another order).
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msprof_py.trace.atomic import file_mode, parent_dir
from msprof_py.trace.parquet import (
    ROW_GROUP_ROWS,
    check_appendable_file,
    check_trace_directory,
    move_directory_into_place,
    parquet_options,
)
from msprof_py.trace.schema import META_KEY, Trace, TraceMeta, arrow_schema

_DONE = object()
_EMPTY = pa.table({})
#: Rows a rank's file gathers before it writes them as one row group.
MIN_GROUP_ROWS = 16 * 1024
#: The interpreter's thread switch interval while a stream is open (see the module docstring).
SWITCH_INTERVAL_S = 1e-4
_streams_open = 0
_saved_interval = 0.0
_interval_lock = threading.Lock()


def _switch_interval(change: int) -> None:
    """Count streams opening (+1) and closing (-1); shorten the interval while any is open."""
    global _streams_open, _saved_interval
    with _interval_lock:
        if change > 0 and _streams_open == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL_S))
        _streams_open += change
        if change < 0 and _streams_open == 0:
            sys.setswitchinterval(_saved_interval)


class Chunk(Protocol):
    """Rows a producer hands the writer: they build themselves into a sorted trace."""

    def to_trace(self, meta: TraceMeta, *, canonical: bool = True) -> Trace: ...


class TraceWriter:
    """A Parquet output written by a background thread from the chunks its producer hands it."""

    def __init__(self, path: str | Path, world_size: int) -> None:
        self.path = Path(path)
        self.single_file = self.path.suffix == ".parquet"
        if self.single_file:
            check_appendable_file(self.path, world_size)
        parent = parent_dir(self.path)
        if not self.single_file:
            check_trace_directory(self.path)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent))
        # A program that dies before finish() leaves no half-written output behind.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        self._schema = arrow_schema()  # the metadata goes into the footer at close, when it is known
        self._writers: dict[int, pq.ParquetWriter] = {}
        self._pending: dict[int, list[pa.Table]] = {}  # per rank: rows not yet in a row group
        # (sequence number, chunk to build or table to write); bounded: a slow disk holds the
        # producer back, not memory.
        self._jobs: queue.Queue = queue.Queue(maxsize=4)
        self._submitted = 0
        self._error: BaseException | None = None
        self.fallback: str | None = None
        self._thread = threading.Thread(target=self._work, name="msprof-py trace writer", daemon=True)
        _switch_interval(+1)
        self._open = True
        self._thread.start()

    # ---------------------------------------------------------------- producer side
    def pulse(self) -> None:
        """Called by the producer every so often while it waits (the emulator's engine: every few
        hundred callbacks while a host thread waits on the device). Deliberately empty and
        interpreted: entering it lets CPython hand the GIL to the writer thread if it asked for
        it. Compiled code never checks for that request, so without this a long synchronize
        would stall the writer until it returned."""

    def submit(self, chunk: Chunk) -> None:
        """Queue a chunk of rows for the writer thread."""
        if self._error is None:
            self._jobs.put((self._submitted, chunk))
            self._submitted += 1

    def close(self, meta: TraceMeta, rest: Chunk, *, fallback: str | None = None) -> Trace | None:
        """Write `rest` (the rows never handed over), finish the files and move them into place.

        `fallback`: why the producer stopped streaming early, if it did; then `rest` is every row
        it still holds and the whole trace is rebuilt in memory, sorted, written and returned.
        Otherwise returns None (the caller reads the output back when it needs the table)."""
        if fallback is not None:
            self.fallback = fallback
        try:
            if self.fallback is None:
                self.submit(rest)
            # The producer's thread is free now: it builds the chunks still queued while the
            # writer thread builds and writes, so the tail runs on both cores.
            built = []
            while True:
                try:
                    seq, chunk = self._jobs.get_nowait()
                except queue.Empty:
                    break
                built.append((seq, self._build(chunk)))
            for item in built:
                self._jobs.put(item)
            self._jobs.put(_DONE)
            self._thread.join()
            if self._error is not None:
                raise self._error
            if self.fallback is not None:
                return self._merge(meta, rest)
            self._flush_pending()
            if not self._writers:
                self._writer(0)  # nothing recorded: still a readable (empty) trace
            for writer in self._writers.values():
                writer.add_key_value_metadata({META_KEY: meta.to_json().encode()})
                writer.close()
            self._writers.clear()
            self._move_into_place()
            return None
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the partial output (a producer that failed, or after close)."""
        if self._open:
            self._open = False
            _switch_interval(-1)
        if self._thread.is_alive():
            self._error = self._error or RuntimeError("aborted")
            self._jobs.put(_DONE)
            self._thread.join()
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        self._writers.clear()
        self._cleanup()

    # ---------------------------------------------------------------- writer thread
    def _work(self) -> None:
        """Build and write the chunks in order (at close the producer's thread builds some:
        tables may then arrive out of order)."""
        ready: dict[int, Any] = {}
        next_seq = 0
        while True:
            item = self._jobs.get()
            if item is _DONE:
                return
            seq, job = item
            ready[seq] = job if isinstance(job, pa.Table) or job is None else self._build(job)
            while next_seq in ready:
                table = ready.pop(next_seq)
                next_seq += 1
                if table is not None and self._error is None:
                    try:
                        self._write(table)
                    except BaseException as exc:  # noqa: BLE001 - re-raised in the producer's thread by close()
                        self._error = exc

    def _build(self, chunk: Chunk) -> pa.Table | None:
        """A chunk sorted into a table (None after an error: it is skipped)."""
        if self._error is not None:
            return None
        try:
            return chunk.to_trace(TraceMeta(), canonical=False).table
        except BaseException as exc:  # noqa: BLE001 - re-raised in the producer's thread by close()
            self._error = exc
            return None

    def _write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self.single_file:
            self._append(0, table)
        else:
            ranks = table.column("rank")
            for rank in pc.unique(ranks).to_pylist():
                self._append(rank, table.filter(pc.equal(ranks, rank)))

    def _append(self, rank: int, table: pa.Table, *, last: bool = False) -> None:
        """Add rows to a rank's file, a row group once MIN_GROUP_ROWS are pending (a chunk split
        over many ranks would otherwise make row groups too small to compress well)."""
        pending = self._pending.setdefault(rank, [])
        if table.num_rows:
            pending.append(table.replace_schema_metadata(None))
        if pending and (last or sum(t.num_rows for t in pending) >= MIN_GROUP_ROWS):
            group = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            pending.clear()
            self._writer(rank).write_table(group, row_group_size=ROW_GROUP_ROWS)

    def _flush_pending(self) -> None:
        for rank in list(self._pending):
            self._append(rank, _EMPTY, last=True)

    def _writer(self, rank: int) -> pq.ParquetWriter:
        writer = self._writers.get(rank)
        if writer is None:
            if self.single_file:
                where = self._tmp / self.path.name
            else:
                (self._tmp / f"rank={rank}").mkdir()
                where = self._tmp / f"rank={rank}" / "part-0.parquet"
            writer = self._writers[rank] = pq.ParquetWriter(where, self._schema, **parquet_options(self._schema.names))
        return writer

    # ---------------------------------------------------------------- finishing
    def _files(self) -> list[Path]:
        return sorted(self._tmp.rglob("*.parquet"))

    def _merge(self, meta: TraceMeta, rest: Chunk) -> Trace:
        """After a fallback: the rows written so far plus the rest, sorted as one table."""
        from msprof_py.trace.schema import build_table

        self._flush_pending()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        written = [pq.read_table(f) for f in self._files()]
        tail = rest.to_trace(meta).table
        table = pa.concat_tables([*(t.cast(tail.schema) for t in written), tail]) if written else tail
        trace = build_table({name: table.column(name) for name in table.column_names}, meta)
        from msprof_py.trace import write_trace

        write_trace(trace, self.path)
        return trace

    def _move_into_place(self) -> None:
        if self.single_file:
            src = self._tmp / self.path.name
            os.chmod(src, file_mode())
            os.replace(src, self.path)
        else:
            move_directory_into_place(self._tmp, self.path)
