"""Helpers the benchmark scripts share (they run as scripts: `python benchmarks/NAME.py`)."""

from __future__ import annotations

import os
import platform


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
