"""The one exception type of msprof-py's domain code."""

from __future__ import annotations


class MsprofError(Exception):
    """A problem the user can fix: bad input, missing file, unwritable output.

    The CLI turns it into a one-line message and exit code 2; library callers catch it.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        """The message and, when known, what to do next, on one line."""
        text = " ".join(str(self).split())
        return f"{text} ({self.hint})" if self.hint else text


class TraceFormatError(MsprofError):
    """The input is not a readable trace (bad JSON, gzip, Parquet or event fields)."""
