"""The one severity rule: a finding's severity follows its cost as a share of the run.

| cost share of the run | severity |
|---|---|
| >= 10% | critical |
| >= 3%  | warning  |
| below  | info     |

What the share is of, by what the finding costs (`Finding.cost_unit`):

| cost | share of | when the trace does not tell it |
|---|---|---|
| time (`lost_ns`) | the device's step time (the rank's span for QUEUE_CONGESTION's blocked launches and SLOW_RANK's caused waits) | - |
| memory (`lost_bytes`) | the device's memory capacity: the emulator's preset (`hbm_bytes`), Kineto's `deviceProperties` (`totalGlobalMem`) | the run's peak device memory (reserved, used or live, the largest), the least the device holds: the share is then an upper bound, so at most a warning (`UNKNOWN_CAPACITY`) |
| memory the trace does not show (an allocation failed, the free memory it could have used is not recorded) | - | a warning: the failure is the evidence, its size is unknown (`UNKNOWN_COST`) |

A finding whose cause the trace cannot name (unexplained) is at most a warning, and a
measurement that no single fix recovers (device idle while a collective runs: exposed
communication, whose recoverable part SLOW_RANK / SLOW_LINK / BANDWIDTH_CONTENTION report with
their cause) stays information: `CEILING` lists these codes and their highest severity.

What a time cost is drawn from (`COST_OF`), so that no nanosecond is counted twice and the costs
of a run never add up to more than its idle, blocked and busy time:

| budget | codes | what the cost is |
|---|---|---|
| `idle` | BUBBLE_*, LAUNCH_BOUND | a device's kernel-idle time, each nanosecond one cause (analyzers.causality.attribution) |
| `blocked` | QUEUE_CONGESTION | host time blocked in launches at a full stream queue (the device was busy) |
| `busy` | CORE_CONTENTION, UNDER_OCCUPANCY | latency while the device computes: tasks waiting for cores, cores a kernel left unused |
| a cause of `idle` | SLOW_RANK, LOW_OVERLAP, SLOW_LINK, PIPELINE_BUBBLE (collective), BANDWIDTH_CONTENTION (copy, collective, unexplained, and fill / drain: a slowed copy before the first kernel) | a finer reason for part of that cause's idle: an "of which" of the BUBBLE_ finding of the cause, never added to it |

SYNC_STALL carries no cost (its device idle is BUBBLE_SYNC's); memory findings cost bytes.
"""

from __future__ import annotations

from analyzers.finding import Severity

CRITICAL_SHARE = 0.10
WARNING_SHARE = 0.03

#: Codes whose severity is capped, and the cap.
CEILING: dict[str, Severity] = {
    "BUBBLE_OTHER": Severity.WARNING,
    "BUBBLE_COLLECTIVE": Severity.INFO,
}


def severity(share: float, code: str = "") -> Severity:
    """The severity of a finding costing `share` of the run (0..1)."""
    sev = (Severity.CRITICAL if share >= CRITICAL_SHARE else Severity.WARNING if share >= WARNING_SHARE
           else Severity.INFO)
    cap = CEILING.get(code)
    return min(sev, cap) if cap is not None else sev


#: Per code that costs time, what its cost is part of (see the table above): "idle", "blocked",
#: "busy", or the attribution causes whose idle holds it (an "of which", never added).
COST_OF: dict[str, str | tuple[str, ...]] = {
    **{code: "idle" for code in ("BUBBLE_HOST_LAUNCH", "BUBBLE_SYNC", "BUBBLE_BLOCKING_COPY", "BUBBLE_OP_COMPILE",
                                 "BUBBLE_DATA", "BUBBLE_HOST_IDLE", "BUBBLE_COPY", "BUBBLE_EVENT",
                                 "BUBBLE_COLLECTIVE", "BUBBLE_OTHER", "LAUNCH_BOUND")},
    "QUEUE_CONGESTION": "blocked",
    "CORE_CONTENTION": "busy",
    "UNDER_OCCUPANCY": "busy",
    "SLOW_RANK": ("collective",),
    "LOW_OVERLAP": ("collective",),
    "SLOW_LINK": ("collective",),
    "PIPELINE_BUBBLE": ("collective",),
    "BANDWIDTH_CONTENTION": ("copy", "collective", "unexplained", "fill", "drain"),
}


def adds_up(code: str) -> bool:
    """Whether a finding of `code`'s time cost adds to the run's total (False: it is part of
    another's, see COST_OF)."""
    return isinstance(COST_OF.get(code, "idle"), str)


#: A memory finding's severity when the trace states no capacity (its share is of the run's peak).
UNKNOWN_CAPACITY = Severity.WARNING
#: A memory finding's severity when the trace does not show the bytes it costs.
UNKNOWN_COST = Severity.WARNING


def memory_severity(lost_bytes: float | None, capacity: float | None, peak: float | None,
                    code: str = "") -> tuple[Severity, float | None]:
    """The severity of a finding costing `lost_bytes` of device memory, and its share: of the
    device's `capacity` when the trace states it; otherwise of the run's `peak` device memory,
    at most `UNKNOWN_CAPACITY`. Without a cost (None) or anything to share it of: `UNKNOWN_COST`
    and no share."""
    if lost_bytes is not None and lost_bytes <= 0:
        return severity(0.0, code), 0.0
    if lost_bytes is not None and capacity:
        share = float(lost_bytes) / float(capacity)
        return severity(share, code), share
    if lost_bytes is not None and peak:
        share = float(lost_bytes) / float(peak)
        return min(severity(share, code), UNKNOWN_CAPACITY), share
    return min(UNKNOWN_COST, CEILING.get(code, UNKNOWN_COST)), None
