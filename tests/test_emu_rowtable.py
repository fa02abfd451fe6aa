"""The native trace-table build (runtime_emu/_rowtable.c) against the Arrow build (tables.py).

Both must give the same table, dictionaries in canonical form, on every chunk the recorder
can hand over; the native one declines (returns None, leaving the chunk as it was) what it
does not cover, and then the Arrow build decides. Compared: every scenario with each of its
problem switches, streamed cuts, random chunks of every row kind (nulls, several ranks, new
texts in full rows, ties in ts), the split over threads at every boundary, and the declines.
"""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from msprof_py.trace.schema import TraceMeta, arrow_schema, canonical_dictionaries
from runtime_emu import PRESETS, Kernel, Runtime, scenarios, tables
from runtime_emu.recorder import (
    _FIXED_CODES,
    API_W,
    COUNTER_W,
    FLOW_W,
    K_KERNEL,
    K_MEMCPY,
    K_MEMSET,
    K_RECORD,
    K_WAIT,
    NULL,
    TASK_W,
    Chunk,
)

NATIVE = tables.native_module()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the native table build is off (not compiled, or MSPROF_PY_PURE=1)")
SCHEMA = arrow_schema(TraceMeta())


def copy_chunk(chunk: Chunk) -> Chunk:
    return Chunk(list(chunk.rows), {k: None if v is None else v.copy() for k, v in chunk.buffers.items()},
                 list(chunk.strings))


def both(chunk: Chunk, workers: int | None = None, monkeypatch=None):
    """(native table or None, Arrow table made canonical) of the same rows."""
    arrow_chunk = copy_chunk(chunk)
    if workers is not None:
        monkeypatch.setattr(tables, "_workers", lambda: workers)
    native = tables.build_native(NATIVE, chunk, SCHEMA)
    return native, canonical_dictionaries(tables.build_arrow(arrow_chunk, SCHEMA))


def assert_same(native, arrow) -> None:
    assert native is not None, "the native build declined"
    assert native.schema.equals(arrow.schema, check_metadata=True)
    for name in arrow.column_names:
        a, b = native.column(name), arrow.column(name)
        assert a.equals(b), f"column {name}: {a.slice(0, 5)} != {b.slice(0, 5)}"
    for name in ("ph", "name", "cat", "kind"):  # canonical: the values used, in order of first use
        col = native.column(name).combine_chunks()
        seen = list(dict.fromkeys(v for v in col.to_pylist() if v is not None))
        assert col.dictionary.to_pylist() == seen


class Capture:
    """Every chunk a run builds, compared both ways as it is built."""

    def __init__(self, monkeypatch) -> None:
        self.compared = 0
        real = tables.build

        def build(chunk, schema, *, canonical=True):
            native, arrow = both(copy_chunk(chunk))
            assert_same(native, arrow)
            self.compared += 1
            return real(chunk, schema, canonical=canonical)

        monkeypatch.setattr(tables, "build", build)


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_every_scenario_with_each_switch_builds_the_arrow_table(name, monkeypatch):
    cap = Capture(monkeypatch)
    scenario = scenarios.get(name)
    for switches in [(), *[(s,) for s in sorted(scenario.switches)]]:
        scenarios.run(name, switches=switches, steps=2)
    assert cap.compared == 1 + len(scenario.switches)


def test_streamed_cuts_build_the_arrow_table(monkeypatch):
    rt = Runtime(seed=3)
    rt.set_device(0)
    streams = [rt.create_stream(priority=p) for p in (0, 3)]
    ev = rt.create_event()
    buf = rt.malloc(1 << 20)
    for i in range(300):
        s = streams[i % 2]
        rt.launch_kernel(Kernel(f"K{i % 7}\"q\\", 500 + i % 13, op_type="Op\n\u00e9"), 1 + i % 5, s)
        if i % 10 == 0:
            rt.record_event(ev, s)
            rt.stream_wait_event(streams[(i + 1) % 2], ev)
            rt.memcpy_async(buf, 1 << 20, 0x7F00_0000_0000, 4096, 1, s)
    rt.synchronize_device()
    middle = rt.now() // 2
    for before, floor in ((middle, 0), (rt.now() + 1, middle)):
        chunk = rt.recorder.cut(before, floor)
        assert chunk is not None and len(chunk) > 100
        assert_same(*both(chunk))


# ------------------------------------------------------------------ random chunks
def random_chunk(rng: random.Random, n: int, *, full_rows: int = 20) -> Chunk:
    """Rows of every buffer as the recorder writes them, with nulls where a field may be null,
    a few ranks, ts ties, and full rows bringing texts the recorder has not coded."""
    strings = list(_FIXED_CODES) + ["AI_CORE", "AI_VECTOR_CORE", "H2D", "queue full", "aclrtLaunchKernel",
                                    'we"ird\\name', "Op\tTab", "Queue depth stream 0", "\u00fcnicode"]
    ncode = len(strings)

    def ts() -> int:
        return rng.choice((0, 0, 5, rng.randrange(10_000), rng.randrange(1 << 40)))

    def maybe(v: int) -> int:
        return NULL if rng.random() < 0.2 else v

    rank = lambda: rng.randrange(3)  # noqa: E731
    tasks = []
    for _ in range(n):
        kind = rng.choice((K_KERNEL, K_MEMCPY, K_MEMSET, K_WAIT, K_RECORD))
        tasks.append([rank(), maybe(rng.randrange(4)), 2_000_000 + rng.randrange(3), rng.randrange(9), ts(),
                      rng.randrange(1000), rng.randrange(ncode), kind, rng.randrange(ncode), maybe(rng.randrange(1 << 33)),
                      rng.randrange(1, 50), rng.randrange(1, 5), maybe(rng.randrange(1 << 30)), maybe(rng.randrange(ncode)),
                      rng.randrange(100), maybe(rng.randrange(20))])
    apis = [[rank(), 1_000_000 + rng.randrange(3), rng.randrange(1, 4), rng.randrange(ncode), ts(), rng.randrange(99),
             rng.randrange(ncode), maybe(0), maybe(rng.randrange(9)), maybe(rng.randrange(1 << 40)),
             maybe(rng.randrange(1 << 20)), maybe(rng.randrange(7)), maybe(rng.randrange(1, 40)),
             maybe(rng.randrange(ncode)), maybe(rng.randrange(1 << 35)), maybe(rng.randrange(1 << 50)),
             maybe(rng.randrange(1 << 50))] for _ in range(n)]
    flows = [[rank(), rng.randrange(2), ts(), rng.randrange(1 << 22), rng.randrange(9), maybe(rng.randrange(1 << 45)),
              maybe(0), maybe(rng.randrange(9)), maybe(rng.randrange(5))] for _ in range(n)]
    counters = [[rank(), 2_000_000, rng.randrange(ncode), ts(), rng.randrange(1 << 52), rng.randrange(3), maybe(0),
                 maybe(rng.randrange(9)), maybe(rng.randrange(5))] for _ in range(n)]
    rows = []
    for i in range(full_rows):
        rows.append((rank(), rng.choice(("M", "i", "X", "C")), rng.choice((None, "process_name", f"new text {i % 4}")),
                     rng.choice((None, "memory", "AscendCL")), ts(), rng.choice((None, 7)), 1_000_000, rng.randrange(4),
                     rng.choice((None, "12")), rng.choice((None, '{"name":"é\\"x"}')), rng.choice((None, '{"s":"t"}')),
                     rng.choice(("meta", "alloc", "step")), rng.choice((None, 0)), rng.choice((None, 3)),
                     rng.choice((None, 9)), rng.choice((None, 1 << 40)), rng.choice((None, 4096)),
                     rng.choice((None, 1.5, 3)), rng.choice((None, 2))))

    def pack(rows_: list, width: int) -> np.ndarray | None:
        return np.array(rows_, dtype=np.int64).reshape(-1, width) if rows_ else None

    return Chunk(rows, {"tasks": pack(tasks, TASK_W), "apis": pack(apis, API_W), "flows": pack(flows, FLOW_W),
                        "counters": pack(counters, COUNTER_W)}, strings)


@pytest.mark.parametrize("seed", range(6))
def test_random_chunks_build_the_arrow_table(seed):
    rng = random.Random(seed)
    assert_same(*both(random_chunk(rng, rng.choice((1, 37, 500, 3000)), full_rows=rng.choice((0, 1, 40)))))


def _in_order(chunk: Chunk, names: tuple[str, ...]) -> Chunk:
    """The chunk with the named buffers ("rows" for the full rows) each put in (rank, ts) order."""
    ts_field = {"tasks": 4, "apis": 4, "flows": 2, "counters": 3}
    for name in names:
        if name == "rows":
            chunk.rows = sorted(chunk.rows, key=lambda r: (r[0], r[4]))
            continue
        g = chunk.buffers[name]
        chunk.buffers[name] = g[np.lexsort((g[:, ts_field[name]], g[:, 0]))]
    return chunk


@pytest.mark.parametrize("names", [("rows", "tasks", "apis", "flows", "counters"), ("apis", "flows", "counters"),
                                   ("tasks",), ("rows", "counters")])
def test_buffers_already_in_order_are_merged_as_they_are(names):
    # The recorder's API slices, flows and counters usually come in order: they are merged
    # with the sorted rest, ties (many here: three ranks, ts often 0 or 5) going to the row
    # recorded first.
    for seed in range(3):
        chunk = _in_order(random_chunk(random.Random(100 + seed), 700, full_rows=30), names)
        assert_same(*both(chunk))


def test_one_rank_in_buffers_each_in_order_but_not_one_after_another():
    chunk = random_chunk(random.Random(7), 300, full_rows=0)
    for g in chunk.buffers.values():
        g[:, 0] = 0
    chunk = _in_order(chunk, ("tasks", "apis", "flows", "counters"))
    native, arrow = both(chunk)
    assert_same(native, arrow)
    assert native.column("ts").to_pylist() == sorted(native.column("ts").to_pylist())


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 1001])
def test_the_split_over_threads_changes_nothing(n, workers, monkeypatch):
    chunk = random_chunk(random.Random(n), n, full_rows=n % 3)
    assert_same(*both(chunk, workers, monkeypatch))


def test_rows_already_in_order_and_an_empty_chunk():
    rt = Runtime(seed=0)
    rt.set_device(0)
    assert_same(*both(rt.recorder.take()))  # a few rows, in recording order already
    empty = Chunk([], {"tasks": None, "apis": None, "flows": None, "counters": None}, list(_FIXED_CODES))
    native, arrow = both(empty)
    assert native.num_rows == 0
    assert_same(native, arrow)


def test_the_table_owns_its_memory_once_the_chunk_is_gone():
    chunk = random_chunk(random.Random(9), 2000)
    want = canonical_dictionaries(tables.build_arrow(copy_chunk(chunk), SCHEMA))
    table = tables.build_native(NATIVE, chunk, SCHEMA)
    assert chunk.rows == [] and chunk.buffers == {}  # taken over
    del chunk
    gc.collect()
    np.ones(1 << 22).sum()  # reuse freed memory
    assert_same(table, want)
    assert table.column("args").to_pylist() == want.column("args").to_pylist()


# ------------------------------------------------------------------ the block pool
def _pool_bytes() -> int:
    return NATIVE.pool_state()[1]


def test_a_table_gives_its_blocks_to_the_next_build_and_the_pool_keeps_to_its_limit():
    # 70k rows per packed buffer: 280k rows, so every int32 column is a block of 1.1 MB, which the
    # pool keeps (it keeps blocks from 1 MiB). The second build takes what the first table held,
    # blocks that still hold its bytes, and must come out as the Arrow build does all the same.
    NATIVE.release_pool()
    assert NATIVE.pool_state() == (0, 0, tables.POOL_DEFAULT_MB << 20)
    first = random_chunk(random.Random(11), 70_000, full_rows=5)
    table = tables.build_native(NATIVE, first, SCHEMA)
    assert table is not None and table.num_rows == 280_005
    del table, first
    gc.collect()
    blocks, held, _limit = NATIVE.pool_state()
    # every column's data, validity (35 KB: too small to keep) and offsets of 1 MiB and up
    assert blocks >= 19 and held >= 280_005 * (4 * 7 + 8 * 8)
    native, arrow = both(random_chunk(random.Random(12), 70_000, full_rows=5))
    assert _pool_bytes() < held  # the second build took blocks from the pool
    assert_same(native, arrow)
    assert native.column("args").to_pylist() == arrow.column("args").to_pylist()
    del native
    gc.collect()
    try:
        NATIVE.set_pool_limit(3 << 20)  # the rest is freed at once, and kept out from now on
        assert _pool_bytes() <= 3 << 20
        NATIVE.set_pool_limit(0)
        assert NATIVE.pool_state()[:2] == (0, 0)
        table = tables.build_native(NATIVE, random_chunk(random.Random(13), 70_000, full_rows=0), SCHEMA)
        del table
        gc.collect()
        assert NATIVE.pool_state()[:2] == (0, 0)
    finally:
        NATIVE.set_pool_limit(tables.POOL_DEFAULT_MB << 20)
    with pytest.raises(ValueError, match="number of bytes"):
        NATIVE.set_pool_limit(-1)


def test_a_forked_child_builds_from_the_pool_it_inherited():
    import os

    NATIVE.release_pool()
    table = tables.build_native(NATIVE, random_chunk(random.Random(14), 70_000, full_rows=0), SCHEMA)
    del table
    gc.collect()
    held = _pool_bytes()
    assert held > 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: build, report, leave without running the parent's clean-up
        try:
            native, arrow = both(random_chunk(random.Random(15), 70_000, full_rows=0))
            assert_same(native, arrow)
            os.write(write, f"ok {_pool_bytes() < held}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == "ok True"  # it built the same table, taking blocks from its copy of the pool
    assert _pool_bytes() == held  # the parent's pool is its own


@pytest.mark.parametrize("text, mb", [(None, 1024), ("", 1024), (" ", 1024), ("0", 0), ("256", 256), (" 64 ", 64)])
def test_the_pool_limit_from_the_environment(text, mb):
    assert tables.pool_limit_mb(text) == mb


@pytest.mark.parametrize("text", ["-1", "1.5", "lots", "1e3", "0x10"])
def test_a_pool_limit_that_is_not_whole_mib_is_an_error(text):
    with pytest.raises(ValueError, match=r"MSPROF_PY_POOL_MB=.* is not a whole number of MiB >= 0"):
        tables.pool_limit_mb(text)


def test_the_cli_refuses_a_bad_pool_limit_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "MSPROF_PY_POOL_MB": "lots"}
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "msprof_py.cli", "demo", "--output", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "msprof-py: error: MSPROF_PY_POOL_MB='lots' is not a whole number of MiB >= 0: set it to the memory the "
        "trace build may keep for reuse (0 keeps none) or unset it (1024 MiB)"]
    assert not out.exists()


# ------------------------------------------------------------------ what it declines
def _declined(chunk: Chunk) -> None:
    before = copy_chunk(chunk)
    assert tables.build_native(NATIVE, chunk, SCHEMA) is None
    assert chunk.rows == before.rows and chunk.strings == before.strings  # left as it was
    for name, g in before.buffers.items():
        assert (g is None and chunk.buffers[name] is None) or np.array_equal(g, chunk.buffers[name])


def _one(buffer: str, field: int, value: int) -> Chunk:
    chunk = random_chunk(random.Random(1), 40, full_rows=0)
    chunk.buffers[buffer][5, field] = value
    return chunk


@pytest.mark.parametrize("buffer, field, value, why", [
    ("apis", 2, NULL, "a null tid"),
    ("tasks", 3, NULL, "a null stream, which is the task's tid"),
    ("tasks", 6, 10_000, "a name code outside the strings"),
    ("tasks", 7, 9, "a task kind the recorder has not"),
    ("counters", 2, -5, "a negative code"),
    ("flows", 0, 1 << 40, "a rank outside int32"),
    ("apis", 0, -1, "a negative rank (the sort's key)"),
])
def test_what_the_recorder_never_writes_is_left_to_the_arrow_build(buffer, field, value, why):
    _declined(_one(buffer, field, value))


@pytest.mark.parametrize("row", [
    (0, "M", "x"),  # not 19 fields
    tuple([0, "M", None, None, 0, None, 1, 1, None, None, None, None] + [None] * 7),  # no kind
    tuple([0, "M", None, None, 0.5, None, 1, 1, None, None, None, "meta"] + [None] * 7),  # a float ts
    tuple([0, "M", None, None, 0, None, 1, 1, None, None, None, "meta", None, None, None, None, None, "1", None]),
])
def test_full_rows_of_another_shape_are_left_to_the_arrow_build(row):
    chunk = random_chunk(random.Random(2), 10, full_rows=3)
    chunk.rows.append(row)
    _declined(chunk)


def test_the_build_used_follows_the_switch(monkeypatch):
    monkeypatch.setenv("MSPROF_PY_PURE", "1")
    assert tables.native_module() is None
    assert tables.state() == "Arrow; MSPROF_PY_PURE=1"
    monkeypatch.delenv("MSPROF_PY_PURE")
    assert tables.state() == "native"


# ------------------------------------------------------------------ recording rows
def test_append_row_writes_what_struct_writes():
    from runtime_emu import recorder

    rng = random.Random(5)
    native, packed = bytearray(), bytearray()
    for _ in range(200):
        width = rng.choice((1, 6, 9, 15, 16, 17, 70))
        values = [rng.choice((0, -1, 1, rng.randrange(-(1 << 63), 1 << 63))) for _ in range(width)]
        NATIVE.append_row(native, width, *values)
        recorder._packed_append(packed, width, *values)
    assert native == packed and len(native) % 8 == 0
    assert recorder.append_row is NATIVE.append_row  # the recorder uses it


@pytest.mark.parametrize("width, values, error", [
    (3, (1, 2), ValueError), (2, (1, 2, 3), ValueError), (1, (1 << 63,), OverflowError), (2, (1, None), TypeError),
    (2, (1, 2.5), TypeError), (-1, (), ValueError)])
def test_append_row_refuses_a_bad_row_and_appends_nothing(width, values, error):
    from runtime_emu import recorder

    for append in (NATIVE.append_row, recorder._packed_append):
        buf = bytearray(b"12345678")
        with pytest.raises(error if append is NATIVE.append_row else Exception):
            append(buf, width, *values)
        assert buf == b"12345678"
    with pytest.raises(TypeError):
        NATIVE.append_row(b"bytes are not a bytearray", 1, 1)


# ------------------------------------------------------------------ the recorder's row buffers
def test_a_row_buffer_takes_rows_as_a_bytearray_does():
    from runtime_emu import recorder

    rng = random.Random(6)
    buf, packed = NATIVE.RowBuffer(), bytearray()
    assert not buf and len(buf) == 0 and bytes(buf) == b""
    for _ in range(20_000):  # past its first room, and several doublings
        width = rng.choice((9, 16, 17))
        values = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(width)]
        NATIVE.append_row(buf, width, *values)
        recorder._packed_append(packed, width, *values)
    assert len(buf) == len(packed) and bytes(buf) == bytes(packed)
    assert np.array_equal(np.frombuffer(buf, dtype=np.int64), np.frombuffer(packed, dtype=np.int64))
    assert bytes(NATIVE.RowBuffer(b"0123456789abcdef")) == b"0123456789abcdef"
    assert buf.__sizeof__() >= len(buf)
    assert type(recorder.new_buffer("apis")) is NATIVE.RowBuffer  # the recorder's, with the native build
    with pytest.raises(ValueError, match="role is -1"):
        NATIVE.RowBuffer(b"", 8)


def test_a_row_buffer_refuses_a_bad_row_and_a_resize_while_viewed():
    buf = NATIVE.RowBuffer(b"12345678")
    with pytest.raises(OverflowError):
        NATIVE.append_row(buf, 2, 1, 1 << 63)
    assert bytes(buf) == b"12345678"  # a bad row appends nothing
    view = memoryview(buf)
    for _ in range(9000):  # room for some rows in place, then a resize
        try:
            NATIVE.append_row(buf, 1, 7)
        except BufferError as exc:
            assert "cannot be re-sized" in str(exc)
            break
    else:
        pytest.fail("the buffer grew while a view of it was alive")
    view.release()
    NATIVE.append_row(buf, 1, 7)  # with the view gone it grows


def test_a_recordings_row_buffers_go_back_to_the_pool_for_the_next_one():
    import resource

    def run() -> int:
        """One recording and table: the page faults it took (memory new from the kernel)."""
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rt = Runtime(preset=PRESETS["910B3"].with_(cube_cores=4))
        rt.set_device(0)
        streams = [rt.create_stream() for _ in range(2)]
        k = Kernel("k", block_ns=1000)
        for i in range(40_000):  # ~5 MB of API rows, ~25 MB of rows and ~35 MB of table in all
            rt.launch_kernel(k, 1, streams[i % 2])
        rt.synchronize_device()
        assert type(rt.recorder.apis) is NATIVE.RowBuffer and type(rt.truth.tasks) is NATIVE.RowBuffer
        rt.finish()
        del rt
        gc.collect()  # the run's table and buffers freed (a runtime's objects are in cycles)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    NATIVE.release_pool()
    cold = run()
    assert NATIVE.pool_state()[1] > 0  # the buffers' blocks, and the table's, are kept
    run()
    warm = run()  # takes its memory from the pool: a fraction of the faults
    assert cold > 10_000 and warm < cold / 4, (cold, warm)
    NATIVE.set_pool_limit(0)  # no pool: what it held is freed, and it keeps nothing of the next run
    assert NATIVE.pool_state()[:2] == (0, 0)
    run()
    assert NATIVE.pool_state()[:2] == (0, 0)
    NATIVE.set_pool_limit(tables.pool_limit_mb(None) << 20)
