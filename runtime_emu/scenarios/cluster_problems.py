"""Problem switches of multi-rank jobs: the catalogue, and the code that injects and reports each.

As in `problems`, an injector acts the way the real fault would (one NPU runs slower, a link
trains down, a prefetch shares the links the collectives cross) and records where, when and
what an analyzer should measure. What the collectives actually did is known only once the job
has run, so the reports resolve it from HCCL's matched collectives (`rt.hccl.collectives`):
arrival per member (the Notify_Wait a rank spends waiting for the others), transfer start and
end. Factors marked DEFAULT are plausible choices, not measurements.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from runtime_emu.device import KERNEL, Stream
from runtime_emu.presets import MiB, Preset
from runtime_emu.runtime import MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.problems import SWITCHES, Injector, cost_dict, device_span_ns, kernel_idle_ns
from runtime_emu.scenarios.scenario import Config, TaskIndex, task_dict, where
from runtime_emu.topology import Topology

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

#: The problems the data-parallel training scenarios inject.
DATA_PARALLEL_SWITCHES: dict[str, str] = {
    "slow-rank": "one rank's kernels run longer (a throttled or lower-clocked NPU): the other ranks wait for it "
                 "in every collective (Notify_Wait)",
    "slow-link": "one link at a quarter of its bandwidth (an HCCS link, a PCIe link trained down, a RoCE NIC): "
                 "every collective crossing it is slower",
    "bandwidth-contention": "H2D prefetch copies on the PCIe links the collectives also cross, started with the "
                            "first gradient bucket: both run slower",
    "no-overlap": "gradients reduced only after the whole backward (no bucketing under compute): every "
                  "bucket's collective waits for the last backward kernel and the device idles through them",
    "leak": SWITCHES["leak"] + " (on one rank)",
}
#: Every multi-rank problem: the data-parallel ones and the pipeline's.
MULTI_RANK_SWITCHES: dict[str, str] = {
    **DATA_PARALLEL_SWITCHES,
    "pipeline-bubble": "the batch in as many micro-batches as the pipeline has stages: each stage idles "
                       "(P - 1) / (2 P - 1) of the step while the pipeline fills and drains",
}

SLOW_RANK_FACTOR = 1.4  # DEFAULT: a throttled NPU (thermal / power capping), kernels 40% longer
SLOW_LINK_FRACTION = 0.25  # DEFAULT: e.g. a PCIe x16 link trained down to x4, a NIC at 50 GbE of 200
PREFETCH_CHUNK_BYTES = 32 * MiB  # DEFAULT: host-offloaded optimizer state is swapped in in chunks of this size


def slow_links(topo: Topology, preset: Preset) -> tuple[tuple[int, ...], dict[str, float]]:
    """The link the slow-link switch degrades in `topo`: (ranks it attaches, {link name: GB/s}).

    Several servers: the RoCE NIC (both directions) of the first rank of server 1. One HCCS
    server: the HCCS link between two ranks half the server apart, both directions. One PCIe
    server: one card's PCIe link, both directions.
    """
    n = topo.devices_per_server
    if topo.servers > 1:
        r = n
        return (r,), {f"r{r}.roce_tx": topo.roce_gbps * SLOW_LINK_FRACTION,
                      f"r{r}.roce_rx": topo.roce_gbps * SLOW_LINK_FRACTION}
    a, b = n // 4, n // 4 + n // 2
    if topo.intra == "hccs":
        return (a, b), {f"r{a}->r{b}.hccs": topo.hccs_gbps * SLOW_LINK_FRACTION,
                        f"r{b}->r{a}.hccs": topo.hccs_gbps * SLOW_LINK_FRACTION}
    dev = f"r{a}.d{topo.local_of(a)}"
    return (a,), {f"{dev}.pcie_h2d": preset.pcie_gbps * SLOW_LINK_FRACTION,
                  f"{dev}.pcie_d2h": preset.pcie_gbps * SLOW_LINK_FRACTION}


def nominal_gbps(topo: Topology, preset: Preset, link: str) -> float:
    return topo.roce_gbps if ".roce_" in link else topo.hccs_gbps if link.endswith(".hccs") else preset.pcie_gbps


def degrade(topo: Topology, cfg: Config) -> Topology:
    """`topo` with the slow-link switch's link degraded, when the switch is on."""
    if cfg.on("slow-link"):
        topo.overrides.update(slow_links(topo, cfg.preset)[1])
    return topo


class ClusterProblems:
    """The multi-rank switches of one job, shared by every rank's program."""

    def __init__(self, rt: "Runtime", cfg: Config, call_site: str, prefetch_bytes: int,
                 chunk_bytes: int) -> None:
        self.rt, self.cfg, self.log = rt, cfg, cfg.problems
        self.call_site = call_site  # prefix of the call sites the reports name ("bert.train_step")
        self.chunk = chunk_bytes  # bytes per prefetch copy
        self.copies = max(1, prefetch_bytes // chunk_bytes)  # prefetch copies per step and rank
        self.target = cfg["problem_rank"]  # the rank slow-rank and leak act on
        self._slowed: list[int] = []  # corr of the slow rank's kernels
        self._prefetch: dict[int, tuple[Stream, int, int]] = {}  # rank -> (stream, host buffer, device buffer)
        self._copies: dict[int, list[int]] = {}  # rank -> corr of its prefetch copies
        self._deferred: dict[int, list[list[int]]] = {}  # rank -> per step, corr of its deferred collectives
        assert rt.topology is not None, "cluster problems act on a multi-rank topology"
        self.link_ranks, self.links = slow_links(rt.topology, cfg.preset)

    def start(self, compute: Stream, comm: Stream) -> None:
        """Record the problems that act on this rank; call once per rank once its streams exist."""
        rank = compute.device.rank
        if self.on("slow-rank") and rank == self.target:
            self.report_slow_rank(compute, comm)
        if self.on("slow-link") and rank == self.link_ranks[0]:
            self.report_slow_link(comm)
        if self.on("no-overlap"):
            self.report_no_overlap(compute, comm)

    def on(self, switch: str) -> bool:
        return self.cfg.on(switch)

    def injector(self, rank: int) -> Injector:
        """The single-rank injector for `rank`: leak acts on the target rank only."""
        if rank == self.target or not self.on("leak"):
            return Injector(self.rt, self.cfg)
        return Injector(self.rt, replace(self.cfg, switches=self.cfg.switches - {"leak"}))

    # ------------------------------------------------------------------ slow rank
    def compute_factor(self, rank: int) -> float:
        return SLOW_RANK_FACTOR if self.on("slow-rank") and rank == self.target else 1.0

    def slowed(self, corr: int) -> None:
        """Note one of the slow rank's kernels (the report's `when` spans them)."""
        self._slowed.append(corr)

    def report_slow_rank(self, compute: Stream, comm: Stream) -> None:
        rank = compute.device.rank

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            colls = [c for c in self.rt.hccl.collectives if rank in c.index]
            own: list[int] = []
            others: list[int] = []
            for c in colls:
                for m, r in enumerate(c.members):
                    (own if r == rank else others).append(c.start_ns - c.arrive_ns[m])
            kernel_ns: dict[int, int] = {}
            for t in tasks.by_corr.values():
                if t.kind == KERNEL:
                    kernel_ns[t.rank] = kernel_ns.get(t.rank, 0) + t.end_ns - t.start_ns
            vals = list(kernel_ns.values())
            first, last = tasks[self._slowed[0]], tasks[self._slowed[-1]]
            return {"when": {"start_ns": first.start_ns, "end_ns": last.end_ns},
                    "expected": {"slow_rank": rank, "compute_factor": SLOW_RANK_FACTOR,
                                 "collectives": len(colls), "comm_stream": comm.id,
                                 "waiting_ranks": sorted({r for c in colls for r in c.members} - {rank}),
                                 "slow_rank_max_wait_ns": max(own), "others_mean_wait_ns": sum(others) // len(others),
                                 "kernel_ns": {str(r): ns for r, ns in sorted(kernel_ns.items())},
                                 "compute_spread": round((max(vals) - min(vals)) * len(vals) / sum(vals), 4)}}

        self.log.add("slow-rank", where=where(compute, call_site=f"{self.call_site}:compute"), resolve=resolve,
                     detail=f"rank {rank}'s kernels take {SLOW_RANK_FACTOR}x as long (a throttled NPU); the other "
                            "ranks reach every collective first and wait for it in Notify_Wait")

    # ------------------------------------------------------------------ slow link
    def report_slow_link(self, comm: Stream) -> None:
        """Record the degraded link (`degrade` put it in the topology)."""
        ranks, links = self.link_ranks, self.links
        assert self.rt.topology is not None, "cluster problems act on a multi-rank topology"
        nominal = nominal_gbps(self.rt.topology, self.cfg.preset, next(iter(links)))

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            colls = [c for c in self.rt.hccl.collectives if all(r in c.index for r in ranks)]
            durs = [c.end_ns - c.start_ns for c in colls]
            link_bytes = self.rt.hccl.link_bytes
            return {"when": {"start_ns": min(c.start_ns for c in colls), "end_ns": max(c.end_ns for c in colls)},
                    "expected": {"links": sorted(links), "gbps": next(iter(links.values())), "nominal_gbps": nominal,
                                 "link_ranks": list(ranks), "collectives": len(colls),
                                 "link_bytes": {name: link_bytes.get(name, 0) for name in sorted(links)},
                                 "mean_collective_ns": sum(durs) // len(durs), "max_collective_ns": max(durs)}}

        self.log.add("slow-link", where=where(comm, links=sorted(links)), resolve=resolve,
                     detail=f"{' and '.join(sorted(links))} run at {SLOW_LINK_FRACTION:.0%} of {nominal:g} GB/s; "
                            "every collective step that sends across them waits for the slowest send")

    # ------------------------------------------------------------------ no overlap
    def deferred(self, rank: int, corrs: list[int]) -> None:
        """Note one step's collectives that waited for the whole backward (the last bucket's excluded:
        it follows the backward's last kernel with overlap too)."""
        self._deferred.setdefault(rank, []).append(corrs)

    def report_no_overlap(self, compute: Stream, comm: Stream) -> None:
        rank, dev = compute.device.rank, compute.device.id

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            steps = [[tasks[c] for c in corrs] for corrs in self._deferred.get(rank, [])]
            first, last = steps[0][0], steps[-1][-1]
            # The device's idle while the deferred collectives ran: what overlapping them under the
            # backward recovers at most (the last layer's bucket stays partly exposed even then).
            idle = sum(kernel_idle_ns(tasks, rank, dev, s[0].start_ns, s[-1].end_ns) for s in steps)
            return {"when": {"start_ns": first.start_ns, "end_ns": last.end_ns},
                    "expected": {"collectives_per_step": len(steps[0]), "steps": len(steps), "comm_stream": comm.id,
                                 "deferred_ns": sum(s[-1].end_ns - s[0].start_ns for s in steps),
                                 "first_deferred": task_dict(first),
                                 "cost": cost_dict(ns=idle, span_ns=device_span_ns(tasks, rank, dev))}}

        self.log.add("no-overlap", where=where(comm, call_site=f"{self.call_site}:reduce"), resolve=resolve,
                     detail=f"rank {rank} reduces every gradient bucket on stream {comm.id} only after the whole "
                            "backward: the collectives run with no compute alongside")

    # ------------------------------------------------------------------ bandwidth contention
    def prefetch(self, after: Any, device_stream: Stream) -> None:
        """Start this step's H2D prefetch copies on a side stream once `after` (an event) is reached."""
        if not self.on("bandwidth-contention"):
            return
        rt = self.rt
        rank = device_stream.device.rank
        if rank not in self._prefetch:
            nbytes = self.copies * self.chunk
            self._prefetch[rank] = (rt.create_stream(), rt.malloc_host(nbytes), rt.malloc(nbytes))
            self._copies[rank] = []
            self._report_contention(self._prefetch[rank][0], device_stream)
        stream, host, dev = self._prefetch[rank]
        rt.stream_wait_event(stream, after)
        for k in range(self.copies):
            off = k * self.chunk
            self._copies[rank].append(rt.memcpy_async(dev + off, self.chunk, host + off,
                                                      self.chunk, MEMCPY_HOST_TO_DEVICE, stream))

    def close(self, rank: int) -> None:
        if rank in self._prefetch:
            _, host, dev = self._prefetch[rank]
            self.rt.free(dev)
            self.rt.free_host(host)

    def _report_contention(self, stream: Stream, comm: Stream) -> None:
        rank = stream.device.rank
        dev = stream.device
        link = f"r{rank}.d{dev.id}.pcie_h2d"
        preset = self.cfg.preset
        alone = preset.copy_latency_ns + round(self.chunk / preset.pcie_gbps)

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            copies = [tasks[c] for c in self._copies[rank]]
            colls = [c for c in self.rt.hccl.collectives if rank in c.index]
            hit = [c for c in colls if any(p.start_ns < c.end_ns and c.start_ns < p.end_ns for p in copies)]
            spans = [(max(p.start_ns, c.start_ns), min(p.end_ns, c.end_ns)) for c in hit for p in copies
                     if p.start_ns < c.end_ns and c.start_ns < p.end_ns]
            when = ({"start_ns": min(s for s, _ in spans), "end_ns": max(e for _, e in spans)} if spans
                    else {"start_ns": copies[0].start_ns, "end_ns": copies[-1].end_ns})
            durs = [p.end_ns - p.start_ns for p in copies]
            # What the run would get back: the copies' overhang past their alone time during
            # which the cores had no kernel to run (they waited for the collectives the copies slowed).
            lost = sum(kernel_idle_ns(tasks, rank, dev.id, p.start_ns + alone, p.end_ns) for p in copies) if hit else 0
            return {"when": when,
                    "expected": {"link": link, "copy_bytes": self.chunk, "copies": len(copies),
                                 "alone_ns": alone, "mean_copy_ns": sum(durs) // len(durs),
                                 "copy_gbps": round(self.chunk * len(durs) / sum(durs), 3),
                                 "pcie_gbps": preset.pcie_gbps, "comm_stream": comm.id,
                                 "collectives_overlapped": [
                                     {"seq": c.seq_label, "op": c.op, "bytes": c.nbytes, "start_ns": c.start_ns,
                                      "end_ns": c.end_ns} for c in hit],
                                 "first_copy": task_dict(copies[0]), "manifested": bool(hit),
                                 "cost": cost_dict(ns=lost, span_ns=device_span_ns(tasks, rank, dev.id))}}

        self.log.add("bandwidth-contention", where=where(stream, link=link), resolve=resolve,
                     detail=f"{self.copies} x {self.chunk >> 20} MiB H2D prefetch copies per step on "
                            f"stream {stream.id} share {link} with the collectives on stream {comm.id}")
