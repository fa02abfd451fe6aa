"""communication.json and communication_matrix.json: HCCL collectives per rank, step and op, in
the layout torch_npu / msprof-analyze write (key names as theirs: "Communication Time Info",
"Communication Bandwidth Info", "Transit Size(MB)", "Bandwidth(GB/s)", ...).

Both files come from one computation per op and rank (`_op_links`): the bytes and busy time of
every link the rank sent on during the op, src -> dst, each with its transport as the topology
routes the pair. The matrix lists those links; communication.json's bandwidth info per transport
is their sum, so the two agree by construction. Bandwidth is msprof-analyze's
Transit Size(MB) / Transit Time(ms) (MB = 2^20 bytes), in both files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from analyzers.comm_links import Series, link_series, one_series

if TYPE_CHECKING:
    from msprof_py.summaries import Rows

MiB = 1024 * 1024
TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA")
#: msprof-analyze's small-packet limits (DOMAIN.md §3): below these a transfer is "small".
LARGE_PACKET_BYTES = {"RDMA": 1 * MiB, "HCCS": 16 * MiB, "PCIE": 16 * MiB, "SDMA": 16 * MiB}



def summaries(rows: "Rows") -> tuple[dict, dict]:
    """communication.json and communication_matrix.json, per rank: {rank: {stepN: {"collective" |
    "p2p": {op: ...}}}}, the per-rank layout torch_npu writes, one rank per top-level key.

    An op is one collective call as its members saw it (same name, start and end on every
    member; a send and its receive, named differently, pair by their recorded channel and call
    number); its name is `<name>__<k>@<members>`. Time info is msprof-analyze's split
    (`_split`): elapse = the Notify_Wait before the op (waiting for the last member) + the op;
    wait = that wait and the wait tasks inside the op; synchronization = the opening wait;
    transit = the time in the op when some link it sent on was busy (the union over its links,
    from the same counters as its bandwidth), or the op when there are no link counters;
    idle = elapse - transit - wait. Ratios: wait / (wait + transit), sync / (sync + transit).

    The links of an op on a rank (`_op_links`) are the links it sent on, integrated from the
    link-rate counters (`--sys-hardware-mem`) over the op: a counter that names its peer
    (HCCS "r0->r1") gives the pair directly; a port that does not (the RoCE NIC, the PCIe link
    of a PCIe-only server) is shared out among the peers the topology routes through it (for
    the NIC, the members on other servers in the sender's position, HCCL's inter-server plane)
    by how much each peer's receiving port ran with it. The matrix lists these links;
    communication.json's bandwidth info per transport sums them.

    Without a topology in the trace's meta (a real trace), only peer-naming counters give
    links; an op without any link keeps today's classification: its payload on the transport
    its members imply (HCCS, or PCIE for `intra: pcie`, RDMA across servers), over the op's
    duration, with no matrix entry.
    """
    return reduce([summarize(rows)], rows.topology, rows.origin_ns)


class LinkRows(Protocol):
    """What `summarize` reads of a trace: its device tasks and its counters (summaries.Rows has them)."""

    tasks: pd.DataFrame
    counters: pd.DataFrame


def summarize(rows: "Rows | LinkRows") -> dict[str, Any]:
    """What `reduce` needs of some ranks (one rank partition's Rows, or the whole trace's): their
    collective slices with the Notify_Wait before each (one row per collective op), and the
    rate series of the links and ports they recorded. Small next to the partition."""
    t = rows.tasks
    coll = t[t["kind"] == "collective"].copy()
    if len(coll):
        hccl_waits = t[(t["kind"] == "wait") & (t["cat"] == "hccl")][["rank", "device", "stream", "ts", "end"]]
        waits = hccl_waits.rename(columns={"ts": "wait_ts", "end": "ts"})
        coll = coll.merge(waits, on=["rank", "device", "stream", "ts"], how="left").drop_duplicates(
            ["rank", "device", "stream", "ts", "name"])
        coll["wait"] = (coll["ts"] - coll["wait_ts"].fillna(coll["ts"])).astype(np.int64)
        coll["inner_waits"] = pd.Series(_inner_waits(coll, hccl_waits), index=coll.index, dtype=object)
        coll = coll[["rank", "device", "stream", "name", "ts", "end", "dur", "bytes", "step", "wait", "inner_waits",
                     "addr", "value"]]
    return {"collectives": coll, "links": _link_series(rows)}


def _inner_waits(coll: pd.DataFrame, waits: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per collective (in `coll`'s order): the union of the HCCL wait tasks (Notify_Wait) that ran
    inside it on its rank and device, as merged (starts, ends). Traces that record the op's tasks
    (torch_npu) have them; a trace with only the op slice has none."""
    out: list[tuple[np.ndarray, np.ndarray]] = []
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    by_key = {k: (g["ts"].to_numpy(np.int64)[o], g["end"].to_numpy(np.int64)[o])
              for k, g in waits.groupby(["rank", "device"], sort=False)
              for o in [np.argsort(g["ts"].to_numpy(), kind="stable")]}
    for rank, device, ts, end in zip(coll["rank"], coll["device"], coll["ts"], coll["end"]):
        w = by_key.get((rank, device))
        if w is None:
            out.append(empty)
            continue
        lo, hi = np.searchsorted(w[0], ts, side="left"), np.searchsorted(w[0], end, side="left")
        s, e = w[0][lo:hi], w[1][lo:hi]
        inside = e <= end
        out.append(_merge(s[inside], e[inside]) if inside.any() else empty)
    return out


def _merge(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [ts, end) as sorted, disjoint (starts, ends)."""
    if not len(ts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.argsort(ts, kind="stable")
    ts, end = np.asarray(ts, np.int64)[o], np.maximum.accumulate(np.asarray(end, np.int64)[o])
    new = np.concatenate(([True], ts[1:] > end[:-1]))
    idx = np.flatnonzero(new)
    return ts[idx], np.append(end[idx[1:] - 1], end[-1])


def _opening_waits(coll: pd.DataFrame) -> np.ndarray:
    """Per collective of `coll` (`instance` set: `_ops`): the wait at its start for its last member,
    where the trace records no wait of its own (no Notify_Wait before or inside it: each rank's
    kernel spins until its peers come, as NCCL's; an emulated op without waits has one start on
    every member, so it gets 0). The op could move data only once its last member had started,
    so each member's kernel waited from its own start to that (at most its length). 0 elsewhere."""
    out = np.zeros(len(coll), dtype=np.int64)
    alone = np.array([w == 0 and not len(inner[0]) for w, inner in zip(coll["wait"], coll["inner_waits"])])
    matched = coll["instance"].to_numpy() >= 0
    if not (alone & matched).any():
        return out
    # The op's last member to start, among those that did not record a wait of their own.
    start = pd.Series(np.where(alone & matched, coll["ts"].to_numpy(np.int64), np.iinfo(np.int64).min))
    release = start.groupby(coll["instance"].to_numpy()).transform("max").to_numpy(np.int64)
    ts, end = coll["ts"].to_numpy(np.int64), coll["end"].to_numpy(np.int64)
    sel = alone & matched
    out[sel] = np.clip(release[sel] - ts[sel], 0, end[sel] - ts[sel])
    return out


def reduce(parts: list[dict[str, Any]], topology: dict, origin_ns: int) -> tuple[dict, dict]:
    """communication.json and communication_matrix.json (as `summaries` gives them) from the
    `summarize` outputs of every rank partition: ops are matched across the partitions'
    collectives (`tables`, the one computation), then written op by op as the files lay them out."""
    ops, sent = tables(parts, topology)
    if ops.empty:
        return {}, {}
    at = sent.groupby("row", sort=False).indices if len(sent) else {}
    s_src, s_dst = sent["src"].to_numpy(np.int64), sent["dst"].to_numpy(np.int64)
    s_tr, s_bytes, s_busy = sent["transport"].to_numpy(), sent["bytes"].to_numpy(np.int64), sent["busy"].to_numpy(np.int64)
    comm: dict[str, Any] = {}
    matrix: dict[str, Any] = {}
    for i, r in enumerate(ops.itertuples(index=False)):
        step = "step" if pd.isna(r.step) else f"step{int(r.step)}"
        wait_ms, transit_ms, sync_ms = r.wait_ns / 1e6, r.transit / 1e6, r.synchronization / 1e6
        time_info = {
            "Start Timestamp(us)": (origin_ns + int(r.ts) - r.wait) / 1000,
            "Elapse Time(ms)": r.elapse / 1e6,
            "Transit Time(ms)": transit_ms, "Wait Time(ms)": wait_ms, "Synchronization Time(ms)": sync_ms,
            "Idle Time(ms)": r.idle / 1e6, "Wait Time Ratio": _ratio(wait_ms, transit_ms),
            "Synchronization Time Ratio": _ratio(sync_ms, transit_ms),
        }
        mine = at.get(i, ())
        pairs = {f"{s_src[j]}-{s_dst[j]}": {"Transport Type": str(s_tr[j]), "Transit Size(MB)": int(s_bytes[j]) / MiB,
                                            "Transit Time(ms)": int(s_busy[j]) / 1e6,
                                            "Bandwidth(GB/s)": _gbps(int(s_bytes[j]) / MiB, int(s_busy[j]) / 1e6),
                                            "Op Name": r.op}
                 for j in mine}
        if pairs:
            bandwidth = _bandwidth_info(pairs, [int(s_bytes[j]) for j in mine])
        else:  # no link counters: the payload on the transport the members imply (as msprof-analyze without tasks)
            nbytes = 0 if pd.isna(r.bytes) else int(r.bytes)
            transport = _transport([int(x) for x in r.group.split("-")], topology)
            bandwidth = {tr: _bandwidth_entry(0.0, 0.0) for tr in TRANSPORTS}
            bandwidth[transport] = _bandwidth_entry(nbytes / MiB, r.dur / 1e6,
                                                    1.0 if nbytes >= LARGE_PACKET_BYTES[transport] else 0.0)
            bandwidth[transport]["Size Distribution"] = {f"{nbytes / MiB:g}": [1, r.dur / 1e6]} if nbytes else {}
        per_rank = comm.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})
        per_rank[r.kind][r.op] = {"Communication Time Info": time_info, "Communication Bandwidth Info": bandwidth}
        matrix.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})[r.kind][r.op] = pairs
    return comm, matrix


def _ratio(wait: float, transit: float) -> float:
    return round(wait / (wait + transit), 4) if wait + transit > 0 else 0.0


def _gbps(size_mb: float, time_ms: float) -> float:
    """msprof-analyze's bandwidth: Transit Size(MB) / Transit Time(ms)."""
    return round(size_mb / time_ms, 4) if time_ms > 0 else 0.0


def _bandwidth_entry(size_mb: float, time_ms: float, large_ratio: float = 0.0) -> dict[str, Any]:
    return {"Transit Size(MB)": size_mb, "Transit Time(ms)": time_ms, "Bandwidth(GB/s)": _gbps(size_mb, time_ms),
            "Large Packet Ratio": large_ratio, "Size Distribution": {}}


def _bandwidth_info(pairs: dict[str, dict], sizes: list[int]) -> dict[str, Any]:
    """communication.json's bandwidth info per transport: the sums of the matrix's links of that
    transport (summed in the matrix's order, so a reader summing them gets the same floats); a
    link is one transfer in the size distribution and the large-packet ratio."""
    out = {}
    for tr in TRANSPORTS:
        mine = [(link, n) for link, n in zip(pairs.values(), sizes) if link["Transport Type"] == tr]
        size_mb = sum((link["Transit Size(MB)"] for link, _ in mine), 0.0)
        time_ms = sum((link["Transit Time(ms)"] for link, _ in mine), 0.0)
        large = sum(1 for _, n in mine if n >= LARGE_PACKET_BYTES[tr])
        entry = _bandwidth_entry(size_mb, time_ms, round(large / len(mine), 4) if mine else 0.0)
        for link, _ in mine:
            cell = entry["Size Distribution"].setdefault(f"{link['Transit Size(MB)']:g}", [0, 0.0])
            cell[0] += 1
            cell[1] += link["Transit Time(ms)"]
        out[tr] = entry
    return out


def _transport(group: list[int], topology: dict) -> str:
    per_server = topology.get("devices_per_server")
    if per_server and len({r // per_server for r in group}) > 1:
        return "RDMA"
    return "PCIE" if topology.get("intra") == "pcie" else "HCCS"


def _link_series(rows: "Rows | LinkRows") -> dict[tuple, Series]:
    """The trace's link rate series (analyzers.comm_links.link_series): the SLOW_LINK finding
    integrates the same series with the same function."""
    return link_series(rows.counters)


def _rate_at(series, at: np.ndarray) -> np.ndarray:
    ts, rate = series[0], series[1]
    i = np.searchsorted(ts, at, side="right") - 1
    return np.where(i >= 0, rate[np.clip(i, 0, None)], 0.0)


#: The time split columns of `op_time_split`, as communication.json names them.
SPLIT = ("Elapse Time(ms)", "Transit Time(ms)", "Wait Time(ms)", "Synchronization Time(ms)", "Idle Time(ms)")


def op_time_split(comm: dict[str, Any]) -> list[dict[str, Any]]:
    """msprof-analyze's communication time per op kind, summed over ranks and steps from
    communication.json (`summaries`' first result): per op name (the collective's name, its
    instance and members dropped) the number of (rank, op) entries and the total of each time of
    `SPLIT` (ms), the costliest first. Elapse = transit + wait + idle; synchronization is part of wait."""
    out: dict[str, dict[str, Any]] = {}
    for steps in comm.values():
        for kinds in steps.values():
            for ops in kinds.values():
                for op, entry in ops.items():
                    name = op.split("__", 1)[0]
                    row = out.setdefault(name, {"op": name, "count": 0, **{k: 0.0 for k in SPLIT}})
                    row["count"] += 1
                    info = entry["Communication Time Info"]
                    for k in SPLIT:
                        row[k] += float(info[k])
    return sorted(out.values(), key=lambda r: (-r["Elapse Time(ms)"], r["op"]))


# ---------------------------------------------------------------- the columnar reduce
#: One row per (rank, op): the op as communication.json names it and its time split (ns).
OP_COLUMNS = ["rank", "step", "kind", "op", "name", "group", "ts", "end", "dur", "bytes", "wait", "opening",
              "elapse", "transit", "wait_ns", "synchronization", "idle", "linked"]
#: One row per link an op sent on (communication_matrix.json's entries), in the matrix's order.
LINK_COLUMNS = ["row", "rank", "op", "src", "dst", "transport", "bytes", "busy"]


def _ops(parts: list[dict[str, Any]]) -> pd.DataFrame | None:
    """Every partition's collectives as one table of ops, matched across ranks and named: an op's
    members are the parts `analyzers.causality.collectives.match` makes one collective (the one
    rule every cross-rank reader of collectives uses: the recorded communicator and call number,
    a send and its receive included; the n-th such op where the trace records none); a part it
    matches with no other rank is an op of its rank alone."""
    from analyzers.causality.collectives import match

    tables = [p["collectives"] for p in parts if len(p["collectives"])]
    if not tables:
        return None
    coll = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0].copy()
    coll = coll.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    has = "addr" in coll and "value" in coll
    found = match(pd.DataFrame({
        "rank": coll["rank"].to_numpy(np.int64), "stream": coll["stream"].to_numpy(), "name": coll["name"].astype(str),
        "bytes": coll["bytes"].fillna(-1).to_numpy().astype(np.int64),
        "arrival_ns": coll["ts"].to_numpy(np.int64), "end": coll["end"].to_numpy(np.int64),
        "group": coll["addr"].to_numpy(np.float64) if has else np.nan,
        "seq": coll["value"].to_numpy(np.float64) if has else np.nan, "row": np.arange(len(coll))}))
    instance = np.full(len(coll), -1, dtype=np.int64)
    instance[found["row"].to_numpy(np.int64)] = found["instance"].to_numpy(np.int64)
    coll["instance"] = instance
    members = found.groupby("instance")["rank"].agg(lambda r: "-".join(map(str, sorted(set(r)))))
    coll["group"] = np.where(instance >= 0, members.reindex(instance).to_numpy(dtype=object),
                             coll["rank"].astype(str).to_numpy(dtype=object))
    coll["opening"] = _opening_waits(coll)
    coll["k"] = coll.groupby(["rank", "group", "name"]).cumcount()
    coll["op"] = coll["name"] + "__" + coll["k"].astype(str) + "@" + coll["group"]
    return coll.drop(columns="instance")


def _at(series: Series, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`analyzers.comm_links.integral` at every instant of `at`: bytes and busy ns up to it."""
    ts, rate, cum_bytes, cum_busy = series
    i = np.searchsorted(ts, at, side="right") - 1
    ok = i >= 0
    j = np.clip(i, 0, None)
    dt = at - ts[j]
    return (np.where(ok, cum_bytes[j] + rate[j] * dt, 0.0),
            np.where(ok, cum_busy[j] + np.where(rate[j] > 0, dt, 0), 0).astype(np.int64))


def _windows(series: Series, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`analyzers.comm_links.window` over many windows: whole bytes and busy ns of each."""
    b0, t0 = _at(series, start)
    b1, t1 = _at(series, end)
    return np.round(b1 - b0).astype(np.int64), t1 - t0


def _combined(series: list[Series], how: str) -> Series:
    """One step series of several: the smaller rate of two (`min`), or 1 wherever any is busy
    (`any`); its integral is their overlap, its busy time their union's."""
    cuts = np.unique(np.concatenate([s[0] for s in series]))
    rates = [_rate_at(s, cuts) for s in series]
    rate = np.minimum(rates[0], rates[1]) if how == "min" else (np.stack(rates) > 0).any(axis=0).astype(np.float64)
    return one_series(cuts, np.asarray(rate, np.float64))


def tables(parts: list[dict[str, Any]], topology: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """communication.json's ops and communication_matrix.json's links as two tables (OP_COLUMNS,
    LINK_COLUMNS) from the `summarize` outputs of every rank partition: the one computation
    both files come from, link windows and shares computed over all ops of a rank and group at
    once. `reduce` writes the files' dicts from them."""
    coll = _ops(parts)
    if coll is None:
        return pd.DataFrame(columns=OP_COLUMNS), pd.DataFrame(columns=LINK_COLUMNS)
    links: dict[tuple, Series] = {k: v for p in parts for k, v in p["links"].items()}
    sends: dict[int, list[tuple]] = {}
    for key in links:
        if len(key) == 3:  # a rank's peer-naming links, by sender
            sends.setdefault(int(key[0]), []).append(key)
    rank_all = coll["rank"].to_numpy(np.int64)
    ts_all, end_all = coll["ts"].to_numpy(np.int64), coll["end"].to_numpy(np.int64)
    per_server = topology.get("devices_per_server")
    out: list[pd.DataFrame] = []
    mins: dict[tuple, Series] = {}
    for (rank, group), idx in coll.groupby(["rank", "group"], sort=False).indices.items():
        rank = int(rank)
        members = [int(x) for x in str(group).split("-")]
        rows, start, end = idx, ts_all[idx], end_all[idx]
        for key in sends.get(rank, ()):
            if key[1] in members and key[1] != rank:
                nbytes, busy = _windows(links[key], start, end)
                keep = nbytes > 0
                if keep.any():
                    out.append(pd.DataFrame({"row": rows[keep], "src": key[0], "dst": key[1], "transport": key[2],
                                             "bytes": nbytes[keep], "busy": busy[keep]}))
        if not per_server:
            continue
        server, position = rank // per_server, rank % per_server
        remote = [d for d in members if d // per_server != server]
        plane = [d for d in remote if d % per_server == position] or remote
        shares: list[tuple[tuple, list[tuple[int, tuple]], str, tuple | None]] = [
            (("roce_tx", rank), [(d, ("roce_rx", d)) for d in plane], "RDMA", None)]
        if topology.get("intra") == "pcie":
            local = [d for d in members if d // per_server == server and d != rank]
            nic = ("roce_tx", rank) if topology.get("roce_over_pcie") else None
            shares.append((("pcie_d2h", rank), [(d, ("pcie_h2d", d)) for d in local], "PCIE", nic))
        for port, peers, transport, minus in shares:
            if port not in links or not peers:
                continue
            nbytes, busy = _windows(links[port], start, end)
            if minus is not None and minus in links:  # traffic of another transport on the same port
                nbytes = nbytes - _windows(links[minus], start, end)[0]
            weights = np.zeros((len(peers), len(rows)))
            for k, (_, rx) in enumerate(peers):
                if rx in links:
                    pair = (port, rx)
                    if pair not in mins:
                        mins[pair] = _combined([links[port], links[rx]], "min")
                    b0, _ = _at(mins[pair], start)
                    b1, _ = _at(mins[pair], end)
                    weights[k] = b1 - b0
            total = weights.sum(axis=0)
            weights = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 1 / len(peers))
            for k, (dst, _) in enumerate(peers):
                share_b, share_t = np.round(nbytes * weights[k]), np.round(busy * weights[k])
                keep = (nbytes > 0) & (share_b > 0)
                if keep.any():
                    out.append(pd.DataFrame({"row": rows[keep], "src": rank, "dst": dst, "transport": transport,
                                             "bytes": share_b[keep].astype(np.int64),
                                             "busy": share_t[keep].astype(np.int64)}))
    sent = pd.concat(out, ignore_index=True) if out else pd.DataFrame(
        {c: pd.Series(dtype=np.int64) for c in ("row", "src", "dst", "bytes", "busy")}).assign(transport="")
    sent["order"] = sent["transport"].map({t: i for i, t in enumerate(TRANSPORTS)})
    sent = sent.sort_values(["row", "dst", "order"], kind="stable").reset_index(drop=True)
    sent["rank"] = rank_all[sent["row"].to_numpy(np.int64)]
    # Op names and transports as categories (codes, not a string per link: a 64-rank job has
    # millions of links), the categories sorted so that they sort as the strings do.
    codes, names = pd.factorize(coll["op"], sort=True)
    sent["op"] = pd.Categorical.from_codes(codes[sent["row"].to_numpy(np.int64)], categories=names)
    sent["transport"] = pd.Categorical(sent["transport"], categories=sorted(set(sent["transport"])))
    coll["linked"] = np.bincount(sent["row"], minlength=len(coll)) > 0
    _split(coll, sent, links)
    coll["kind"] = np.where(coll["name"].astype(str).str.startswith(("hcom_send", "hcom_receive")), "p2p",
                            "collective")
    return coll[OP_COLUMNS], sent[LINK_COLUMNS]


def _split(coll: pd.DataFrame, sent: pd.DataFrame, links: dict[tuple, Series]) -> None:
    """msprof-analyze's split of every op's time on its rank (CommAnalyzerTime), in ns, in place.

    elapse = the wait before the op + the op; wait = the Notify_Wait time, before the op and inside
    it (merged); synchronization = the opening wait (before the first transfer: the wait before the
    op, plus a wait at the op's start inside it, `opening`, as a kernel that spins until its last
    peer arrives, as NCCL's); transit = the time inside the op, outside its waits, when at least one
    series its links came from was busy (a peer-naming link's own counter, else the sending port
    it was shared out of; one union series per rank and set of such series), or all of the op
    outside its waits when it has no links; idle = elapse - transit - wait (>= 0 by construction,
    since transit and the inner waits are disjoint parts of the op)."""
    n = len(coll)
    ts, end = coll["ts"].to_numpy(np.int64), coll["end"].to_numpy(np.int64)
    wait_before = coll["wait"].to_numpy(np.int64)
    opening = coll["opening"].to_numpy(np.int64)
    # The waits inside each op (and an opening wait), merged and clipped to it: (op, start, end).
    w_row, w_a, w_b = [], [], []
    for i, (inner, op_ts, op_end, o) in enumerate(zip(coll["inner_waits"], ts, end, opening)):
        if o > 0:
            inner = _merge(np.append(inner[0], op_ts), np.append(inner[1], op_ts + o))
        if len(inner[0]):
            w_row.append(np.full(len(inner[0]), i))
            w_a.append(np.clip(inner[0], op_ts, op_end))
            w_b.append(np.clip(inner[1], op_ts, op_end))
    wr = np.concatenate(w_row) if w_row else np.zeros(0, np.int64)
    wa = np.concatenate(w_a) if w_a else np.zeros(0, np.int64)
    wb = np.concatenate(w_b) if w_b else np.zeros(0, np.int64)
    inner_ns = np.bincount(wr, weights=wb - wa, minlength=n).astype(np.int64)
    transit = end - ts - inner_ns  # no link counters: the op outside its waits
    if len(sent):
        rank = coll["rank"].to_numpy(np.int64)
        # Each link's series: one key per distinct (sender, peer, transport), not one per link.
        kinds = sent[["src", "dst", "transport", "rank"]].astype({"transport": str})
        kid, distinct = pd.factorize(pd.MultiIndex.from_frame(kinds))
        keys = [(int(s), int(d), t) if (s, d, t) in links else ("roce_tx" if t == "RDMA" else "pcie_d2h", int(r))
                for s, d, t, r in distinct]
        row_of = sent["row"].to_numpy(np.int64)  # sorted: an op's links are together
        cut = np.flatnonzero(np.diff(row_of)) + 1
        by_set: dict[tuple[int, frozenset], list[int]] = {}
        for a, b in zip(np.concatenate(([0], cut)), np.concatenate((cut, [len(row_of)]))):
            row = int(row_of[a])
            ks = frozenset(keys[k] for k in set(kid[a:b].tolist()))
            by_set.setdefault((int(rank[row]), ks), []).append(row)
        w_order = np.argsort(wr, kind="stable")
        w_first = np.searchsorted(wr[w_order], np.arange(n + 1))
        for (_, ks), rows_list in by_set.items():
            union = _combined([links[k] for k in sorted(ks, key=str)], "any")
            rows = np.array(rows_list, dtype=np.int64)
            busy = _at(union, end[rows])[1] - _at(union, ts[rows])[1]
            # The busy time inside the op's waits is not transit.
            lo, hi = w_first[rows], w_first[rows + 1]
            has = hi > lo
            if has.any():
                sel = np.concatenate([w_order[a:b] for a, b in zip(lo[has], hi[has])])
                inside = _at(union, wb[sel])[1] - _at(union, wa[sel])[1]
                busy -= np.bincount(np.searchsorted(rows, wr[sel]), weights=inside, minlength=len(rows)).astype(np.int64)
            transit[rows] = busy
    coll["wait_ns"] = wait_before + inner_ns
    coll["elapse"] = wait_before + (end - ts)
    coll["transit"] = transit
    coll["synchronization"] = wait_before + opening
    coll["idle"] = coll["elapse"] - coll["transit"] - coll["wait_ns"]


def op_time_split_table(ops: pd.DataFrame) -> list[dict[str, Any]]:
    """`op_time_split` from `tables`' ops (no communication.json dicts in between): per op name (up
    to the op's first "__", as `op_time_split` cuts it: torch_npu's names hold "__" themselves)
    the (rank, op) entries and each time of `SPLIT` summed in ns, then in ms."""
    if ops.empty:
        return []
    cols = {"Elapse Time(ms)": "elapse", "Transit Time(ms)": "transit", "Wait Time(ms)": "wait_ns",
            "Synchronization Time(ms)": "synchronization", "Idle Time(ms)": "idle"}
    g = ops.groupby(ops["op"].astype(str).str.split("__", n=1).str[0], sort=False)  # as op_time_split names them
    sums = g[list(cols.values())].sum()
    count = g.size()
    out = [{"op": str(name), "count": int(count[name]), **{k: int(sums.at[name, c]) / 1e6 for k, c in cols.items()}}
           for name in sums.index]
    return sorted(out, key=lambda r: (-r["Elapse Time(ms)"], r["op"]))


def link_table(sent: pd.DataFrame) -> pd.DataFrame:
    """`tables`' links as the cluster analyses read communication_matrix.json's entries (op, name,
    src, dst, transport, size_mb, transit_ms, bandwidth_gbps), without the dicts."""
    size_mb = sent["bytes"].to_numpy(np.int64) / MiB
    transit_ms = sent["busy"].to_numpy(np.int64) / 1e6
    op = pd.Categorical(sent["op"])
    # The op kind of each category (names repeat: a category per distinct kind, in sorted order).
    kind_codes, kinds = pd.factorize(pd.Index(op.categories.astype(str)).str.split("__").str[0], sort=True)
    name = pd.Categorical.from_codes(kind_codes[op.codes], categories=kinds)
    return pd.DataFrame({"op": op, "name": name,
                         "src": sent["src"].to_numpy(np.int64), "dst": sent["dst"].to_numpy(np.int64),
                         "transport": pd.Categorical(sent["transport"]), "size_mb": size_mb,
                         "transit_ms": transit_ms,
                         "bandwidth_gbps": np.where(transit_ms > 0, np.round(size_mb / np.where(transit_ms > 0, transit_ms,
                                                                                                1.0), 4), 0.0)})
