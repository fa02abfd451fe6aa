"""Atomic output: write to a hidden temporary sibling, then rename, so no reader ever sees a
half-written file and a crash leaves the previous output (or nothing) in place."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from msprof_py.errors import MsprofError


def file_mode() -> int:
    """0o666 less the umask: what open() would give (mkstemp files are 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def parent_dir(path: Path) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MsprofError(f"{path}: directory {parent} does not exist", hint="create it or choose another output")
    return parent


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it becomes `path`, on error it is removed."""
    path = Path(path)
    parent = parent_dir(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except PermissionError:
        raise MsprofError(f"{path}: permission denied", hint="choose a writable output location") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
