"""`ground_truth.json`: what an emulated run injected and knows caused each delay.

It sits beside a trace, never inside it: tests and evaluation read it, analyzers never do.
This is the one place it is written, whoever saves an emulated run (a PROF dir, a sample).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from msprof_py.trace.atomic import atomic_file

FILE_NAME = "ground_truth.json"


def write_ground_truth(ground_truth: dict[str, Any], directory: str | Path) -> Path:
    """Write `ground_truth` as `directory/ground_truth.json` (atomically); returns the file."""
    path = Path(directory) / FILE_NAME
    with atomic_file(path) as tmp:
        tmp.write_bytes(msgspec.json.encode(ground_truth))
    return path
