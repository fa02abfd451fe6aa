"""The scenario library: each switch's problem must be visible in the trace table itself (not only in
ground_truth.json), and each healthy twin must be free of it.

Runs are cached per (scenario, switches, seed, params): a run takes a few tens of milliseconds.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd
import pytest

from runtime_emu import Switches, scenarios
from runtime_emu.presets import PRESETS
from runtime_emu.scenarios.problems import FLOOD_QUEUE_TASKS, FRAG_REQUEST_BYTES, SWITCHES

P = PRESETS["910B3"]
NAMES = ("resnet50-infer", "yolo-pipeline")
DEVICE_KINDS = ("kernel", "memcpy", "memset")


@lru_cache(maxsize=None)
def _run(name: str, switches: tuple[str, ...] = (), seed: int = 0, params: tuple = ()):
    return scenarios.run(name, switches=switches, seed=seed, **dict(params))


def run(name: str, *switches: str, seed: int = 0, **params):
    return _run(name, tuple(switches), seed, tuple(sorted(params.items())))


def table(result) -> pd.DataFrame:
    return result.trace.to_pandas()


def problems(result, switch: str) -> list[dict]:
    found = [p for p in result.ground_truth["problems"] if p["problem"] == switch]
    assert found, f"no {switch} problem recorded"
    return found


def end(rows: pd.DataFrame) -> pd.Series:
    return rows.ts + rows.dur.fillna(0).astype("int64")


def busy_ns(rows: pd.DataFrame, start: int, stop: int) -> int:
    """Union of the rows' intervals clipped to [start, stop)."""
    spans = sorted((s, e) for s, e in zip(np.maximum(rows.ts, start), np.minimum(end(rows), stop)) if s < e)
    busy, reach = 0, start
    for s, e in spans:
        if e > reach:
            busy += e - max(s, reach)
            reach = e
    return int(busy)


def idle_gaps(rows: pd.DataFrame, min_ns: int) -> list[int]:
    """Gaps of at least min_ns between the rows' merged intervals."""
    gaps, reach = [], None
    for s, e in sorted(zip(rows.ts, end(rows))):
        if reach is not None and s - reach >= min_ns:
            gaps.append(int(s - reach))
        reach = e if reach is None else max(reach, e)
    return gaps


def overlap(a_start, a_end, b_start, b_end) -> int:
    return max(0, min(a_end, b_end) - max(a_start, b_start))


# ---------------------------------------------------------------------- registry and run()
def test_registry_lists_each_scenario_with_its_paragraph_and_switches():
    listed = [s for s in scenarios.list_scenarios() if not s.multi_rank]  # multi-rank: test_emu_scenarios_multirank
    assert [s.name for s in listed] == sorted(NAMES)
    for s in listed:
        assert s.description.strip() and "\n\n" not in s.description.strip(), s.name
        assert s.switches == frozenset(SWITCHES) and s.default_steps >= 2
        assert scenarios.SCENARIOS[s.name] is s and s.__doc__ == s.description


@pytest.mark.parametrize("call, message", [
    (lambda: scenarios.run("bert-pretrain"), "unknown scenario 'bert-pretrain'; choose one of .*resnet50-infer, yolo"),
    (lambda: scenarios.run("resnet50-infer", switches=["oom"]), "unknown switch 'oom'.*choose from "
                                                                 "bandwidth-contention, fragmentation"),
    (lambda: scenarios.run("resnet50-infer", switches="leak", batch_size=8), "unknown parameter 'batch_size'.*batch"),
    (lambda: scenarios.run("resnet50-infer", ranks=8), "single-rank; ranks must be 1"),
    (lambda: scenarios.run("resnet50-infer", steps=0), "steps must be >= 1"),
    (lambda: scenarios.run("yolo-pipeline", switches=["serial-copies", "missing-sync"]), "cannot be on together"),
    (lambda: scenarios.run("yolo-pipeline", switches=["missing-sync"], triple_buffer=False), "needs triple_buffer"),
    (lambda: scenarios.run("resnet50-infer", preset="A100"), "unknown device preset 'A100'"),
])
def test_bad_choices_raise_value_errors_naming_the_valid_ones(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("switch", [None, *sorted(SWITCHES)])
def test_every_scenario_runs_healthy_and_with_each_switch(name, switch):
    result = run(name, *([switch] if switch else []))
    df = table(result)
    assert set(df.kind) >= {"kernel", "memcpy", "step", "launch", "alloc", "free"}
    assert (df.kind == "step").sum() == scenarios.SCENARIOS[name].default_steps
    found = result.ground_truth["problems"]
    if switch is None:
        assert found == []
        return
    trace_end = int(end(df).max())
    streams = set(df.stream.dropna().astype(int))
    assert found and {p["problem"] for p in found} == {switch}
    for p in found:
        assert set(p) == {"problem", "where", "when", "expected", "detail"}
        assert p["where"]["rank"] == 0 and p["where"]["device"] == 0 and p["where"]["stream"] in streams
        assert 0 <= p["when"]["start_ns"] <= p["when"]["end_ns"] <= trace_end
        assert p["expected"] and isinstance(p["detail"], str) and p["detail"]
    assert json.loads(json.dumps(found)) == found  # plain JSON: ground_truth.json holds it as is


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("left_out", ["missing-sync", "serial-copies"])  # the two cannot be on together
def test_switches_combine_and_each_problem_still_shows(name, left_out):
    on = set(SWITCHES) - {left_out}
    found = run(name, *sorted(on)).ground_truth["problems"]
    assert {p["problem"] for p in found} == on
    assert all(p["expected"].get("manifested", True) for p in found)


def test_same_seed_gives_the_same_trace_and_another_seed_does_not():
    a, b = scenarios.run("resnet50-infer", switches=["leak"], seed=5), scenarios.run("resnet50-infer",
                                                                                       switches=["leak"], seed=5)
    assert a.trace.table.equals(b.trace.table) and a.ground_truth == b.ground_truth
    assert not a.trace.table.equals(scenarios.run("resnet50-infer", switches=["leak"], seed=6).trace.table)
    y1, y2 = run("yolo-pipeline", seed=1), scenarios.run("yolo-pipeline", seed=1)
    assert y1.trace.table.equals(y2.trace.table)
    assert not y1.trace.table.equals(run("yolo-pipeline", seed=2).trace.table)


def test_saved_ground_truth_holds_the_problems(tmp_path):
    result = run("yolo-pipeline", "missing-sync")
    saved = json.loads((result.save(tmp_path / "out") / "ground_truth.json").read_text())
    assert saved["problems"] == result.ground_truth["problems"]


# ---------------------------------------------------------------------- each problem, seen in the trace
def live_bytes_at_step_ends(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Net live bytes (all allocators, from alloc/free rows) and the caching allocator's 'Total
    Allocated' at each ProfilerStep end."""
    mem = df[df.kind.isin(["alloc", "free"])]
    signed = np.where(mem.kind == "alloc", mem.bytes, -mem.bytes)
    caching = mem[mem.args.str.contains('"Allocator":"caching"')]
    ends = end(df[df.kind == "step"].sort_values("ts"))
    live = np.array([signed[(mem.ts <= e).to_numpy()].sum() for e in ends])
    allocated = np.array([caching.value[caching.ts <= e].iloc[-1] for e in ends])
    return live, allocated


@pytest.mark.parametrize("name", NAMES)
def test_leak_grows_live_bytes_by_the_leak_size_every_step(name):
    (leak,) = problems(run(name, "leak"), "leak")
    per_step = leak["expected"]["leak_bytes_per_step"]
    assert per_step >= 1 << 20 and leak["where"]["call_site"]
    df = table(run(name, "leak"))
    live, allocated = live_bytes_at_step_ends(df)
    assert list(np.diff(live)) == [per_step] * (len(live) - 1)
    # Each leaked address ends the run allocated, by the tagged call site.
    mem = df[df.kind.isin(["alloc", "free"])].sort_values("ts", kind="stable")
    leaked = mem.groupby("addr").tail(1).set_index("addr").loc[leak["expected"]["addresses"]]
    assert (leaked.kind == "alloc").all() and set(leaked.bytes) == {per_step}
    assert set(leaked.name) == {f"[memory] {leak['where']['call_site']}"}
    assert list(np.diff(allocated)) == [per_step] * (len(live) - 1)
    healthy_live, healthy_allocated = live_bytes_at_step_ends(table(run(name)))
    assert not np.diff(healthy_live).any() and not np.diff(healthy_allocated).any()


@pytest.mark.parametrize("name", NAMES)
def test_fragmentation_holds_reserved_far_above_allocated_and_a_large_request_fails(name):
    result = run(name, "fragmentation")
    (frag,) = problems(result, "fragmentation")
    df = table(result)
    t0, t1 = frag["when"]["start_ns"], frag["when"]["end_ns"]
    counters = df[(df.kind == "counter") & df.ts.between(t0, t1)]
    reserved = counters[counters.name == "Device memory reserved"].set_index("ts").value
    allocated = counters[counters.name == "Device memory allocated"].set_index("ts").value
    held = (reserved - allocated).dropna()
    assert held.max() >= FRAG_REQUEST_BYTES and held.max() >= 0.6 * reserved[held.idxmax()]
    expected = frag["expected"]
    failed = expected["failed_request"]
    assert failed["bytes"] == FRAG_REQUEST_BYTES and failed["error"] == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert t0 <= failed["ts_ns"] <= t1 and "reserved" in failed["message"]
    # When the large request failed, the cache held more than it asked for, in pieces.
    at_failure = held[held.index <= failed["ts_ns"]].iloc[-1]
    assert at_failure == expected["reserved_minus_allocated_bytes"] > 4 * FRAG_REQUEST_BYTES
    oom = df[(df.kind == "alloc_fail") & df.ts.between(t0, t1)]
    assert list(zip(oom.ts, oom.bytes)) == [(failed["ts_ns"], FRAG_REQUEST_BYTES)]
    assert oom.value.iloc[0] < FRAG_REQUEST_BYTES  # the largest free block is too small
    empty = df[(df.name == "empty_cache") & df.ts.between(t0, t1)]
    assert list(empty.bytes) == [expected["empty_cache_released_bytes"]] and expected["empty_cache_released_bytes"] > 0
    healthy = table(run(name))
    h_counters = healthy[healthy.kind == "counter"]
    h_held = (h_counters[h_counters.name == "Device memory reserved"].set_index("ts").value
              - h_counters[h_counters.name == "Device memory allocated"].set_index("ts").value).dropna()
    assert h_held.max() < FRAG_REQUEST_BYTES


@pytest.mark.parametrize("name", NAMES)
def test_launch_bound_tiny_kernels_leave_the_device_idle(name):
    result = run(name, "launch-bound")
    df = table(result)
    device = df[df.kind.isin(DEVICE_KINDS)]
    for p in problems(result, "launch-bound"):
        t0, t1 = p["when"]["start_ns"], p["when"]["end_ns"]
        kernels = device[(device.kind == "kernel") & device.ts.between(t0, t1 - 1)]
        assert len(kernels) == p["expected"]["kernels"] >= 50
        assert (kernels.dur < 50_000).mean() >= 0.9 and kernels.dur.between(2_000, 10_000).all()
        idle = 1 - busy_ns(device, t0, t1) / (t1 - t0)
        assert idle > 0.5 and idle == pytest.approx(p["expected"]["device_idle_fraction"], abs=1e-3)
    healthy = table(run(name))
    hdev = healthy[healthy.kind.isin(DEVICE_KINDS)]
    first, last = hdev.ts.min(), end(hdev).max()
    assert 1 - busy_ns(hdev, first, last) / (last - first) < 0.05


@pytest.mark.parametrize("name", NAMES)
def test_serial_copies_leave_compute_idle_while_copies_run(name):
    result = run(name, "serial-copies")
    df = table(result)
    kernels, copies = df[df.kind == "kernel"], df[df.kind == "memcpy"]
    for c in copies.itertuples():
        assert busy_ns(kernels, c.ts, c.ts + c.dur) == 0, c
    for p in problems(result, "serial-copies"):
        t0, t1 = p["when"]["start_ns"], p["when"]["end_ns"]
        assert busy_ns(kernels, t0, t1) == 0 and t1 - t0 == p["expected"]["bubble_ns"] > p["expected"]["copy_ns"] > 0
        for c in p["expected"]["copies"]:
            assert t0 <= c["start_ns"] <= c["end_ns"] <= t1
    # Healthy: after the first batch every input copy runs under the previous batch's compute.
    healthy = table(run(name))
    h2d = healthy[healthy.name == "MEMCPY_ASYNC H2D"].sort_values("ts").iloc[1:]
    hk = healthy[healthy.kind == "kernel"]
    assert all(busy_ns(hk, c.ts, c.ts + c.dur) == c.dur for c in h2d.itertuples())


def races(df: pd.DataFrame) -> set[tuple[int, int]]:
    """(writer corr, reader corr) of reads of a buffer on one stream while a write to it, launched
    earlier on another stream, runs: from the mem_read / mem_write rows and the task rows."""
    tasks = df[df.kind.isin(DEVICE_KINDS)].set_index("corr")
    launched = df[df.kind == "launch"].set_index("corr").ts
    acc = df[df.kind.isin(["mem_read", "mem_write"])]
    corr = acc["corr"]
    acc = acc.assign(start=corr.map(tasks.ts), stop=corr.map(end(tasks)), sid=corr.map(tasks.stream),
                     launch=corr.map(launched))
    pairs = acc[acc.kind == "mem_read"].merge(acc[acc.kind == "mem_write"], on="addr", suffixes=("_r", "_w"))
    hit = pairs[(pairs.sid_r != pairs.sid_w) & (pairs.launch_w <= pairs.launch_r) & (pairs.start_r < pairs.stop_w)
                & (pairs.stop_r > pairs.start_w)]
    return set(zip(hit["corr_w"].astype(int), hit["corr_r"].astype(int)))


@pytest.mark.parametrize("name", NAMES)
def test_missing_sync_consumer_starts_before_its_producer_ends(name):
    result = run(name, "missing-sync")
    df = table(result)
    kernels = df[df.kind == "kernel"].set_index("corr", drop=False)
    found = problems(result, "missing-sync")
    assert len(found) == scenarios.SCENARIOS[name].default_steps
    for p in found:
        prod, cons = kernels.loc[p["expected"]["producer"]["corr"]], kernels.loc[p["expected"]["consumer"]["corr"]]
        assert prod.stream != cons.stream == p["where"]["stream"]
        assert cons.ts < prod.ts + prod.dur
        assert p["expected"]["early_ns"] == prod.ts + prod.dur - cons.ts > 0
        overlap_ns = p["expected"]["overlap"]["end_ns"] - p["expected"]["overlap"]["start_ns"]
        assert overlap_ns == overlap(prod.ts, prod.ts + prod.dur, cons.ts, cons.ts + cons.dur) > 0
    assert {(p["expected"]["producer"]["corr"], p["expected"]["consumer"]["corr"]) for p in found} <= races(df)
    # Healthy: the i-th consumer starts only after the i-th producer has ended.
    producer, consumer = found[0]["expected"]["producer"]["name"], found[0]["expected"]["consumer"]["name"]
    healthy = table(run(name))
    prods = healthy[healthy.name == producer].sort_values("corr")
    conss = healthy[healthy.name == consumer].sort_values("corr")
    assert len(prods) == len(conss) == len(found)
    assert (conss.ts.to_numpy() >= end(prods).to_numpy()).all()
    assert races(healthy) == set()


@pytest.mark.parametrize("name", NAMES)
def test_queue_congestion_blocks_launches_at_a_full_queue(name):
    result = run(name, "queue-congestion")
    df = table(result)
    found = problems(result, "queue-congestion")
    stream = found[0]["where"]["stream"]
    launches = df[(df.kind == "launch") & (df.stream == stream)]
    blocked = launches[launches.dur > P.launch_overhead_ns]
    assert len(blocked) == sum(p["expected"]["blocked_launches"] for p in found) > 0
    assert blocked.dur.max() > 20 * P.launch_overhead_ns  # the host stuck in a launch call
    assert (blocked.dur - P.launch_overhead_ns).sum() == sum(p["expected"]["blocked_ns"] for p in found)
    depths = df[(df.kind == "counter") & df.name.str.startswith("Queue depth")].groupby("name").value.max()
    queue = result.trace.meta.extra["preset"]["queue_tasks"]
    assert depths.pop(f"Queue depth stream {stream}") == queue == FLOOD_QUEUE_TASKS == found[0]["expected"]["queue_tasks"]
    assert (depths < 0.9 * queue).all()  # only the flooded stream congests
    for p in found:
        assert len(blocked[blocked.ts.between(p["when"]["start_ns"], p["when"]["end_ns"])]) == \
            p["expected"]["blocked_launches"]
    healthy = table(run(name))
    assert (healthy[healthy.kind == "launch"].dur == P.launch_overhead_ns).all()
    assert "queue_full" not in run(name).ground_truth["host_blocks"]["reason"]


@pytest.mark.parametrize("name", NAMES)
def test_bandwidth_contention_slows_overlapping_copies(name):
    result = run(name, "bandwidth-contention")
    df = table(result)
    h2d = df[df.name == "MEMCPY_ASYNC H2D"].set_index("corr", drop=False)
    alone = P.copy_latency_ns + h2d.bytes / P.pcie_gbps
    overlapped = [c.corr for c in h2d.itertuples() for o in h2d.itertuples()
                  if o.corr != c.corr and overlap(c.ts, c.ts + c.dur, o.ts, o.ts + o.dur) > 0]
    assert overlapped and (h2d.dur[overlapped] > 1.1 * alone[overlapped]).all()
    for p in problems(result, "bandwidth-contention"):
        victim = h2d.loc[p["expected"]["victim"]["corr"]]
        assert victim.dur == p["expected"]["actual_ns"] and victim.dur > 1.8 * alone[victim["corr"]]
        assert p["expected"]["alone_ns"] == pytest.approx(alone[victim["corr"]], abs=1)
        assert p["expected"]["manifested"] and p["where"]["link"] == "r0.d0.pcie_h2d"
    healthy = table(run(name))
    hh = healthy[healthy.name == "MEMCPY_ASYNC H2D"].sort_values("ts")
    assert (hh.ts.to_numpy()[1:] >= end(hh).to_numpy()[:-1]).all()  # never two at once
    assert np.allclose(hh.dur, P.copy_latency_ns + hh.bytes / P.pcie_gbps, atol=1)


def test_triple_buffering_raises_throughput_and_removes_device_idle_gaps():
    def measure(result):
        df = table(result)
        device = df[df.kind.isin(DEVICE_KINDS)]
        steps = (df.kind == "step").sum()
        first, last = device.ts.min(), end(device).max()
        return (steps / ((end(df).max() - df[df.kind == "step"].ts.min()) / 1e9),
                len(idle_gaps(device, 100_000)), 1 - busy_ns(device, first, last) / (last - first))

    on_rate, on_gaps, on_idle = measure(run("yolo-pipeline"))
    off_rate, off_gaps, off_idle = measure(run("yolo-pipeline", triple_buffer=False))
    assert on_rate > 1.4 * off_rate
    assert on_gaps < off_gaps and off_gaps >= scenarios.SCENARIOS["yolo-pipeline"].default_steps - 1
    assert on_idle < 0.05 < 0.25 < off_idle


def test_run_records_what_its_recording_switches_say():
    """`record` is msprof's --task-time / --memory ...: the same run, recorded differently."""
    full = scenarios.run("resnet50-infer", steps=1)
    quiet = scenarios.run("resnet50-infer", steps=1, record=Switches(task_time=False, memory=False))

    def kinds(result) -> set:
        return set(result.trace.table.column("kind").to_pylist())

    assert {"kernel", "alloc", "flow", "api"} <= kinds(full)
    assert not {"kernel", "alloc", "flow"} & kinds(quiet) and "api" in kinds(quiet)
    assert quiet.ground_truth["tasks"] == full.ground_truth["tasks"]
