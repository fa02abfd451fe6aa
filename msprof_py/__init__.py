"""msprof-py: profiling and trace analysis for AI-accelerator runtimes.

    with msprof_py.profile(output="profiling", schedule=msprof_py.schedule(wait=1, active=3)) as prof:
        ...
        prof.step()

    con = msprof_py.sql("trace_dir")   # DuckDB views over a trace (see msprof_py.sql)
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["profile", "schedule", "sql"]


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
