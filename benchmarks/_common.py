"""Helpers the benchmark scripts share (they run as scripts: `python benchmarks/NAME.py`)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def dist_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def environment(**packages: str) -> dict:
    """Machine and package versions to store next to measured figures."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count()}
    env.update({label: dist_version(dist) for label, dist in packages.items()})
    return env


def save_json(path: Path, data: dict) -> None:
    """Write a benchmark's figures (with `environment()` inside) for later comparison."""
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
