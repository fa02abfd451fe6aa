"""HCCL on the emulator: HCCL's closed-form costs, max-min contention, matching, misuse, traffic.

Closed forms (DOMAIN.md §1): a = alpha (path latency), b = 1/bandwidth, g = 1/reduce bandwidth,
n bytes, p ranks. They are written out here on purpose, independently of the implementation.
"""

from __future__ import annotations

import json
from math import log2

import pytest

from runtime_emu import AclError, Deadlock, Runtime, Switches, acl, hccl, topology
from runtime_emu.hccl import algorithms as A
from runtime_emu.presets import PRESETS, MiB

FP32, INT8, SUM = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_DATA_TYPE_INT8, hccl.HCCL_REDUCE_SUM
SRC, DST = 0x1_0000_0000, 0x1_0010_0000  # device pointers are only checked for being ints
P = PRESETS["910B3"]
G = 1 / hccl.DEFAULT_REDUCE_GBPS  # ns per reduced byte
HCCS = (3_000, 1 / 28.0)  # topology defaults: alpha ns, ns per byte
ROCE = (15_000, 1 / 25.0)
PCIE = (P.copy_latency_ns, 1 / P.pcie_gbps)
KiB = 1 << 10


@pytest.fixture(autouse=True)
def _fresh_acl(monkeypatch):
    monkeypatch.setattr(acl, "_current", None)  # each test starts (and leaves) acl uninitialised


def job(topo, program, **config):
    """Run program(rank) on every rank; return (per-rank results, hccl ground truth, EmuResult)."""
    rt = acl.init(topology=topo, **config)
    out = rt.run_ranks(program)
    gt = hccl.ground_truth()
    return out, gt, acl.finalize()


def allreduce_program(topo, nbytes, algorithm=None, late=None, op="all_reduce"):
    late = late or {}

    def program(rank):
        acl.rt.set_device(topo.local_of(rank))
        comm = hccl.comm_init_all()
        s = acl.rt.create_stream()
        if rank in late:
            acl.prof.host_work("late", late[rank])
        if op == "all_reduce":
            hccl.all_reduce(SRC, DST, nbytes // 4, FP32, SUM, comm, s, algorithm=algorithm)
        elif op == "all_gather":
            hccl.all_gather(SRC, DST, nbytes, INT8, comm, s, algorithm=algorithm)
        elif op == "reduce_scatter":
            hccl.reduce_scatter(SRC, DST, nbytes, INT8, SUM, comm, s, algorithm=algorithm)
        elif op == "broadcast":
            hccl.broadcast(SRC, nbytes, INT8, 1, comm, s, algorithm=algorithm)
        elif op == "alltoall":
            hccl.alltoall(SRC, nbytes, INT8, DST, nbytes, INT8, comm, s, algorithm=algorithm)
        acl.rt.synchronize_stream(s)

    return program


def rows(result, name=None, kind=None):
    df = result.trace.to_pandas()
    df = df[df.ph == "X"]
    if name is not None:
        df = df[df.name == name]
    if kind is not None:
        df = df[df.kind == kind]
    return df


# ============================================================================ closed forms
def pieces(n, limit=hccl.DEFAULT_BUFFSIZE_MB * MiB):
    full, rest = divmod(n, limit)
    return [n] if n <= limit else [limit] * full + ([rest] if rest else [])


def ring_ar(p, n, a, b):
    return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * G


def hd_ar(p, n, a, b):
    return 2 * log2(p) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * G


def mesh_ar(p, n, a, b):
    return 2 * a + 2 / p * n * b + (p - 1) / p * n * G


def hier_ar(servers, local, n):
    """Intra-server mesh reduce-scatter + inter-server HD allreduce of n/L + intra mesh allgather."""
    (ai, bi), (ar, br) = HCCS, ROCE
    intra = (ai + n / local * bi + (local - 1) / local * n * G) + (ai + n / local * bi) if local > 1 else 0.0
    return intra + hd_ar(servers, n / local, ar, br)


def closed_form(alg, p, n):
    """HCCL's model for one allreduce, summed over the HCCL_BUFFSIZE pieces (each pays its alphas)."""
    if alg == "hierarchical":
        return sum(hier_ar(2, p // 2, x) for x in pieces(n))
    f = {"ring": ring_ar, "hd": hd_ar, "mesh": mesh_ar}[alg]
    return sum(f(p, x, *HCCS) for x in pieces(n))


def emulate_allreduce(alg, p, n):
    topo = topology.cluster(2, p // 2) if alg == "hierarchical" else topology.server(p)
    _, gt, _ = job(topo, allreduce_program(topo, n, algorithm=alg), switches=Switches(sys_hardware_mem=False))
    (c,) = gt["collectives"]
    assert len(set(c["arrive_ns"])) == 1  # every rank arrived at once
    return c["end_ns"] - c["start_ns"], c


SIZES = {"1KiB": KiB, "1MiB": MiB, "64MiB": 64 * MiB, "1GiB": 1024 * MiB}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("alg", ["ring", "hd", "mesh", "hierarchical"])
def test_allreduce_time_matches_hccl_closed_form(alg, p, size):
    n = SIZES[size]
    emulated, c = emulate_allreduce(alg, p, n)
    assert c["algorithm"] == alg and c["pieces"] == len(pieces(n))
    # The brief allows 5%; steps run in lockstep, so only ns rounding separates the two (< 0.05%).
    assert emulated == pytest.approx(closed_form(alg, p, n), rel=0.005)


def test_non_power_of_two_hd_folds_the_extra_ranks():
    p, n = 6, 12 * MiB  # p' = 4 survivors, 2 folded ranks: two extra steps of a + n*b, n*g to reduce
    a, b = HCCS
    expected = hd_ar(4, n, a, b) + 2 * (a + n * b) + n * G
    emulated, c = emulate_allreduce("hd", p, n)
    assert c["steps"] == 2 * 2 + 2
    assert emulated == pytest.approx(expected, rel=0.01)


def test_pieces_follow_a_configured_hccl_buffsize():
    topo = topology.server(4)
    rt = acl.init(topology=topo)
    hccl.configure(buffsize_mb=1)
    rt.run_ranks(allreduce_program(topo, 5 * MiB // 2))
    (c,) = hccl.ground_truth()["collectives"]
    assert c["pieces"] == 3 and c["steps"] == 3 * 2
    expected = sum(mesh_ar(4, x, *HCCS) for x in (MiB, MiB, MiB // 2))
    assert c["end_ns"] - c["start_ns"] == pytest.approx(expected, rel=0.001)
    acl.finalize()


# ============================================================================ broadcast
def ring_bcast(p, n, a, b):
    """Ring scatter (p-1 hops of n/p) then ring allgather (p-1 steps of n/p)."""
    return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b


def hd_bcast(p, n, a, b):
    """Binomial scatter (n/2 ... n/p) then recursive-doubling allgather (n/p ... n/2)."""
    return 2 * log2(p) * a + 2 * (p - 1) / p * n * b


def mesh_bcast(p, n, a, b):
    """The root sends n/p on each of its p-1 links at once, then every member does."""
    return 2 * a + 2 / p * n * b


FLAT_BCAST = {"ring": ring_bcast, "hd": hd_bcast, "mesh": mesh_bcast}

# (algorithm, topology, closed form of one piece of n bytes): the flat algorithms on HCCS, on
# PCIe through the host switch and on one NIC per rank; hierarchical on 2 or 4 servers (hd
# across them) and 3 (ring across), with HCCS (mesh inside) or PCIe (ring inside).
BCAST_CASES = {
    **{f"ring-hccs-{p}": ("ring", lambda p=p: topology.server(p), lambda n, p=p: ring_bcast(p, n, *HCCS))
       for p in (4, 8, 16)},
    **{f"ring-pcie-{p}": ("ring", lambda p=p: topology.server(p, intra="pcie"),
                          lambda n, p=p: ring_bcast(p, n, *PCIE)) for p in (4, 8, 16)},
    **{f"hd-hccs-{p}": ("hd", lambda p=p: topology.server(p), lambda n, p=p: hd_bcast(p, n, *HCCS))
       for p in (4, 8, 16)},
    **{f"hd-roce-{p}": ("hd", lambda p=p: topology.cluster(p, 1), lambda n, p=p: hd_bcast(p, n, *ROCE))
       for p in (4, 8, 16)},
    **{f"mesh-hccs-{p}": ("mesh", lambda p=p: topology.server(p), lambda n, p=p: mesh_bcast(p, n, *HCCS))
       for p in (4, 8, 16)},
    **{f"hierarchical-{s}x{L}-hccs": ("hierarchical", lambda s=s, L=L: topology.cluster(s, L),
                                      lambda n, s=s, L=L: FLAT_BCAST["hd" if s != 3 else "ring"](s, n, *ROCE)
                                      + mesh_bcast(L, n, *HCCS))
       for s, L in ((2, 2), (2, 4), (2, 8), (4, 4), (3, 4))},
    "hierarchical-2x4-pcie": ("hierarchical", lambda: topology.cluster(2, 4, intra="pcie"),
                              lambda n: hd_bcast(2, n, *ROCE) + ring_bcast(4, n, *PCIE)),
}
BCAST_SIZES = {"1MiB": MiB, "64MiB": 64 * MiB, "1GiB": 1024 * MiB}


def broadcast_program(topo, nbytes, root, algorithm):
    def program(rank):
        acl.rt.set_device(topo.local_of(rank))
        comm = hccl.comm_init_all()
        s = acl.rt.create_stream()
        hccl.broadcast(SRC, nbytes, INT8, root, comm, s, algorithm=algorithm)
        acl.rt.synchronize_stream(s)

    return program


@pytest.mark.parametrize("root", ["first", "second", "last"])
@pytest.mark.parametrize("size", BCAST_SIZES)
@pytest.mark.parametrize("case", BCAST_CASES)
def test_broadcast_time_matches_its_closed_form(case, size, root):
    alg, make_topo, one_piece = BCAST_CASES[case]
    topo, n = make_topo(), BCAST_SIZES[size]
    r = {"first": 0, "second": 1, "last": topo.world_size - 1}[root]
    _, gt, _ = job(topo, broadcast_program(topo, n, r, alg), switches=Switches(sys_hardware_mem=False))
    (c,) = gt["collectives"]
    assert len(set(c["arrive_ns"])) == 1 and c["algorithm"] == alg and c["pieces"] == len(pieces(n))
    # Every piece pays its own alphas; lockstep steps leave only ns rounding (< 0.05%).
    assert c["end_ns"] - c["start_ns"] == pytest.approx(sum(one_piece(x) for x in pieces(n)), rel=0.0005)


@pytest.mark.parametrize("alg", ["ring", "hd", "mesh"])
def test_broadcast_schedules_deliver_every_chunk_from_holders_only(alg, monkeypatch):
    """Chunk j is 2**j bytes, so a send's size names the chunks it carries: every send must carry
    chunks its sender already holds, every member must end with all of them, and with ring and hd
    no member sends or receives twice in a step (the root never drives all its links at once)."""
    monkeypatch.setattr(A, "chunks", lambda n, p: [1 << j for j in range(p)])
    for p in (2, 3, 4, 5, 8, 16):
        if alg == "hd" and not A.is_pow2(p):
            continue
        for root in range(p):
            full = (1 << p) - 1
            held = [full if m == root else 0 for m in range(p)]
            sched = A.schedule("broadcast", alg, p, 0, root)
            expected_steps = {"ring": 2 * (p - 1), "hd": 2 * int(log2(p)), "mesh": 2}[alg]
            assert len(sched) == expected_steps
            for step in sched:
                got = list(held)
                for src, dst, b in step.sends:
                    assert b and b & ~held[src] == 0, (p, root, step)
                    got[dst] |= b
                if alg != "mesh":
                    assert len({s for s, _, _ in step.sends}) == len({d for _, d, _ in step.sends}) == len(step.sends)
                if alg == "ring":
                    assert all(dst == (src + 1) % p for src, dst, _ in step.sends)
                held = got
            assert held == [full] * p

# ============================================================================ contention
def contention_job(copy_bytes, copy_first):
    """Ring allreduce on a PCIe server; rank 1 also copies copy_bytes H2D over its pcie_h2d link,
    the link the collective's 0 -> 1 sends cross."""
    topo = topology.server(4, intra="pcie")
    n = 16 * MiB

    def program(rank):
        acl.rt.set_device(rank)
        comm = hccl.comm_init_all()
        s, s2 = acl.rt.create_stream(), acl.rt.create_stream()
        host, dev = acl.rt.malloc_host(max(copy_bytes, 1)), acl.rt.malloc(max(copy_bytes, 1))
        copy = rank == 1 and copy_bytes > 0
        if copy and copy_first:
            acl.rt.memcpy_async(dev, copy_bytes, host, copy_bytes, acl.ACL_MEMCPY_HOST_TO_DEVICE, s2)
        hccl.all_reduce(SRC, DST, n // 4, FP32, SUM, comm, s)
        if copy and not copy_first:
            acl.rt.memcpy_async(dev, copy_bytes, host, copy_bytes, acl.ACL_MEMCPY_HOST_TO_DEVICE, s2)
        acl.rt.synchronize_device()

    _, gt, result = job(topo, program)
    (c,) = gt["collectives"]
    copies = rows(result, kind="memcpy")
    copy = None if copies.empty else (int(copies.ts.iloc[0]), int(copies.ts.iloc[0] + copies.dur.iloc[0]))
    return c, copy, n


def test_copy_outlasting_the_collective_halves_its_bandwidth_on_the_shared_link():
    c, copy, n = contention_job(1024 * MiB, copy_first=True)
    a, b = PCIE
    p, chunk = 4, n / 4
    assert c["algorithm"] == "ring"
    # The copy holds half of rank 1's pcie_h2d for the whole collective, so every step's 0 -> 1
    # send runs at B/2 (max-min: two flows bottlenecked on one link), the other sends at B.
    expected = 2 * (p - 1) * (a + 2 * chunk * b) + (p - 1) * chunk * G
    assert copy[0] < c["start_ns"] and copy[1] > c["end_ns"]
    assert c["end_ns"] - c["start_ns"] == pytest.approx(expected, rel=0.01)


def test_short_copy_delays_the_collective_by_its_own_bytes_over_the_link():
    base, _, n = contention_job(0, copy_first=False)
    copy_bytes = 1 * MiB
    c, copy, _ = contention_job(copy_bytes, copy_first=False)
    a, b = PCIE
    # The copy starts inside the first step's 0 -> 1 send and ends before it: rank 1's pcie_h2d
    # is busy throughout, carrying the chunk and the copy, so that step (and the collective)
    # ends exactly copy_bytes / B later.
    assert c["start_ns"] + a < copy[0] and copy[1] < c["start_ns"] + a + n / 4 * b * 2
    slowdown = (c["end_ns"] - c["start_ns"]) - (base["end_ns"] - base["start_ns"])
    assert slowdown == pytest.approx(copy_bytes * b, rel=0.01)
    assert base["end_ns"] - base["start_ns"] == pytest.approx(ring_ar(4, n, *PCIE), rel=0.001)


# ============================================================================ late ranks, init, determinism
def test_a_late_rank_shows_as_notify_wait_on_the_others_and_transfers_stay_the_same():
    topo = topology.server(4)
    _, _, base = job(topo, allreduce_program(topo, MiB))
    _, gt, late = job(topo, allreduce_program(topo, MiB, late={2: 1_000_000}))
    waits = rows(late, "Notify_Wait")
    assert sorted(waits["rank"]) == [0, 1, 3] and set(waits["dur"]) == {1_000_000}
    assert set(waits["kind"]) == {"wait"}
    transfer = rows(late, kind="collective")
    assert set(transfer["dur"]) == set(rows(base, kind="collective")["dur"]) and len(transfer) == 4
    assert gt["collectives"][0]["wait_ns"] == [1_000_000, 1_000_000, 0, 1_000_000]
    assert rows(base, "Notify_Wait").empty


def test_comm_init_blocks_every_rank_until_the_last_joins():
    topo = topology.server(4)
    rt = acl.init(topology=topo)
    info = hccl.get_root_info()

    def program(rank):
        acl.rt.set_device(rank)
        acl.prof.host_work("setup", 100_000 * rank)
        t0 = acl.prof.now()
        comm = hccl.comm_init_root_info(4, info, 3 - rank)  # rank ids reversed
        return t0, acl.prof.now(), comm.rank, comm.ranks

    out = rt.run_ranks(program)
    last_join = max(t0 for t0, *_ in out)
    assert {t1 for _, t1, *_ in out} == {last_join + hccl.COMM_INIT_NS}
    assert [r for *_, r, _ in out] == [3, 2, 1, 0] and out[0][3] == (3, 2, 1, 0)
    inits = hccl.ground_truth()["inits"]
    assert [i["end_ns"] - i["start_ns"] for i in sorted(inits, key=lambda i: i["rank"])] == [
        last_join - t0 + hccl.COMM_INIT_NS for t0, *_ in out]
    acl.finalize()


def test_comm_init_missing_a_rank_deadlocks_with_a_clear_message():
    acl.init(topology=topology.server(2))
    acl.rt.set_device(0)  # rank 0 on the main thread; rank 1 never joins
    with pytest.raises(Deadlock, match="HcclCommInitAll waits for all 2 ranks"):
        hccl.comm_init_all()


def mixed_program(topo):
    def program(rank):
        acl.rt.set_device(topo.local_of(rank))
        comm = hccl.comm_init_all()
        s = acl.rt.create_stream()
        acl.prof.host_work("jitter", 10_000 * rank)
        hccl.all_reduce(SRC, DST, 1 << 18, FP32, SUM, comm, s)
        hccl.all_gather(SRC, DST, 1 << 16, INT8, comm, s, algorithm="ring")
        peer = rank ^ 1
        (hccl.send if rank % 2 == 0 else hccl.recv)(SRC, 4096, INT8, peer, comm, s)
        acl.rt.synchronize_stream(s)

    return program


def test_two_runs_give_identical_traces_and_ground_truth():
    topo = topology.cluster(2, 2)
    _, gt1, r1 = job(topo, mixed_program(topo))
    _, gt2, r2 = job(topo, mixed_program(topo))
    assert r1.trace.equals(r2.trace) and gt1 == gt2 and len(gt1["collectives"]) == 2 + 2


# ============================================================================ misuse
def run_catching(topo, body):
    """Each rank runs body(rank, comm, stream); returns each rank's AclError message or None."""
    def program(rank):
        acl.rt.set_device(topo.local_of(rank))
        comm = hccl.comm_init_all()
        s = acl.rt.create_stream()
        try:
            body(rank, comm, s)
        except AclError as exc:
            return str(exc)
        return None

    out, _, _ = job(topo, program)
    return out


@pytest.mark.parametrize("call, message", [
    (lambda c, s: hccl.all_reduce(SRC, DST, 0, FP32, SUM, c, s), "count must be a positive"),
    (lambda c, s: hccl.all_reduce(SRC, DST, 8, FP32, 9, c, s), "unknown HcclReduceOp 9"),
    (lambda c, s: hccl.all_reduce(SRC, DST, 8, 99, SUM, c, s), "unknown HcclDataType 99"),
    (lambda c, s: hccl.all_reduce("buf", DST, 8, FP32, SUM, c, s), "send_buf must be a device pointer"),
    (lambda c, s: hccl.all_reduce(SRC, DST, 8, FP32, SUM, c, s, algorithm="tree"), "unknown HCCL algorithm"),
    (lambda c, s: hccl.broadcast(SRC, 8, FP32, 5, c, s), "root must be a rank id 0..1"),
    (lambda c, s: hccl.send(SRC, 8, FP32, 7, c, s), "peer rank 7 is not in the communicator"),
    (lambda c, s: hccl.all_reduce(SRC, DST, 8, FP32, SUM, "comm", s), "invalid communicator handle"),
])
def test_misuse_raises_a_clear_error(call, message):
    out = run_catching(topology.server(2), lambda rank, c, s: call(c, s))
    assert all(message in m for m in out), out


def test_mismatched_counts_are_caught_at_the_rendezvous():
    caught = []

    def body(rank, comm, s):
        if rank == 1:
            try:
                hccl.all_reduce(SRC, DST, 16, FP32, SUM, comm, s)
            except AclError as exc:
                caught.append(str(exc))
        hccl.all_reduce(SRC, DST, 8, FP32, SUM, comm, s)  # the right call still matches
        acl.rt.synchronize_stream(s)

    assert run_catching(topology.server(2), body) == [None, None]
    assert "is allReduce(16, 4, 0, None) on rank 1 but allReduce(8, 4, 0, None) on rank(s) [0]" in caught[0]


def test_rank_outside_the_communicator_and_foreign_handles_are_refused():
    topo = topology.server(3)
    handles = {}

    def program(rank):
        acl.rt.set_device(rank)
        if rank < 2:
            handles[rank] = hccl.comm_init_all(ranks=[0, 1])
            return None
        errors = []
        for attempt in (lambda: hccl.comm_init_all(ranks=[0, 1]),
                        lambda: hccl.all_reduce(SRC, DST, 8, FP32, SUM, handles[0], None)):
            try:
                attempt()
            except AclError as exc:
                errors.append(str(exc))
        return errors

    out, _, _ = job(topo, program)
    assert "rank 2 is not in communicator ranks [0, 1]" in out[2][0]
    assert "rank 2 is not the owner of this handle" in out[2][1]


def test_hccl_needs_a_topology():
    acl.init(ranks=2)
    with pytest.raises(AclError, match="needs a runtime created with a topology"):
        hccl.get_root_info()
    acl.finalize()


# ============================================================================ subsets, selection, traffic
def test_subset_communicators_run_side_by_side_on_their_own_links():
    topo = topology.server(4)

    def program(rank):
        acl.rt.set_device(rank)
        comm = hccl.comm_init_all(ranks=[0, 1] if rank < 2 else [3, 2])
        s = acl.rt.create_stream()
        hccl.all_reduce(SRC, DST, MiB // 4, FP32, SUM, comm, s)
        acl.rt.synchronize_stream(s)
        return comm.rank

    out, gt, _ = job(topo, program)
    assert out == [0, 1, 1, 0]
    assert [c["ranks"] for c in gt["collectives"]] == [[0, 1], [3, 2]]
    for c in gt["collectives"]:
        assert c["end_ns"] - c["start_ns"] == pytest.approx(mesh_ar(2, MiB, *HCCS), rel=0.001)
    assert gt["link_bytes"] == {"r0->r1.hccs": MiB, "r1->r0.hccs": MiB,  # n/2 each phase (RS, AG)
                                "r2->r3.hccs": MiB, "r3->r2.hccs": MiB}


@pytest.mark.parametrize("topo, ranks, op, asked, expected", [
    (topology.server(8), None, "allReduce", "auto", "mesh"),
    (topology.server(8, intra="pcie"), None, "allReduce", "auto", "ring"),
    (topology.cluster(2, 4), None, "allReduce", "auto", "hierarchical"),
    (topology.cluster(4, 1), None, "allReduce", "auto", "hd"),
    (topology.cluster(3, 1), None, "allReduce", "auto", "ring"),
    (topology.cluster(2, 4), [0, 1, 4], "allReduce", "auto", "ring"),
    (topology.server(8), None, "alltoall", "auto", "mesh"),
    (topology.cluster(2, 4), None, "alltoall", "auto", "pairwise"),
    # Requests that do not apply fall back, and say so.
    (topology.cluster(2, 4), [0, 1, 4], "allReduce", "hierarchical", "ring"),
    (topology.server(4), None, "allReduce", "hierarchical", "mesh"),
    (topology.server(6), None, "allGather", "hd", "ring"),
    (topology.server(6), None, "allReduce", "hd", "hd"),
    (topology.server(4), None, "alltoall", "ring", "pairwise"),
    (topology.server(4), None, "broadcast", "pairwise", "ring"),
    (topology.server(4), None, "send", "mesh", "p2p"),
])
def test_algorithm_choice_and_fallbacks(topo, ranks, op, asked, expected):
    rt = Runtime(topology=topo)
    st = hccl.HcclState(rt)
    group = st.new_group(tuple(ranks or range(topo.world_size)))
    assert st.resolve(op, group, None if asked == "auto" else asked) == (expected, asked)


def link_totals(result):
    """Bytes each link carried, integrated from the trace's link bandwidth counters (GB/s x ns)."""
    df = result.trace.to_pandas()
    df = df[(df.ph == "C") & df.name.str.endswith(" GB/s")].sort_values("ts", kind="stable")
    out = {}
    for name, g in df.groupby("name", sort=True):
        ts, v = g.ts.to_numpy(), g.value.to_numpy()
        out[name[:-5]] = float((v[:-1] * (ts[1:] - ts[:-1])).sum())
    return out


C4 = 300_001 * 4  # bytes per rank: not a round number, and large enough that ns rounding is noise
RING4 = {f"r{i}->r{(i + 1) % 4}.hccs" for i in range(4)}
ALL4 = {f"r{i}->r{j}.hccs" for i in range(4) for j in range(4) if i != j}


@pytest.mark.parametrize("op, alg, expected", [
    # allgather ring: each ring link forwards the other p-1 ranks' blocks.
    ("all_gather", "ring", {k: 3 * C4 for k in RING4}),
    ("all_gather", "mesh", {k: C4 for k in ALL4}),
    ("all_gather", "hd", {k: v for i in range(4) for k, v in {f"r{i}->r{i ^ 1}.hccs": C4,
                                                               f"r{i}->r{i ^ 2}.hccs": 2 * C4}.items()}),
    ("reduce_scatter", "ring", {k: 3 * C4 for k in RING4}),
    ("reduce_scatter", "mesh", {k: C4 for k in ALL4}),
    # broadcast from rank 1 = scatter (n/p to each) + allgather (n/p blocks): 2n/p out of the root.
    ("broadcast", "mesh", {k: (2 if k.startswith("r1->") else 1) * C4 // 4 for k in ALL4}),
    # ring from rank 1: the scatter carries 3, 2, 1 chunks over 1->2, 2->3, 3->0, then the
    # allgather 3 chunks over every ring link.
    ("broadcast", "ring", {"r0->r1.hccs": 3 * C4 // 4, "r1->r2.hccs": 6 * C4 // 4,
                           "r2->r3.hccs": 5 * C4 // 4, "r3->r0.hccs": 4 * C4 // 4}),
    # hd from rank 1: the scatter sends 2 chunks 1->3, then 1 chunk 1->0 and 3->2; the allgather
    # 1 chunk to r xor 1, 2 chunks to r xor 2.
    ("broadcast", "hd", {k: v + {"r1->r3.hccs": 2 * C4 // 4, "r1->r0.hccs": C4 // 4,
                                 "r3->r2.hccs": C4 // 4}.get(k, 0)
                         for i in range(4) for k, v in {f"r{i}->r{i ^ 1}.hccs": C4 // 4,
                                                         f"r{i}->r{i ^ 2}.hccs": 2 * C4 // 4}.items()}),
    ("alltoall", "mesh", {k: C4 for k in ALL4}),
    ("alltoall", "pairwise", {k: C4 for k in ALL4}),
])
def test_link_bytes_equal_the_algorithm_traffic(op, alg, expected):
    topo = topology.server(4)
    _, gt, result = job(topo, allreduce_program(topo, C4, algorithm=alg, op=op))
    assert gt["link_bytes"] == expected
    totals = link_totals(result)
    assert {k: v for k, v in totals.items() if v} == pytest.approx(expected, rel=0.002)


def test_send_recv_and_hierarchical_allreduce_traffic():
    topo = topology.cluster(2, 2)
    n = MiB

    def program(rank):
        acl.rt.set_device(topo.local_of(rank))
        comm = hccl.comm_init_all()
        s = acl.rt.create_stream()
        hccl.all_reduce(SRC, DST, n // 4, FP32, SUM, comm, s)
        if rank in (0, 3):
            (hccl.send if rank == 0 else hccl.recv)(SRC, 1000, INT8, 3 - rank, comm, s)
        acl.rt.synchronize_stream(s)

    _, gt, result = job(topo, program)
    ar, p2p = gt["collectives"]
    assert (ar["algorithm"], p2p["op"], p2p["ranks"]) == ("hierarchical", "send", [0, 3])
    lb = gt["link_bytes"]
    # Hierarchical: HCCS carries n/2 each way per phase (mesh RS + AG among 2); each NIC sends
    # 2(S-1)/S * n/L = n/2 in the inter-server HD allreduce; the send adds 1000 bytes 0 -> 3.
    assert {k: v for k, v in lb.items() if "hccs" in k} == {"r0->r1.hccs": n, "r1->r0.hccs": n,
                                                             "r2->r3.hccs": n, "r3->r2.hccs": n}
    assert lb["r0.roce_tx"] == n // 2 + 1000 and lb["r3.roce_rx"] == n // 2 + 1000
    assert lb["r1.roce_tx"] == lb["r2.roce_rx"] == n // 2
    names = set(rows(result, kind="collective").name)
    assert names == {"hcom_allReduce", "hcom_send", "hcom_receive"}
    args = json.loads(rows(result, "hcom_allReduce").args.iloc[0])
    assert (args["algorithm"], args["size(Byte)"], args["ranks"]) == ("hierarchical", n, 4)


def test_switching_hccl_recording_off_keeps_the_timing():
    topo = topology.server(2)
    _, gt, result = job(topo, allreduce_program(topo, MiB), switches=Switches(hccl=False))
    assert rows(result, kind="collective").empty and gt["collectives"][0]["end_ns"] > 0


# ============================================================================ schedules (pure)
def test_ring_and_hd_schedules_move_2_p_minus_1_over_p_of_the_data():
    for p in (2, 4, 8):
        n = 8 * 1024
        for sched in (A.schedule("allReduce", "ring", p, n), A.schedule("allReduce", "hd", p, n)):
            sent = [0] * p
            for step in sched:
                for src, _, b in step.sends:
                    sent[src] += b
            assert sent == [2 * (p - 1) * n // p] * p
    assert A.schedule("allGather", "ring", 3, 300) == [
        A.Step(((0, 1, 100), (1, 2, 100), (2, 0, 100))), A.Step(((0, 1, 100), (1, 2, 100), (2, 0, 100)))]
    assert A.chunks(10, 4) == [2, 3, 2, 3]


def test_collectives_find_a_directly_built_runtime_without_acl_init():
    from runtime_emu import Runtime, acl, hccl, topology

    acl._current = None
    rt = Runtime(topology=topology.server(2))

    def program(rank):
        rt.set_device(rank)
        s = rt.create_stream()
        comm = hccl.comm_init_all()
        buf = rt.malloc(1 << 20)
        hccl.all_reduce(buf, buf, 1024, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, s)
        rt.synchronize_stream(s)

    rt.run_ranks(program)
    df = rt.finish().trace.to_pandas()
    assert sorted(df[df.kind == "collective"]["rank"]) == [0, 1]
