"""The closed sets of values the CLI and the library accept, each defined once.

Plain enums with no imports beyond the standard library: the CLI declares its options with them
(Typer turns an enum into a checked choice listed in `--help`), and the modules that take the
same values (report formats, analysis windows) read their lists from here.
"""

from __future__ import annotations

from enum import Enum


class Window(str, Enum):
    """Which events an analysis sees."""

    all = "all"
    #: Drop the last, usually cut-short, profiler step, as Holistic Trace Analysis does.
    complete_steps = "complete_steps"


class ReportFormat(str, Enum):
    """The formats `report` writes."""

    md = "md"
    html = "html"
    json = "json"


class OutputFormat(str, Enum):
    """How `analyze` and `sql` print their result: a table for reading (numbers rounded), or CSV
    and JSON at full precision."""

    table = "table"
    csv = "csv"
    json = "json"


class OnOff(str, Enum):
    """msprof's switches (`--task-time=on`, `--export=on`)."""

    on = "on"
    off = "off"


class FailOn(str, Enum):
    """The least severe finding that fails a CI run (`report --fail-on`)."""

    warning = "warning"
    critical = "critical"


class Engine(str, Enum):
    """Where `analyze` / `report` run the analyzers over the rank partitions."""

    #: In this process, one rank partition at a time.
    local = "local"
    #: One task per rank partition on a Dask cluster (the dask extra).
    dask = "dask"


#: What a value of each enum is, for the one-line error naming a value that is none of them.
NOUNS: dict[type[Enum], str] = {Window: "analysis window", ReportFormat: "report format", FailOn: "--fail-on severity",
                               Engine: "analysis engine"}
