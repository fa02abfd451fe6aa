"""The native JSON event scanner (`_scan.c`, compiled at install when a C compiler is there).

The JSON importer scans the event array with it first and falls back to the msgspec decoder
whenever the scanner is not built, is switched off (MSPROF_PY_PURE_IMPORT=1), or declines an
input. Both give the same table; the scanner is about twice as fast (benchmarks/bench_cli.py).
"""

from __future__ import annotations

import os
from typing import Any

#: Why the scanner is not in use ("" while it is); set by load().
reason = ""


def load() -> Any:
    """The compiled scanner module, or None (then `reason` says why)."""
    global reason
    if os.environ.get("MSPROF_PY_PURE_IMPORT", "") not in ("", "0"):
        reason = "MSPROF_PY_PURE_IMPORT=1"
        return None
    try:
        from msprof_py.trace import _scan  # type: ignore[attr-defined]
    except ImportError:
        reason = "not built; reinstall with a C compiler"
        return None
    reason = ""
    return _scan


def state() -> str:
    """For `msprof-py --version`: "native scanner", or "msgspec; <why>"."""
    return "native scanner" if load() is not None else f"msgspec; {reason}"
