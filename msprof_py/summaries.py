"""msprof-compatible summaries of a trace table: the CSV / JSON files msprof writes into
`mindstudio_profiler_output/`, with msprof's file names and column headers.

Pure functions of the table (pandas, vectorised per group); writing them out is the PROF
directory's job (`msprof_py.prof_dir`). Times come from the typed columns (`ts`, `dur` in ns)
and are written in msprof's units (us with exactly three decimals, ms for communication);
the only fields read from `args` are the two msprof keeps there and the typed schema does not
(`Task Type`, `Block Dim`), extracted column-wise with a regex.

Header sources (CANN msprof export definitions and the hiascend "Profiling" data-file pages):
op_summary, op_statistic, api_statistic, task_time, npu_mem, memory_record, operator_memory as
msprof's `mindstudio_profiler_output` CSVs (Device_id first where msprof puts it);
step_trace_time as torch_npu / msprof-analyze write it; communication.json and
communication_matrix.json come from `msprof_py.communication`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from msprof_py import communication
from msprof_py.trace.schema import DEVICE_KINDS, Trace

NA = "N/A"

HEADERS: dict[str, tuple[str, ...]] = {
    "op_summary": ("Device_id", "Model ID", "Task ID", "Stream ID", "Op Name", "OP Type", "OP State", "Task Type",
                   "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)", "Block Dim", "Mix Block Dim",
                   "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
                   "Output Formats"),
    "op_statistic": ("Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
                     "Max Time(us)", "Ratio(%)"),
    "api_statistic": ("Device_id", "Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)", "Max(us)",
                      "Variance"),
    "task_time": ("Device_id", "kernel_name", "kernel_type", "stream_id", "task_id", "task_time(us)",
                  "task_start(us)", "task_stop(us)"),
    "step_trace_time": ("Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                        "Communication", "Free", "Stage", "Bubble",
                        "Communication(Not Overlapped and Exclude Receive)", "Preparing"),
    "npu_mem": ("Device_id", "event", "ddr(KB)", "hbm(KB)", "memory(KB)", "timestamp(us)"),
    "memory_record": ("Component", "Timestamp(us)", "Total Allocated(KB)", "Total Reserved(KB)", "Device"),
    "operator_memory": ("Name", "Size(KB)", "Allocation Time(us)", "Duration(us)", "Allocation Total Allocated(KB)",
                        "Allocation Total Reserved(KB)", "Release Total Allocated(KB)", "Release Total Reserved(KB)",
                        "Device"),
}
CSV_SUMMARIES = tuple(HEADERS)
JSON_SUMMARIES = ("communication", "communication_matrix")
#: Task types by kind, for rows whose args do not say (imported traces without "Task Type").
_DEFAULT_TASK_TYPE = {"kernel": "AI_CORE", "memcpy": "MEMCPY_ASYNC", "memset": "MEMSET", "collective": "HCCL",
                      "wait": "EVENT_WAIT", "marker": "EVENT_RECORD"}
_COLUMNS = ["rank", "ph", "name", "cat", "ts", "dur", "pid", "kind", "device", "stream", "corr", "bytes", "addr",
            "value", "step"]


def summaries(trace: Trace) -> dict[str, Any]:
    """Every summary: {name: DataFrame with msprof's header} for CSVs, {name: dict} for JSONs."""
    rows = Rows(trace)
    out: dict[str, Any] = {
        "op_summary": op_summary(rows), "op_statistic": op_statistic(rows), "api_statistic": api_statistic(rows),
        "task_time": task_time(rows), "step_trace_time": step_trace_time(rows), "npu_mem": npu_mem(rows),
        "memory_record": memory_record(rows), "operator_memory": operator_memory(rows),
    }
    comm, matrix = communication.summaries(rows)
    out["communication"], out["communication_matrix"] = comm, matrix
    return out


def _args(t: pa.Table, rows: np.ndarray) -> pa.ChunkedArray | None:
    """The `args` of these rows; None when the table has no `args` column."""
    return t.column("args").take(pa.array(rows)) if "args" in t.column_names else None


def _arg_field(args: pa.ChunkedArray | None, pattern: str, n: int) -> np.ndarray:
    """A field parsed out of `args` (`_extract`); unknown (None) for all `n` rows without args."""
    return np.full(n, None, dtype=object) if args is None else _extract(args, pattern)


class Rows:
    """The row sets the summaries share (device tasks, host API calls, steps...), built once."""

    def __init__(self, trace: Trace) -> None:
        """`trace` may lack the `args` column (a partition read with the analysis columns only, as
        the cluster analyses read it): the fields parsed out of it (task type, block dim, OP Type,
        allocator) are then unknown."""
        t = trace.table
        self.origin_ns = int(trace.meta.origin_ns or 0)
        self.topology = (trace.meta.extra or {}).get("topology") or {}
        df = t.select(_COLUMNS).to_pandas()
        for c in ("ph", "name", "cat", "kind"):
            df[c] = df[c].astype(object)
        self.df = df
        device_pids = set(df.loc[df["kind"].isin(DEVICE_KINDS), "pid"].unique())
        on_device = df["pid"].isin(device_pids)
        timed = (df["ph"] == "X") & ~df["kind"].isin(("meta", "flow", "counter", "step"))
        tasks = df[timed & on_device].copy()
        tasks["dur"] = tasks["dur"].fillna(0).astype(np.int64)
        tasks["end"] = tasks["ts"] + tasks["dur"]
        tasks["device"] = tasks["device"].fillna(-1).astype(np.int64)
        tasks["stream"] = tasks["stream"].astype("Int64")
        args = _args(t, tasks.index.to_numpy())
        task_type = _arg_field(args, r'"Task Type":\s*"(?P<v>[^"]*)"', len(tasks))
        tasks["task_type"] = np.where(pd.isna(task_type), tasks["kind"].map(_DEFAULT_TASK_TYPE).fillna(NA), task_type)
        tasks["block_dim"] = _arg_field(args, r'"Block Dim":\s*(?P<v>\d+)', len(tasks))
        # msprof's OP Type (the operator, e.g. Conv2D, of the instance Conv2D12) where the producer
        # recorded it (the emulator does; a torch_npu timeline does not): else the op's own name.
        op_type = _arg_field(args, r'"OP Type":\s*"(?P<v>(?:[^"\\]|\\.)*)"', len(tasks))
        op_type = np.array([None if v is None or pd.isna(v) else (json.loads(f'"{v}"') if "\\" in v else v)
                            for v in op_type], dtype=object)
        tasks["op_type"] = np.where(pd.isna(op_type), tasks["name"].to_numpy(dtype=object), op_type)
        tasks = tasks.sort_values(["rank", "device", "stream", "ts"], kind="stable")
        # msprof's Task Wait Time: from the end of the stream's previous task to this start.
        prev_end = tasks.groupby(["rank", "device", "stream"], sort=False)["end"].transform(
            lambda s: s.cummax().shift(1))
        tasks["wait"] = (tasks["ts"] - prev_end).clip(lower=0).fillna(0).astype(np.int64)
        self.tasks = tasks.sort_values(["device", "rank", "ts"], kind="stable")
        api_kinds = df["kind"].isin(("api", "launch", "sync", "wait", "op_compile"))
        self.apis = df[(df["ph"] == "X") & api_kinds & ~on_device
                       & ~df["cat"].isin(("user_annotation",))].copy()
        steps = df[(df["kind"] == "step") & (df["ph"] == "X")].copy()
        steps["end"] = steps["ts"] + steps["dur"].fillna(0).astype(np.int64)
        self.steps = steps.sort_values(["rank", "ts"], kind="stable")
        memory = df[df["kind"].isin(("alloc", "free"))]
        allocator = _arg_field(_args(t, memory.index.to_numpy()), r'"Allocator":\s*"(?P<v>[^"]*)"', len(memory))
        # The driver's frees say "aclrtFree": one allocator, two call names.
        allocator = np.where(allocator == "aclrtFree", "aclrtMalloc", allocator)
        self.memory = memory.assign(allocator=allocator).sort_values(["rank", "ts"], kind="stable")
        self.counters = df[df["kind"] == "counter"]
        self.device_of_rank = (tasks.groupby("rank")["device"].min() if len(tasks)
                               else pd.Series(dtype=np.int64))

    def us(self, ns: pd.Series | np.ndarray) -> list[str]:
        """Absolute (origin + ts) microseconds, exact, three decimals: msprof's timestamps."""
        return us_text(np.asarray(ns, dtype=np.int64) + self.origin_ns)


def _extract(args: pa.ChunkedArray | pa.Array, pattern: str) -> np.ndarray:
    if len(args) == 0:
        return np.array([], dtype=object)
    got = pc.extract_regex(args, pattern)
    return np.asarray(pc.struct_field(got, [0]).to_pandas(), dtype=object)


def us_text(ns: np.ndarray) -> list[str]:
    """ns -> microseconds as text with exactly three decimals (no float rounding)."""
    ns = np.asarray(ns, dtype=np.int64)
    whole, frac = np.divmod(np.abs(ns), 1000)
    sign = np.where(ns < 0, "-", "")
    return [f"{s}{w}.{f:03d}" for s, w, f in zip(sign.tolist(), whole.tolist(), frac.tolist())]


def _frame(name: str, data: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(data, columns=list(HEADERS[name]))


def _kb(nbytes: pd.Series | np.ndarray) -> np.ndarray:
    return np.round(np.asarray(nbytes, dtype=np.float64) / 1024, 3)


def _int_or_na(values: pd.Series) -> list:
    return [NA if pd.isna(v) else int(v) for v in values]


# ---------------------------------------------------------------------- operators and tasks
def op_summary(rows: Rows) -> pd.DataFrame:
    """One row per operator run on a device: kernels, and HCCL collectives (msprof gives HCCL
    rows no task or stream id: their many sub-tasks each have their own)."""
    ops = rows.tasks[rows.tasks["kind"].isin(("kernel", "collective"))]
    hccl = (ops["kind"] == "collective").to_numpy()
    n = len(ops)
    return _frame("op_summary", {
        "Device_id": ops["device"].to_numpy(), "Model ID": [NA] * n,
        "Task ID": np.where(hccl, NA, np.asarray(_int_or_na(ops["corr"]), dtype=object)),
        "Stream ID": np.where(hccl, NA, np.asarray(_int_or_na(ops["stream"]), dtype=object)),
        "Op Name": ops["name"].to_numpy(), "OP Type": ops["op_type"].to_numpy(), "OP State": [NA] * n,
        "Task Type": ops["task_type"].to_numpy(), "Task Start Time(us)": rows.us(ops["ts"]),
        "Task Duration(us)": us_text(ops["dur"]), "Task Wait Time(us)": us_text(ops["wait"]),
        "Block Dim": [NA if v is None or pd.isna(v) else int(v) for v in ops["block_dim"]], "Mix Block Dim": [0] * n,
        **{h: [NA] * n for h in HEADERS["op_summary"][13:]},
    })


def op_statistic(rows: Rows) -> pd.DataFrame:
    """Kernels grouped by (device, op type, core type), as msprof groups them: count, total / min / avg / max time, and
    each group's share of the device's kernel time."""
    k = rows.tasks[rows.tasks["kind"] == "kernel"]
    if not len(k):
        return _frame("op_statistic", {})
    g = k.groupby(["device", "op_type", "task_type"], sort=False)["dur"].agg(["count", "sum", "min", "mean", "max"])
    g = g.reset_index()
    device_total = g.groupby("device")["sum"].transform("sum")
    g["ratio"] = np.round(g["sum"] / device_total * 100, 3)
    g = g.sort_values(["device", "sum"], ascending=[True, False], kind="stable")
    return _frame("op_statistic", {
        "Device_id": g["device"].to_numpy(), "OP Type": g["op_type"].to_numpy(), "Core Type": g["task_type"].to_numpy(),
        "Count": g["count"].to_numpy(), "Total Time(us)": us_text(g["sum"]), "Min Time(us)": us_text(g["min"]),
        "Avg Time(us)": np.round(g["mean"].to_numpy() / 1000, 3), "Max Time(us)": us_text(g["max"]),
        "Ratio(%)": g["ratio"].to_numpy(),
    })


def api_statistic(rows: Rows) -> pd.DataFrame:
    """Host runtime API calls grouped by (device, level, name). Level as msprof names it: `acl`
    for AscendCL calls, `hccl` for HCCL's, `runtime` for the rest."""
    a = rows.apis
    if not len(a):
        return _frame("api_statistic", {})
    a = a.assign(dur_us=a["dur"].fillna(0).astype(np.int64) / 1000,
                 dev=[("host" if pd.isna(d) else str(int(d))) for d in a["device"]],
                 level=np.select([a["name"].str.startswith("acl"), a["name"].str.lower().str.startswith("hccl")],
                                 ["acl", "hccl"], "runtime"),
                 dur_ns=a["dur"].fillna(0).astype(np.int64))
    g = a.groupby(["dev", "level", "name"], sort=False).agg(
        total=("dur_ns", "sum"), count=("dur_ns", "size"), mean=("dur_us", "mean"), lo=("dur_ns", "min"),
        hi=("dur_ns", "max"), var=("dur_us", lambda s: float(np.var(s.to_numpy())))).reset_index()
    g = g.sort_values("total", ascending=False, kind="stable")
    return _frame("api_statistic", {
        "Device_id": g["dev"].to_numpy(), "Level": g["level"].to_numpy(), "API Name": g["name"].to_numpy(),
        "Time(us)": us_text(g["total"]), "Count": g["count"].to_numpy(), "Avg(us)": np.round(g["mean"], 3).to_numpy(),
        "Min(us)": us_text(g["lo"]), "Max(us)": us_text(g["hi"]), "Variance": np.round(g["var"], 3).to_numpy(),
    })


def task_time(rows: Rows) -> pd.DataFrame:
    """Every task a device ran (kernels, copies, memsets, event records / waits, HCCL parts)."""
    t = rows.tasks
    return _frame("task_time", {
        "Device_id": t["device"].to_numpy(), "kernel_name": t["name"].to_numpy(),
        "kernel_type": t["task_type"].to_numpy(), "stream_id": _int_or_na(t["stream"]),
        "task_id": _int_or_na(t["corr"]), "task_time(us)": us_text(t["dur"]), "task_start(us)": rows.us(t["ts"]),
        "task_stop(us)": rows.us(t["end"]),
    })


# ---------------------------------------------------------------------- steps
def step_trace_time(rows: Rows) -> pd.DataFrame:
    """Per step of each rank (`ProfilerStep#N`), torch_npu's split of the step in us:
    Computing = union of kernel time, Communication = union of HCCL time (transfers and their
    notify waits), Overlapped = both at once, Free = Stage - Computing - Communication(Not
    Overlapped), Stage = from the step's start to the end of its last device task, Preparing =
    from the step's start to its first device task. Bubble (pipeline receives) is 0: the emulator
    has no pipeline-parallel receive ops."""
    steps = rows.steps
    if not len(steps):
        return _frame("step_trace_time", {})
    t = rows.tasks
    t = t.assign(comm=(t["kind"] == "collective") | ((t["kind"] == "wait") & (t["cat"] == "hccl")),
                 compute=t["kind"] == "kernel")
    work = t[t["kind"].isin(DEVICE_KINDS) | t["comm"]]
    by_step = dict(tuple(work.groupby(["rank", "step"], sort=False)))
    empty = work.iloc[:0]
    out = []
    for (rank, step), s in steps.groupby(["rank", "step"], sort=True):
        start, host_end = int(s["ts"].min()), int(s["end"].max())
        mine = by_step.get((rank, step), empty)
        end = max(host_end, int(mine["end"].max())) if len(mine) else host_end
        comp_ns, comm_ns = _union(mine[mine["compute"]]), _union(mine[mine["comm"]])
        overlapped = comp_ns + comm_ns - _union(mine[mine["compute"] | mine["comm"]])
        stage = end - start
        not_overlapped = comm_ns - overlapped
        preparing = max(0, int(mine["ts"].min()) - start) if len(mine) else 0
        device = rows.device_of_rank.get(rank, NA)
        out.append((device, int(step), comp_ns, not_overlapped, overlapped, comm_ns,
                    max(0, stage - comp_ns - not_overlapped), stage, 0, not_overlapped, preparing))
    arr = np.array([r[2:] for r in out], dtype=np.int64)
    data = {"Device_id": [r[0] for r in out], "Step": [r[1] for r in out]}
    for i, h in enumerate(HEADERS["step_trace_time"][2:]):
        data[h] = us_text(arr[:, i])
    return _frame("step_trace_time", data)


def _union(f: pd.DataFrame) -> int:
    """Length of the union of the [ts, end) intervals in f."""
    if not len(f):
        return 0
    f = f.sort_values("ts", kind="stable")
    ts, end = f["ts"].to_numpy(), f["end"].to_numpy()
    reach = np.maximum.accumulate(end)
    gaps = np.maximum(ts[1:] - reach[:-1], 0).sum()
    return int(reach[-1] - ts[0] - gaps)


# ---------------------------------------------------------------------- memory
def npu_mem(rows: Rows) -> pd.DataFrame:
    """Device memory the application holds over time (the driver's "Device memory used")."""
    c = rows.counters[rows.counters["name"] == "Device memory used"].sort_values(["device", "ts"], kind="stable")
    hbm = _kb(c["value"])
    return _frame("npu_mem", {"Device_id": c["device"].astype("Int64").to_numpy(), "event": ["app"] * len(c),
                              "ddr(KB)": [0] * len(c), "hbm(KB)": hbm, "memory(KB)": hbm,
                              "timestamp(us)": rows.us(c["ts"])})


#: The counter holding each allocator's reserved bytes, and msprof's component name for it.
_RESERVED_COUNTER = {"aclrtMalloc": "Device memory used", "caching": "Device memory reserved"}
_COMPONENT = {"aclrtMalloc": "APP", "caching": "PTA"}


def _with_reserved(rows: Rows, m: pd.DataFrame) -> pd.Series:
    """Reserved bytes after each memory event: for the driver (aclrtMalloc) what the device has
    handed out ("Device memory used"), for the caching allocator its "Device memory reserved"."""
    out = pd.Series(np.nan, index=m.index)
    for allocator, counter in _RESERVED_COUNTER.items():
        c = rows.counters[rows.counters["name"] == counter][["rank", "device", "ts", "value"]]
        sub = m[m["allocator"] == allocator]
        if not len(c) or not len(sub):
            continue
        c = c.sort_values("ts", kind="stable").rename(columns={"value": "reserved"})
        left = sub[["rank", "device", "ts"]].reset_index().sort_values("ts", kind="stable")
        got = pd.merge_asof(left, c, on="ts", by=["rank", "device"], direction="backward").set_index("index")
        out.loc[got.index] = got["reserved"]
    return out


def memory_record(rows: Rows) -> pd.DataFrame:
    """One row per allocation or free: the allocator's allocated and reserved totals after it
    (component APP for aclrtMalloc, PTA for the framework's caching allocator, as msprof names
    them)."""
    m = rows.memory
    reserved = _with_reserved(rows, m)
    return _frame("memory_record", {
        "Component": m["allocator"].map(_COMPONENT).fillna("APP").to_numpy(), "Timestamp(us)": rows.us(m["ts"]),
        "Total Allocated(KB)": _kb(m["value"]), "Total Reserved(KB)": _kb(reserved.fillna(m["value"])),
        "Device": [f"NPU:{int(d)}" for d in m["device"]],
    })


def operator_memory(rows: Rows) -> pd.DataFrame:
    """Each allocation with its lifetime: paired with the next free of the same address by the
    same allocator on the same device. Name is the call site the allocation was tagged with
    (`[memory] <tag>`); never-freed allocations have no duration or release totals."""
    m = rows.memory.assign(reserved=_with_reserved(rows, rows.memory))
    if not len(m):
        return _frame("operator_memory", {})
    key = ["rank", "device", "allocator", "addr"]
    m = m.sort_values([*key, "ts"], kind="stable")
    nxt = m.groupby(key, sort=False, dropna=False)[["kind", "ts", "value", "reserved"]].shift(-1)
    freed = (m["kind"] == "alloc") & (nxt["kind"] == "free")
    a = m[m["kind"] == "alloc"].sort_values(["device", "ts"], kind="stable")
    f, ok = nxt.loc[a.index], freed.loc[a.index].to_numpy()
    names = a["name"].str.replace(r"^\[memory\]\s*", "", regex=True).replace("", "[memory]")
    duration = np.where(ok, (f["ts"].fillna(0) - a["ts"]).to_numpy(), 0).astype(np.int64)
    return _frame("operator_memory", {
        "Name": names.to_numpy(), "Size(KB)": _kb(a["bytes"]), "Allocation Time(us)": rows.us(a["ts"]),
        "Duration(us)": np.where(ok, np.asarray(us_text(duration), dtype=object), ""),
        "Allocation Total Allocated(KB)": _kb(a["value"]),
        "Allocation Total Reserved(KB)": _kb(a["reserved"].fillna(a["value"])),
        "Release Total Allocated(KB)": np.where(ok, _kb(f["value"].fillna(0)), None),
        "Release Total Reserved(KB)": np.where(ok, _kb(f["reserved"].fillna(f["value"]).fillna(0)), None),
        "Device": [f"NPU:{int(d)}" for d in a["device"]],
    })


# ---------------------------------------------------------------------- job steps
# A step of a multi-rank job is the job's: the same step number on every rank, from the first
# rank's start of it to the last rank's end of it. Beside it, msprof-analyze's cluster step table:
# per rank and step, where the rank's step time went (computing, communication not overlapped,
# overlapped, free). Interval arithmetic over sorted arrays (analyzers.frames.Cover), one pass
# per rank: no Python loop over events or steps.

RANK_STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns", "step_ns")
JOB_STEP_COLUMNS = ("step", "start_ns", "end_ns", "step_ns", "ranks", "rank_step_ns_min", "rank_step_ns_median",
                    "rank_step_ns_max", "slowest_rank", "last_rank")
STEP_TABLE_COLUMNS = ("rank", "step", "start_ns", "end_ns", "step_ns", "computing_ns",
                      "communication_not_overlapped_ns", "overlapped_ns", "communication_ns", "free_ns")
#: msprof-analyze's `cluster_step_trace_time.csv` header (times in us, one row per rank and step).
CLUSTER_STEP_TRACE_TIME = ("Step", "Type", "Index", "Computing", "Communication(Not Overlapped)", "Overlapped",
                           "Communication", "Free", "Stage", "Bubble",
                           "Communication(Not Overlapped and Exclude Receive)")


def rank_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Each rank's steps (RANK_STEP_COLUMNS), by rank then step, from step rows (rank, name, ts,
    end, step: `Frames.steps`): one row per (rank, step number), from its first row's start to its
    last row's end. A row without a step number takes the one its name ends with (`...#N`), else
    its order on the rank."""
    if steps is None or not len(steps):
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in RANK_STEP_COLUMNS})
    step = pd.to_numeric(steps["step"], errors="coerce") if "step" in steps else pd.Series(np.nan, index=steps.index)
    if step.isna().any():
        named = pd.to_numeric(steps["name"].astype(str).str.extract(r"#(\d+)\s*$")[0], errors="coerce")
        step = step.fillna(named)
        step = step.fillna(steps.groupby("rank").cumcount().astype(np.float64))
    df = pd.DataFrame({"rank": steps["rank"].to_numpy(np.int64), "step": step.to_numpy(np.int64),
                       "start_ns": steps["ts"].to_numpy(np.int64), "end_ns": steps["end"].to_numpy(np.int64)})
    df = df.groupby(["rank", "step"], sort=True).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    df = df.reset_index()
    df["step_ns"] = df["end_ns"] - df["start_ns"]
    return df[list(RANK_STEP_COLUMNS)].astype(np.int64)


def job_steps(ranks: pd.DataFrame) -> pd.DataFrame:
    """The job's steps (JOB_STEP_COLUMNS) from `rank_steps`: per step number, the first rank's start
    to the last rank's end, how many ranks ran it, the min / median / max of their own step times,
    the rank with the longest one (`slowest_rank`, the lowest on a tie) and the rank that ended it
    (`last_rank`)."""
    if not len(ranks):
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in JOB_STEP_COLUMNS})
    g = ranks.groupby("step", sort=True)
    out = g.agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), ranks=("rank", "size"),
                rank_step_ns_min=("step_ns", "min"), rank_step_ns_median=("step_ns", "median"),
                rank_step_ns_max=("step_ns", "max"))
    slowest = ranks.sort_values(["step", "step_ns", "rank"], ascending=[True, False, True], kind="stable")
    last = ranks.sort_values(["step", "end_ns", "rank"], ascending=[True, False, True], kind="stable")
    out["slowest_rank"] = slowest.drop_duplicates("step").set_index("step")["rank"]
    out["last_rank"] = last.drop_duplicates("step").set_index("step")["rank"]
    out = out.reset_index()
    out["step_ns"] = out["end_ns"] - out["start_ns"]
    return out[list(JOB_STEP_COLUMNS)]


def step_table(ranks: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """msprof-analyze's cluster step table (STEP_TABLE_COLUMNS): per rank and step (`rank_steps`),
    within the rank's step [start, end): computing = time some kernel of the rank runs, communication
    = time some collective runs, overlapped = both at once, communication not overlapped = a
    collective with no kernel running, free = neither. So computing + communication not overlapped
    + free = step time and overlapped <= communication, exactly. `ops`: device ops (rank, kind, ts,
    end: `Frames.device_ops`)."""
    from analyzers.frames import Cover  # the analyzers' interval arithmetic, only where the table is built

    out = ranks.copy()
    parts = {c: np.zeros(len(out), np.int64) for c in ("computing_ns", "communication_ns", "busy_ns")}
    if len(out) and len(ops):
        kind = ops["kind"].astype(str).to_numpy()
        ts_all, end_all = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
        kernel, collective = kind == "kernel", kind == "collective"
        by_rank = ops.groupby("rank", sort=False).indices
        for rank, rows in out.groupby("rank", sort=False).indices.items():
            idx = by_rank.get(rank)
            if idx is None:
                continue
            ts, end, k, c = ts_all[idx], end_all[idx], kernel[idx], collective[idx]
            w0, w1 = out["start_ns"].to_numpy()[rows], out["end_ns"].to_numpy()[rows]
            parts["computing_ns"][rows] = Cover(ts[k], end[k]).between(w0, w1)
            parts["communication_ns"][rows] = Cover(ts[c], end[c]).between(w0, w1)
            parts["busy_ns"][rows] = Cover(ts[k | c], end[k | c]).between(w0, w1)
    overlapped = parts["computing_ns"] + parts["communication_ns"] - parts["busy_ns"]
    out["computing_ns"] = parts["computing_ns"]
    out["communication_not_overlapped_ns"] = parts["communication_ns"] - overlapped
    out["overlapped_ns"] = overlapped
    out["communication_ns"] = parts["communication_ns"]
    out["free_ns"] = out["step_ns"].to_numpy(np.int64) - parts["busy_ns"]
    return out[list(STEP_TABLE_COLUMNS)].astype(np.int64)


def cluster_step_table(trace: Trace) -> pd.DataFrame | None:
    """`cluster_step_trace_time` of a trace of several ranks (None: one rank, or no steps)."""
    from analyzers.frames import Frames  # the analyzers' tables, only where the table is built

    if len(pc.unique(trace.table.column("rank"))) < 2:
        return None
    frames = Frames(trace)
    ranks = rank_steps(frames.steps)
    if not len(ranks):
        return None
    return cluster_step_trace_time(step_table(ranks, frames.device_ops))


def cluster_step_trace_time(table: pd.DataFrame) -> pd.DataFrame:
    """`step_table` as msprof-analyze writes `cluster_step_trace_time.csv`: Type "rank", Index the
    rank, times in us (Stage: the rank's step time; Bubble 0: no pipeline receives are told apart)."""
    us = {c: table[c].to_numpy(np.int64) / 1000 for c in STEP_TABLE_COLUMNS[4:]}
    return pd.DataFrame({
        "Step": table["step"].to_numpy(), "Type": ["rank"] * len(table), "Index": table["rank"].to_numpy(),
        "Computing": us["computing_ns"], "Communication(Not Overlapped)": us["communication_not_overlapped_ns"],
        "Overlapped": us["overlapped_ns"], "Communication": us["communication_ns"], "Free": us["free_ns"],
        "Stage": us["step_ns"], "Bubble": np.zeros(len(table)),
        "Communication(Not Overlapped and Exclude Receive)": us["communication_not_overlapped_ns"],
    }, columns=list(CLUSTER_STEP_TRACE_TIME))
