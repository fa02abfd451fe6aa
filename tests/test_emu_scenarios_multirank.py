"""Multi-rank scenarios: each switch's problem must show in the trace table itself (Notify_Wait,
collective durations, link counters, copy rates, memory rows), against the healthy twin that
differs only by the switch; plus the sample traces' determinism.

Runs are cached per (scenario, switches, params): a multi-rank run takes 0.1-0.3 s.
"""

from __future__ import annotations

import filecmp
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msprof_py.trace import read_trace
from runtime_emu import scenarios
from runtime_emu.presets import PRESETS
from runtime_emu.scenarios import samples
from runtime_emu.scenarios.cluster_problems import (
    DATA_PARALLEL_SWITCHES,
    SLOW_LINK_FRACTION,
    SLOW_RANK_FACTOR,
)

P = PRESETS["910B3"]
NAMES = ("bert-train-dp", "llm-train-2server")
#: The healthy twin of bandwidth-contention: the same topology, without the prefetch.
TWIN = {"bert-train-dp": {"intra": "pcie"}, "llm-train-2server": {"roce_over_pcie": True}}
SAMPLES_DIR = Path(__file__).resolve().parents[1] / "sample_traces" / "emulated"


@lru_cache(maxsize=None)
def _run(name: str, switches: tuple[str, ...], params: tuple):
    return scenarios.run(name, switches=switches, **dict(params))


def run(name: str, *switches: str, **params):
    return _run(name, tuple(switches), tuple(sorted(params.items())))


def table(result) -> pd.DataFrame:
    return result.trace.to_pandas()


def problems(result, switch: str) -> list[dict]:
    found = [p for p in result.ground_truth["problems"] if p["problem"] == switch]
    assert found, f"no {switch} problem recorded"
    return found


def collectives(df: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's collective rows in issue order, with their Notify_Wait (0 when none was recorded)."""
    coll = df[(df.kind == "collective") & (df["rank"] == rank)].sort_values("corr")
    waits = df[(df.name == "Notify_Wait") & (df["rank"] == rank)].set_index("corr").dur
    return coll.assign(wait=coll["corr"].map(waits).fillna(0).astype("int64"),
                       end=coll.ts + coll.dur, seq=[json.loads(a)["seq"] for a in coll.args])


def overlaps(a_start, a_end, b_start, b_end) -> bool:
    return a_start < b_end and b_start < a_end


# ---------------------------------------------------------------------- registry and every switch
def test_registry_lists_the_multi_rank_scenarios_with_their_paragraph_and_switches():
    multi = {s.name: s for s in scenarios.list_scenarios() if s.multi_rank}
    assert sorted(multi) == sorted([*NAMES, "llm-pipeline"])
    assert (multi["bert-train-dp"].ranks, multi["llm-train-2server"].ranks, multi["llm-pipeline"].ranks) == (8, 16, 4)
    for s in multi.values():
        assert s.description.strip() and "\n\n" not in s.description.strip(), s.name
        assert s.default_steps >= 2
        assert s.switches == (frozenset({"pipeline-bubble"}) if s.name == "llm-pipeline"
                              else frozenset(DATA_PARALLEL_SWITCHES)), s.name


@pytest.mark.parametrize("call, message", [
    (lambda: scenarios.run("bert-train-dp", switches=["serial-copies"]), "unsupported switch 'serial-copies'"),
    (lambda: scenarios.run("resnet50-infer", switches=["slow-rank"]), "unsupported switch 'slow-rank'"),
    (lambda: scenarios.run("bert-train-dp", switches=["bandwidth-contention"], intra="hccs"), "needs intra='pcie'"),
    (lambda: scenarios.run("llm-train-2server", switches=["bandwidth-contention"], roce_over_pcie=False),
     "needs roce_over_pcie=True"),
    (lambda: scenarios.run("llm-train-2server", ranks=6 + 1), "multiple of 2 servers"),
    (lambda: scenarios.run("bert-train-dp", problem_rank=8), "problem_rank must be 0..7"),
    (lambda: scenarios.run("bert-train-dp", intra="nvlink"), "intra must be 'hccs' or 'pcie'"),
])
def test_bad_choices_raise_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("switch", [None, *sorted(DATA_PARALLEL_SWITCHES)])
def test_every_multi_rank_scenario_runs_healthy_and_with_each_switch(name, switch):
    result = run(name, *([switch] if switch else []))
    df = table(result)
    scenario = scenarios.SCENARIOS[name]
    world = scenario.ranks
    assert result.trace.meta.world_size == world == df["rank"].nunique()
    steps = df[df.kind == "step"]
    # ProfilerStep#0..#n-1 on every rank, each rank's host thread named.
    assert {r: sorted(g.name) for r, g in steps.groupby("rank")} == {
        r: [f"ProfilerStep#{i}" for i in range(scenario.default_steps)] for r in range(world)}
    named = df[(df.kind == "meta") & (df.name == "thread_name") & (df.pid == 1_000_000 + df["rank"])]
    assert set(named["rank"]) == set(range(world))
    assert set(df.kind) >= {"kernel", "memcpy", "collective", "launch", "step", "alloc", "free"}
    found = result.ground_truth["problems"]
    if switch is None:
        assert found == []
        return
    trace_end = int((df.ts + df.dur.fillna(0)).max())
    assert found and {p["problem"] for p in found} == {switch}
    for p in found:
        assert set(p) == {"problem", "where", "when", "expected", "detail"}
        w = p["where"]
        assert 0 <= w["rank"] < world and w["stream"] in set(df[df["rank"] == w["rank"]].stream.dropna())
        assert 0 <= p["when"]["start_ns"] < p["when"]["end_ns"] <= trace_end
        assert p["expected"] and p["detail"] and p["expected"].get("manifested", True)
    assert json.loads(json.dumps(found)) == found


@pytest.mark.parametrize("name", NAMES)
def test_all_switches_at_once_each_problem_still_shows(name):
    found = run(name, *sorted(DATA_PARALLEL_SWITCHES)).ground_truth["problems"]
    assert {p["problem"] for p in found} == set(DATA_PARALLEL_SWITCHES)
    assert all(p["expected"].get("manifested", True) for p in found)


@pytest.mark.parametrize("name", NAMES)
def test_healthy_runs_raise_no_warning_in_the_analyzers(name):
    analyzers = pytest.importorskip("analyzers")
    findings = analyzers.run(run(name).trace).findings
    assert [f.code for f in findings if f.severity >= analyzers.Severity.WARNING] == []


def test_collective_algorithms_follow_the_topology():
    def algs(result):
        return {(c["op"], c["algorithm"]) for c in result.ground_truth["hccl"]["collectives"]}

    assert algs(run("bert-train-dp")) == {("allReduce", "mesh")}
    assert algs(run("bert-train-dp", intra="pcie")) == {("allReduce", "ring")}
    assert algs(run("llm-train-2server")) == {("reduceScatter", "hierarchical"), ("allGather", "hierarchical")}
    assert algs(run("llm-train-2server", zero=False, steps=1)) == {("allReduce", "hierarchical")}


# ---------------------------------------------------------------------- determinism and storage
def test_same_seed_gives_the_same_trace_and_another_seed_does_not():
    a = scenarios.run("bert-train-dp", switches=["slow-rank"], seed=4, steps=2)
    b = scenarios.run("bert-train-dp", switches=["slow-rank"], seed=4, steps=2)
    assert a.trace.table.equals(b.trace.table) and a.ground_truth == b.ground_truth
    assert not a.trace.table.equals(scenarios.run("bert-train-dp", switches=["slow-rank"], seed=5, steps=2).trace.table)


@pytest.mark.parametrize("name", NAMES)
def test_saved_trace_is_partitioned_by_rank_with_world_size_and_topology(tmp_path, name):
    result = run(name)
    out = result.save(tmp_path / name)
    world = scenarios.SCENARIOS[name].ranks
    assert sorted(p.name for p in (out / "trace").iterdir()) == sorted(f"rank={r}" for r in range(world))
    back = read_trace(out / "trace")
    assert back.table.num_rows == result.trace.table.num_rows
    meta = back.meta
    assert meta.world_size == world
    topo = meta.extra["topology"]
    assert topo["servers"] * topo["devices_per_server"] == world
    assert (topo["servers"], topo["intra"]) == ((1, "hccs") if name == "bert-train-dp" else (2, "hccs"))
    assert json.loads((out / "ground_truth.json").read_text())["problems"] == []


# ---------------------------------------------------------------------- each problem, seen in the trace
@pytest.mark.parametrize("name", NAMES)
def test_slow_rank_makes_the_others_wait_in_notify_wait(name):
    result = run(name, "slow-rank")
    (p,) = problems(result, "slow-rank")
    slow = p["where"]["rank"]
    df, healthy = table(result), table(run(name))
    world = scenarios.SCENARIOS[name].ranks
    waits = {r: collectives(df, r).wait for r in range(world)}
    healthy_waits = {r: collectives(healthy, r).wait for r in range(world)}
    assert waits[slow].max() <= 1_000 and p["expected"]["slow_rank_max_wait_ns"] == waits[slow].max()
    others = pd.concat([waits[r] for r in range(world) if r != slow])
    # The backward's gradient collectives: every other rank waits there, far longer than healthy
    # (but for the embedding's, which the slow rank reaches right behind the previous bucket).
    grads = collectives(df, 0).name.isin(["hcom_allReduce", "hcom_reduceScatter"]).to_numpy()
    for r in range(world):
        if r != slow:
            assert np.median(waits[r].to_numpy()[grads]) > 1_000_000
            assert waits[r].mean() > 20 * max(1, healthy_waits[r].mean())
    assert others.mean() == pytest.approx(p["expected"]["others_mean_wait_ns"], rel=1e-6)
    kernels = df[df.kind == "kernel"].groupby("rank").dur.sum()
    assert kernels[slow] == pytest.approx(SLOW_RANK_FACTOR * kernels.drop(slow).mean(), rel=0.02)
    assert p["expected"]["kernel_ns"] == {str(r): int(ns) for r, ns in kernels.items()}


@pytest.mark.parametrize("name", NAMES)
def test_slow_link_makes_every_collective_crossing_it_slower(name):
    result = run(name, "slow-link")
    (p,) = problems(result, "slow-link")
    df, healthy = table(result), table(run(name))
    slow = collectives(df, 0).set_index("seq").dur
    base = collectives(healthy, 0).set_index("seq").dur
    assert list(slow.index) == list(base.index) and len(slow) == p["expected"]["collectives"]
    assert (slow / base).min() > 1.3
    # The link's bandwidth counter never goes past the degraded rate; healthy, it reaches nominal.
    expected = p["expected"]
    assert expected["gbps"] == pytest.approx(SLOW_LINK_FRACTION * expected["nominal_gbps"])
    for link in expected["links"]:
        rates = df[df.name == f"{link} GB/s"].value
        assert 0 < rates.max() <= expected["gbps"] + 1e-9 and expected["link_bytes"][link] > 0
        assert healthy[healthy.name == f"{link} GB/s"].value.max() == pytest.approx(expected["nominal_gbps"])


@pytest.mark.parametrize("name", NAMES)
def test_bandwidth_contention_slows_the_collectives_and_the_copies_sharing_pcie(name):
    result = run(name, "bandwidth-contention")
    df, twin = table(result), table(run(name, **TWIN[name]))
    assert result.trace.meta.extra["topology"] == run(name, **TWIN[name]).trace.meta.extra["topology"]
    found = problems(result, "bandwidth-contention")
    assert sorted(p["where"]["rank"] for p in found) == list(range(scenarios.SCENARIOS[name].ranks))
    slowdowns = []
    for p in found:
        rank = p["where"]["rank"]
        copies = df[(df["rank"] == rank) & (df.kind == "memcpy") & (df.stream == p["where"]["stream"])]
        assert len(copies) == p["expected"]["copies"] and set(copies.bytes) == {p["expected"]["copy_bytes"]}
        mine, base = collectives(df, rank).set_index("seq"), collectives(twin, rank).set_index("seq")
        hit = [seq for seq, c in mine.iterrows()
               if any(overlaps(c.ts, c.end, s, s + d) for s, d in zip(copies.ts, copies.dur))]
        assert hit == [c["seq"] for c in p["expected"]["collectives_overlapped"]] and hit
        # Only a collective's PCIe phases can meet a copy (with RoCE over PCIe, its inter-server phase).
        ratio = mine.dur[hit] / base.dur[hit]
        assert (ratio >= 1).all() and (ratio > 1.05).mean() > 0.6
        slowdowns.append(ratio.mean())
        # Copies that met a collective ran below PCIe bandwidth.
        met = copies[[any(overlaps(c.ts, c.ts + c.dur, s, e) for s, e in zip(mine.ts[hit], mine.end[hit]))
                      for c in copies.itertuples()]]
        gbps = met.bytes / met.dur
        assert gbps.max() < 1.0001 * P.pcie_gbps and gbps.min() < 0.6 * P.pcie_gbps
        assert p["expected"]["copy_gbps"] == pytest.approx(copies.bytes.sum() / copies.dur.sum(), abs=1e-3)
        assert p["expected"]["copy_gbps"] < 0.96 * P.pcie_gbps
    assert np.mean(slowdowns) > (1.5 if name == "bert-train-dp" else 1.1)
    assert not ((twin.kind == "memcpy") & (twin.bytes >= 4 * 1024 * 1024)).any()  # the twin has no prefetch


@pytest.mark.parametrize("name", NAMES)
def test_leak_grows_live_bytes_on_one_rank_only(name):
    result = run(name, "leak")
    (leak,) = problems(result, "leak")
    rank, per_step = leak["where"]["rank"], leak["expected"]["leak_bytes_per_step"]
    df = table(result)
    mem = df[df.kind.isin(["alloc", "free"])]
    steps = df[df.kind == "step"]
    for r, g in mem.groupby("rank"):
        signed = np.where(g.kind == "alloc", g.bytes, -g.bytes)
        ends = (steps[steps["rank"] == r].ts + steps[steps["rank"] == r].dur).sort_values()
        live = np.array([signed[(g.ts <= e).to_numpy()].sum() for e in ends])
        assert list(np.diff(live)) == [per_step if r == rank else 0] * (len(live) - 1), r
    leaked = mem[mem.addr.isin(leak["expected"]["addresses"])]
    assert set(leaked["rank"]) == {rank} and set(leaked.kind) == {"alloc"}
    assert set(leaked.name) == {f"[memory] {leak['where']['call_site']}"}


# ---------------------------------------------------------------------- sample traces
def test_sample_traces_regenerate_byte_identical(tmp_path):
    if not SAMPLES_DIR.is_dir():
        pytest.skip("sample_traces/emulated is not in this checkout")
    samples.generate(tmp_path)
    committed = sorted(p.relative_to(SAMPLES_DIR) for p in SAMPLES_DIR.rglob("*") if p.is_file())
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh == committed
    _, mismatch, errors = filecmp.cmpfiles(SAMPLES_DIR, tmp_path, [str(p) for p in committed], shallow=False)
    assert mismatch == errors == []
    assert all((SAMPLES_DIR / p).stat().st_size < 2 << 20 for p in committed)
