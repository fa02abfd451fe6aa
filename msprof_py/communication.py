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

from analyzers.comm_links import Series, link_series
from analyzers.comm_links import window as _window

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
    member); its name is `<name>__<k>@<members>`. Time info is msprof-analyze's split
    (`time_split`): elapse = the Notify_Wait before the op (waiting for the last member) + the op;
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
        coll = coll[["rank", "device", "stream", "name", "ts", "end", "dur", "bytes", "step", "wait", "inner_waits"]]
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


def _length(x: tuple[np.ndarray, np.ndarray]) -> int:
    return int((x[1] - x[0]).sum())


def _minus(x: tuple[np.ndarray, np.ndarray], y: tuple[np.ndarray, np.ndarray]) -> int:
    """The length of the union `x` outside the union `y` (both merged)."""
    if not len(y[0]):
        return _length(x)
    overlap = 0
    for a, b in zip(*x):
        overlap += int(np.clip(np.minimum(y[1], b) - np.maximum(y[0], a), 0, None).sum())
    return _length(x) - overlap


def time_split(wait_before_ns: int, start: int, end: int, inner_waits: tuple[np.ndarray, np.ndarray],
               busy: tuple[np.ndarray, np.ndarray] | None, opening_ns: int = 0) -> dict[str, int]:
    """msprof-analyze's split of one op's time on one rank (CommAnalyzerTime), in ns.

    elapse = the wait before the op + the op; wait = the Notify_Wait time, before the op and inside
    it (`inner_waits`, merged); synchronization = the opening wait (before the first transfer);
    transit = the time inside the op, outside its waits, when at least one link or port the op sent
    on was busy (`busy`: the union of their busy intervals, merged), or all of the op outside its
    waits when there are no link counters (`busy` None); idle = elapse - transit - wait (>= 0 by
    construction, since transit and the inner waits are disjoint parts of the op). `opening_ns`: a
    wait at the op's start inside it (already among `inner_waits`), before its first transfer, which
    counts as synchronization too (a kernel that spins until its last peer arrives, as NCCL's)."""
    inner = (np.clip(inner_waits[0], start, end), np.clip(inner_waits[1], start, end))
    inner_ns = _length(inner)
    dur = end - start
    if busy is None:
        transit = dur - inner_ns
    else:
        clipped = _merge(np.clip(busy[0], start, end), np.clip(busy[1], start, end))
        transit = _minus(clipped, inner)
    wait = wait_before_ns + inner_ns
    elapse = wait_before_ns + dur
    return {"elapse": elapse, "transit": transit, "wait": wait, "synchronization": wait_before_ns + opening_ns,
            "idle": elapse - transit - wait}


def _opening_waits(coll: pd.DataFrame) -> np.ndarray:
    """Per collective of `coll` (`group` set): the wait at its start for its last member, where the
    trace records no wait of its own (no Notify_Wait before or inside it: each rank's kernel spins
    until its peers come, as NCCL's; an emulated op without waits has one start on every member,
    so it gets 0). Such ops are matched across ranks as the slow-rank analysis matches them
    (analyzers.ranks.match_collectives: same stream, name and bytes, the n-th such on the rank),
    so both read one arrival table; the op
    could move data only once its last member had started, so each member's kernel waited from its
    own start to that (at most its length). The matched members become the op's group. 0 elsewhere."""
    from analyzers.ranks import match_collectives

    out = np.zeros(len(coll), dtype=np.int64)
    if coll["rank"].nunique() < 2:
        return out
    alone = np.array([w == 0 and not len(inner[0]) for w, inner in zip(coll["wait"], coll["inner_waits"])])
    if not alone.any():
        return out
    c = coll[alone]
    parts = pd.DataFrame({"rank": c["rank"].to_numpy(), "stream": c["stream"].to_numpy(),
                          "name": c["name"].astype(str).to_numpy(),
                          "bytes": c["bytes"].fillna(-1).to_numpy().astype(np.int64),  # as collective_parts
                          "arrival_ns": c["ts"].to_numpy(np.int64), "ts": c["ts"].to_numpy(np.int64),
                          "end": c["end"].to_numpy(np.int64), "row": np.flatnonzero(alone)})
    inst = match_collectives(parts)
    if inst.empty:
        return out
    g = inst.groupby("instance", sort=False)
    release = g["arrival_ns"].transform("max").to_numpy(np.int64)
    ts, end, row = inst["ts"].to_numpy(np.int64), inst["end"].to_numpy(np.int64), inst["row"].to_numpy(np.int64)
    out[row] = np.clip(release - ts, 0, end - ts)
    # Members sharing an op's times grouped it already (emulated ops); a real trace's ranks may
    # share a start and end by chance (microsecond clocks), so the match's members win when more.
    members = g["rank"].transform(lambda r: "-".join(map(str, sorted(r)))).to_numpy()
    more = np.array([m.count("-") > grp.count("-") for m, grp in zip(members, coll["group"].to_numpy()[row])],
                    dtype=bool)
    coll.iloc[row[more], coll.columns.get_loc("group")] = members[more]
    return out


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
    coll["opening"] = _opening_waits(coll)
    coll["k"] = coll.groupby(["rank", "group", "name"]).cumcount()
    coll["op"] = coll["name"] + "__" + coll["k"].astype(str) + "@" + coll["group"]
    links: dict[tuple, Any] = {k: v for p in parts for k, v in p["links"].items()}
    for key in [k for k in links if len(k) == 3]:  # a rank's peer-naming links, by sender
        links.setdefault(("sends", key[0]), []).append(key)
    comm: dict[str, Any] = {}
    matrix: dict[str, Any] = {}
    for r in coll.itertuples(index=False):
        step = "step" if pd.isna(r.step) else f"step{int(r.step)}"
        kind = "p2p" if str(r.name).startswith(("hcom_send", "hcom_receive")) else "collective"
        group = [int(x) for x in r.group.split("-")]
        sent = _op_links(links, topology, int(r.rank), group, int(r.ts), int(r.end))
        inner = r.inner_waits
        if r.opening > 0:  # the kernel spun until the last member came: an opening wait inside it
            inner = _merge(np.append(inner[0], int(r.ts)), np.append(inner[1], int(r.ts) + int(r.opening)))
        split = time_split(int(r.wait), int(r.ts), int(r.end), inner,
                           _busy(links, int(r.rank), sent, int(r.ts), int(r.end)) if sent else None,
                           opening_ns=int(r.opening))
        wait_ms, transit_ms, sync_ms = split["wait"] / 1e6, split["transit"] / 1e6, split["synchronization"] / 1e6
        time_info = {
            "Start Timestamp(us)": (origin_ns + int(r.ts) - r.wait) / 1000,
            "Elapse Time(ms)": split["elapse"] / 1e6,
            "Transit Time(ms)": transit_ms, "Wait Time(ms)": wait_ms, "Synchronization Time(ms)": sync_ms,
            "Idle Time(ms)": split["idle"] / 1e6, "Wait Time Ratio": _ratio(wait_ms, transit_ms),
            "Synchronization Time Ratio": _ratio(sync_ms, transit_ms),
        }
        pairs = {f"{src}-{dst}": {"Transport Type": transport, "Transit Size(MB)": nbytes / MiB,
                                  "Transit Time(ms)": busy / 1e6,
                                  "Bandwidth(GB/s)": _gbps(nbytes / MiB, busy / 1e6), "Op Name": r.op}
                 for src, dst, transport, nbytes, busy in sent}
        if pairs:
            bandwidth = _bandwidth_info(pairs, [nbytes for *_, nbytes, _ in sent])
        else:  # no link counters: the payload on the transport the members imply (as msprof-analyze without tasks)
            nbytes = 0 if pd.isna(r.bytes) else int(r.bytes)
            transport = _transport(group, topology)
            bandwidth = {tr: _bandwidth_entry(0.0, 0.0) for tr in TRANSPORTS}
            bandwidth[transport] = _bandwidth_entry(nbytes / MiB, r.dur / 1e6,
                                                    1.0 if nbytes >= LARGE_PACKET_BYTES[transport] else 0.0)
            bandwidth[transport]["Size Distribution"] = {f"{nbytes / MiB:g}": [1, r.dur / 1e6]} if nbytes else {}
        per_rank = comm.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})
        per_rank[kind][r.op] = {"Communication Time Info": time_info, "Communication Bandwidth Info": bandwidth}
        matrix.setdefault(str(r.rank), {}).setdefault(step, {"collective": {}, "p2p": {}})[kind][r.op] = pairs
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


def _op_links(links: dict, topology: dict, rank: int, group: list[int], start: int,
              end: int) -> list[tuple[int, int, str, int, int]]:
    """The links `rank` sent on during [start, end) of an op among `group`: (src, dst, transport,
    bytes, busy ns), by destination. The one computation both files' figures come from."""
    out = []
    members = set(group)
    for key in links.get(("sends", rank), ()):
        src, dst, transport = key
        if dst in members and dst != rank:
            nbytes, busy = _window(links[key], start, end)
            if nbytes > 0:
                out.append((src, dst, transport, nbytes, busy))
    per_server = topology.get("devices_per_server")
    if per_server:
        server, position = rank // per_server, rank % per_server
        remote = [d for d in group if d // per_server != server]
        # HCCL's inter-server plane joins the NPUs in the same position; a flat algorithm any member.
        plane = [d for d in remote if d % per_server == position] or remote
        out += _shared(links, ("roce_tx", rank), [(d, ("roce_rx", d)) for d in plane], rank, "RDMA", start, end)
        if topology.get("intra") == "pcie":
            local = [d for d in group if d // per_server == server and d != rank]
            nic = ("roce_tx", rank) if topology.get("roce_over_pcie") else None
            out += _shared(links, ("pcie_d2h", rank), [(d, ("pcie_h2d", d)) for d in local], rank, "PCIE",
                           start, end, minus=nic)
    return sorted(out, key=lambda link: (link[1], TRANSPORTS.index(link[2])))


def _busy(links: dict, rank: int, sent: list[tuple[int, int, str, int, int]], start: int,
          end: int) -> tuple[np.ndarray, np.ndarray]:
    """The union of the busy intervals (rate > 0) within [start, end) of the series the op's links
    (`_op_links`) were integrated from: a peer-naming link's own counter, else the sending port
    it was shared out of (the RoCE NIC for RDMA, the PCIe link for PCIE)."""
    keys: set[tuple] = set()
    for src, dst, transport, _, _ in sent:
        if (src, dst, transport) in links:
            keys.add((src, dst, transport))
        elif transport == "RDMA":
            keys.add(("roce_tx", rank))
        elif transport == "PCIE":
            keys.add(("pcie_d2h", rank))
    starts, ends = [], []
    for key in keys:
        ts_all, rate_all = links[key][0], links[key][1]
        if not len(ts_all):
            continue
        # Only the samples whose step can meet [start, end): the one in force at start, and those
        # before end (a lookup, not a pass over the whole series: ops x samples would be quadratic).
        lo = max(int(np.searchsorted(ts_all, start, side="right")) - 1, 0)
        hi = int(np.searchsorted(ts_all, end, side="left"))
        ts, rate = ts_all[lo:hi], rate_all[lo:hi]
        if not len(ts):
            continue
        last = ts_all[hi] if hi < len(ts_all) else max(end, int(ts_all[-1]))  # the last sample's rate holds on
        nxt = np.append(ts[1:], last)
        on = (rate > 0) & (nxt > start) & (ts < end)
        starts.append(np.clip(ts[on], start, end))
        ends.append(np.clip(nxt[on], start, end))
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _merge(np.concatenate(starts), np.concatenate(ends))


def _shared(links: dict, port: tuple, peers: list[tuple[int, tuple]], rank: int, transport: str, start: int,
            end: int, minus: tuple | None = None) -> list[tuple[int, int, str, int, int]]:
    """A sending port's bytes and busy time in the window shared out among its peers, each by the
    bytes it could have taken from the port (the integral of the smaller of the port's rate and
    the peer's receiving port's); a link's bandwidth is then the port's mean rate, never above it."""
    if port not in links or not peers:
        return []
    nbytes, busy = _window(links[port], start, end)
    if minus is not None and minus in links:  # traffic of another transport on the same port
        nbytes -= _window(links[minus], start, end)[0]
    if nbytes <= 0:
        return []
    weights = np.array([_overlap(links[port], links[rx], start, end) if rx in links else 0.0 for _, rx in peers])
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(peers), 1 / len(peers))
    out = []
    for (dst, _), w in zip(peers, weights):
        if round(nbytes * w) > 0:
            out.append((rank, dst, transport, round(nbytes * w), round(busy * w)))
    return out


def _link_series(rows: "Rows | LinkRows") -> dict[tuple, Series]:
    """The trace's link rate series (analyzers.comm_links.link_series): the SLOW_LINK finding
    integrates the same series with the same function."""
    return link_series(rows.counters)


def _rate_at(series, at: np.ndarray) -> np.ndarray:
    ts, rate = series[0], series[1]
    i = np.searchsorted(ts, at, side="right") - 1
    return np.where(i >= 0, rate[np.clip(i, 0, None)], 0.0)


def _overlap(a, b, start: int, end: int) -> float:
    """The integral over [start, end) of the smaller of two links' rates."""
    # The samples inside the window (two lookups per series, not a pass over it).
    inside = [x[0][np.searchsorted(x[0], start, side="left"):np.searchsorted(x[0], end, side="right")] for x in (a, b)]
    cuts = np.unique(np.concatenate(([start, end], *inside)))
    if len(cuts) < 2:
        return 0.0
    left = cuts[:-1]
    return float(np.sum(np.minimum(_rate_at(a, left), _rate_at(b, left)) * np.diff(cuts)))


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

