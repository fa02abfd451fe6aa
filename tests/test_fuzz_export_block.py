"""Crashes the fuzzer found in the msprof-py export import path (msprof_py/trace/importers/__init__.py,
`_from_export`, and schema.build_table behind it): a damaged `msprof_py` block must give the
one-line TraceFormatError (exit 2 in the CLI), not a TypeError / ArrowInvalid / OverflowError,
and metadata of the wrong type must not be accepted."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from msprof_py.cli import app
from msprof_py.errors import TraceFormatError
from msprof_py.trace.importers import import_bytes

EVENT = '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1}'
TYPED = {"rank": [0], "kind": ["kernel"], "device": [1], "stream": [1], "corr": [1], "bytes": [1], "addr": [1],
         "value": [1.5], "step": [1]}


def export_with(block: dict) -> bytes:
    return ('{"traceEvents":[' + EVENT + '],"msprof_py":' + json.dumps(block) + "}").encode()


@pytest.mark.parametrize("block", [
    {"typed": {**TYPED, "device": 1.5}},  # TypeError: object of type 'float' has no len()
    {"typed": {**TYPED, "device": ["x"]}},  # ArrowInvalid: Could not convert 'x' ... to int32
    {"typed": {**TYPED, "corr": [2**64]}},  # OverflowError: Python int too large to convert to C long
    {"typed": TYPED, "origin_ns": "x"},  # accepted: a str origin, which the written Parquet cannot be read with
    {"typed": TYPED, "extra": []},  # accepted: extra must be an object
    {"typed": TYPED, "origin_ns": []},  # accepted; the Parquet written from it does not read back
    {"typed": {**TYPED, "kind": [[]]}},  # TypeError: unhashable type: 'list'
    {"typed": {**TYPED, "rank": [[]]}},  # ArrowInvalid: Could not convert [] with type list ... to int32
])
def test_a_damaged_export_block_is_a_trace_format_error(block):
    with pytest.raises(TraceFormatError) as err:
        import_bytes(export_with(block))
    assert err.value.one_line().startswith("trace: ")
    assert "\n" not in str(err.value)


def test_a_null_in_a_column_that_always_has_a_value_is_rejected():
    # Accepted: the table then broke its own schema (column 'rank' is null), found by the fuzz
    # run `--cases 5000 --seed 5000` (round 5012, "export typed 'rank'[0] = None").
    with pytest.raises(TraceFormatError) as err:
        import_bytes(export_with({"typed": {**TYPED, "rank": [None]}}))
    assert err.value.one_line() == ("trace: typed column 'rank' is null at event 0, and this column always "
                                    "has a value")
    # A null where the column allows one still imports.
    assert import_bytes(export_with({"typed": {**TYPED, "device": [None]}})).table.column("device").null_count == 1


def test_an_export_block_with_a_list_for_source_format_is_rejected(tmp_path):
    # Accepted on import; `msprof-py info` then crashed in rich: 'list' object has no attribute 'translate'.
    src = tmp_path / "export.json"
    src.write_bytes(export_with({"typed": TYPED, "source_format": []}))
    result = CliRunner().invoke(app, ["info", str(src)])
    assert result.exit_code == 2, repr(result.exception)
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"msprof-py: error: {src}")


def test_the_cli_rejects_a_damaged_export_block_with_exit_2(tmp_path):
    src = tmp_path / "export.json"
    src.write_bytes(export_with({"typed": {**TYPED, "device": 1.5}}))
    result = CliRunner().invoke(app, ["info", str(src)])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"msprof-py: error: {src}")
