"""The msprof-style output directory of one profiled run, and the runs in an output directory.

    OUTPUT/PROF_000001_20250101120000123_ABCDEFGHIJKLMNOP/
      README.txt                              what is here, and whether the run is complete
      status.json                             complete / incomplete / running, why, exit code, summary
      host/data/rank=R/part-0.parquet         host rows: API calls, launches, steps, memory events
      device_{d}/data/rank=R/part-0.parquet   rows of device d: tasks, HCCL, queue and memory counters
      mindstudio_profiler_output/             msprof_{stamp}.json (timeline) and the summaries
      ground_truth.json                       what the emulator injected (emulated runs only)
      report.html                             bottleneck report (`msprof-py demo`)

The raw data is the trace event table split by where each row was recorded (a process with
device tasks is a device; everything else is the host) and partitioned by rank: together the
parts are the whole table (`read_raw`). `mindstudio_profiler_output/` is derived from it and
can be regenerated at any time (`write_exports`, `msprof-py --export=on`).

Every file is written atomically (temporary name, then rename), so a killed capture leaves
each file whole or absent, never half-written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import shutil
import string
import tempfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py.errors import MsprofError
from msprof_py.trace.atomic import atomic_file, file_mode
from msprof_py.trace.ground_truth import write_ground_truth
from msprof_py.trace.parquet import parquet_writer, read_trace, read_trace_meta, write_trace
from msprof_py.trace.schema import COLUMN_NAMES, DEVICE_KINDS, Trace, arrow_schema, canonical_dictionaries
from msprof_py.trace.units import ms as ms_text

PROF_RE = re.compile(r"^PROF_(\d{6})_(\d{17})_([A-Z]{16})$")
EXPORT_DIR = "mindstudio_profiler_output"
STAGING_DIR = ".staging"
STATUS_FILE = "status.json"
README_FILE = "README.txt"
COMPLETE, INCOMPLETE, RUNNING = "complete", "incomplete", "running"


# ---------------------------------------------------------------------- naming
def new_prof_dir(output: str | Path, *, now: _dt.datetime | None = None) -> Path:
    """Create the next `PROF_{n}_{timestamp}_{random}` under output (created if missing).

    As msprof names them: n counts the runs in output (6 digits), the timestamp is local time to
    the millisecond (17 digits), and the suffix is 16 random capital letters.
    """
    output = check_output(output)
    now = now or _dt.datetime.now()
    stamp = now.strftime("%Y%m%d%H%M%S") + f"{now.microsecond // 1000:03d}"
    while True:
        n = 1 + max((int(m.group(1)) for p in output.iterdir() if (m := PROF_RE.match(p.name))), default=0)
        letters = "".join(secrets.choice(string.ascii_uppercase) for _ in range(16))
        path = output / f"PROF_{n:06d}_{stamp}_{letters}"
        try:
            path.mkdir()
        except FileExistsError:  # another capture took this number at the same instant
            continue
        except PermissionError:
            raise MsprofError(f"{output}: permission denied", hint="choose a writable --output") from None
        return path


def check_output(output: str | Path) -> Path:
    """An output directory that exists (created if missing) and is writable, or MsprofError."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise MsprofError(f"{output}: not a directory", hint="--output names a directory for PROF_* runs")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MsprofError(f"{output}: cannot create directory ({exc.strerror or exc})") from None
    if not os.access(output, os.W_OK | os.X_OK):
        raise MsprofError(f"{output}: directory is not writable", hint="choose a writable --output")
    return output


def is_prof_dir(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and PROF_RE.match(path.name) is not None


def prof_dirs(path: str | Path) -> list[Path]:
    """`path` itself when it is a PROF directory, else the PROF directories in it, by number."""
    path = Path(path)
    if not path.is_dir():
        raise MsprofError(f"{path}: no such directory")
    if is_prof_dir(path):
        return [path]
    return sorted((p for p in path.iterdir() if is_prof_dir(p)), key=lambda p: p.name)


def export_stamp(now: _dt.datetime | None = None) -> str:
    """The timestamp msprof puts in exported file names (`op_summary_20250101120000.csv`)."""
    return (now or _dt.datetime.now()).strftime("%Y%m%d%H%M%S")


# ---------------------------------------------------------------------- raw data
def write_raw(trace: Trace, prof: str | Path) -> list[Path]:
    """Split the table into `host/data` and `device_{d}/data` (each partitioned by rank)."""
    prof = Path(prof)
    t = trace.table
    targets = _targets(t)
    written = []
    for target in sorted(set(targets.tolist())):
        sub = t.filter(pa.array(targets == target))
        where = prof / ("host" if target < 0 else f"device_{target}")
        where.mkdir(exist_ok=True)
        written.append(write_trace(Trace(table=sub, meta=trace.meta), where / "data", partition_by_rank=True))
    return written


def write_raw_rank(path: str | Path, prof: str | Path) -> dict[str, Any]:
    """Lay out one rank's trace file (a streamed run's `rank=R/part-0.parquet`) in `host/data`
    and `device_{d}/data`, a row group at a time: memory holds one row group, not the rank
    (a rank can hold a large share of a job: rank 0 records the links of the whole cluster).
    Each output file is written to a temporary name and renamed when complete. Returns the
    rank's summary_part."""
    path, prof = Path(path), Path(prof)
    keys = read_trace(path, columns=["rank", "pid", "kind", "device"])  # checks the file, and small
    ranks = pc.unique(keys.table.column("rank")).to_pylist()
    if len(ranks) > 1:
        raise ValueError(f"{path}: write_raw_rank takes one rank's file, this one holds ranks {sorted(ranks)}")
    owner = _owners(keys.table)
    del keys
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    meta = read_trace_meta(pf, where=str(path))
    schema = arrow_schema(meta)
    writers: dict[int, tuple[Any, Path, Path]] = {}
    parts = []
    try:
        for i in range(pf.num_row_groups):
            group = pf.read_row_group(i).select(list(COLUMN_NAMES))
            parts.append(summary_part(Trace(table=group, meta=meta)))
            targets = _map_owner(group.column("pid").to_numpy(), owner)
            for target in sorted(set(targets.tolist())):
                if target not in writers:
                    where = prof / ("host" if target < 0 else f"device_{target}") / "data" / f"rank={ranks[0]}"
                    where.mkdir(parents=True, exist_ok=True)
                    tmp = where / ".part-0.parquet.tmp"
                    writers[target] = (parquet_writer(tmp, schema), tmp, where / "part-0.parquet")
                writers[target][0].write_table(group.filter(pa.array(targets == target)).cast(schema))
        for writer, tmp, final in writers.values():
            writer.close()
            os.chmod(tmp, file_mode())
            os.replace(tmp, final)
    finally:
        for writer, tmp, _final in writers.values():
            if tmp.exists():
                writer.close()
                tmp.unlink()
    return merge_parts(parts)


def _owners(t: pa.Table) -> Any:
    """pid -> device id: a process that ran device tasks or holds device counters is that
    device's; all of its rows (names, counters, waits) go with it."""
    kinds = t.column("kind").combine_chunks()
    names = np.array(kinds.dictionary.to_pylist(), dtype=object)[np.asarray(kinds.indices)] if len(t) else \
        np.array([], dtype=object)
    pid = t.column("pid").to_numpy()
    device = t.column("device").fill_null(-1).to_numpy()
    import pandas as pd  # here, not at the top: reading a PROF dir (`info`) must not pay for pandas

    marks = np.isin(names, (*DEVICE_KINDS, "counter")) & (device >= 0)
    return pd.Series(device[marks]).groupby(pid[marks]).first()


def _map_owner(pid: np.ndarray, owner: Any) -> np.ndarray:
    """Device id each row belongs to (-1: host), by its pid."""
    import pandas as pd

    return pd.Series(pid).map(owner).fillna(-1).astype(np.int64).to_numpy()


def _targets(t: pa.Table) -> np.ndarray:
    """Device id each row of `t` belongs to (-1: host)."""
    return _map_owner(t.column("pid").to_numpy(), _owners(t))


def raw_dirs(prof: str | Path) -> list[Path]:
    prof = Path(prof)
    dirs = [prof / "host" / "data"] + sorted(prof.glob("device_*/data"), key=lambda p: p.parent.name)
    return [d for d in dirs if d.is_dir()]


def read_raw(prof: str | Path) -> Trace:
    """The whole trace table of a PROF directory (host and device parts together)."""
    prof = Path(prof)
    parts = [read_trace(d) for d in raw_dirs(prof)]
    if not parts:
        raise MsprofError(f"{prof}: no raw data (host/data or device_*/data)",
                          hint="the run recorded nothing; see its README.txt")
    table = pa.concat_tables([p.table for p in parts])
    order = np.lexsort((table.column("ts").to_numpy(), table.column("rank").to_numpy()))
    table = canonical_dictionaries(table.take(pa.array(order)).select(list(COLUMN_NAMES)))
    return Trace(table=table, meta=parts[0].meta)


# ---------------------------------------------------------------------- exports
def write_exports(prof: str | Path, trace: Trace, *, stamp: str | None = None) -> list[Path]:
    """(Re)write `mindstudio_profiler_output/`: the Chrome timeline and every summary.

    The new directory is built beside the old one and swapped in, so a reader sees the old
    exports or the new ones, never a mix.
    """
    from msprof_py.summaries import CSV_SUMMARIES, cluster_step_table, summaries  # pandas: only here
    from msprof_py.trace.export import export_chrome  # and the exporter

    prof = Path(prof)
    stamp = stamp or export_stamp()
    final = prof / EXPORT_DIR
    tmp = Path(tempfile.mkdtemp(prefix=f".{EXPORT_DIR}.", suffix=".tmp", dir=prof))
    try:
        export_chrome(trace, tmp / f"msprof_{stamp}.json")
        for name, value in summaries(trace).items():
            if name in CSV_SUMMARIES:
                value.to_csv(tmp / f"{name}_{stamp}.csv", index=False)
            else:
                (tmp / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
        cluster = cluster_step_table(trace)
        if cluster is not None:  # a job of several ranks: its step table as msprof-analyze names it
            cluster.to_csv(tmp / "cluster_step_trace_time.csv", index=False)
        os.chmod(tmp, file_mode() | 0o111)
        for f in tmp.iterdir():
            os.chmod(f, file_mode())
        old = prof / f".{EXPORT_DIR}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(final.iterdir())


# ---------------------------------------------------------------------- status and README
def read_status(prof: str | Path) -> dict[str, Any]:
    path = Path(prof) / STATUS_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_status(prof: str | Path, status: dict[str, Any]) -> dict[str, Any]:
    with atomic_file(Path(prof) / STATUS_FILE) as tmp:
        tmp.write_text(json.dumps(status, indent=2, default=str) + "\n", encoding="utf-8")
    return status


def update_status(prof: str | Path, **changes: Any) -> dict[str, Any]:
    return write_status(prof, {**read_status(prof), **changes})


def run_summary(trace: Trace) -> dict[str, Any]:
    """What `--query=on` lists for a run: events, ranks, devices, steps, time span."""
    return merge_summaries([summary_part(trace)])


def summary_part(trace: Trace) -> dict[str, Any]:
    """run_summary's facts of some of a run's rows (one rank's, say), for merge_summaries."""
    t = trace.table
    kinds = t.column("kind").cast(pa.string()).to_numpy(zero_copy_only=False)
    real = kinds != "meta"
    ts = t.column("ts").to_numpy()[real]
    end = ts + t.column("dur").fill_null(0).to_numpy()[real]
    steps = kinds == "step"
    return {"events": int(real.sum()), "ranks": set(np.unique(t.column("rank").to_numpy()).tolist()),
            "devices": set(np.unique(t.column("device").drop_null().to_numpy()).tolist()),
            "steps": set(np.unique(t.column("step").to_numpy(zero_copy_only=False)[steps]).tolist()),
            "start": int(ts.min()) if len(ts) else None, "end": int(end.max()) if len(ts) else None}


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary_part of the rows of all `parts` together."""
    starts = [p["start"] for p in parts if p["start"] is not None]
    ends = [p["end"] for p in parts if p["end"] is not None]
    return {"events": sum(p["events"] for p in parts), "ranks": set().union(*(p["ranks"] for p in parts)),
            "devices": set().union(*(p["devices"] for p in parts)), "steps": set().union(*(p["steps"] for p in parts)),
            "start": min(starts) if starts else None, "end": max(ends) if ends else None}


def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """run_summary of a run from the summary_part of each of its pieces."""
    whole = merge_parts(parts)
    span = whole["end"] - whole["start"] if whole["start"] is not None else 0
    return {"events": whole["events"], "ranks": len(whole["ranks"]), "devices": len(whole["devices"]),
            "steps": len(whole["steps"]), "span_ns": span}


_DESCRIBE = [
    (STATUS_FILE, "run status (complete / incomplete / running), why, exit code, command, summary"),
    ("host/data/", "raw host data: API calls, launches, steps, memory events (Parquet, rank=R/ partitions)"),
    ("device_*/data/", "raw device data: tasks, HCCL, queue and memory counters of that device (Parquet, rank=R/)"),
    ("msprof_*.json", "timeline (Chrome trace): open in ui.perfetto.dev or chrome://tracing"),
    ("op_summary_*.csv", "every operator run: task type, start, duration, wait, block dim"),
    ("op_statistic_*.csv", "operators grouped by type: count, total / min / avg / max time, ratio"),
    ("api_statistic_*.csv", "host API calls grouped by name: time, count, avg / min / max, variance"),
    ("task_time_*.csv", "every device task: kernels, copies, event records / waits, HCCL"),
    ("step_trace_time_*.csv", "per step: computing, communication, overlap, free, stage, preparing (us)"),
    ("npu_mem_*.csv", "device memory the application holds over time"),
    ("memory_record_*.csv", "allocated / reserved totals after every allocation and free"),
    ("operator_memory_*.csv", "every allocation with its size and lifetime"),
    ("communication.json", "per rank, step and HCCL op: time split (transit / wait) and bandwidth"),
    ("communication_matrix.json", "per HCCL op: bytes, time and bandwidth of every rank-to-rank link"),
    ("cluster_step_trace_time.csv", "a job of several ranks: per rank and step, computing, communication not "
                                    "overlapped, overlapped, free (us), as msprof-analyze's cluster analysis"),
    ("ground_truth.json", "what the emulator injected (tests and evaluation only; analyzers never read it)"),
    ("report.html", "bottleneck report: findings ranked by time lost, with remedies"),
]


def write_readme(prof: str | Path) -> Path:
    """README.txt: the run's status and every file present, each with what it holds."""
    prof = Path(prof)
    st = read_status(prof)
    lines = [f"{prof.name}: profile data written by msprof-py", ""]
    state = st.get("status", "unknown")
    lines.append(f"status: {state}" + (" (the data stops where the run stopped)" if state == INCOMPLETE else ""))
    for reason in st.get("reasons", []):
        lines.append(f"  - {reason}")
    if st.get("command"):
        lines.append(f"command: {st['command']}")
    if st.get("exit_code") is not None:
        lines.append(f"exit code: {st['exit_code']}")
    if st.get("summary"):
        s = st["summary"]
        lines.append(f"recorded: {s['events']} events, {s['ranks']} rank(s), {s['devices']} device(s), "
                     f"{s['steps']} step(s), {ms_text(s['span_ns'])}")
    lines += ["", "files:"]
    for rel in _present(prof):
        text = next((t for pattern, t in _DESCRIBE
                     if fnmatch(rel, pattern) or fnmatch(rel.split("/")[-1], pattern)), "")
        lines.append(f"  {rel}: {text}")
    lines += ["", "layout: raw data is the msprof-py trace table split by where rows were recorded (host or",
              "device_<id>) and partitioned by rank; mindstudio_profiler_output/ is derived from it and is",
              "regenerated by: msprof-py --export=on --output=" + str(prof), ""]
    path = prof / README_FILE
    with atomic_file(path) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return path


def _present(prof: Path) -> list[str]:
    out = [STATUS_FILE] if (prof / STATUS_FILE).exists() else []
    out += [f"{d.relative_to(prof).as_posix()}/" for d in raw_dirs(prof)]
    export = prof / EXPORT_DIR
    if export.is_dir():
        out += [f"{EXPORT_DIR}/{f.name}" for f in sorted(export.iterdir()) if not f.name.startswith(".")]
    out += [n for n in ("ground_truth.json", "report.html") if (prof / n).exists()]
    return out


# ---------------------------------------------------------------------- one run, end to end
def finish(prof: str | Path, trace: Trace, *, ground_truth: dict | None = None, exports: bool = True,
           **status: Any) -> Path:
    """Write a run's raw data, exports (unless `exports=False`), ground truth (emulated runs),
    status and README."""
    prof = Path(prof)
    write_raw(trace, prof)
    if ground_truth is not None:
        write_ground_truth(ground_truth, prof)
    if exports:
        write_exports(prof, trace)
    update_status(prof, **status, summary=run_summary(trace), finished=now_iso())
    write_readme(prof)
    return prof


def finish_streamed(prof: str | Path, streamed: str | Path, *, ground_truth: dict | None = None,
                    exports: bool = True, progress: Any = None, **status: Any) -> Path:
    """finish() for a run whose trace was streamed to the rank-partitioned directory `streamed`:
    its ranks are laid out one at a time (memory holds one rank's rows, not the run's) and the
    directory removed. The exports need the whole table: `exports=False` leaves them for later
    (`msprof-py --export=on`). `progress(done, total)` is called after each rank."""
    prof, streamed = Path(prof), Path(streamed)
    files = sorted(streamed.glob("rank=*/*.parquet"), key=lambda f: int(f.parent.name.split("=", 1)[1]))
    parts = []
    for i, f in enumerate(files):
        parts.append(write_raw_rank(f, prof))
        if progress is not None:
            progress(i + 1, len(files))
    shutil.rmtree(streamed)
    if ground_truth is not None:
        write_ground_truth(ground_truth, prof)
    if exports:
        write_exports(prof, read_raw(prof))
    update_status(prof, **status, summary=merge_summaries(parts), finished=now_iso())
    write_readme(prof)
    return prof


def export(prof: str | Path) -> list[Path]:
    """Regenerate a run's exports from its raw data (e.g. after an msprof-py upgrade)."""
    prof = Path(prof)
    trace = read_raw(prof)
    files = write_exports(prof, trace)
    update_status(prof, summary=run_summary(trace), exported=now_iso())
    write_readme(prof)
    return files


def now_iso() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


def query(output: str | Path) -> list[dict[str, Any]]:
    """The runs in an output directory: job, status, devices, ranks, steps, duration, size."""
    rows = []
    for prof in prof_dirs(output):
        st = read_status(prof)
        s = st.get("summary") or {}
        size = sum(f.stat().st_size for f in prof.rglob("*") if f.is_file())
        rows.append({"job": prof.name, "status": st.get("status", "unknown"), "devices": s.get("devices"),
                     "ranks": s.get("ranks"), "steps": s.get("steps"),
                     "duration_ms": None if "span_ns" not in s else s["span_ns"] / 1e6, "size_bytes": size,
                     "source": st.get("source"), "command": st.get("command")})
    return rows
