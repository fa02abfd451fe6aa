"""analyzers: pure functions of the trace table that find where time and memory go.

    from analyzers import run
    result = run(trace)            # every registered analyzer
    for f in result.ranked(): print(f.severity, f.title, f.message, f.lookup.remedy)
"""

from analyzers.finding import (
    REGISTRY,
    AnalysisResult,
    Finding,
    LookupEntry,
    Severity,
    Skipped,
    lookup,
    lookup_table,
    run,
)
from analyzers.frames import Frames

__all__ = ["REGISTRY", "AnalysisResult", "Finding", "Frames", "LookupEntry", "Severity", "Skipped", "lookup",
           "lookup_table", "run"]
