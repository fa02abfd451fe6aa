"""Fuzzing the trace readers with mutations of real traces (a fixed, derandomized sample in CI).

Every input must give a correct import or the project's one-line error (see fuzz/checks.py);
`python -m fuzz.fuzz_importers` runs the same cases by the thousand.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir

from fuzz.checks import check_cli, check_json, check_parquet, check_roundtrip
from fuzz.json_cases import JsonCase, json_cases, json_seeds, write_case
from fuzz.parquet_cases import ParquetCase, parquet_cases, parquet_seeds
from msprof_py.trace import import_bytes

# Hypothesis caches what it learns from the source under its home directory: not in the tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "msprof-py-hypothesis")

#: Deterministic: the same cases on every run, no example database, no time limit per case.
CI = settings(derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seeds(real_traces: Path) -> dict[str, bytes]:
    return json_seeds(real_traces)


def test_every_seed_imports_cleanly(seeds):
    for name, data in seeds.items():
        assert check_json(data) == "ok", name


def test_json_importers_on_mutated_real_traces(seeds, tmp_path):
    outcomes = []

    @settings(CI, max_examples=250)
    @given(case=json_cases(seeds))
    def run(case: JsonCase) -> None:
        file = write_case(case, tmp_path) if case.as_file != "bytes" else None
        outcomes.append(check_json(case.data, file=file))

    run()
    # The mutations must not all be fatal (nor all harmless): both outcomes are exercised.
    assert outcomes.count("ok") >= 25 and outcomes.count("error") >= 25, outcomes.count("ok")


def test_parquet_reader_on_damaged_tables(seeds, tmp_path):
    tables = parquet_seeds(seeds, ("kineto-event-sync", "torch-npu"))
    outcomes = []

    @settings(CI, max_examples=120)
    @given(case=parquet_cases(tables, tmp_path / "seed"))
    def run(case: ParquetCase) -> None:
        outcomes.append(check_parquet(case.write(tmp_path / "case", tables[case.seed]), case.columns))

    run()
    assert outcomes.count("ok") >= 10 and outcomes.count("error") >= 40, outcomes.count("ok")


def test_imported_mutations_round_trip_through_parquet(seeds, tmp_path):
    @settings(CI, max_examples=40)
    @given(case=json_cases(seeds))
    def run(case: JsonCase) -> None:
        if check_json(case.data) == "ok":
            check_roundtrip(import_bytes(case.data), tmp_path)

    run()


def test_cli_on_mutated_traces(seeds, tmp_path):
    tables = parquet_seeds(seeds, ("kineto-tiny",))

    @settings(CI, max_examples=30)
    @given(case=json_cases(seeds))
    def json_run(case: JsonCase) -> None:
        check_cli(write_case(case, tmp_path), tmp_path)

    @settings(CI, max_examples=20)
    @given(case=parquet_cases(tables, tmp_path / "seed"))
    def parquet_run(case: ParquetCase) -> None:
        check_cli(case.write(tmp_path / "case", tables[case.seed]), tmp_path)

    json_run()
    parquet_run()
