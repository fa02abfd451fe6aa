"""Use the compiled emulator core only while it matches its source.

An install compiles the hot modules with mypyc (see setup.py) and records a hash of each
source in `_compiled.json`. A compiled module is an extension module beside its `.py`, and
Python prefers extension modules, so an edited checkout would silently run stale code. Before
any of them is imported, this checks the hashes: if the record is missing, a source changed,
or `MSPROF_PY_PURE=1` is set, the `.py` files are imported instead (with a warning in the
first two cases, saying how to rebuild). This module itself is never compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_PACKAGE = __name__.rpartition(".")[0]
#: The modules mypyc compiles, in dependency order: the one list of them. setup.py reads it from
#: this file's text (a literal, so the build needs no import of the package) and the tests check
#: the build against it.
COMPILED = ("engine", "links", "device", "host", "recorder", "rows", "dispatch", "cuts", "api_streams", "api_events",
            "api_memory", "runtime")
#: How much faster the compiled core runs a simulation (README, benchmarks/bench_emulator.py).
SPEEDUP = 4
#: Why the pure-Python modules run, as `choose()` decided; None while the compiled core is used.
pure_reason: str | None = None


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


def compiled_modules(directory: Path = _HERE) -> list[str]:
    """Modules in `directory` present both as an extension module and as a .py source."""
    names = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for so in directory.glob(f"*{suffix}"):
            name = so.name[: -len(suffix)]
            if (directory / f"{name}.py").exists():
                names.append(name)
    return sorted(set(names))


def stale(names: list[str], directory: Path = _HERE) -> str | None:
    """Why the compiled modules must not be used, or None when they match their sources."""
    record = directory / "_compiled.json"
    try:
        sources = json.loads(record.read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no record of the sources they were built from"
    changed = [n for n in names if sources.get(n) != hashlib.sha256((directory / f"{n}.py").read_bytes()).hexdigest()]
    if changed:
        return f"{', '.join(f'{n}.py' for n in changed)} changed since they were built"
    return None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules of the package as their .py files."""

    def __init__(self, names: list[str]) -> None:
        self.names = {f"{_PACKAGE}.{n}": _HERE / f"{n}.py" for n in names}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol
        source = self.names.get(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source is not None else None


def choose() -> None:
    """Called by the package's __init__ before it imports any compiled module."""
    global pure_reason
    names = compiled_modules()
    if not names:
        pure_reason = "not built"
        return
    if os.environ.get("MSPROF_PY_PURE") == "1":
        why = None
        pure_reason = "MSPROF_PY_PURE=1"
    else:
        # A build of another list (an older checkout's) is not this core, whatever its hashes say.
        why = stale(names) if sorted(names) == sorted(COMPILED) else \
            f"built {', '.join(names)}, not {', '.join(sorted(COMPILED))}"
        if why is None:
            return
        pure_reason = f"compiled modules stale: {why}"
        warnings.warn(f"runtime_emu: not using the compiled emulator core ({why}); running the pure-Python modules. "
                      "Rebuild it with `pip install -e .` (or set MSPROF_PY_PURE=1 to silence this).",
                      RuntimeWarning, stacklevel=3)
    sys.meta_path.insert(0, _SourceFinder(names))
