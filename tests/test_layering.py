"""Who may import whom (ARCHITECTURE section 7): the import-linter contracts in pyproject.toml hold.

`lint-imports` reads every import of the packages, function-level ones included, so a layering
break hidden in a function body fails here as well as one at the top of a module.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import msprof_py

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
#: msprof_py modules the contracts allow below the profiler: the trace contract and its exception type.
BASE = {"msprof_py.trace", "msprof_py.errors"}


def test_the_import_contracts_hold():
    out = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_every_msprof_py_module_is_placed_in_the_contracts():
    """The contracts list msprof_py's upper modules one by one; a new module must join them, or
    runtime_emu and the analyzers could import it unnoticed."""
    contracts = {c["id"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
                 ["contracts"]}
    upper = {f"msprof_py.{m.name}" for m in pkgutil.iter_modules(msprof_py.__path__)} - BASE
    assert upper, "no msprof_py modules found"
    for cid in ("trace", "runtime", "analyzers"):
        listed = set(contracts[cid]["forbidden_modules"])
        assert upper <= listed, f"contract {cid!r} does not forbid {sorted(upper - listed)}"
    # Only the trace contract itself may raise msprof_py.errors; the emulator and the analyzers
    # reach it through msprof_py.trace.
    for cid in ("runtime", "analyzers"):
        assert "msprof_py.errors" in contracts[cid]["forbidden_modules"]
