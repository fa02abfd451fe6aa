"""One causal model of time: the dependency graph of a trace (`graph`) and the conserved
attribution of every idle nanosecond to one cause (`attribution`). Time findings are views of it."""

from analyzers.causality.attribution import (
    ATTRIBUTION_COLUMNS,
    CAUSE_LABELS,
    CAUSES,
    EDGE_CAUSES,
    HOST_CAUSES,
    attribution,
    device_windows,
    idle_by_rank,
)

__all__ = ["ATTRIBUTION_COLUMNS", "CAUSES", "CAUSE_LABELS", "EDGE_CAUSES", "HOST_CAUSES", "attribution",
           "device_windows", "idle_by_rank"]
