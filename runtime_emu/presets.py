"""Device presets: core counts, memory, bandwidths, queue depth, host overheads.

Figures marked "doc" are from the CANN / Ascend documentation summarised in DOMAIN.md §1;
every other figure is a DEFAULT chosen to be plausible, not a measured fact. Override any of
them with `dataclasses.replace(preset, ...)` or `Preset.with_(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Preset:
    name: str
    cube_cores: int  # AI Cores (Cube)
    vector_cores: int  # Vector cores
    hbm_bytes: int
    hbm_gbps: float  # device memory bandwidth, GB/s (1e9 B/s)
    pcie_gbps: float  # per direction
    huge_page_bytes: int  # share of device memory served as 2 MiB huge pages
    queue_depth: int = 2048  # doc (910B): hardware queue entries per stream
    queue_tasks: int = 2013  # doc (910B): tasks a stream can hold before launch blocks
    launch_overhead_ns: int = 5_000  # DEFAULT: host cost of one task-launching API call
    api_overhead_ns: int = 1_000  # DEFAULT: host cost of other runtime calls
    sync_overhead_ns: int = 2_000  # DEFAULT: host cost of returning from a synchronize
    dispatch_latency_ns: int = 1_000  # DEFAULT: launch reaching the device queue
    copy_latency_ns: int = 2_000  # DEFAULT: fixed cost of one DMA copy
    memset_gbps: float = 0.0  # 0: memset runs at HBM bandwidth
    extra: dict = field(default_factory=dict, compare=False)

    def with_(self, **changes) -> "Preset":
        return replace(self, **changes)


PRESETS: dict[str, Preset] = {
    # 910B1/B2: 24 Cube + 48 Vector (doc). HBM 64 GiB and ~1.6 TB/s, PCIe Gen5 x16 ~25 GB/s
    # per direction: DEFAULTS from DOMAIN.md's "defaults to calibrate".
    "910B2": Preset("910B2", cube_cores=24, vector_cores=48, hbm_bytes=64 * GiB, hbm_gbps=1600.0,
                    pcie_gbps=25.0, huge_page_bytes=32 * GiB),
    # 910B3/B4: 20 Cube + 40 Vector (doc).
    "910B3": Preset("910B3", cube_cores=20, vector_cores=40, hbm_bytes=64 * GiB, hbm_gbps=1600.0,
                    pcie_gbps=25.0, huge_page_bytes=32 * GiB),
    # 310P3: 8 + 7 (doc). 24 GiB LPDDR at ~204.8 GB/s, PCIe Gen4 ~25 GB/s, queue depth as 910B:
    # DEFAULTS.
    "310P3": Preset("310P3", cube_cores=8, vector_cores=7, hbm_bytes=24 * GiB, hbm_gbps=204.8,
                    pcie_gbps=25.0, huge_page_bytes=12 * GiB),
}
DEFAULT_PRESET = "910B3"


def preset(name_or_preset: "str | Preset") -> Preset:
    if isinstance(name_or_preset, Preset):
        return name_or_preset
    try:
        return PRESETS[name_or_preset]
    except KeyError:
        raise ValueError(f"unknown device preset {name_or_preset!r}; choose one of {', '.join(PRESETS)}") from None
