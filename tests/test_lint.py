"""The lint and type checks pyproject.toml configures ([tool.ruff], [tool.mypy]) pass: mypy as the
compiled core needs, ruff on the whole project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes_on_the_packages_it_is_configured_for(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("Success: no issues found")


def test_ruff_finds_nothing_in_the_project() -> None:
    # [tool.ruff] in pyproject.toml: pyflakes, syntax errors, bugbear, import order.
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
