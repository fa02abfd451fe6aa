"""Numbers as people read them: 3 significant digits, one unit per quantity.

Text output (tables, finding messages, Markdown / HTML reports) shows time in ms and memory
in MiB, rounded to 3 significant digits; JSON and CSV keep full precision and never go
through here. Every module that prints a number for people uses these, so one output never
mixes ms with us or MB with MiB.

A time stamp is a place on the timeline, not an amount: `ms_at` keeps it to the microsecond
(still in ms), since 3 significant digits of 41,656.770 ms would point 43 ms away from it.
"""

from __future__ import annotations

import math

MiB = 1 << 20
NS_PER_MS = 1_000_000
SIGNIFICANT = 3


def sig(value: float, digits: int = SIGNIFICANT) -> str:
    """`value` to `digits` significant digits, without an exponent, thousands separated:
    146589.2 -> '147,000'; 13.964 -> '14.0'; 0.00725 -> '0.00725'; 4284415.999999998 -> '4,280,000'."""
    if value is None or isinstance(value, bool):
        return "-"
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, decimals)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) != math.floor(math.log10(abs(value))):
        decimals -= 1  # 9.996 rounds up to 10.0: one decimal fewer keeps 3 digits, '10.0'
        rounded = round(value, decimals)
    return f"{rounded:,.{max(decimals, 0)}f}"


def ms(ns: float | None) -> str:
    """A duration given in ns, in ms: 146589200 -> '147 ms'."""
    return "-" if ns is None else f"{sig(ns / NS_PER_MS)} ms"


def mib(n_bytes: float | None) -> str:
    """A size given in bytes, in MiB: 3211776 -> '3.06 MiB'."""
    return "-" if n_bytes is None else f"{sig(n_bytes / MiB)} MiB"


def pct(ratio: float | None, *, signed: bool = False) -> str:
    """A ratio as a percentage: 0.7134 -> '71.3%'; a change with `signed`: 1.1389 -> '+114%',
    -0.0821 -> '-8.21%', 0 -> '0%'."""
    if ratio is None:
        return "-"
    text = f"{sig(100 * ratio)}%"
    return f"+{text}" if signed and ratio > 0 else text


def ms_at(ns: float | None) -> str:
    """A time stamp given in ns, in ms to the microsecond: 41656770 -> '41.657 ms'."""
    return "-" if ns is None else f"{ns / NS_PER_MS:,.3f} ms"
