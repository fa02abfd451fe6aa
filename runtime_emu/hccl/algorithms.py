"""Collective algorithms as step schedules, and HCCL-style automatic algorithm choice.

A schedule is a list of `Step`s. A step is the point-to-point sends that run at once
(source member, destination member, bytes; members are indices into a communicator's rank
list) and the most bytes any receiver reduces once they have landed. The runtime glue runs
steps in lockstep: a step ends when its slowest send ends, plus gamma * reduce_bytes. Lockstep
is what HCCL's closed forms assume (each step costs alpha + bytes * beta [+ bytes * gamma]);
real HCCL synchronises neighbours with notifies rather than a global barrier, so a slow link
shows up here at once instead of rippling round the ring over a few steps.

This module is pure: it knows member indices and byte counts, never links or time.

Algorithms (n = bytes of the whole vector, p members):
- ring: reduce-scatter then allgather around the ring, p-1 steps each, n/p bytes per send.
- hd (recursive halving-doubling): reduce-scatter by recursive halving (log2 p steps, n/2,
  n/4 ... n/p bytes with partner r xor d), allgather by recursive doubling (the reverse).
  Non-power-of-two allreduce folds first (as Rabenseifner's algorithm and HCCL do): with
  p' = 2^floor(log2 p) and r = p - p', odd member 2i+1 (i < r) sends its whole vector to 2i,
  which reduces it; the p' survivors run HD; 2i sends the result back to 2i+1. That costs two
  extra steps of alpha + n*beta and n*gamma. Non-power-of-two reduce-scatter, allgather and
  broadcast fall back to ring.
- mesh: every pair at once (one step per phase), for full-mesh links such as HCCS in a server.
- hierarchical: servers of equal size L; intra-server reduce-scatter, inter-server allreduce
  among members with the same position in their server (L of them run side by side),
  intra-server allgather. Allgather goes inter-server first (only 1/L of the data crosses the
  slow links), reduce-scatter intra-server first; broadcast goes to the root's column across
  servers, then within every server: S servers of L members cost the flat broadcast of n over
  S members with the inter algorithm (inter-server alpha, beta) plus the flat broadcast of n
  over L members with the intra algorithm (intra-server alpha, beta).
- broadcast (flat): van de Geijn's scatter then allgather (each member gets one n/p chunk,
  then every member passes its chunk on), so the data leaves the root once in pieces instead
  of n per hop. The scatter follows the allgather's pattern, so with ring and hd no member
  sends or receives more than one piece in a step, and the closed form holds on any topology
  where distinct pairs use distinct links:
  ring: scatter along the ring (p-1 steps; the root sends the chunk of the farthest member
  first, every member forwards what it received the step before), ring allgather:
  2(p-1)*alpha + 2(p-1)/p*n*beta.
  hd (power-of-two p): binomial scatter by recursive halving from the root (log2 p steps of
  n/2, n/4 ... n/p, partner r xor d), recursive-doubling allgather:
  2*log2(p)*alpha + 2(p-1)/p*n*beta.
  mesh: the root sends every chunk in one step, one per link of its full mesh, then the mesh
  allgather: 2*alpha + 2n/p*beta.
- alltoall: mesh (all pairs in one step) or pairwise (p-1 steps, step k: i -> i+k).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import Sequence

RING, HD, MESH, HIERARCHICAL, PAIRWISE, AUTO = "ring", "hd", "mesh", "hierarchical", "pairwise", "auto"
P2P = "p2p"  # send/recv: one direct transfer, whatever algorithm is configured
ALGORITHMS = (RING, HD, MESH, HIERARCHICAL, PAIRWISE)
OPS = ("allReduce", "allGather", "reduceScatter", "broadcast", "alltoall", "send")


@dataclass(frozen=True)
class Step:
    sends: tuple[tuple[int, int, int], ...]  # (src member, dst member, bytes)
    reduce_bytes: int = 0


Schedule = list[Step]


def chunks(n: int, p: int) -> list[int]:
    """n bytes split into p near-equal parts (sizes differ by at most one byte)."""
    return [n * (i + 1) // p - n * i // p for i in range(p)]


def is_pow2(p: int) -> bool:
    return p > 0 and p & (p - 1) == 0


def _step(sends: list[tuple[int, int, int]], reduce_bytes: int = 0) -> Step:
    return Step(tuple(sends), reduce_bytes)


def parallel(schedules: Sequence[Schedule]) -> Schedule:
    """Schedules of disjoint member groups run side by side: step k is the union of their step k."""
    out: Schedule = []
    for steps in zip_longest(*schedules):
        live = [s for s in steps if s is not None]
        out.append(Step(tuple(x for s in live for x in s.sends), max(s.reduce_bytes for s in live)))
    return out


# ---------------------------------------------------------------------------- ring
def ring_reduce_scatter(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    cs = chunks(n, p)
    steps = []
    for s in range(p - 1):
        sends = [(g[i], g[(i + 1) % p], cs[(i - s) % p]) for i in range(p)]
        steps.append(_step(sends, max(b for _, _, b in sends)))
    return steps


def ring_scatter(g: Sequence[int], n: int, root: int) -> Schedule:
    """One n/p chunk of the root's n bytes to every member along the ring, one hop per step (p-1 steps).

    Step s: the member d hops after the root (d <= s) sends the chunk of the member p-1-s+d hops
    after the root, so the farthest chunks leave first and all arrive in the last step. Member m's
    chunk is m+1, the one ring_allgather starts from (a ring reduce-scatter leaves it there).
    """
    p = len(g)
    cs = chunks(n, p)
    return [_step([(g[(root + d) % p], g[(root + d + 1) % p], cs[(root + p - s + d) % p]) for d in range(s + 1)])
            for s in range(p - 1)]


def ring_allgather(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    cs = chunks(n, p)
    return [_step([(g[i], g[(i + 1) % p], cs[(i + 1 - s) % p]) for i in range(p)]) for s in range(p - 1)]


# ---------------------------------------------------------------------------- halving-doubling
def hd_reduce_scatter(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    if not is_pow2(p):
        return ring_reduce_scatter(g, n)
    cs = chunks(n, p)
    seg = [(0, p)] * p  # chunk range each member still holds, halved every step
    steps = []
    d = p // 2
    while d:
        sends, kept = [], []
        for i in range(p):
            lo, hi = seg[i]
            mid = (lo + hi) // 2
            give, keep = ((lo, mid), (mid, hi)) if i & d else ((mid, hi), (lo, mid))
            sends.append((g[i], g[i ^ d], sum(cs[give[0]:give[1]])))
            kept.append(keep)
        seg = kept
        steps.append(_step(sends, max(sum(cs[lo:hi]) for lo, hi in seg)))
        d //= 2
    return steps


def hd_scatter(g: Sequence[int], n: int, root: int) -> Schedule:
    """Chunk j of the root's n bytes to member j by recursive halving (binomial tree, log2 p steps).

    Members are counted from the root as v = member xor root; the holder of chunks [v, v + 2d)
    sends the upper half to v + d, so step sizes are n/2, n/4 ... n/p and every holder sends once.
    Needs a power-of-two p (else ring).
    """
    p = len(g)
    if not is_pow2(p):
        return ring_scatter(g, n, root)
    cs = chunks(n, p)
    steps = []
    d = p // 2
    while d:
        steps.append(_step([(g[v ^ root], g[(v + d) ^ root], sum(cs[u ^ root] for u in range(v + d, v + 2 * d)))
                            for v in range(0, p, 2 * d)]))
        d //= 2
    return steps


def hd_allgather(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    if not is_pow2(p):
        return ring_allgather(g, n)
    cs = chunks(n, p)
    seg = [(i, i + 1) for i in range(p)]
    steps = []
    d = 1
    while d < p:
        steps.append(_step([(g[i], g[i ^ d], sum(cs[seg[i][0]:seg[i][1]])) for i in range(p)]))
        seg = [(min(seg[i][0], seg[i ^ d][0]), max(seg[i][1], seg[i ^ d][1])) for i in range(p)]
        d *= 2
    return steps


def hd_allreduce(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    if is_pow2(p):
        return hd_reduce_scatter(g, n) + hd_allgather(g, n)
    core = 1 << (p.bit_length() - 1)
    extra = p - core
    fold = _step([(g[2 * i + 1], g[2 * i], n) for i in range(extra)], n)
    survivors = [g[2 * i] for i in range(extra)] + list(g[2 * extra:])
    unfold = _step([(g[2 * i], g[2 * i + 1], n) for i in range(extra)])
    return [fold] + hd_reduce_scatter(survivors, n) + hd_allgather(survivors, n) + [unfold]


# ---------------------------------------------------------------------------- mesh
def mesh_reduce_scatter(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    cs = chunks(n, p)
    sends = [(g[i], g[j], cs[j]) for i in range(p) for j in range(p) if i != j]
    return [_step(sends, (p - 1) * max(cs))]


def mesh_allgather(g: Sequence[int], n: int) -> Schedule:
    p = len(g)
    cs = chunks(n, p)
    return [_step([(g[i], g[j], cs[i]) for i in range(p) for j in range(p) if i != j])]


def mesh_scatter(g: Sequence[int], n: int, root: int) -> Schedule:
    """Chunk j to member j in one step: on a full mesh each goes on its own link of the root."""
    cs = chunks(n, len(g))
    return [_step([(g[root], g[j], cs[j]) for j in range(len(g)) if j != root])]


# ---------------------------------------------------------------------------- flat ops
_RS = {RING: ring_reduce_scatter, HD: hd_reduce_scatter, MESH: mesh_reduce_scatter}
_AG = {RING: ring_allgather, HD: hd_allgather, MESH: mesh_allgather}
_SCATTER = {RING: ring_scatter, HD: hd_scatter, MESH: mesh_scatter}


def flat(op: str, alg: str, g: Sequence[int], n: int, root: int = 0) -> Schedule:
    """The schedule of `op` over members g with a flat algorithm; `root` is a position in g."""
    if len(g) < 2:
        return []
    if op == "allReduce":
        if alg == HD:
            return hd_allreduce(g, n)
        return _RS[alg](g, n) + _AG[alg](g, n)
    if op == "reduceScatter":
        return _RS[alg](g, n)
    if op == "allGather":
        return _AG[alg](g, n)
    if op == "broadcast":
        return _SCATTER[alg](g, n, root) + _AG[alg](g, n)
    if op == "alltoall":
        p = len(g)
        c = n // p
        if alg == MESH:
            return [_step([(g[i], g[j], c) for i in range(p) for j in range(p) if i != j])]
        return [_step([(g[i], g[(i + k) % p], c) for i in range(p)]) for k in range(1, p)]
    raise ValueError(f"no flat schedule for {op!r}")


def hierarchical(op: str, servers: Sequence[Sequence[int]], n: int, intra: str, inter: str, root: int = 0) -> Schedule:
    """Two-level schedule over `servers` (member lists of equal length L, one per server)."""
    L = len(servers[0])
    cols = [[s[j] for s in servers] for j in range(L)]
    per_col = chunks(n, L)
    if op == "allReduce":
        return (parallel([flat("reduceScatter", intra, s, n) for s in servers])
                + parallel([flat("allReduce", inter, c, per_col[j]) for j, c in enumerate(cols)])
                + parallel([flat("allGather", intra, s, n) for s in servers]))
    if op == "reduceScatter":
        return (parallel([flat("reduceScatter", intra, s, n) for s in servers])
                + parallel([flat("reduceScatter", inter, c, per_col[j]) for j, c in enumerate(cols)]))
    if op == "allGather":
        return (parallel([flat("allGather", inter, c, per_col[j]) for j, c in enumerate(cols)])
                + parallel([flat("allGather", intra, s, n) for s in servers]))
    if op == "broadcast":
        where = next((si, s.index(root)) for si, s in enumerate(servers) if root in s)
        col = cols[where[1]]
        return (flat("broadcast", inter, col, n, root=where[0])
                + parallel([flat("broadcast", intra, s, n, root=where[1]) for s in servers]))
    raise ValueError(f"no hierarchical schedule for {op!r}")


def schedule(op: str, alg: str, members: int, n: int, root: int = 0, servers: Sequence[Sequence[int]] = (),
             intra: str = MESH) -> Schedule:
    """The steps of one piece of `op` (n bytes) over `members` ranks with a resolved algorithm."""
    if op == "send":
        return [_step([(0, 1, n)])]
    if alg == HIERARCHICAL:
        inter = HD if is_pow2(len(servers)) else RING
        return hierarchical(op, servers, n, intra, inter, root)
    return flat(op, alg, list(range(members)), n, root)


def resolve(op: str, asked: str, servers: Sequence[Sequence[int]], intra_link: str) -> str:
    """The algorithm that actually runs when `asked` (maybe "auto") is requested for `op`.

    Requests that do not apply fall back, and the fallback is what the ground truth reports:
    alltoall runs mesh or pairwise; pairwise for other ops means ring; hierarchical needs
    servers of equal size (else ring) and is the intra-server algorithm on one server;
    hd for reduce-scatter, allgather and broadcast needs a power-of-two rank count (else ring).
    """
    if op == "send":
        return P2P
    alg = choose(op, servers, intra_link) if asked == AUTO else asked
    p = sum(len(s) for s in servers)
    if op == "alltoall":
        return MESH if alg == MESH else PAIRWISE
    if alg == PAIRWISE:
        return RING
    if alg == HIERARCHICAL:
        if len({len(s) for s in servers}) > 1:
            return RING
        if len(servers) == 1:
            return MESH if intra_link == "hccs" else RING
    if alg == HD and op != "allReduce" and not is_pow2(p):
        return RING
    return alg


def choose(op: str, servers: Sequence[Sequence[int]], intra_link: str) -> str:
    """The automatic algorithm, HCCL-style, from where the members sit.

    Rule (DEFAULT; HCCL's real choice also weighs message size and CANN version):
    - one server: HCCS full mesh -> mesh; PCIe through the host switch -> ring (a mesh would
      push p-1 sends through each card's one PCIe link);
    - several servers with the same number (> 1) of members each -> hierarchical, whose
      inter-server phase is hd for a power-of-two server count, else ring;
    - one member per server: hd for a power-of-two count, else ring;
    - uneven servers -> ring over all members.
    alltoall: mesh on one HCCS server, pairwise otherwise.
    """
    intra = MESH if intra_link == "hccs" else RING
    sizes = {len(s) for s in servers}
    if op == "alltoall":
        return MESH if len(servers) == 1 and intra == MESH else PAIRWISE
    if len(servers) == 1:
        return intra
    if len(sizes) == 1 and sizes.pop() > 1:
        return HIERARCHICAL
    if len(servers) == sum(len(s) for s in servers):
        return HD if is_pow2(len(servers)) else RING
    return RING
