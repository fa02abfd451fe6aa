"""Streaming the trace to Parquet while the emulation runs (Runtime(trace_path=...)): the same
table as building it at the end, refused where it cannot be sorted, nothing left behind on failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msprof_py.errors import MsprofError
from msprof_py.trace import read_trace, write_trace, writer
from msprof_py.trace.schema import TraceMeta
from runtime_emu import Kernel, Runtime, scenarios
from runtime_emu.scenarios.samples import SAMPLES

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = ROOT / "sample_traces" / "emulated"
KERNELS = [Kernel("MatMul", 12_170), Kernel("Add", 3_270, core="vector"), Kernel("Conv2D", 15_430)]


def _program(rt: Runtime, launches: int) -> None:
    rt.set_device(0)
    streams = [rt.create_stream(priority=p) for p in (0, 1, 0)]
    for i in range(launches):
        rt.launch_kernel(KERNELS[i % 3], 1 + i % 37, streams[i % 3])
    rt.synchronize_device()


@pytest.mark.parametrize("name, fallback", [
    ("resnet50-infer", None),
    ("yolo-pipeline-no-triple-buffer", None),
    ("llm-train-2server-slow-link", None),  # 16 ranks, 2 servers: one file per rank
    # Its prefetch stream is created (and named) mid-run, after the first cut at this cut size.
    ("bert-train-dp-bandwidth-contention", "a row was recorded after rows later than it had been written"),
])
def test_streamed_scenarios_write_the_committed_sample_tables(tmp_path, name, fallback):
    sample = next(s for s in SAMPLES if s.name == name)
    out = tmp_path / "trace"
    result = scenarios.run(sample.scenario, switches=sample.switches, seed=sample.seed, steps=sample.steps,
                           trace_path=out, trace_cut_tasks=64, **sample.params)
    assert result.stream_fallback == fallback
    assert result.trace_path == out
    committed = read_trace(SAMPLES_DIR / name / "trace")
    streamed = read_trace(out)
    assert streamed.table.equals(committed.table)
    assert streamed.meta == committed.meta
    assert result.trace.table.equals(committed.table)
    assert [p.name for p in tmp_path.iterdir()] == ["trace"]  # no temporary directory left


def test_one_rank_job_streams_into_one_file_in_row_groups_as_it_runs(tmp_path):
    plain = Runtime(seed=1)
    _program(plain, 15_000)
    write_trace(plain.finish().trace, tmp_path / "plain.parquet")

    rt = Runtime(seed=1, trace_path=tmp_path / "streamed.parquet", trace_cut_tasks=500)
    _program(rt, 15_000)
    # Cuts happen while the program runs: most rows have left the recorder before finish().
    assert len(rt.recorder) < 20_000  # of 90k: the host runs ahead of the device by up to a queue of rows
    result = rt.finish()
    assert result.stream_fallback is None
    streamed, expected = read_trace(tmp_path / "streamed.parquet"), read_trace(tmp_path / "plain.parquet")
    assert streamed.table.equals(expected.table) and streamed.meta == expected.meta
    assert streamed.table.num_rows == 90_021  # 6 per launch; 5 API slices; 16 process/thread names
    # Cuts of ~3k rows gather into row groups of at least MIN_GROUP_ROWS (16 Ki); the rest is
    # written at finish().
    meta = pq.ParquetFile(tmp_path / "streamed.parquet").metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(groups) == 90_021 and len(groups) >= 3
    assert all(writer.MIN_GROUP_ROWS <= g < writer.MIN_GROUP_ROWS + 4_000 for g in groups[:-1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.parquet", "streamed.parquet"]


class _ListSink:
    """A trace writer that only keeps what it is handed: all the runtime asks of a sink."""

    path = None

    def __init__(self) -> None:
        self.log: list = []

    def pulse(self) -> None:
        pass

    def submit(self, chunk) -> None:
        self.log.append(("chunk", chunk))

    def close(self, meta, rest, *, fallback=None):
        self.log.append(("close", rest, fallback))

    def abort(self) -> None:
        self.log.append(("abort",))


def test_the_runtime_hands_its_rows_to_the_sink_passed_in_and_writes_nothing_itself(tmp_path, monkeypatch):
    plain = Runtime(seed=1)
    _program(plain, 3_000)
    expected = plain.finish().trace

    monkeypatch.chdir(tmp_path)
    sink = _ListSink()
    rt = Runtime(seed=1, trace_writer=sink, trace_cut_tasks=200)
    _program(rt, 3_000)
    result = rt.finish()
    assert [entry[0] for entry in sink.log[-1:]] == ["close"] and sink.log[-1][2] is None
    chunks = [entry[1] for entry in sink.log]
    assert len(chunks) > 3  # cut while the program ran
    tables = [chunk.to_trace(expected.meta).table for chunk in chunks]
    assert pa.concat_tables(tables).to_pydict() == expected.table.to_pydict()
    assert result.trace_path is None and list(tmp_path.iterdir()) == []


def test_an_empty_run_streams_a_readable_empty_trace(tmp_path):
    rt = Runtime(trace_path=tmp_path / "t.parquet", switches=None)
    result = rt.finish()
    table = read_trace(tmp_path / "t.parquet").table
    assert table.num_rows == result.trace.table.num_rows == 8  # device and host process, stream 0 names
    assert set(table.column("ph").to_pylist()) == {"M"}


def test_a_multi_rank_job_is_not_streamed_into_one_file(tmp_path):
    with pytest.raises(MsprofError, match="2-rank trace is sorted by rank first and cannot be streamed into one file"):
        Runtime(ranks=2, trace_path=tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_streaming_into_a_directory_that_is_not_a_trace_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(MsprofError, match="exists and is not an msprof-py trace directory"):
        Runtime(trace_path=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_program_that_fails_leaves_no_output_behind(tmp_path):
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_emu_streaming import _program\n"
        "from runtime_emu import Runtime\n"
        f"rt = Runtime(trace_path={str(tmp_path / 'out.parquet')!r}, trace_cut_tasks=100)\n"
        "_program(rt, 2_000)\n"
        "assert len(rt.recorder) < 2_000  # rows were cut and written\n"
        "raise SystemExit('the program failed before finish()')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "the program failed before finish()" in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_switch_interval_is_short_only_while_a_stream_is_open(tmp_path):
    before = sys.getswitchinterval()
    first = Runtime(trace_path=tmp_path / "a.parquet")
    second = Runtime(trace_path=tmp_path / "b.parquet")
    assert sys.getswitchinterval() == pytest.approx(min(before, writer.SWITCH_INTERVAL_S))
    _program(first, 10)
    first.finish()
    assert sys.getswitchinterval() == pytest.approx(min(before, writer.SWITCH_INTERVAL_S))  # b is still open
    second.finish()
    assert sys.getswitchinterval() == before


def test_a_finish_that_fails_leaves_no_streamed_output(tmp_path):
    from runtime_emu import Deadlock, Thread

    before = sys.getswitchinterval()
    rt = Runtime(trace_path=tmp_path / "t.parquet", trace_cut_tasks=1)
    _program(rt, 50)  # some cuts are written before it fails
    stream = rt.create_stream()
    never = rt.create_event()
    never.record_seq = 5  # as if recorded on a stream that never gets there
    rt.stream_wait_event(stream, never)
    Thread(lambda: rt.synchronize_stream(stream), runtime=rt).start()
    with pytest.raises(Deadlock):
        rt.finish()
    assert list(tmp_path.iterdir()) == []
    assert sys.getswitchinterval() == before


def test_a_host_thread_waiting_on_the_device_lets_the_writer_thread_in(tmp_path, monkeypatch):
    # Compiled code never offers the GIL to another thread; the engine calls the stream's
    # (interpreted) pulse every PULSE_EVENTS callbacks while a host thread waits, so it can.
    from simcore import engine

    waits: list = []
    monkeypatch.setattr(writer.TraceWriter, "pulse", lambda self: waits.append(rt.engine.now))
    rt = Runtime(seed=1, trace_path=tmp_path / "t.parquet")
    _program(rt, 3_000)  # the queues fill: launches wait, then synchronize_device waits
    rt.finish()
    assert len(waits) == 15 and waits == sorted(waits)
    assert Runtime().engine.pulse is None  # not streaming: no writer thread to let in
    assert engine.PULSE_EVENTS == 256


def test_many_short_streamed_runs_in_one_process_do_not_crash_it(tmp_path):
    # A build running in the writer thread beside the compiled emulator once corrupted the
    # interpreter's memory (an Acero union node): the process died within 200 of these runs,
    # each of which writes many tiny cuts, falls back to merging, then fails in finish().
    script = (
        "import sys, tempfile, pathlib\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_emu_streaming import _program\n"
        "from runtime_emu import Runtime, Deadlock, Thread\n"
        "for i in range(200):\n"
        f"    rt = Runtime(trace_path=pathlib.Path({str(tmp_path)!r}) / f't{{i}}.parquet', trace_cut_tasks=1)\n"
        "    _program(rt, 50)\n"
        "    stream = rt.create_stream()\n"
        "    never = rt.create_event()\n"
        "    never.record_seq = 5\n"
        "    rt.stream_wait_event(stream, never)\n"
        "    Thread(lambda: rt.synchronize_stream(stream), runtime=rt).start()\n"
        "    try:\n"
        "        rt.finish()\n"
        "    except Deadlock:\n"
        "        pass\n"
        "print('survived')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout) == (0, "survived\n"), run.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []



def test_a_cut_holds_only_the_strings_its_rows_use():
    # Every kernel name is a recorder string; a cut after the first 400 kernels names only
    # what its own rows use (else every row group of a multi-rank trace carries them all).
    from runtime_emu import tables

    rt = Runtime(seed=1)
    rt.set_device(0)
    stream = rt.create_stream()
    for i in range(400):
        rt.launch_kernel(Kernel(f"K{i}", 1_000), 1, stream)
    rt.synchronize_device()
    middle = rt.now()
    for _ in range(100):
        rt.launch_kernel(KERNELS[1], 1, stream)
    rt.synchronize_device()
    early = rt.recorder.cut(middle, 0)
    late = rt.recorder.cut(rt.now() + 1, middle)
    assert len(late.strings) > tables.TRIM_ABOVE
    table = late.to_trace(TraceMeta(), canonical=False).table
    assert table.num_rows == 100 * 6 + 1  # 6 rows a launch, and the second synchronize
    for name in ("ph", "name", "cat", "kind"):
        column = table.column(name).combine_chunks()
        assert sorted(column.dictionary.to_pylist()) == sorted({v for v in column.to_pylist() if v is not None})
    assert set(table.column("name").to_pylist()) >= {"Add", "aclrtLaunchKernel"}
    assert len(early.to_trace(TraceMeta(), canonical=False).table.column("name").chunk(0).dictionary) > 400
