"""The rule every input must obey: a correct import, or the project's one-line error.

Anything else is a `FuzzFailure`: another exception type, a multi-line or unbounded message,
a numpy overflow warning (a silently wrong number), an imported table that breaks the schema,
strict and lenient imports that disagree, an import by the native scanner that differs from the
msgspec decoder's (table, metadata or error text), or, through the CLI, anything but exit 0 or
exit 2 with one line on stderr and no output left behind.
"""

from __future__ import annotations

import shutil
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from msprof_py.errors import MsprofError
from msprof_py.trace import Trace, chrome, read_trace, write_trace
from msprof_py.trace.importers import import_bytes, import_trace
from msprof_py.trace.schema import validate

#: A one-line message longer than this has pasted input into itself.
MAX_MESSAGE = 400


class FuzzFailure(AssertionError):
    """An input the readers handled in a way they must not."""


def outcome(call: Callable[[], Any], where: str) -> Any:
    """`call()`'s Trace, or the MsprofError it raised once that error is checked; any other
    exception (or a numpy RuntimeWarning) becomes a FuzzFailure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            return call()
        except MsprofError as exc:
            line = exc.one_line()
            if "\n" in str(exc) or "\n" in line or len(line) > MAX_MESSAGE or not line.startswith(where):
                raise FuzzFailure(f"bad error message: {line[:MAX_MESSAGE * 2]!r}") from None
            return exc
        except Exception as exc:  # noqa: BLE001 - that is the point: anything else is a failure
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise FuzzFailure(f"{type(exc).__name__}: {str(exc)[:300]} "
                              f"(at {Path(frame.filename).name}:{frame.lineno} in {frame.name})") from exc


#: TraceMeta fields and the types they must have in any trace a reader returns.
META_TYPES = {"origin_ns": int, "source_format": str, "producer": str, "world_size": (int, type(None)),
              "schema_version": int, "source_meta": dict, "extra": dict}


def check_trace(trace: Trace, where: str) -> None:
    """An imported or read trace obeys the table's schema, and its metadata has its types."""
    problem = outcome(lambda: validate(trace.table, where=where), where)
    if isinstance(problem, MsprofError):
        raise FuzzFailure(f"the table breaks the schema: {problem.one_line()}")
    for key, types in META_TYPES.items():
        value = getattr(trace.meta, key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise FuzzFailure(f"metadata {key!r} is a {type(value).__name__}: {value!r:.80}")


def check_json(data: bytes, *, file: Path | None = None) -> str:
    """Import `data` strictly and leniently (from `file` too when given); returns "ok" or "error"."""
    strict = outcome(lambda: import_bytes(data, where="fuzz"), "fuzz")
    lenient = outcome(lambda: import_bytes(data, where="fuzz", lenient=True), "fuzz")
    if chrome._scan is not None:
        pure = outcome(lambda: _without_native(lambda: import_bytes(data, where="fuzz")), "fuzz")
        if _what(pure) != _what(strict) or (isinstance(strict, Trace) and not (
                strict.table.equals(pure.table, check_metadata=True) and strict.meta == pure.meta)):
            raise FuzzFailure(f"the native scanner's import ({_what(strict)}) differs from the msgspec "
                              f"decoder's ({_what(pure)})")
    for got in (strict, lenient):
        if isinstance(got, Trace):
            check_trace(got, "fuzz")
    if isinstance(strict, Trace):
        if not isinstance(lenient, Trace):
            raise FuzzFailure(f"strict import succeeded, lenient failed: {lenient.one_line()}")
        if lenient.meta.extra.get("skipped_events") or not lenient.table.equals(strict.table):
            raise FuzzFailure("strict and lenient imports of a valid trace differ")
    if file is not None:
        via_file = outcome(lambda: import_trace(file), str(file))
        if isinstance(via_file, Trace) != isinstance(strict, Trace) and not _gzip_cut(file):
            raise FuzzFailure(f"import of the file ({_what(via_file)}) disagrees with import of its bytes "
                              f"({_what(strict)})")
        if isinstance(via_file, Trace):
            check_trace(via_file, str(file))
    return "ok" if isinstance(strict, Trace) else "error"


def _without_native(call: Callable[[], Any]) -> Any:
    """`call()` with the native scanner off: the msgspec decoder's answer."""
    scan, chrome._scan = chrome._scan, None
    try:
        return call()
    finally:
        chrome._scan = scan


def check_roundtrip(trace: Trace, directory: Path) -> None:
    """A trace that imported writes to Parquet and reads back equal."""
    out = directory / "roundtrip.parquet"
    outcome(lambda: write_trace(trace, out), str(out))
    back = outcome(lambda: read_trace(out), str(out))
    if not isinstance(back, Trace):
        raise FuzzFailure(f"the Parquet written from an imported trace does not read back: {back.one_line()}")
    if not back.table.equals(trace.table):
        raise FuzzFailure("Parquet round trip of an imported trace changed it")
    out.unlink()


def check_parquet(path: Path, columns: list[str] | None) -> str:
    """Read a (possibly damaged) trace table; returns "ok" or "error"."""
    got = outcome(lambda: read_trace(path, columns=columns), str(path))
    if isinstance(got, Trace) and columns is None:
        check_trace(got, str(path))
    return "ok" if isinstance(got, Trace) else "error"


def check_cli(trace_path: Path, workdir: Path) -> list[str]:
    """`msprof-py info` and `import` on the input: exit 0, or exit 2 with one line on stderr and
    nothing written. Returns the exit codes as text."""
    from typer.testing import CliRunner

    from msprof_py.cli import app

    runner = CliRunner()
    outdir = workdir / "cli-out"
    codes = []
    for args in (["info", str(trace_path)], ["import", str(trace_path), "-o", str(outdir / "t.parquet")]):
        shutil.rmtree(outdir, ignore_errors=True)
        outdir.mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            result = runner.invoke(app, args)
        exc = result.exception
        if result.exit_code not in (0, 2) or (exc is not None and not isinstance(exc, SystemExit)):
            detail = "".join(traceback.format_exception(exc)[-3:]) if exc else result.output[-500:]
            raise FuzzFailure(f"msprof-py {args[0]}: exit {result.exit_code}: {detail}")
        if result.exit_code == 2:
            err = result.stderr.splitlines()
            if len(err) != 1 or not err[0].startswith("msprof-py: error: ") or "Traceback" in result.output:
                raise FuzzFailure(f"msprof-py {args[0]}: exit 2 without one error line: {result.stderr[-500:]!r}")
            if any(outdir.iterdir()):
                raise FuzzFailure(f"msprof-py {args[0]} failed but left {sorted(p.name for p in outdir.iterdir())}")
        codes.append(f"{args[0]}:{result.exit_code}")
    shutil.rmtree(outdir, ignore_errors=True)
    return codes


def _what(got: Any) -> str:
    return "ok" if isinstance(got, Trace) else got.one_line()


def _gzip_cut(path: Path) -> bool:
    """A gzip file cut short fails where its bytes would import: that is not a disagreement."""
    import gzip
    import zlib

    if path.suffix != ".gz":
        return False
    try:
        gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error):
        return True
    return False
