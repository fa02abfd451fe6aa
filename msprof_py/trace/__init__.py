"""The trace event table and its I/O: schema, Parquet, importers, Chrome JSON export."""

from msprof_py.trace.export import export_chrome, to_chrome_bytes
from msprof_py.trace.importers import import_bytes, import_trace
from msprof_py.trace.parquet import read_trace, write_trace
from msprof_py.trace.schema import COLUMN_NAMES, KINDS, SCHEMA_VERSION, Trace, TraceMeta, build_table, validate

__all__ = [
    "COLUMN_NAMES", "KINDS", "SCHEMA_VERSION", "Trace", "TraceMeta", "build_table", "validate",
    "import_trace", "import_bytes", "read_trace", "write_trace", "export_chrome", "to_chrome_bytes",
]
