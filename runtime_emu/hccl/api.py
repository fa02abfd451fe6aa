"""The host calls, shaped like pyACL's hccl: validate, match across ranks, launch a COLLECTIVE task.

Every call acts on the current runtime (`runtime_emu.acl.current()`) from the calling rank's
host thread. As in runtime_emu.acl, misuse raises AclError instead of returning an error code,
and calls that create something return it.
"""

from __future__ import annotations

from typing import Any

from runtime_emu import acl
from runtime_emu import errors as E
from runtime_emu.device import COLLECTIVE, Stream
from runtime_emu.errors import AclError
from runtime_emu.hccl import algorithms as A
from runtime_emu.hccl import collective as C

# HcclDataType (hccl_types.h).
HCCL_DATA_TYPE_INT8, HCCL_DATA_TYPE_INT16, HCCL_DATA_TYPE_INT32, HCCL_DATA_TYPE_FP16 = 0, 1, 2, 3
HCCL_DATA_TYPE_FP32, HCCL_DATA_TYPE_INT64, HCCL_DATA_TYPE_UINT64, HCCL_DATA_TYPE_UINT8 = 4, 5, 6, 7
HCCL_DATA_TYPE_UINT16, HCCL_DATA_TYPE_UINT32, HCCL_DATA_TYPE_FP64, HCCL_DATA_TYPE_BFP16 = 8, 9, 10, 11
HCCL_DATA_TYPE_INT128 = 12
DTYPE_BYTES = {0: 1, 1: 2, 2: 4, 3: 2, 4: 4, 5: 8, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 2, 12: 16}
# HcclReduceOp (hccl_types.h).
HCCL_REDUCE_SUM, HCCL_REDUCE_PROD, HCCL_REDUCE_MAX, HCCL_REDUCE_MIN = 0, 1, 2, 3
_REDUCE_OPS = (0, 1, 2, 3)

__all__ = [
    "HCCL_DATA_TYPE_BFP16", "HCCL_DATA_TYPE_FP16", "HCCL_DATA_TYPE_FP32", "HCCL_DATA_TYPE_FP64",
    "HCCL_DATA_TYPE_INT128", "HCCL_DATA_TYPE_INT16", "HCCL_DATA_TYPE_INT32", "HCCL_DATA_TYPE_INT64",
    "HCCL_DATA_TYPE_INT8", "HCCL_DATA_TYPE_UINT16", "HCCL_DATA_TYPE_UINT32", "HCCL_DATA_TYPE_UINT64",
    "HCCL_DATA_TYPE_UINT8", "HCCL_REDUCE_MAX", "HCCL_REDUCE_MIN", "HCCL_REDUCE_PROD", "HCCL_REDUCE_SUM",
    "DTYPE_BYTES", "RootInfo", "all_gather", "all_reduce", "alltoall", "broadcast", "comm_destroy", "comm_init_all",
    "comm_init_root_info", "configure", "get_rank_id", "get_rank_size", "get_root_info", "ground_truth", "recv",
    "reduce_scatter", "send"]


class RootInfo:
    """HcclRootInfo: names one communicator to be; share it with every rank that will join."""

    __slots__ = ("key", "state")

    def __init__(self, key: Any, state: C.HcclState) -> None:
        self.key = key
        self.state = state

    def __repr__(self) -> str:
        return f"RootInfo({self.key!r})"


def _param(message: str) -> AclError:
    return AclError(E.ACL_ERROR_INVALID_PARAM, message)


def _state(rt) -> C.HcclState:
    if rt.topology is None:
        raise _param("HCCL needs a runtime created with a topology, e.g. Runtime(topology=topology.server(8))")
    return C.state(rt)


# ============================================================================ configuration
def configure(*, algorithm: str | None = None, buffsize_mb: int | None = None, reduce_gbps: float | None = None) -> None:
    """Runtime-wide defaults: algorithm ("auto", "ring", "hd", "mesh", "hierarchical"), HCCL_BUFFSIZE
    in MB, reduce bandwidth in GB/s (gamma = 1 / reduce_gbps)."""
    st = _state(acl.current())
    if algorithm is not None:
        st.algorithm = _algorithm(algorithm)
    if buffsize_mb is not None:
        if not isinstance(buffsize_mb, int) or buffsize_mb <= 0:
            raise _param(f"HCCL_BUFFSIZE must be a positive number of MB, got {buffsize_mb!r}")
        st.buffsize_bytes = buffsize_mb * C.MiB
    if reduce_gbps is not None:
        if reduce_gbps <= 0:
            raise _param(f"reduce bandwidth must be positive, got {reduce_gbps} GB/s")
        st.reduce_bytes_per_ns = float(reduce_gbps)


def ground_truth() -> dict:
    """The current runtime's HCCL facts (communicators, collectives, link bytes)."""
    return _state(acl.current()).ground_truth()


# ============================================================================ communicators
def get_root_info() -> RootInfo:
    """HcclGetRootInfo: a fresh root info (rank 0 makes it and hands it to the others)."""
    rt = acl.current()
    th = rt._enter()
    st = _state(rt)
    t0 = th.clock
    st.next_root += 1
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "HcclGetRootInfo", t0)
    return RootInfo(("root", st.next_root), st)


def comm_init_root_info(n_ranks: int, root_info: RootInfo, rank: int) -> C.Comm:
    """HcclCommInitRootInfo: join as `rank` (0..n_ranks-1); blocks until all n_ranks have joined."""
    rt = acl.current()
    th = rt._enter()
    st = _state(rt)
    t0 = th.clock
    if not isinstance(root_info, RootInfo) or root_info.state is not st:
        raise _param(f"invalid root info {root_info!r}: get one with hccl.get_root_info() on this runtime")
    if not _is_int(n_ranks) or not 1 <= n_ranks <= rt.world_size:
        raise _param(f"n_ranks must be 1..{rt.world_size} (the job's ranks), got {n_ranks!r}")
    if not _is_int(rank) or not 0 <= rank < n_ranks:
        raise _param(f"rank must be 0..{n_ranks - 1}, got {rank!r}")
    return _join(rt, th, st, root_info.key, n_ranks, rank, t0, "HcclCommInitRootInfo")


def comm_init_all(ranks: "list[int] | None" = None) -> C.Comm:
    """Join the communicator over `ranks` (global ranks, default all; rank id = position in the list).

    Every listed rank calls it; the k-th call with the same list on each rank makes the same
    communicator. Blocks until all listed ranks have called.
    """
    rt = acl.current()
    th = rt._enter()
    st = _state(rt)
    t0 = th.clock
    members = tuple(range(rt.world_size)) if ranks is None else tuple(ranks)
    bad = [r for r in members if not _is_int(r) or not 0 <= r < rt.world_size]
    if bad or not members or len(set(members)) != len(members):
        raise _param(f"ranks must be distinct ranks of 0..{rt.world_size - 1}, got {list(members)}")
    if th.rank not in members:
        raise _param(f"rank {th.rank} is not in communicator ranks {list(members)}")
    k = st.init_calls.get((th.rank, members), 0)
    st.init_calls[(th.rank, members)] = k + 1
    return _join(rt, th, st, ("all", members, k), len(members), members.index(th.rank), t0, "HcclCommInitAll")


def _join(rt, th, st: C.HcclState, key: Any, n_ranks: int, rank: int, t0: int, api: str) -> C.Comm:
    rv = st.rendezvous.get(key)
    if rv is None:
        rv = st.rendezvous[key] = C.Rendezvous(n_ranks)
    if rv.group is not None:
        raise _param(f"{api}: all {rv.n_ranks} ranks of {key} have already joined")
    if rv.n_ranks != n_ranks:
        raise _param(f"{api}: rank {th.rank} says {n_ranks} ranks, an earlier caller said {rv.n_ranks}")
    if rank in rv.members:
        raise _param(f"{api}: rank id {rank} taken twice (global ranks {rv.members[rank]} and {th.rank})")
    if th.rank in rv.members.values():
        raise _param(f"{api}: global rank {th.rank} joined {key} twice")
    rv.members[rank] = th.rank
    rv.join_ns = max(rv.join_ns, th.clock)
    arrived = th.clock
    if len(rv.members) == n_ranks:
        rv.group = st.new_group(tuple(rv.members[i] for i in range(n_ranks)))
    else:
        rt.coord.block(th, lambda: rv.group is not None, f"{api} waits for all {n_ranks} ranks of {key} to join")
    # Every member leaves together: the rendezvous ends with the last join.
    waited = max(th.clock, rv.join_ns) - arrived
    th.clock = max(th.clock, rv.join_ns) + C.COMM_INIT_NS
    group = rv.group
    assert group is not None, "the last rank to join made the group"
    st.inits.append((th.rank, t0, th.clock, group.id))
    rt.rows.api(th, api, t0, "sync", blocked="waiting for the other ranks", blocked_ns=waited)
    return C.Comm(group, rank, th.rank)


def comm_destroy(comm: C.Comm) -> None:
    """HcclCommDestroy: this rank's handle can no longer be used."""
    rt = acl.current()
    th = rt._enter()
    _check_comm(_state(rt), th, comm).destroyed = True


def get_rank_size(comm: C.Comm) -> int:
    return _check_comm(_state(acl.current()), acl.current().coord.current(), comm).size


def get_rank_id(comm: C.Comm) -> int:
    return _check_comm(_state(acl.current()), acl.current().coord.current(), comm).rank


# ============================================================================ collectives
def all_reduce(send_buf: int, recv_buf: int, count: int, data_type: int, op: int, comm: C.Comm,
               stream: Stream | None = None, *, algorithm: str | None = None) -> int:
    """HcclAllReduce: every rank gets the reduction of all ranks' `count` elements."""
    _bufs(send_buf=send_buf, recv_buf=recv_buf)
    n = _count(count, "count") * _dtype(data_type)
    desc = ("allReduce", count, data_type, _reduce(op), algorithm)
    return _collective("HcclAllReduce", "allReduce", comm, stream, desc, n, n, algorithm,
                       reads=(send_buf,), writes=(recv_buf,))


def all_gather(send_buf: int, recv_buf: int, send_count: int, data_type: int, comm: C.Comm,
               stream: Stream | None = None, *, algorithm: str | None = None) -> int:
    """HcclAllGather: every rank gets all ranks' `send_count` elements, in rank order."""
    _bufs(send_buf=send_buf, recv_buf=recv_buf)
    c = _count(send_count, "send_count") * _dtype(data_type)
    desc = ("allGather", send_count, data_type, algorithm)
    return _collective("HcclAllGather", "allGather", comm, stream, desc, c, c * _size(comm), algorithm,
                       reads=(send_buf,), writes=(recv_buf,))


def reduce_scatter(send_buf: int, recv_buf: int, recv_count: int, data_type: int, op: int, comm: C.Comm,
                   stream: Stream | None = None, *, algorithm: str | None = None) -> int:
    """HcclReduceScatter: rank i gets block i (recv_count elements) of the reduction."""
    _bufs(send_buf=send_buf, recv_buf=recv_buf)
    c = _count(recv_count, "recv_count") * _dtype(data_type)
    desc = ("reduceScatter", recv_count, data_type, _reduce(op), algorithm)
    n = c * _size(comm)
    return _collective("HcclReduceScatter", "reduceScatter", comm, stream, desc, n, n, algorithm,
                       reads=(send_buf,), writes=(recv_buf,))


def broadcast(buf: int, count: int, data_type: int, root: int, comm: C.Comm, stream: Stream | None = None, *,
              algorithm: str | None = None) -> int:
    """HcclBroadcast: `count` elements from rank `root` (rank id in comm) to every rank."""
    _bufs(buf=buf)
    n = _count(count, "count") * _dtype(data_type)
    if not _is_int(root) or not 0 <= root < _size(comm):
        raise _param(f"broadcast root must be a rank id 0..{_size(comm) - 1}, got {root!r}")
    desc = ("broadcast", count, data_type, root, algorithm)
    # The root's buffer is read, every other rank's written.
    mine = ((buf,), ()) if comm.rank == root else ((), (buf,))
    return _collective("HcclBroadcast", "broadcast", comm, stream, desc, n, n, algorithm, root=root,
                       reads=mine[0], writes=mine[1])


def alltoall(send_buf: int, send_count: int, send_type: int, recv_buf: int, recv_count: int, recv_type: int,
             comm: C.Comm, stream: Stream | None = None, *, algorithm: str | None = None) -> int:
    """HcclAlltoAll: rank i sends its j-th block of `send_count` elements to rank j."""
    _bufs(send_buf=send_buf, recv_buf=recv_buf)
    c = _count(send_count, "send_count") * _dtype(send_type)
    if _count(recv_count, "recv_count") * _dtype(recv_type) != c:
        raise _param(f"alltoall sends {c} bytes per rank but receives {recv_count * DTYPE_BYTES[recv_type]}")
    desc = ("alltoall", send_count, send_type, recv_count, recv_type, algorithm)
    n = c * _size(comm)
    return _collective("HcclAlltoAll", "alltoall", comm, stream, desc, n, n, algorithm,
                       reads=(send_buf,), writes=(recv_buf,))


def send(send_buf: int, count: int, data_type: int, dest_rank: int, comm: C.Comm,
         stream: Stream | None = None) -> int:
    """HcclSend: `count` elements to rank id `dest_rank`; matched with that rank's recv, in order."""
    _bufs(send_buf=send_buf)
    return _p2p("HcclSend", "hcom_send", comm, stream, count, data_type, dest_rank, sending=True, buf=send_buf)


def recv(recv_buf: int, count: int, data_type: int, src_rank: int, comm: C.Comm,
         stream: Stream | None = None) -> int:
    """HcclRecv: `count` elements from rank id `src_rank`; matched with that rank's send, in order."""
    _bufs(recv_buf=recv_buf)
    return _p2p("HcclRecv", "hcom_receive", comm, stream, count, data_type, src_rank, sending=False, buf=recv_buf)


def _p2p(api: str, name: str, comm: C.Comm, stream: Any, count: int, data_type: int, peer: int, sending: bool,
         buf: int) -> int:
    n = _count(count, "count") * _dtype(data_type)
    size = _size(comm)
    if not _is_int(peer) or not 0 <= peer < size:
        raise _param(f"{api}: peer rank {peer!r} is not in the communicator (rank ids 0..{size - 1})")
    if peer == comm.rank:
        raise _param(f"{api}: rank id {peer} cannot exchange with itself")
    src, dst = (comm.rank, peer) if sending else (peer, comm.rank)
    desc = ("send", count, data_type, src, dst)
    return _collective(api, "send", comm, stream, desc, n, n, None, pair=(src, dst), name=name,
                       reads=(buf,) if sending else (), writes=() if sending else (buf,))


def _collective(api: str, op: str, comm: C.Comm, stream: Any, desc: tuple, task_bytes: int, nbytes: int,
                algorithm: str | None, root: int = 0, pair: tuple[int, int] | None = None,
                name: str | None = None, reads: tuple[int, ...] = (), writes: tuple[int, ...] = ()) -> int:
    """Match this call with the other members' and launch this rank's COLLECTIVE task; the buffers it
    reads and writes are recorded as a kernel's are (mem_read / mem_write), so races with the
    compute streams show."""
    rt = acl.current()
    th = rt._enter()
    st = _state(rt)
    t0 = th.clock
    comm = _check_comm(st, th, comm)
    stream = rt._check_stream(th, stream)
    if stream.device.rank != th.rank:
        raise _param(f"{api}: stream {stream.id} belongs to rank {stream.device.rank}, called from rank {th.rank}")
    requested = None if algorithm is None else _algorithm(algorithm)
    group = comm.group
    if pair is None:
        key: Any = comm.next_seq
        members = group.ranks
    else:
        key = ("p2p", *pair, comm.p2p_seq.get(pair, 0))
        members = (group.ranks[pair[0]], group.ranks[pair[1]])
    coll = group.pending.get(key)
    if coll is None:
        alg, asked = st.resolve(op, group, requested)
        coll = C.Collective(st, group, key, desc, members, nbytes, alg, asked, root)
        group.pending[key] = coll
        if rt.truth.keep:  # for the ground truth and the problems resolved from it
            st.collectives.append(coll)
    elif coll.desc != desc:
        raise _param(f"{api}: call {coll.seq_label} on communicator {group.id} is {_show(desc)} on rank {th.rank} "
                     f"but {_show(coll.desc)} on rank(s) {coll.joined}")
    coll.joined.append(th.rank)
    if pair is None:
        comm.next_seq += 1
    else:
        comm.p2p_seq[pair] = key[-1] + 1
    task = rt.dispatch.new_task(COLLECTIVE, name or f"hcom_{op}", stream, t0)
    task.bytes = task_bytes
    task.on_start = coll.arrive
    task.extra = coll
    rt.dispatch.launch(th, task, api, t0)
    if reads or writes:
        rt.rows.accesses(th, stream, task.corr, reads, writes)
    return task.corr


# ============================================================================ validation
def _check_comm(st: C.HcclState, th, comm: Any) -> C.Comm:
    if not isinstance(comm, C.Comm) or not any(g is comm.group for g in st.groups):
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid communicator handle {comm!r}")
    if comm.destroyed:
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"communicator {comm.group.id} was destroyed on this rank")
    if comm.global_rank != th.rank:
        raise _param(f"rank {th.rank} is not the owner of this handle: it is rank {comm.global_rank}'s handle "
                     f"of communicator {comm.group.id} (ranks {list(comm.ranks)})")
    return comm


def _size(comm: Any) -> int:
    return comm.size if isinstance(comm, C.Comm) else 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(count: Any, what: str) -> int:
    if not _is_int(count) or count <= 0:
        raise _param(f"{what} must be a positive number of elements, got {count!r}")
    return count


def _dtype(data_type: Any) -> int:
    if data_type not in DTYPE_BYTES or not _is_int(data_type):
        raise _param(f"unknown HcclDataType {data_type!r} (0..12, e.g. HCCL_DATA_TYPE_FP32 = 4)")
    return DTYPE_BYTES[data_type]


def _reduce(op: Any) -> int:
    if op not in _REDUCE_OPS or not _is_int(op):
        raise _param(f"unknown HcclReduceOp {op!r} (SUM=0, PROD=1, MAX=2, MIN=3)")
    return op


def _algorithm(name: Any) -> str:
    if name not in (*A.ALGORITHMS, A.AUTO):
        raise _param(f"unknown HCCL algorithm {name!r}; choose one of auto, {', '.join(A.ALGORITHMS)}")
    return name


def _bufs(**bufs: Any) -> None:
    for what, ptr in bufs.items():
        if not _is_int(ptr):
            raise _param(f"{what} must be a device pointer (int), got {ptr!r}")


def _show(desc: tuple) -> str:
    return f"{desc[0]}({', '.join(map(repr, desc[1:]))})"
