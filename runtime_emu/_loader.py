"""The emulator's plain C extensions (`_core`, `_rowtable`, `_acl`), each optional.

Which of the mypyc-compiled modules run (compiled or as their .py files) is `simcore._loader`'s
decision, made once for the whole group when `simcore` is imported (runtime_emu imports it first).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_PACKAGE = __name__.rpartition(".")[0]


def native(name: str) -> Any:
    """The package's plain C extension `name` (`_rowtable`, `_acl`: each optional, built at install
    when a C compiler is there), or None when it is not built or MSPROF_PY_PURE=1 runs the
    pure-Python emulator; the caller then uses its Python code for the same job."""
    if os.environ.get("MSPROF_PY_PURE") == "1":
        return None
    try:
        return importlib.import_module(f"{_PACKAGE}.{name}")
    except ImportError:
        return None
