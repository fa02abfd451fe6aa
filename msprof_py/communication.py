"""communication.json and communication_matrix.json: HCCL collectives per rank, step and op, in
the layout torch_npu / msprof-analyze write (key names as theirs: "Communication Time Info",
"Communication Bandwidth Info", "Transit Size(MB)", "Bandwidth(GB/s)", ...)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from msprof_py.summaries import Rows

MiB = 1024 * 1024
#: msprof-analyze's small-packet limits (DOMAIN.md §3): below these a transfer is "small".
LARGE_PACKET_BYTES = {"RDMA": 1 * MiB, "HCCS": 16 * MiB, "PCIE": 16 * MiB, "SDMA": 16 * MiB}
_LINK = re.compile(r"^r(\d+)->r(\d+)\.(\w+) GB/s$")


def summaries(rows: "Rows") -> tuple[dict, dict]:
    """communication.json and communication_matrix.json, per rank: {rank: {stepN: {"collective" |
    "p2p": {op: ...}}}}, the per-rank layout torch_npu writes, one rank per top-level key.

    An op is one collective call as its members saw it (same name, start and end on every
    member); its name is `<name>__<k>@<members>`. Time info comes from the collective slice
    (transit) and the Notify_Wait before it (waiting for the last member). Bandwidth info puts the
    op's payload (`bytes`) on its transport: HCCS or PCIE inside a server, RDMA across servers.
    The matrix gives, for each op, the bytes every rank-to-rank link carried during it, integrated
    from the link-rate counters (`--sys-hardware-mem`); NIC links (RoCE) have no peer in the
    table, so cross-server pairs are absent.
    """
    return reduce([summarize(rows)], rows.topology, rows.origin_ns)


def summarize(rows: "Rows") -> dict[str, Any]:
    """What `reduce` needs of some ranks (one rank partition's Rows, or the whole trace's): their
    collective slices with the Notify_Wait before each (one row per collective op), and the
    rate series of the rank-to-rank links they recorded. Small next to the partition."""
    t = rows.tasks
    coll = t[t["kind"] == "collective"].copy()
    if len(coll):
        waits = t[(t["kind"] == "wait") & (t["cat"] == "hccl")][["rank", "device", "stream", "ts", "end"]]
        waits = waits.rename(columns={"ts": "wait_ts", "end": "ts"})
        coll = coll.merge(waits, on=["rank", "device", "stream", "ts"], how="left").drop_duplicates(
            ["rank", "device", "stream", "ts", "name"])
        coll["wait"] = (coll["ts"] - coll["wait_ts"].fillna(coll["ts"])).astype(np.int64)
        coll = coll[["rank", "device", "stream", "name", "ts", "end", "dur", "bytes", "step", "wait"]]
    return {"collectives": coll, "links": _link_series(rows)}


def reduce(parts: list[dict[str, Any]], topology: dict, origin_ns: int) -> tuple[dict, dict]:
    """communication.json and communication_matrix.json (as `summaries` gives them) from the
    `summarize` outputs of every rank partition: ops are matched across the partitions' collectives."""
    tables = [p["collectives"] for p in parts if len(p["collectives"])]
    if not tables:
        return {}, {}
    coll = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    members = coll.groupby(["name", "ts", "end"])["rank"].transform(lambda r: "-".join(map(str, sorted(r))))
    coll["group"] = members
    coll = coll.sort_values(["rank", "ts"], kind="stable")
    coll["k"] = coll.groupby(["rank", "group", "name"]).cumcount()
    coll["op"] = coll["name"] + "__" + coll["k"].astype(str) + "@" + coll["group"]
    coll["transport"] = [_transport(g, topology) for g in coll["group"]]
    links = {k: v for p in parts for k, v in p["links"].items()}
    comm: dict[str, Any] = {}
    matrix: dict[str, Any] = {}
    for r in coll.itertuples(index=False):
        step = "step" if pd.isna(r.step) else f"step{int(r.step)}"
        kind = "p2p" if str(r.name).startswith(("hcom_send", "hcom_receive")) else "collective"
        wait_ms, transit_ms = r.wait / 1e6, r.dur / 1e6
        nbytes = 0 if pd.isna(r.bytes) else int(r.bytes)
        size_mb = nbytes / MiB
        time_info = {
            "Start Timestamp(us)": (origin_ns + int(r.ts) - r.wait) / 1000,
            "Elapse Time(ms)": wait_ms + transit_ms,
            "Transit Time(ms)": transit_ms, "Wait Time(ms)": wait_ms, "Synchronization Time(ms)": wait_ms,
            "Idle Time(ms)": 0.0, "Wait Time Ratio": _ratio(wait_ms, transit_ms),
            "Synchronization Time Ratio": _ratio(wait_ms, transit_ms),
        }
        bandwidth = {tr: _bandwidth_entry(0, 0.0) for tr in ("RDMA", "HCCS", "PCIE", "SDMA")}
        bandwidth[r.transport] = _bandwidth_entry(nbytes, transit_ms, large=nbytes >= LARGE_PACKET_BYTES[r.transport])
        bandwidth[r.transport]["Size Distribution"] = {f"{size_mb:g}": [1, transit_ms]} if nbytes else {}
        per_rank = comm.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})
        per_rank[kind][r.op] = {"Communication Time Info": time_info, "Communication Bandwidth Info": bandwidth}
        pairs = _matrix_entries(links, int(r.rank), set(map(int, r.group.split("-"))), int(r.ts), int(r.end), r.op)
        matrix.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})[kind][r.op] = pairs
    return comm, matrix


def _ratio(wait: float, transit: float) -> float:
    return round(wait / (wait + transit), 4) if wait + transit > 0 else 0.0


def _bandwidth_entry(nbytes: int, time_ms: float, large: bool = False) -> dict[str, Any]:
    size_mb = nbytes / MiB
    return {"Transit Size(MB)": size_mb, "Transit Time(ms)": time_ms,
            "Bandwidth(GB/s)": round(size_mb / time_ms, 4) if time_ms > 0 else 0.0,
            "Large Packet Ratio": 1.0 if large else 0.0, "Size Distribution": {}}


def _transport(group: str, topology: dict) -> str:
    ranks = [int(x) for x in group.split("-")]
    per_server = topology.get("devices_per_server")
    if per_server and len({r // per_server for r in ranks}) > 1:
        return "RDMA"
    return "PCIE" if topology.get("intra") == "pcie" else "HCCS"


def _link_series(rows: "Rows") -> dict[tuple[int, int, str], tuple[np.ndarray, ...]]:
    """Rank-to-rank link rate counters: (src, dst, transport) -> (ts, cumulative bytes,
    cumulative busy ns) at each change (ts, rate, bytes, busy), for integrating any window with two lookups."""
    c = rows.counters
    c = c[c["name"].str.contains("->", regex=False, na=False)]
    out = {}
    for name, s in c.groupby("name", sort=False):
        m = _LINK.match(name)
        if not m:
            continue
        s = s.sort_values("ts", kind="stable")
        ts, rate = s["ts"].to_numpy(np.int64), s["value"].to_numpy(np.float64)
        span = np.diff(ts)
        cum_bytes = np.concatenate(([0.0], np.cumsum(rate[:-1] * span)))
        cum_busy = np.concatenate(([0], np.cumsum(np.where(rate[:-1] > 0, span, 0))))
        out[(int(m.group(1)), int(m.group(2)), m.group(3).upper())] = (ts, rate, cum_bytes, cum_busy)
    return out


def _integral(series, at: int) -> tuple[float, int]:
    ts, rate, cum_bytes, cum_busy = series
    i = int(np.searchsorted(ts, at, side="right")) - 1
    if i < 0:
        return 0.0, 0
    dt = at - int(ts[i])
    return float(cum_bytes[i] + rate[i] * dt), int(cum_busy[i] + (dt if rate[i] > 0 else 0))


def _matrix_entries(links: dict, rank: int, group: set[int], start: int, end: int, op: str) -> dict[str, Any]:
    out = {}
    for (src, dst, transport), series in links.items():
        if rank not in (src, dst) or src not in group or dst not in group:
            continue
        b0, t0 = _integral(series, start)
        b1, t1 = _integral(series, end)
        nbytes, busy = b1 - b0, t1 - t0
        if nbytes <= 0:
            continue
        out[f"{src}-{dst}"] = {"Transport Type": transport, "Transit Size(MB)": nbytes / MiB,
                               "Transit Time(ms)": busy / 1e6,
                               "Bandwidth(GB/s)": round(nbytes / busy, 4) if busy else 0.0,
                               "Op Name": op}
    return out
