"""Slow links: an interconnect link that never reaches its nominal bandwidth."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from analyzers.causality import idle_by_rank
from analyzers.comm_links import one_series, window
from analyzers.finding import Finding, Skipped, register
from analyzers.frames import Frames
from analyzers.severity import severity
from msprof_py.trace.units import ms, pct, sig

_LINK = re.compile(r"^r(?P<rank>\d+)(?:\.d\d+)?(?:->r(?P<peer>\d+))?\.(?P<type>hccs|roce_tx|roce_rx|pcie_h2d|pcie_d2h|hbm) GB/s$")


@dataclass
class LinkConfig:
    slow_ratio: float = 0.5  # the best rate a link reached, as a share of its nominal bandwidth
    min_busy_ns: int = 20_000  # ignore links that carried almost nothing


@register("links", LinkConfig)
def analyze(frames: Frames, cfg: LinkConfig):
    """Slow link.

    Pattern: one interconnect link (HCCS, RoCE, PCIe) carries traffic but never reaches its
    nominal bandwidth, so every transfer or collective step crossing it is slow.

    Algorithm: the per-link "GB/s in use" counters (recorded by the emulator; msprof's
    hardware-bandwidth counters play the same role) give each link's best rate while busy and
    its busy time. Nominal bandwidth per link type comes from the topology and device preset
    in the trace metadata (a specification, not a measurement). A link whose best rate stays
    under `slow_ratio` x nominal although it was busy for `min_busy_ns` is slow. What running
    it at nominal would recover is a view of the causal attribution: the rank's device idle
    while its collectives moved data after every rank arrived (the exposed transfer; transfers
    hidden under compute cost nothing), times (1 - best / nominal), and never more than the
    link's busy time times the same. That cost is part of the rank's BUBBLE_COLLECTIVE
    (analyzers.severity.COST_OF); its share of the rank's step time sets the severity by the one
    rule (analyzers.severity).
    """
    return reduce([summarize(frames)], cfg)


_NO_COUNTERS = "no link bandwidth counters in the trace (record with --sys-hardware-mem=on)"


def summarize(frames: Frames) -> dict:
    """Per link counter of some ranks (one partition or the whole trace): its best rate, busy time,
    nominal bandwidth and first and last sample, as (counter name, row) pairs in name order, and
    whether the ranks had link counters at all. `reduce` groups the slow links of all partitions."""
    c = frames.counters
    rows = c[c["name"].astype(str).str.endswith(" GB/s")] if not c.empty else c
    # Every partition gives its ranks' idle: a link's counters may sit in another rank's partition.
    idle = {rank: {"transfer_ns": r["transfer_ns"], "step_ns": r["step_ns"]} for rank, r in idle_by_rank(frames).items()}
    if rows.empty:
        return {"counters": False, "links": [], "idle": idle}
    names = rows["name"].astype(str)
    extra = frames.trace.meta.extra
    topo, preset = extra.get("topology") or {}, extra.get("preset") or {}
    nominal = {"hccs": topo.get("hccs_gbps"), "roce_tx": topo.get("roce_gbps"), "roce_rx": topo.get("roce_gbps"),
               "pcie_h2d": preset.get("pcie_gbps"), "pcie_d2h": preset.get("pcie_gbps"), "hbm": preset.get("hbm_gbps")}
    links = []
    for name, g in rows.groupby(names, sort=True):
        m = _LINK.match(name)
        if not m or not nominal.get(m["type"]):
            continue
        series = one_series(g["ts"].to_numpy(np.int64), g["value"].to_numpy(dtype=np.float64))
        ts, val = series[0], series[1]
        # The bytes and busy time communication_matrix.json's links of this counter sum to (one integration).
        nbytes, busy = window(series, int(ts[0]), int(ts[-1]))
        links.append((name, {"link": name[:-5], "rank": int(m["rank"]), "best": float(val.max()),
                             "nominal": float(nominal[m["type"]]), "busy": float(busy), "bytes": int(nbytes),
                             "t0": int(ts[0]), "t1": int(ts[-1])}))
    return {"counters": True, "links": links, "idle": idle}


def reduce(summaries: list[dict], cfg: LinkConfig):
    """The slow-link findings and metrics from the `summarize` outputs of all partitions."""
    if not any(s["counters"] for s in summaries):
        raise Skipped(_NO_COUNTERS)
    metrics, slow = [], []
    for _name, link in sorted((x for s in summaries for x in s["links"]), key=lambda x: x[0]):
        best, nom, busy = link["best"], link["nominal"], link["busy"]
        metrics.append({"link": link["link"], "best_gbps": round(best, 4), "nominal_gbps": nom, "busy_ns": int(busy),
                        "bytes": link["bytes"]})
        if busy >= cfg.min_busy_ns and best < cfg.slow_ratio * nom:
            slow.append(link)
    # Links capped at the same rate are one fault seen from both ends (a flow crossing a slow link
    # runs at its rate on every other link of its path): report them together as suspects.
    idle = {rank: r for s in summaries for rank, r in s.get("idle", {}).items()}
    findings = []
    groups: dict = {}
    for link in slow:
        groups.setdefault((round(link["best"], 3), link["nominal"]), []).append(link)
    for (best, nom), links in groups.items():
        busy = max(link["busy"] for link in links)
        names_ = ", ".join(link["link"] for link in links)
        slower = 1 - best / nom
        exposed = max(idle.get(link["rank"], {}).get("transfer_ns", 0) for link in links)
        lost = int(min(busy, exposed) * slower)
        step_ns = max(max(idle.get(link["rank"], {}).get("step_ns", 0) for link in links), 1)
        findings.append(Finding(
            code="SLOW_LINK", severity=severity(lost / step_ns, "SLOW_LINK"),
            title="Slow link" + ("s" if len(links) > 1 else ""),
            message=(f"{names_} never exceeded {sig(best)} GB/s of the nominal {sig(nom)} GB/s over "
                     f"{ms(busy)} of traffic" + (" (one fault seen from both ends of the path)"
                                                           if len(links) > 1 else "")
                     + f", the busiest carrying {sig(max(link['bytes'] for link in links) / 2**20)} MB"
                     + f"; {ms(exposed)} of transfer left the device idle, at nominal {ms(lost)} less "
                       f"({pct(lost / step_ns)} of the step time)"),
            rank=min(link["rank"] for link in links), ts_ns=min(link["t0"] for link in links),
            dur_ns=max(link["t1"] for link in links) - min(link["t0"] for link in links),
            metric="best_over_nominal", value=round(best / nom, 4), threshold=cfg.slow_ratio,
            lost_ns=lost,
            evidence=[{"link": link["link"], "rank": link["rank"], "best_gbps": link["best"], "nominal_gbps": nom,
                       "bytes": link["bytes"], "busy_ns": int(link["busy"]),
                       "gbps": round(link["bytes"] / link["busy"], 4) if link["busy"] else 0.0}
                      for link in links]))
    return findings, {"links": metrics}
