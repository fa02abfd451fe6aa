"""The accuracy harness on a subset of scenarios (the full table: `msprof-py eval`)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from analyzers.accuracy import TARGETED, cases_for, evaluate
from msprof_py.cli import app
from runtime_emu import scenarios


def test_analyzers_find_every_injected_problem_and_nothing_on_healthy_twins():
    scores = evaluate(cases_for(scenarios.SCENARIOS, ["resnet50-infer"]), scenarios.run)
    rows = {r["problem"]: r for r in scores.table()}
    assert scores.false_alarms() == []
    for kind in TARGETED:
        assert rows[kind]["injected"] > 0
        assert rows[kind]["recall"] >= 0.95, rows[kind]
        assert rows[kind]["precision"] >= 0.95, rows[kind]
    assert rows["missing-sync"]["recall"] == 1.0 and rows["leak"]["detected"] == rows["leak"]["injected"]


def test_eval_command_prints_the_table_as_json():
    result = CliRunner().invoke(app, ["eval", "--scenario", "yolo-pipeline", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["runs"] == 1 + len(scenarios.SCENARIOS["yolo-pipeline"].switches)
    assert doc["false_alarms"] == []
    assert {r["problem"] for r in doc["problems"]} >= {"leak", "queue-congestion", "bandwidth-contention"}


def test_eval_rejects_an_unknown_scenario():
    result = CliRunner().invoke(app, ["eval", "--scenario", "nope"])
    assert result.exit_code == 2
    assert "unknown scenario(s) nope" in result.output
