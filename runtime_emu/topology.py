"""Cluster topology: which links a byte crosses between two ranks.

Preset shapes (figures are DEFAULTS to calibrate, from DOMAIN.md §1, not measurements):
- one server of 8 NPUs joined by HCCS in a full mesh (a link per ordered pair, ~28 GB/s, alpha
  ~3 us), each NPU with PCIe to the host (per direction, from the device preset) and a RoCE NIC
  (25 GB/s per direction, alpha ~15 us between servers);
- N such servers joined by RoCE through a non-blocking switch;
- "pcie" servers without HCCS, where card-to-card traffic goes through the host PCIe switch
  (device-to-host link of the sender, host-to-device link of the receiver), as in PCIe-card
  servers: there collectives and host copies share links.
With `roce_over_pcie` the NIC hangs off the card's PCIe link, so inter-server traffic also
crosses PCIe (and contends with H2D/D2H copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simcore.links import Link

if TYPE_CHECKING:
    from runtime_emu.device import Device
    from runtime_emu.runtime import Runtime


@dataclass
class Topology:
    servers: int = 1
    devices_per_server: int = 8
    intra: str = "hccs"  # "hccs" full mesh, or "pcie" through the host switch
    hccs_gbps: float = 28.0
    hccs_latency_ns: int = 3_000
    roce_gbps: float = 25.0
    roce_latency_ns: int = 15_000
    roce_over_pcie: bool = False
    #: Per-link bandwidth overrides by link name (e.g. a slow link), GB/s.
    overrides: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.intra not in ("hccs", "pcie"):
            raise ValueError(f"intra-server interconnect must be 'hccs' or 'pcie', got {self.intra!r}")
        if self.servers < 1 or self.devices_per_server < 1:
            raise ValueError("a topology needs at least one server with one device")
        self._hccs: dict[tuple[int, int], Link] = {}
        self._nic_tx: dict[int, Link] = {}
        self._nic_rx: dict[int, Link] = {}
        self._devices: dict[int, "Device"] = {}

    @property
    def world_size(self) -> int:
        return self.servers * self.devices_per_server

    def server_of(self, rank: int) -> int:
        return rank // self.devices_per_server

    def local_of(self, rank: int) -> int:
        return rank % self.devices_per_server

    def attach(self, rt: "Runtime") -> None:
        """Create the links between the runtime's devices (one device per rank)."""
        for rank in range(self.world_size):
            dev = rt.devices[(rank, self.local_of(rank))]
            self._devices[rank] = dev
            self._nic_tx[rank] = self._link(f"r{rank}.roce_tx", self.roce_gbps, self.roce_latency_ns, rt)
            self._nic_rx[rank] = self._link(f"r{rank}.roce_rx", self.roce_gbps, self.roce_latency_ns, rt)
        if self.intra == "hccs":
            for a in range(self.world_size):
                for b in range(self.world_size):
                    if a != b and self.server_of(a) == self.server_of(b):
                        self._hccs[(a, b)] = self._link(f"r{a}->r{b}.hccs", self.hccs_gbps, self.hccs_latency_ns, rt)
        for dev in self._devices.values():
            for link in (dev.pcie_h2d, dev.pcie_d2h, dev.hbm):
                if link.name in self.overrides:
                    link.bytes_per_ns = self.overrides[link.name]

    def _link(self, name: str, gbps: float, latency_ns: int, rt: "Runtime") -> Link:
        link = Link(name, self.overrides.get(name, gbps), latency_ns)
        link.on_rate = rt.rows.link_rate
        return link

    def path(self, src: int, dst: int) -> tuple[Link, ...]:
        """The links a transfer from rank src to rank dst crosses, in order."""
        if src == dst:
            return (self._devices[src].hbm,)
        a, b = self._devices[src], self._devices[dst]
        if self.server_of(src) == self.server_of(dst):
            if self.intra == "hccs":
                return (self._hccs[(src, dst)],)
            return (a.pcie_d2h, b.pcie_h2d)
        if self.roce_over_pcie:
            return (a.pcie_d2h, self._nic_tx[src], self._nic_rx[dst], b.pcie_h2d)
        return (self._nic_tx[src], self._nic_rx[dst])

    def links(self) -> list[Link]:
        """Every interconnect link (HCCS and RoCE; PCIe and HBM belong to the devices)."""
        return [*self._hccs.values(), *self._nic_tx.values(), *self._nic_rx.values()]

    def describe(self) -> dict:
        return {"servers": self.servers, "devices_per_server": self.devices_per_server, "intra": self.intra,
                "hccs_gbps": self.hccs_gbps, "hccs_latency_ns": self.hccs_latency_ns, "roce_gbps": self.roce_gbps,
                "roce_latency_ns": self.roce_latency_ns,
                "roce_over_pcie": self.roce_over_pcie, "overrides": dict(self.overrides)}


def server(devices: int = 8, **kw) -> Topology:
    """One server of `devices` NPUs joined by HCCS (or `intra="pcie"`)."""
    return Topology(servers=1, devices_per_server=devices, **kw)


def cluster(servers: int, devices_per_server: int = 8, **kw) -> Topology:
    """`servers` servers of NPUs joined by RoCE."""
    return Topology(servers=servers, devices_per_server=devices_per_server, **kw)
