"""The one severity rule: a finding's severity follows its cost as a share of the run.

| cost share of the run (time: of the device's step time; memory: of device memory) | severity |
|---|---|
| >= 10% | critical |
| >= 3%  | warning  |
| below  | info     |

A finding whose cause the trace cannot name (unexplained) is at most a warning, and a
measurement that no single fix recovers (device idle while a collective runs: exposed
communication, whose recoverable part SLOW_RANK / SLOW_LINK / BANDWIDTH_CONTENTION report with
their cause) stays information: `CEILING` lists these codes and their highest severity.
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
