"""Build: everything is in pyproject.toml except the optional compiled parts: the emulator core
and the JSON event scanner.

The emulator's hot modules (the simulation core in ``simcore``: event loop, links, core
pools; streams, host threads, recorder in ``runtime_emu``) are plain, type-checked Python that mypyc compiles to C extension modules when the
package is installed -- about twice the simulation speed, same source, same traces. The pure
Python modules stay importable beside them, so:

* ``MSPROF_PY_COMPILE=0 pip install ...`` skips compiling (no C compiler needed);
* ``MSPROF_PY_COMPILE=1`` makes a failed compile an install error;
* unset, a compile that fails (no compiler, no Python headers) warns and installs pure Python.

The build records a hash of each compiled source in ``simcore/_compiled.json``; at import,
``simcore`` (which ``runtime_emu`` imports first) uses the compiled modules only while every
source still matches (an edited checkout runs the edited Python, with a warning to rebuild).

``msprof_py/trace/_scan.c`` is a plain C extension (no dependency but Python's headers): the
JSON importer's native scanner of the event array. The same switch governs it; when it cannot be
built, imports use the msgspec decoder (the same tables, about half the speed), and
``msprof-py --version`` says which one runs. ``runtime_emu/_rowtable.c`` is another: the native
build of the emulator's trace table from its row buffers; without it the Arrow build in
``runtime_emu/tables.py`` makes the same table, slower. ``runtime_emu/_acl.c`` makes the acl
functions native forwarders to the runtime's methods (Python closures without it).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_list() -> tuple[str, ...]:
    """The modules to compile, in dependency order: simcore/_loader.py's COMPILED (dotted names), read
    as a literal (importing the package would need its dependencies before they are installed)."""
    tree = ast.parse((ROOT / "simcore" / "_loader.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == "COMPILED" and node.value is not None:
            return tuple(ast.literal_eval(node.value))
    sys.exit("simcore/_loader.py defines no COMPILED list")


COMPILED = _compiled_list()
SOURCES = [m.replace(".", "/") + ".py" for m in COMPILED]
MODE = os.environ.get("MSPROF_PY_COMPILE", "auto").strip().lower()
if MODE not in ("0", "1", "auto"):
    sys.exit(f"MSPROF_PY_COMPILE must be 0, 1 or auto, got {MODE!r}")


def _warn(what: str, instead: str = "the pure-Python emulator") -> None:
    print(f"msprof-py: {what}; installing {instead} "
          "(set MSPROF_PY_COMPILE=1 to make this an error)", file=sys.stderr)


#: The JSON importer's native scanner.
SCANNER = Extension("msprof_py.trace._scan", ["msprof_py/trace/_scan.c"], extra_compile_args=["-O2"])
WITHOUT_SCANNER = "the JSON importer without its native scanner"
#: The emulator's native trace-table build.
ROWTABLE = Extension("runtime_emu._rowtable", ["runtime_emu/_rowtable.c"], depends=["runtime_emu/_rowbuf.h"],
                     extra_compile_args=["-O2", "-pthread"],
                     extra_link_args=["-pthread"])
#: The acl functions' native forwarders.
FORWARDS = Extension("runtime_emu._acl", ["runtime_emu/_acl.c"], extra_compile_args=["-O2"])
#: The emulator's event heap, core pools and kernel lifecycle in C.
CORE = Extension("runtime_emu._core", ["runtime_emu/_core.c"], depends=["runtime_emu/_rowbuf.h"],
                 extra_compile_args=["-O2"])
#: The plain C extensions, each optional on its own: what installs without it.
PLAIN = {SCANNER.name: WITHOUT_SCANNER, ROWTABLE.name: "the emulator's trace table without its native build",
         FORWARDS.name: "the acl functions as Python wrappers",
         CORE.name: "the emulator's engine and kernel lifecycle in (compiled) Python"}


def _all_extensions() -> list:
    # The plain ones first: a mypyc failure ends the build of the extensions after it.
    return [] if MODE == "0" else [SCANNER, ROWTABLE, FORWARDS, CORE, *_extensions()]


def _extensions() -> list:
    if MODE == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        if MODE == "1":
            raise
        _warn(f"mypyc is not available ({exc})")
        return []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names modules by their path relative to the working directory
    try:
        return mypycify(["--ignore-missing-imports", "--follow-imports=silent", *SOURCES],
                        opt_level="3", group_name="simcore")
    except Exception as exc:  # a type error or a mypyc limitation: the pure modules still work
        if MODE == "1":
            raise
        _warn(f"mypyc could not compile the emulator ({exc})")
        return []
    finally:
        os.chdir(cwd)


class BuildExt(build_ext):
    """Compile the emulator core and the scanner if possible, then record which emulator sources
    the core was built from."""

    def build_extension(self, ext) -> None:
        if ext.name not in PLAIN:
            super().build_extension(ext)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:  # no C compiler or no Python headers: the Python code does the job
            if MODE == "1":
                raise
            _warn(f"compiling {ext.sources[0]} failed ({exc})", PLAIN[ext.name])

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no C compiler or no Python headers
            if MODE == "1" or not self._core():
                raise
            _warn(f"compiling the emulator failed ({exc})")
            return
        if not self._core():
            return
        info = {"sources": {m: hashlib.sha256((ROOT / s).read_bytes()).hexdigest() for m, s in zip(COMPILED, SOURCES)}}
        dest = (ROOT if self.inplace else Path(self.build_lib)) / "simcore" / "_compiled.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(info, indent=1) + "\n")

    def _core(self) -> bool:
        """Whether the emulator core is among the extensions built (mypyc was there)."""
        return any(ext.name not in PLAIN for ext in self.extensions)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if self._core() and not self.inplace:
            outputs.append(str(Path(self.build_lib) / "simcore" / "_compiled.json"))
        return outputs


setup(ext_modules=_all_extensions(), cmdclass={"build_ext": BuildExt})
