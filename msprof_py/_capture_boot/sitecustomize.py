"""Start-up hook of a program run by `msprof-py --application=...` (see msprof_py.capture_agent).

The capture puts this directory first on the program's PYTHONPATH, so every Python process of
the program runs this at start-up without the program being changed: it asks the capture agent
to attach to the runtimes the process starts. The sitecustomize this one shadows, if any, runs
next, as it would have without the profiler.
"""

import os
import sys


def _install() -> None:
    try:
        from msprof_py import capture_agent
    except ImportError:  # another interpreter, without msprof-py: the process runs unprofiled
        return
    capture_agent.install()


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.path[:]
    me = sys.modules.pop(__name__, None)
    sys.path[:] = [p for p in path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401 - the next one on the path
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if me is not None:  # none to run: this one stays the process's sitecustomize
            sys.modules[__name__] = me
    finally:
        sys.path[:] = path


_install()
_run_shadowed()
