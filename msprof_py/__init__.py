"""msprof-py: profiling and trace analysis for AI-accelerator runtimes.

    with msprof_py.profile(output="profiling", schedule=msprof_py.schedule(wait=1, active=3)) as prof:
        ...
        prof.step()

    con = msprof_py.sql("trace_dir")   # DuckDB views over a trace (see msprof_py.sql)
    new = msprof_py.replay("trace_dir", remedies=["launch", "sync"])   # the trace re-timed (a Trace)
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["profile", "replay", "schedule", "sql"]


def replay(trace: Any, remedies: Any = ()) -> Any:
    """The trace re-timed through its dependency graph with `remedies` applied (each a Remedy or
    its text, `NAME[=NS][@RANK,...]`, as `msprof-py replay --remedy` takes it): a Trace like any
    other, its span before and after on `.meta.extra["replay"]`. `trace` is a Trace or a path
    (any format `msprof-py` reads)."""
    from analyzers import Frames
    from analyzers.causality.replay import Remedy
    from analyzers.causality.replay import replay as _replay
    from msprof_py.trace.schema import Trace

    if not isinstance(trace, Trace):
        from msprof_py import loading

        trace = loading.load_any(trace)
    parsed = [r if isinstance(r, Remedy) else Remedy.parse(str(r)) for r in remedies]
    result = _replay(Frames(trace), parsed)
    extra = {**(result.trace.meta.extra or {}), "replay": {
        "remedies": [str(r) for r in parsed], "span_ns": result.span_ns, "new_span_ns": result.new_span_ns,
        "saving_ns": result.saving_ns}}
    import dataclasses

    return Trace(result.trace.table, dataclasses.replace(result.trace.meta, extra=extra))


def __getattr__(name: str) -> Any:
    # Lazy: `import msprof_py` stays cheap for the CLI and the capture agent.
    if name in ("profile", "schedule"):
        from msprof_py import profiler

        return getattr(profiler, name)
    if name == "sql":
        # The module, which is callable: msprof_py.sql(trace, query=None) (DuckDB loads on first use).
        import msprof_py.sql

        return msprof_py.sql
    raise AttributeError(f"module 'msprof_py' has no attribute {name!r}")
