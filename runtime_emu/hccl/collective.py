"""Communicators and in-flight collectives on the emulated runtime: matching, execution, rows.

Pattern: the k-th collective call on a communicator is the same operation on every member, so
calls are matched by a per-communicator sequence number (point-to-point pairs by a per-pair
number). A member's task "arrives" when it reaches the head of its stream; the algorithm
starts at the last arrival, so a late rank shows as `Notify_Wait` on everyone else, never as
slower transfers.

Algorithm: the schedule (runtime_emu.hccl.algorithms) runs once per piece of at most
HCCL_BUFFSIZE bytes, pieces one after another. Each step starts all its sends as flows on
`topology.path(src, dst)` (the path's latency is the step's alpha, the max-min share of its
links the beta), waits for the slowest, then spends reduce_bytes / reduce bandwidth (gamma)
before the next step. Flow bytes go through the links' on_rate hooks, so link counters show
the traffic without anything recorded here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from msprof_py.trace.schema import communicator_id
from runtime_emu.hccl import algorithms as A

if TYPE_CHECKING:
    from runtime_emu.device import Task
    from runtime_emu.rows import Rows
    from runtime_emu.runtime import Runtime

MiB = 1 << 20
#: doc (hccl_types.h HCCL_COMM_DEFAULT_BUFFSIZE, and the HCCL_BUFFSIZE env var): 200 MB.
DEFAULT_BUFFSIZE_MB = 200
#: DEFAULT: bandwidth of the reduction (AI Core / SDMA inline reduce), gamma = 1 / this.
DEFAULT_REDUCE_GBPS = 100.0
#: DEFAULT: host time HcclCommInitRootInfo adds after the last rank joined (link setup, which
#: takes far longer on real systems, is not modelled).
COMM_INIT_NS = 1_000


@dataclass(eq=False)  # a communicator is itself, not its field values
class Group:
    """One communicator as a whole: its member ranks (index = rank in the communicator)."""

    id: int
    ranks: tuple[int, ...]
    servers: list[list[int]]  # member indices per server, in server order
    intra_link: str
    pending: dict[Any, "Collective"] = field(default_factory=dict)

    def describe(self) -> dict:
        return {"id": self.id, "ranks": list(self.ranks), "servers": [list(s) for s in self.servers]}


class Comm:
    """One rank's communicator handle (HcclComm): what `comm_init_*` returns to that rank."""

    __slots__ = ("group", "rank", "global_rank", "next_seq", "p2p_seq", "destroyed")

    def __init__(self, group: Group, rank: int, global_rank: int) -> None:
        self.group = group
        self.rank = rank  # position in the communicator (HcclGetRankId)
        self.global_rank = global_rank
        self.next_seq = 0
        self.p2p_seq: dict[tuple[int, int], int] = {}
        self.destroyed = False

    @property
    def size(self) -> int:
        return len(self.group.ranks)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.group.ranks

    def __repr__(self) -> str:
        return f"Comm(id={self.group.id}, rank={self.rank}/{self.size}, global_rank={self.global_rank})"


@dataclass
class Rendezvous:
    """Ranks that called comm_init_root_info with one root info, until all n have."""

    n_ranks: int
    members: dict[int, int] = field(default_factory=dict)  # rank in comm -> global rank
    join_ns: int = 0  # the latest join
    group: Group | None = None


class Collective:
    """One matched operation across its members; shared by every member's task as `task.extra`."""

    def __init__(self, state: "HcclState", group: Group, key: Any, desc: tuple, members: tuple[int, ...],
                 nbytes: int, algorithm: str, requested: str, root: int) -> None:
        self.state = state
        self.group = group
        self.key = key
        self.desc = desc
        self.op = desc[0]
        self.members = members  # global ranks taking part, index = member in the schedule
        self.index = {r: i for i, r in enumerate(members)}
        self.nbytes = nbytes
        self.algorithm = algorithm
        self.requested = requested
        self.root = root
        self.joined: list[int] = []  # global ranks whose host called, in call order
        self.tasks: dict[int, Task] = {}
        self.arrive_ns: dict[int, int] = {}
        self.start_ns = -1
        self.end_ns = -1
        self.pieces: list[int] = []
        self.steps = 0
        self.sent_bytes = 0
        self._steps: Iterator[A.Step] = iter(())
        self._outstanding = 0
        self._reduce_bytes = 0

    # ------------------------------------------------------------------ execution
    def arrive(self, task: "Task") -> None:
        """task.on_start: this member is at the head of its stream."""
        rt = self.state.rt
        m = self.index[task.stream.device.rank]
        self.tasks[m] = task
        self.arrive_ns[m] = rt.engine.now
        if len(self.tasks) == len(self.members):
            self.start_ns = rt.engine.now
            self._plan()
            rt.engine.after(0, self._next_step)

    def _plan(self) -> None:
        st = self.state
        limit = st.buffsize_bytes
        if self.op == "send" or self.nbytes <= limit:
            self.pieces = [self.nbytes]
        else:
            full, rest = divmod(self.nbytes, limit)
            self.pieces = [limit] * full + ([rest] if rest else [])
        intra = A.MESH if self.group.intra_link == "hccs" else A.RING
        # Equal pieces share one schedule; pieces run one after another.
        by_size = {size: A.schedule(self.op, self.algorithm, len(self.members), size, self.root,
                                    self.group.servers, intra) for size in set(self.pieces)}
        self._steps = (step for size in self.pieces for step in by_size[size])

    def _next_step(self, _: Any = None) -> None:
        step = next(self._steps, None)
        if step is None:
            self._finish()
        else:
            self._run(step)

    def _run(self, step: A.Step) -> None:
        st = self.state
        rt = st.rt
        self.steps += 1
        self._outstanding = len(step.sends)
        self._reduce_bytes = step.reduce_bytes
        topo = rt.topology
        assert topo is not None, "collectives run on a topology"
        path, members, link_bytes = topo.path, self.members, st.link_bytes
        for src, dst, nbytes in step.sends:
            links = path(members[src], members[dst])
            for link in links:
                link_bytes[link.name] = link_bytes.get(link.name, 0) + nbytes
            self.sent_bytes += nbytes
            rt.net.transfer(links, nbytes, self._flow_done, None)
        if not step.sends:
            self._flow_done(None)

    def _flow_done(self, _: Any) -> None:
        self._outstanding -= 1
        if self._outstanding > 0:
            return
        reduce_ns = -(-self._reduce_bytes // self.state.reduce_bytes_per_ns) if self._reduce_bytes else 0
        self.state.rt.engine.after(int(reduce_ns), self._next_step)

    def _finish(self) -> None:
        rt = self.state.rt
        self.end_ns = rt.engine.now
        self.group.pending.pop(self.key, None)
        for m in range(len(self.members)):
            rt.dispatch.task_finished(self.tasks[m])

    # ------------------------------------------------------------------ recording
    def record(self, rows: "Rows", task: "Task", end_ns: int) -> None:
        """Rows for one member: Notify_Wait (arrival -> last arrival, when > 0), then the transfer."""
        if not rows.sw.hccl:
            return
        stream = task.stream
        dev = stream.device
        m = self.index[dev.rank]
        arrive = self.arrive_ns[m]
        common = (dev.pid, stream.id, None)
        if self.start_ns > arrive:
            args = json.dumps({"Task Type": "Notify_Wait", "Stream Id": stream.id, "Task Id": task.corr,
                               "Device Id": dev.id})
            rows.recorder.rows.append((dev.rank, "X", "Notify_Wait", "hccl", arrive, self.start_ns - arrive, *common,
                                     args, None, "wait", dev.id, stream.id, task.corr, None, None, None, task.step))
        args = json.dumps({"Task Type": "HCCL", "Stream Id": stream.id, "Task Id": task.corr, "Device Id": dev.id,
                           "size(Byte)": task.bytes, "algorithm": self.algorithm, "comm": self.group.id,
                           "seq": self.seq_label, "ranks": len(self.members), "pieces": len(self.pieces)})
        # The communicator and the call's sequence in it, as typed columns (addr, value of a
        # collective row): what matches this rank's part with its peers' parts.
        comm_id, seq = self.instance
        rows.recorder.rows.append((dev.rank, "X", task.name, "hccl", self.start_ns, end_ns - self.start_ns, *common,
                                 args, None, "collective", dev.id, stream.id, task.corr, task.bytes, comm_id,
                                 float(seq), task.step))

    @property
    def instance(self) -> tuple[int, int]:
        """(communicator id, sequence number): a collective's own communicator and its call number
        in it; a send / receive pair's point-to-point channel (one id per pair) and its number."""
        if isinstance(self.key, tuple):
            _, a, b, n = self.key
            return communicator_id(f"{self.group.id}:p2p:{a}-{b}"), int(n)
        return self.group.id, int(self.key)

    @property
    def seq_label(self) -> str:
        return "-".join(map(str, self.key)) if isinstance(self.key, tuple) else str(self.key)

    def ground_truth(self) -> dict:
        return {"comm": self.group.id, "seq": self.seq_label, "op": self.op, "algorithm": self.algorithm,
                "requested": self.requested, "ranks": list(self.members), "bytes": self.nbytes,
                "pieces": len(self.pieces), "steps": self.steps, "sent_bytes": self.sent_bytes,
                "arrive_ns": [self.arrive_ns.get(m) for m in range(len(self.members))],
                "wait_ns": [self.start_ns - self.arrive_ns[m] if self.start_ns >= 0 and m in self.arrive_ns else None
                            for m in range(len(self.members))],
                "start_ns": self.start_ns if self.start_ns >= 0 else None,
                "end_ns": self.end_ns if self.end_ns >= 0 else None}


class HcclState:
    """Everything HCCL keeps on one runtime (`rt.hccl`)."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.algorithm = A.AUTO
        env = os.environ.get("HCCL_BUFFSIZE")  # the real HCCL knob, in MB
        self.buffsize_bytes = int(env if env else DEFAULT_BUFFSIZE_MB) * MiB
        self.reduce_bytes_per_ns = DEFAULT_REDUCE_GBPS  # 1 GB/s == 1 byte/ns
        self.groups: list[Group] = []
        self.rendezvous: dict[Any, Rendezvous] = {}
        self.init_calls: dict[tuple, int] = {}  # (global rank, member tuple) -> comm_init_all calls so far
        self.next_root = 0
        self.collectives: list[Collective] = []
        self.link_bytes: dict[str, int] = {}
        self.inits: list[tuple[int, int, int, int]] = []  # (global rank, start_ns, end_ns, comm id)

    def new_group(self, ranks: tuple[int, ...]) -> Group:
        topo = self.rt.topology
        assert topo is not None, "communicators are made on a topology"
        by_server: dict[int, list[int]] = {}
        for i, r in enumerate(ranks):
            by_server.setdefault(topo.server_of(r), []).append(i)
        group = Group(len(self.groups), ranks, [by_server[s] for s in sorted(by_server)], topo.intra)
        self.groups.append(group)
        return group

    def resolve(self, op: str, group: Group, requested: str | None) -> tuple[str, str]:
        """(algorithm used, algorithm asked for): the per-call keyword, else the runtime default."""
        asked = requested or self.algorithm
        return A.resolve(op, asked, group.servers, group.intra_link), asked

    def ground_truth(self) -> dict:
        """What the runtime's ground truth should carry under "hccl"."""
        return {"config": {"algorithm": self.algorithm, "buffsize_bytes": self.buffsize_bytes,
                           "reduce_gbps": self.reduce_bytes_per_ns},
                "communicators": [g.describe() for g in self.groups],
                "inits": [{"rank": r, "start_ns": a, "end_ns": b, "comm": c} for r, a, b, c in self.inits],
                "collectives": [c.ground_truth() for c in self.collectives],
                "link_bytes": dict(sorted(self.link_bytes.items()))}


def state(rt: "Runtime") -> HcclState:
    """rt.hccl, created on first use."""
    if rt.hccl is None:
        rt.hccl = HcclState(rt)
    return rt.hccl
