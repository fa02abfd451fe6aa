"""`msprof-py sql TRACE [QUERY]`: DuckDB SQL over a trace's views (see msprof_py.sql).

With a QUERY, it prints the result and exits. Without one it reads SQL from stdin until `.quit`
or end of input: a statement runs when a line ends with ';' (a last one without ';' runs at the
end of input), so `msprof-py sql TRACE < queries.sql` works as well as typing at the prompt.
Dot commands: `.tables` (the views), `.schema VIEW` (its columns), `.help`, `.quit` / `.exit`.

A failing statement is one line on stderr; a QUERY run exits 2 at once, the interactive mode
goes on and exits 2 at the end when any statement failed.

Only typer and light standard modules at the top: `msprof-py --help` must not import DuckDB.
"""

from __future__ import annotations

import decimal
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TextIO

import typer

from msprof_py.choices import OutputFormat
from msprof_py.errors import MsprofError

if TYPE_CHECKING:
    import duckdb

PROG = "msprof-py"
#: Rows fetched from DuckDB at a time, for the streamed formats (csv, json).
BATCH_ROWS = 10_000


HELP_TEXT = """\
Views: events, slices, counters, flows, tasks, memory, steps (python -c "import msprof_py.sql; \
help(msprof_py.sql)" documents every column). Times are ns since the trace origin.
End a statement with ';'. Commands: .tables, .schema VIEW, .help, .quit"""


def register(app: typer.Typer) -> None:
    """Add the `sql` command to the CLI's app."""
    app.command("sql", short_help="Query a trace with SQL: slices, tasks, flows, memory views.")(sql_cmd)


def sql_cmd(
    trace_path: Annotated[Path, typer.Argument(
        metavar="TRACE", show_default=False,
        help="Parquet trace table (file or rank-partitioned directory), a sample directory holding one, or a "
             "PROF_* directory; JSON traces need `msprof-py import` first.")],
    query: Annotated[Optional[str], typer.Argument(
        metavar="QUERY", show_default=False,
        help="SQL to run; without it, read SQL from stdin (interactive when stdin is a terminal).")] = None,
    fmt: Annotated[OutputFormat, typer.Option(
        "--format", "-f", help="table (aligned, for reading), csv (full precision) or json (an array of "
                               "objects).")] = OutputFormat.table,
) -> None:
    """Run DuckDB SQL over a trace, in place: views events, slices, counters, flows, tasks, memory, steps.

    \b
    Examples:
      msprof-py sql TRACE "SELECT name, sum(dur) AS ns FROM tasks GROUP BY name ORDER BY ns DESC LIMIT 5"
      msprof-py sql TRACE "SELECT * FROM steps" --format csv
      msprof-py sql TRACE < queries.sql
    """
    from msprof_py import sql

    con = sql.connect(trace_path)
    try:
        if query is not None:
            run(con, query, fmt)
        else:
            failed = repl(con, fmt, sys.stdin)
            if failed:
                raise typer.Exit(2)
    finally:
        con.close()


def run(con: duckdb.DuckDBPyConnection, text: str, fmt: OutputFormat, out: TextIO | None = None) -> None:
    """Run the statements of `text`, printing each one's result (MsprofError when one fails)."""
    import duckdb

    from msprof_py import sql

    for statement in sql.statements(con, text):
        try:
            con.execute(statement)
            if _returns_rows(statement):
                write(con, fmt, out or sys.stdout)
        except duckdb.Error as exc:
            raise MsprofError(sql.one_line(exc)) from None


def _returns_rows(statement: Any) -> bool:
    import duckdb

    expected = statement.expected_result_type
    return duckdb.ExpectedResultType.QUERY_RESULT in expected and duckdb.ExpectedResultType.CHANGED_ROWS \
        not in expected


def repl(con: duckdb.DuckDBPyConnection, fmt: OutputFormat, stdin: TextIO) -> bool:
    """Read statements from stdin until .quit or end of input; True when any failed."""
    interactive = stdin.isatty()
    if interactive:
        typer.echo(f"{PROG} sql: {HELP_TEXT}", err=True)
    failed = False
    buffer: list[str] = []
    while True:
        line = _read_line(stdin, "sql> " if not buffer else "...> ", interactive)
        if line is None:
            break
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            if stripped.split()[0] in (".quit", ".exit"):
                break
            failed |= not _dot_command(con, stripped, fmt)
            continue
        if stripped:
            buffer.append(line)
        if buffer and stripped.endswith(";"):
            failed |= not _run_reporting(con, "\n".join(buffer), fmt)
            buffer = []
    if buffer:
        failed |= not _run_reporting(con, "\n".join(buffer), fmt)
    return failed


def _read_line(stdin: TextIO, prompt: str, interactive: bool) -> str | None:
    if interactive and stdin is sys.stdin:
        try:
            return input(prompt)
        except EOFError:
            typer.echo("", err=True)
            return None
    line = stdin.readline()
    return line.rstrip("\n") if line else None


def _run_reporting(con: duckdb.DuckDBPyConnection, text: str, fmt: OutputFormat) -> bool:
    try:
        run(con, text, fmt)
    except MsprofError as exc:
        typer.echo(f"{PROG}: error: {exc.one_line()}", err=True)
        return False
    sys.stdout.flush()
    return True


def _dot_command(con: duckdb.DuckDBPyConnection, command: str, fmt: OutputFormat) -> bool:
    from msprof_py import sql

    words = command.split()
    if words[0] == ".help":
        typer.echo(HELP_TEXT)
    elif words[0] == ".tables":
        typer.echo("  ".join(sql.VIEWS))
    elif words[0] == ".schema" and len(words) == 2 and words[1] in sql.VIEWS:
        return _run_reporting(con, f"DESCRIBE {words[1]}", fmt)
    elif words[0] == ".schema":
        typer.echo(f"{PROG}: error: .schema takes one view: {', '.join(sql.VIEWS)}", err=True)
        return False
    else:
        typer.echo(f"{PROG}: error: unknown command {words[0]!r}; try .help", err=True)
        return False
    return True


# ---------------------------------------------------------------------- output
def write(con: duckdb.DuckDBPyConnection, fmt: OutputFormat, out: TextIO) -> None:
    """Print the pending result of `con` in `fmt`."""
    import csv
    import json

    names = [d[0] for d in con.description or []]
    if fmt is OutputFormat.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        while batch := con.fetchmany(BATCH_ROWS):
            # Python's float repr is the shortest text that reads back as the same double: full precision.
            writer.writerows([["" if v is None else _csv_value(v) for v in row] for row in batch])
    elif fmt is OutputFormat.json:
        out.write("[")
        first = True
        while batch := con.fetchmany(BATCH_ROWS):
            for row in batch:
                out.write(("\n" if first else ",\n") + json.dumps(
                    {n: _json_value(v) for n, v in zip(names, row)}, default=str, allow_nan=False))
                first = False
        out.write("\n]\n" if not first else "]\n")
    else:
        _print_table(names, [d[1] for d in con.description or []], con.fetchall(), out)


def _csv_value(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, decimal.Decimal):  # a DECIMAL literal or sum: a JSON number, not text
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def _print_table(names: list[str], types: list[Any], rows: list[tuple], out: TextIO) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    numeric = [_is_number(rows, i) for i in range(len(names))]
    table = Table(box=box.SIMPLE_HEAD, caption=f"{len(rows)} row{'s' if len(rows) != 1 else ''}",
                  caption_justify="left")
    for name, right in zip(names, numeric):
        # Text, not str: rich would read a name such as '[memory]' as markup and drop it.
        table.add_column(Text(name), justify="right" if right else "left", overflow="fold")
    for row in rows:
        table.add_row(*[Text(_cell(v)) for v in row])
    if out is sys.stdout:
        from msprof_py.cli import _show

        _show(table)
    else:
        from rich.console import Console

        Console(file=out, width=1 << 16, no_color=True, highlight=False).print(table)


def _is_number(rows: list[tuple], i: int) -> bool:
    values = [r[i] for r in rows if r[i] is not None]
    return bool(values) and all(isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)
                                for v in values)


def _cell(value: Any) -> str:
    """Numbers for reading: thousands grouped (ns values run to 10+ digits), floats to 3 decimals
    (4 significant digits below 1); NULL as in DuckDB."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, decimal.Decimal)):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value) or value == 0:
            return str(value) if value != 0 else "0"
        if abs(value) >= 1:
            return f"{value:,.3f}".rstrip("0").rstrip(".")
        return f"{value:.4g}"
    return str(value)
