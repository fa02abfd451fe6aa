"""msprof-py: profiling and trace analysis for AI-accelerator runtimes.

    with msprof_py.profile(output="profiling", schedule=msprof_py.schedule(wait=1, active=3)) as prof:
        ...
        prof.step()
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["profile", "schedule"]


def __getattr__(name: str) -> Any:
    # Lazy: `import msprof_py` stays cheap for the CLI and the capture agent.
    if name in ("profile", "schedule"):
        from msprof_py import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module 'msprof_py' has no attribute {name!r}")
