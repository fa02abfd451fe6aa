"""The emulator's engine: the C one (runtime_emu._core, built at install) or `simcore.engine.Engine`."""

from __future__ import annotations

import os

from runtime_emu._loader import native
from simcore.engine import Clock, Engine

__all__ = ["Clock", "new_engine", "state"]


def state() -> str:
    """For `msprof-py --version`: what runs the engine and the kernels' lifecycle."""
    if native("_core") is not None:
        return "native"
    return "Python; MSPROF_PY_PURE=1" if os.environ.get("MSPROF_PY_PURE") == "1" else \
        "Python; native core not compiled, reinstall with a C compiler"


def new_engine() -> Clock:
    """The C engine (runtime_emu._core, built at install) or, without it or with
    MSPROF_PY_PURE=1, simcore's."""
    core = native("_core")
    return Engine() if core is None else core.Engine()  # type: ignore[no-any-return]
