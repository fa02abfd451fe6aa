"""Use the compiled simulation core only while it matches its source.

An install compiles the hot modules of `simcore` and `runtime_emu` with mypyc, as one group (see
setup.py), and records a hash of each source in `simcore/_compiled.json`. A compiled module is an
extension module beside its `.py`, and Python prefers extension modules, so an edited checkout
would silently run stale code. Before any of them is imported, this checks the hashes: if the
record is missing, a source changed, or `MSPROF_PY_PURE=1` is set, the `.py` files of all of them
are imported instead (with a warning in the first two cases, saying how to rebuild). One group,
one decision: a compiled module calls its group's others natively, so they are all compiled or
all Python. This module itself is never compiled.
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

#: The directory holding the packages (`simcore/`, `runtime_emu/`).
ROOT = Path(__file__).resolve().parents[1]
#: The modules mypyc compiles, in dependency order: the one list of them. setup.py reads it from
#: this file's text (a literal, so the build needs no import of the package) and the tests check
#: the build against it.
COMPILED = ("simcore.engine", "simcore.links", "simcore.cores", "runtime_emu.device", "runtime_emu.host",
            "runtime_emu.recorder", "runtime_emu.rows", "runtime_emu.dispatch", "runtime_emu.cuts",
            "runtime_emu.api_streams", "runtime_emu.api_events", "runtime_emu.api_memory", "runtime_emu.runtime")
#: Where the build records the hashes of the sources it compiled.
RECORD = "simcore/_compiled.json"
#: How much faster the compiled core runs a simulation (README, benchmarks/bench_emulator.py).
SPEEDUP = 4
#: Why the pure-Python modules run, as `choose()` decided; None while the compiled core is used.
pure_reason: str | None = None


def source(name: str, root: Path = ROOT) -> Path:
    """The .py file of the dotted module `name`."""
    return root.joinpath(*name.split(".")).with_suffix(".py")


def compiled_modules(root: Path = ROOT, names: tuple[str, ...] = COMPILED) -> list[str]:
    """Modules of the packages `names` live in that are there both as an extension module and as
    a .py source (dotted names)."""
    found = []
    for package in sorted({n.rpartition(".")[0] for n in names}):
        directory = root.joinpath(*package.split("."))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            for so in directory.glob(f"*{suffix}"):
                name = so.name[: -len(suffix)]
                if (directory / f"{name}.py").exists():
                    found.append(f"{package}.{name}")
    return sorted(set(found))


def stale(names: list[str], root: Path = ROOT) -> str | None:
    """Why the compiled modules must not be used, or None when they match their sources."""
    try:
        sources = json.loads((root / RECORD).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no record of the sources they were built from"
    changed = [n for n in names if sources.get(n) != hashlib.sha256(source(n, root).read_bytes()).hexdigest()]
    if changed:
        return f"{', '.join(str(source(n, root).relative_to(root)) for n in changed)} changed since they were built"
    return None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules as their .py files."""

    def __init__(self, names: list[str]) -> None:
        self.names = {n: source(n) for n in names}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol
        found = self.names.get(fullname)
        return importlib.util.spec_from_file_location(fullname, found) if found is not None else None


def choose() -> None:
    """Called by `simcore`'s __init__ (which `runtime_emu` imports first) before any compiled
    module is imported."""
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
        warnings.warn(f"msprof-py: not using the compiled simulation core ({why}); running the pure-Python modules. "
                      "Rebuild it with `pip install -e .` (or set MSPROF_PY_PURE=1 to silence this).",
                      RuntimeWarning, stacklevel=3)
    sys.meta_path.insert(0, _SourceFinder(names))
