"""Job steps: a step of a multi-rank job is one step number across ranks, from the first rank's
start of it to the last rank's end of it; beside it the per-rank step table (msprof-analyze's
cluster_step_trace_time.csv). The summary, the report (JSON / Markdown / HTML) and `diff` count
job steps; a single-rank trace keeps its own steps' numbers."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from analyzers import Frames
from analyzers.overview import overview
from msprof_py import report, summaries
from msprof_py.compare import compare, render_diff
from msprof_py.loading import load_any
from msprof_py.summary import render, summarize
from msprof_py.trace.units import pct
from runtime_emu import scenarios

#: bert-train-dp, seed 0, 3 steps: 8 ranks; each job step from the first rank's start to the last
#: rank's end (ns), and the rank whose own step took longest.
BERT_JOB_STEP_NS = [13_861_887, 13_871_075, 13_866_784]
BERT_SLOWEST = [5, 2, 4]


def _build(trace):
    return report.build(trace, timelines=0, what_if=False)


@pytest.fixture(scope="module")
def bert():
    trace = scenarios.run("bert-train-dp", seed=0, steps=3).trace
    return trace, _build(trace)


def _host_steps(trace) -> dict[int, list[tuple[int, int, int]]]:
    """{step: [(rank, start, end)]} read straight from the table's step rows."""
    t = trace.table
    rows = t.filter(pc.and_(pc.equal(t.column("kind").cast("string"), "step"),
                            pc.equal(t.column("ph").cast("string"), "X"))).to_pydict()
    out: dict[int, list[tuple[int, int, int]]] = {}
    for rank, step, ts, dur in zip(rows["rank"], rows["step"], rows["ts"], rows["dur"]):
        out.setdefault(step, []).append((rank, ts, ts + (dur or 0)))
    return out


def _union_in(ts: np.ndarray, end: np.ndarray, lo: int, hi: int) -> int:
    """Covered time of [ts, end) intervals inside [lo, hi), by a plain sweep (the test's own)."""
    total, reach = 0, lo
    for a, b in sorted(zip(ts.tolist(), end.tolist())):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def test_an_8_rank_run_has_3_job_steps_from_first_start_to_last_end(bert):
    trace, rep = bert
    s = rep["summary"]
    assert (s["steps"], s["rank_steps"]) == (3, 24)
    host = _host_steps(trace)
    assert sorted(host) == [0, 1, 2] and all(len(v) == 8 for v in host.values())
    expected = [max(e for _, _, e in host[k]) - min(b for _, b, _ in host[k]) for k in (0, 1, 2)]
    assert expected == BERT_JOB_STEP_NS
    assert [j["step"] for j in rep["job_steps"]] == [0, 1, 2]
    assert [j["step_ns"] for j in rep["job_steps"]] == expected
    assert [j["ranks"] for j in rep["job_steps"]] == [8, 8, 8]
    assert [j["slowest_rank"] for j in rep["job_steps"]] == BERT_SLOWEST
    assert [j["slowest_rank"] for j in rep["job_steps"]] == [
        min(host[k], key=lambda r: (-(r[2] - r[1]), r[0]))[0] for k in (0, 1, 2)]
    assert [j["last_rank"] for j in rep["job_steps"]] == [
        min(host[k], key=lambda r: (-r[2], r[0]))[0] for k in (0, 1, 2)]
    assert s["step_time_ns_mean"] == sum(expected) / 3
    assert s["step_time_ns_max"] == max(expected)
    info = summarize(trace)
    assert (info.steps, info.rank_steps, info.step_time_ns_mean) == (3, 24, sum(expected) / 3)
    first = min(b for v in host.values() for _, b, _ in v)
    last = max(e for v in host.values() for _, _, e in v)
    assert s["throughput_steps_per_s"] == 3 / ((last - first) / 1e9)


def test_the_step_table_splits_each_rank_step_exactly(bert):
    trace, rep = bert
    table = rep["step_table"]
    host = _host_steps(trace)
    assert [(r["rank"], r["step"]) for r in table] == [(rank, step) for rank in range(8) for step in range(3)]
    for r in table:
        (start, end), = [(b, e) for rank, b, e in host[r["step"]] if rank == r["rank"]]
        assert (r["start_ns"], r["end_ns"], r["step_ns"]) == (start, end, end - start)
        assert r["computing_ns"] + r["communication_not_overlapped_ns"] + r["free_ns"] == r["step_ns"]
        assert r["overlapped_ns"] + r["communication_not_overlapped_ns"] == r["communication_ns"]
        assert 0 <= r["overlapped_ns"] <= r["communication_ns"]
        assert r["computing_ns"] > 0 and r["communication_ns"] > 0 and r["free_ns"] >= 0
    # Rank 3's figures by a plain sweep over its kernels and collectives.
    ops = Frames(trace).device_ops
    mine = ops[ops["rank"] == 3]
    kind = mine["kind"].astype(str)
    k, c = mine[kind == "kernel"], mine[kind == "collective"]
    both = mine[kind.isin(("kernel", "collective"))]
    for r in (r for r in table if r["rank"] == 3):
        w = (r["start_ns"], r["end_ns"])
        comp = _union_in(k["ts"].to_numpy(), k["end"].to_numpy(), *w)
        comm = _union_in(c["ts"].to_numpy(), c["end"].to_numpy(), *w)
        busy = _union_in(both["ts"].to_numpy(), both["end"].to_numpy(), *w)
        assert (r["computing_ns"], r["communication_ns"], r["overlapped_ns"], r["free_ns"]) == \
            (comp, comm, comp + comm - busy, r["step_ns"] - busy)


def test_markdown_html_and_json_show_job_steps_and_the_step_table(bert, tmp_path):
    _, rep = bert
    md = report.to_markdown(rep)
    assert "| steps | 3 | job steps: one step number across ranks (24 rank steps) |" in md
    assert "## Job steps" in md and "## Step time per rank" in md
    jobs = md.split("## Job steps")[1].split("## Step time per rank")[0]
    assert "| 0 | 8 | 13.9 | " in jobs and jobs.count("\n| ") == 4  # head + 3 steps
    per_rank = md.split("## Step time per rank")[1].split("\n## ")[0]
    r0 = rep["step_table"][0]
    assert f"| 0 | 0 | 13.9 | {report._ms(r0['computing_ns'])} | {report._ms(r0['communication_not_overlapped_ns'])} |" \
        in per_rank
    assert per_rank.count("\n| ") == 1 + 24
    html = report.to_html(rep)
    assert "<h2>Job steps</h2>" in html and "<h2>Step time per rank</h2>" in html
    doc = json.loads(report.to_json(rep))
    assert doc["summary"]["steps"] == 3 and len(doc["job_steps"]) == 3 and len(doc["step_table"]) == 24


def test_more_than_16_ranks_show_min_median_max_per_step_and_the_slowest_rank(bert):
    _, rep = bert
    # 24 ranks: the 8-rank table three times, ranks 8.. a copy of 0.. with rank 17's step 1 the longest.
    table = [{**r, "rank": r["rank"] + 8 * k} for k in range(3) for r in rep["step_table"]]
    slow = next(r for r in table if (r["rank"], r["step"]) == (17, 1))
    slow.update(step_ns=slow["step_ns"] + 5_000_000, free_ns=slow["free_ns"] + 5_000_000)
    md = report.to_markdown({**rep, "step_table": table})
    per_step = md.split("## Step time per rank")[1].split("\n## ")[0]
    assert "More than 16 ranks" in per_step
    assert per_step.count("\n| ") == 1 + 3  # head + one row per step
    steps1 = sorted(r["step_ns"] for r in table if r["step"] == 1)
    cell = " / ".join(report._ms(v) for v in (steps1[0], float(np.median(steps1)), steps1[-1]))
    row = next(line for line in per_step.splitlines() if line.startswith("| 1 | 24 | "))
    assert row.split(" | ")[2] == cell
    assert row.endswith(f"| 17 ({report._ms(slow['step_ns'])} ms) |")


def test_diff_compares_job_steps(bert):
    _, base = bert
    new = _build(scenarios.run("bert-train-dp", seed=1, steps=3).trace)
    table = compare(base, new)
    rows = {r["metric"]: r for r in table["metrics"]}
    assert (rows["job steps"]["base"], rows["job steps"]["new"], rows["job steps"]["change"]) == (3, 3, 0)
    assert rows["step time (ms)"]["base"] == pytest.approx(sum(BERT_JOB_STEP_NS) / 3 * 1e-6, rel=1e-12)
    assert rows["slowest job step (ms)"]["base"] == pytest.approx(max(BERT_JOB_STEP_NS) * 1e-6, rel=1e-12)
    assert table["multi_rank"] is True
    assert [(r["step"], r["base_ns"], r["base_slowest_rank"]) for r in table["steps"]] == \
        list(zip([0, 1, 2], BERT_JOB_STEP_NS, BERT_SLOWEST))
    assert [r["new_ns"] for r in table["steps"]] == [j["step_ns"] for j in new["job_steps"]]
    for r in table["steps"]:
        assert r["change"] == (r["new_ns"] - r["base_ns"]) / r["base_ns"]
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_diff(table, "a", "b"))
    lines = [[c.strip() for c in line.split("│")[1:-1]] for line in console.export_text().splitlines()
             if line.startswith("│")]
    assert ["job steps", "3", "3", "0%"] in lines
    assert ["0", "13.9", report._ms(table["steps"][0]["new_ns"]), pct(table["steps"][0]["change"], signed=True),
            f"5 -> {new['job_steps'][0]['slowest_rank']}"] in lines


def test_a_single_rank_keeps_its_own_step_figures():
    trace = scenarios.run("yolo-pipeline", seed=0, steps=4).trace
    frames = Frames(trace)
    ov = overview(frames)
    rep = report.build(trace, frames=frames, timelines=0, what_if=False)
    s = rep["summary"]
    assert (s["steps"], s["rank_steps"]) == (ov["steps"], ov["steps"]) == (4, 4)
    for key in ("step_time_ns_mean", "step_time_ns_max", "throughput_steps_per_s"):
        assert s[key] == ov[key], key
    assert "| steps | 4 | profiler steps |" in report.to_markdown(rep)
    info = summarize(trace)
    assert (info.steps, info.rank_steps, info.step_time_ns_mean) == (4, 4, ov["step_time_ns_mean"])
    base = compare(rep, rep)
    assert base["multi_rank"] is False and all(r["metric"] != "job steps" for r in base["metrics"])


def test_the_8_rank_dlrm_trace_has_one_job_step(real_traces):
    trace = load_any(real_traces / "kineto" / "dlrm_8rank")
    rep = _build(trace)
    assert (rep["summary"]["steps"], rep["summary"]["rank_steps"]) == (1, 8)
    (job,) = rep["job_steps"]
    # ProfilerStep#10 on each worker: rank 1 starts first (0.147 ms), rank 4 ends last (20.970 ms),
    # rank 1's own step is the longest (19.901 ms).
    assert (job["step"], job["start_ns"], job["end_ns"], job["step_ns"], job["ranks"]) == \
        (10, 147_000, 20_970_000, 20_823_000, 8)
    assert (job["slowest_rank"], job["last_rank"], job["rank_step_ns_max"], job["rank_step_ns_min"]) == \
        (1, 4, 19_901_000, 12_509_000)
    info = summarize(trace)
    assert (info.steps, info.rank_steps, info.step_time_ns_mean) == (1, 8, 20_823_000.0)
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render(info))
    assert "steps:          1 job step, mean 20.8 ms (first rank's start to last rank's end; 8 rank steps)" in \
        console.export_text().splitlines()
    table = rep["step_table"]
    assert [r["rank"] for r in table] == list(range(8))
    for r in table:
        assert r["computing_ns"] + r["communication_not_overlapped_ns"] + r["free_ns"] == r["step_ns"]
        assert 0 <= r["overlapped_ns"] <= r["communication_ns"] > 0


def test_cluster_step_trace_time_has_msprof_analyzes_header(bert, real_traces):
    _, rep = bert
    header = (real_traces / "ascend" / "cluster_step_trace_time.csv").read_text().splitlines()[0]
    import pandas as pd

    df = summaries.cluster_step_trace_time(pd.DataFrame(rep["step_table"]))
    assert ",".join(df.columns) == header
    r0 = rep["step_table"][0]
    assert df.iloc[0][["Step", "Type", "Index"]].tolist() == [0, "rank", 0]
    assert df.iloc[0]["Computing"] == r0["computing_ns"] / 1000 and df.iloc[0]["Stage"] == r0["step_ns"] / 1000


def test_the_exports_of_a_job_write_cluster_step_trace_time_csv_and_of_one_rank_do_not(bert, tmp_path):
    import pandas as pd

    from msprof_py.prof_dir import EXPORT_DIR, write_exports

    trace, rep = bert
    (tmp_path / "job").mkdir()
    write_exports(tmp_path / "job", trace)
    got = pd.read_csv(tmp_path / "job" / EXPORT_DIR / "cluster_step_trace_time.csv")
    want = summaries.cluster_step_trace_time(pd.DataFrame(rep["step_table"]))
    assert len(got) == 24 and list(got.columns) == list(summaries.CLUSTER_STEP_TRACE_TIME)
    assert got[["Step", "Index"]].values.tolist() == want[["Step", "Index"]].values.tolist()
    assert np.allclose(got[["Computing", "Free", "Stage"]].to_numpy(), want[["Computing", "Free", "Stage"]].to_numpy())
    (tmp_path / "one").mkdir()
    write_exports(tmp_path / "one", scenarios.run("yolo-pipeline", seed=0, steps=2).trace)
    assert not (tmp_path / "one" / EXPORT_DIR / "cluster_step_trace_time.csv").exists()
