"""What-if (analyzers.whatif, msprof_py.whatif_eval, `msprof-py whatif`, `eval --what-if`): each
remedy's prediction against the program fixed for real; a remedy never saves more than the time
its evidence holds, on every shared real trace and scenario; the fix shown in analyze, the
Markdown and HTML reports; the step table; the CLI's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import analyzers
from analyzers import Frames
from analyzers.causality.critical_path import job_graph
from analyzers.causality.replay import REMEDY_DOCS, Remedy, replay
from analyzers.whatif import predict
from msprof_py import report, whatif_eval
from msprof_py.trace import read_trace
from msprof_py.trace.importers import import_trace
from runtime_emu import scenarios
from tests.test_causality import REAL

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "emulated"
NO_TRIPLE = SAMPLES / "yolo-pipeline-no-triple-buffer"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("msprof-py")), *args], capture_output=True, text=True,
                          timeout=600, cwd=str(ROOT))


# ---------------------------------------------------------------- the evidence bounds every saving
def _evidence(frames: Frames, name: str) -> int:
    """The most a remedy can save: the time of what it edits (host calls it shortens, device work
    it shortens or moves, the waits it removes), read from the graph's own calls and tasks."""
    jg = job_graph(frames)
    calls = [g.calls for g in jg.graphs.values()]
    tasks = [g.tasks for g in jg.graphs.values()]
    dur = lambda df, m: int((df["end"] - df["ts"])[m].sum())  # noqa: E731
    if name in ("launch", "compile"):
        klass = "launch" if name == "launch" else "op_compile"
        return sum(int(np.clip((c["end"] - c["ts"])[c["klass"] == klass] - 2_000, 0, None).sum()) for c in calls)
    if name == "data":
        return sum(dur(c, c["klass"].isin(("data_load", "host_work"))) for c in calls)
    if name in ("sync", "pipeline"):
        return sum(dur(c, c["klass"] == "sync") for c in calls)
    if name == "pinned":
        return sum(dur(c, c["klass"] == "blocking_copy") for c in calls)
    if name == "queue":
        return sum(dur(c, c["klass"] == "queue") for c in calls)
    if name == "copy":  # the copies moved and the synchronizes that no longer wait
        return (sum(dur(t, t["kind"] == "memcpy") for t in tasks)
                + sum(dur(c, c["klass"].isin(("sync", "blocking_copy"))) for c in calls))
    if name in ("straggler", "spread"):
        return sum(dur(t, t["kind"] == "kernel") for t in tasks)
    if name in ("link", "overlap"):  # collectives sped up / moved under compute: at most their own time
        return sum(dur(t, t["kind"] == "collective") for t in tasks)
    if name == "stagger":  # the copies that shared a link sped up: never more than their own time
        return sum(dur(t, t["kind"].isin(("memcpy", "memset"))) for t in tasks)
    if name == "priority":  # the kernels' waits for cores other streams held
        from analyzers.causality.contention import release_waits

        return int(release_waits(frames)["wait_ns"].sum())
    if name == "microbatches":  # the pipeline's steps shrink: never more than any stage idled in them
        from analyzers.causality.pipeline import find

        out = 0
        for pipe in find(frames):
            st = pipe.steps
            phase = st.groupby("step")["end"].transform("max") - st.groupby("step")["start"].transform("min")
            out += int((phase - st["work_ns"]).groupby(st["rank"]).sum().min())
        return out
    raise AssertionError(name)


def _bounded(trace) -> dict[str, int]:
    frames = Frames(trace)
    out = {}
    for name in REMEDY_DOCS:
        saving = replay(frames, [Remedy(name)]).saving_ns
        # Raising a stream's priority takes cores from the others: the run may get longer (what-if
        # shows no saving then); every other remedy only takes work or waits away.
        low = -np.inf if name == "priority" else 0
        assert low <= saving <= _evidence(frames, name), (name, saving, _evidence(frames, name))
        out[name] = saving
    return out


@pytest.mark.parametrize("name", REAL)
def test_no_remedy_saves_more_than_its_evidence_on_a_shared_real_trace(real_traces, name):
    _bounded(import_trace(real_traces / name))


@pytest.mark.parametrize("name, switches", [
    ("resnet50-infer", ("launch-bound",)), ("resnet50-infer", ("serial-copies",)),
    ("resnet50-infer", ("queue-congestion",)), ("yolo-pipeline", ()), ("bert-train-dp", ("slow-rank",)),
    ("llm-pipeline", ("pipeline-bubble",)),
])
def test_no_remedy_saves_more_than_its_evidence_on_a_scenario(name, switches):
    s = scenarios.SCENARIOS[name]
    _bounded(scenarios.run(name, seed=1, switches=switches, **({"steps": 2} if s.multi_rank else {})).trace)


def test_the_copy_remedy_never_turns_unexplained_time_into_a_saving(real_traces):
    # tiny_base: three 3-4 us input copies on the compute stream, the first after 2.6 ms in which
    # nothing recorded ran: double-buffering them saves their own time, not the silence before.
    r = replay(Frames(import_trace(real_traces / "kineto" / "tiny_base.json.gz")), [Remedy("copy")])
    assert r.saving_ns == 7_000


# ---------------------------------------------------------------- against the real fix
PASSING = [
    "bert-train-dp slow-rank seed 0", "bert-train-dp slow-link seed 0", "llm-train-2server slow-rank seed 0",
    "llm-train-2server slow-link seed 0", "resnet50-infer serial-copies seed 0", "resnet50-infer launch-bound seed 0",
    "yolo-pipeline serial-copies seed 0", "yolo-pipeline queue-congestion seed 0", "yolo-pipeline launch-bound seed 0",
    "yolo-pipeline triple_buffer=false seed 0", "app sync_every_kernel", "app serial_copy", "app narrow_kernels",
    "resnet50-infer bandwidth-contention seed 0", "yolo-pipeline bandwidth-contention seed 0", "app host_preprocess",
    "resnet50-infer queue-congestion seed 0", "app core_starvation", "bert-train-dp no-overlap seed 0",
    "llm-train-2server no-overlap seed 0", "app allreduce_after_backward",
    "bert-train-dp bandwidth-contention seed 0", "llm-train-2server bandwidth-contention seed 0",
    "llm-pipeline pipeline-bubble seed 0",
]


@pytest.fixture(scope="module")
def seed0_pairs() -> dict[str, whatif_eval.Pair]:
    return {p.label: p for p in whatif_eval.pairs(seeds=(0,))}


@pytest.mark.parametrize("label", PASSING)
def test_the_prediction_from_the_problem_trace_is_within_10_percent_of_the_real_fix(seed0_pairs, label):
    row = whatif_eval.check(seed0_pairs[label])
    assert row.real_ns > 0 and row.ok, row.to_dict()


def test_the_pairs_cover_every_scenario_switch_with_a_mechanical_fix(seed0_pairs):
    assert sorted(seed0_pairs) == sorted(PASSING)
    # The remedies the real fixes are checked against, by pair.
    got = {p.label: p.codes for p in seed0_pairs.values()}
    assert got["yolo-pipeline triple_buffer=false seed 0"] == ("BUBBLE_DATA", "BUBBLE_COPY")
    assert got["resnet50-infer queue-congestion seed 0"] == ("QUEUE_CONGESTION",)


def test_a_straggler_equalised_releases_its_peers_at_the_next_to_last_arrival():
    # The slow rank's kernels at the others' median: the whole job moves, not only that rank.
    bad = scenarios.run("bert-train-dp", seed=1, switches=["slow-rank"], steps=2).trace
    r = replay(Frames(bad), [Remedy.parse("straggler@3")])
    old, new = bad.table.to_pandas(), r.trace.table.to_pandas()
    kernels = old["kind"] == "kernel"
    ends_old = (old["ts"] + old["dur"])[kernels].groupby(old["rank"][kernels]).max()
    ends_new = (new["ts"] + new["dur"])[kernels].groupby(new["rank"][kernels]).max()
    assert ((ends_old - ends_new) > 0.9 * r.saving_ns).all() and r.saving_ns > 9_000_000


# ---------------------------------------------------------------- where users see it
def test_findings_carry_their_fix_in_json_markdown_and_html(tmp_path):
    trace = read_trace(NO_TRIPLE / "trace")
    rep = report.build(trace)
    # The serial pipeline: double-buffering its copies (and so waiting for the batch before, not
    # the one just queued) is worth far more than the 1.37 ms of idle its copies show.
    [copy] = [f for f in rep["findings"] if f["code"] == "BUBBLE_COPY"]
    assert copy["what_if"] == {"remedy": "copy", "saving_ns": 11216744, "saving_share": 0.411089,
                               "span_ns": 27285470, "new_span_ns": 16068726}
    assert copy["cost"] == 11216744 and copy["lost_ns"] == 1368320 and copy["severity"] == "critical"
    assert rep["findings"][0]["code"] == "BUBBLE_COPY"
    md = report.to_markdown(rep)
    assert "### 1. [critical] Device idle: waiting on a copy (BUBBLE_COPY)" in md
    assert "lost: 1.37 ms\n- fix: copy -> saves 11.2 ms (41.1%)\n" in md
    out = tmp_path / "r.html"
    report.write(rep, out, "html")
    assert '<p class="fix"><b>fix: copy -&gt; saves 11.2 ms (41.1%)</b></p>' in out.read_text()


def test_without_what_if_the_report_keeps_the_measured_costs():
    rep = report.build(read_trace(NO_TRIPLE / "trace"), what_if=False)
    assert [(f["code"], f["cost"], f["what_if"]) for f in rep["findings"]][:2] == [
        ("BUBBLE_DATA", 8936624.0, None), ("BUBBLE_COPY", 1368320.0, None)]
    assert "fix:" not in report.to_markdown(rep)


def test_the_what_if_of_a_finding_is_scoped_to_the_ranks_it_was_found_on():
    from analyzers.finding import Finding, Severity
    from analyzers.whatif import remedy_for

    f = Finding("BUBBLE_DATA", Severity.INFO, "", "", rank=2)
    assert remedy_for(f, {"BUBBLE_DATA": {2}}, {0, 1, 2, 3}) == Remedy("data", None, (2,))
    assert remedy_for(f, {"BUBBLE_DATA": {0, 1, 2, 3}}, {0, 1, 2, 3}) == Remedy("data")
    assert remedy_for(Finding("SLOW_RANK", Severity.INFO, "", "", rank=3), {}, {0, 1, 2, 3}) == \
        Remedy("straggler", None, (3,))
    assert remedy_for(Finding("BUBBLE_OTHER", Severity.INFO, "", "", rank=0), {}, {0}) is None


def test_core_contention_raises_its_own_stream_and_prefetches_yield_pcie_to_the_collectives():
    from analyzers.finding import Finding, Severity
    from analyzers.whatif import remedy_for

    starved = Finding("CORE_CONTENTION", Severity.INFO, "", "", rank=0, stream=2)
    assert remedy_for(starved, {}, {0}) == Remedy("priority", 2, (0,))
    on_two = Finding("CORE_CONTENTION", Severity.INFO, "", "", rank=1, stream=2, ranks=[0])
    assert remedy_for(on_two, {}, {0, 1}) == Remedy("priority", 2, (0, 1))
    # bert-train-dp's prefetches share PCIe with the AllReduce (the topology puts collectives on
    # the copies' links): staggering gives the collectives back the time the copies took from
    # them, never more than the copies ran past their time alone (25 GB/s, as the preset says).
    trace = scenarios.run("bert-train-dp", seed=0, switches=("bandwidth-contention",), steps=2).trace
    frames = Frames(trace)
    found = [f for f in analyzers.run(trace, frames=frames).findings if f.code == "BANDWIDTH_CONTENTION"]
    predict(frames, found)
    # One problem on all eight ranks: one finding.
    assert len(found) == 1 and sorted([found[0].rank, *found[0].ranks]) == list(range(8))
    (f,) = found
    assert f.what_if["remedy"] == "stagger" and f.cost == f.what_if["saving_ns"] > 0
    ops = frames.device_ops
    h2d = ops[(ops["kind"] == "memcpy") & (ops["bytes"] == 32 << 20)]
    extra = (h2d["dur"] - (trace.meta.extra["preset"]["copy_latency_ns"] + h2d["bytes"] / 25.0)).clip(lower=0)
    per_rank = extra.groupby(h2d["rank"]).sum()
    assert f.what_if["saving_ns"] <= per_rank.max()
    assert f.severity == Severity.CRITICAL


# ---------------------------------------------------------------- the CLI
def test_whatif_prints_each_steps_time_before_and_after():
    res = cli("whatif", str(NO_TRIPLE), "--remedy", "data", "--remedy", "copy", "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["remedies"] == ["data", "copy"]
    steps = got["steps"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3, 4, 5, None]
    assert all(r["before_ns"] - r["after_ns"] == r["saving_ns"] for r in steps)
    assert steps[-1]["before_ns"] == 27285470 and steps[-1]["saving_ns"] == replay(
        Frames(read_trace(NO_TRIPLE / "trace")), [Remedy("data"), Remedy("copy")]).saving_ns
    text = cli("whatif", str(NO_TRIPLE), "--remedy", "data")
    assert text.returncode == 0 and "run span" in text.stdout and "27.3 ms" in text.stdout


@pytest.mark.parametrize("args, message", [
    (("--remedy", "bogus"), "unknown remedy 'bogus': choose one of " + ", ".join(REMEDY_DOCS)),
    (("--remedy", "data@x"), "remedy 'data@x': after @ give ranks as integers, e.g. data@3 or data@0,2"),
])
def test_whatif_refuses_what_it_does_not_understand_in_one_line(args, message):
    res = cli("whatif", str(NO_TRIPLE), *args)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip() == f"msprof-py: error: {message}" and "Traceback" not in res.stderr


def test_eval_what_if_quick_prints_the_ci_pairs_all_within_tolerance():
    res = cli("eval", "--what-if", "--quick", "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["tolerance"] == 0.1
    assert [(p["pair"], p["ok"]) for p in got["pairs"]] == [
        ("bert-train-dp slow-rank seed 0", True), ("resnet50-infer launch-bound seed 0", True),
        ("yolo-pipeline queue-congestion seed 0", True), ("app sync_every_kernel", True)]


def test_eval_what_if_refuses_a_scenario_filter():
    res = cli("eval", "--what-if", "--scenario", "resnet50-infer")
    assert res.returncode == 2
    assert res.stderr.strip() == "msprof-py: error: --what-if runs its own pairs of programs; drop --scenario"


def test_the_public_replay_takes_a_path_and_remedy_texts_and_returns_a_trace():
    import msprof_py

    t = msprof_py.replay(str(NO_TRIPLE), remedies=["copy"])
    assert t.meta.extra["replay"] == {"remedies": ["copy"], "span_ns": 27285470, "new_span_ns": 16068726,
                                      "saving_ns": 11216744}
    assert len(t) == len(read_trace(NO_TRIPLE / "trace"))
    with pytest.raises(ValueError, match="unknown remedy 'x'"):
        msprof_py.replay(t, remedies=["x"])


def test_rows_that_are_no_node_move_with_their_thread_or_device(tmp_path):
    # Counters, memory events and accesses follow the device's tasks, host rows their thread: the
    # re-timed trace's own span (what `diff` compares) shrinks by the saving, as the fixed run's.
    trace = read_trace(NO_TRIPLE / "trace")
    r = replay(Frames(trace), [Remedy("copy")])
    lo, hi = Frames(trace).span
    lo2, hi2 = Frames(r.trace).span
    assert (hi - lo) - (hi2 - lo2) == pytest.approx(r.saving_ns, rel=0.02)
    counters = r.trace.table.to_pandas()
    counters = counters[counters["kind"] == "counter"]
    assert counters["ts"].max() <= hi2
