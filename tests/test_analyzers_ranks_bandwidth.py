"""Slow rank and bandwidth contention: hand-built tables with answers worked out by hand, emulated
jobs checked against an independent measurement of the loss, and real Kineto traces."""

from __future__ import annotations

import logging
import shutil
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzers import Severity, run
from analyzers.frames import Frames
from msprof_py.trace import import_trace
from msprof_py.trace.schema import Trace, TraceMeta, build_table, canonical_dictionaries

MS = 1_000_000
PRESET = {"pcie_gbps": 10.0, "hbm_gbps": 100.0, "copy_latency_ns": 0}


def table(rows: list[dict], **extra) -> Trace:
    """A trace from rows of (rank, name, kind, ts, dur, stream, corr, bytes); device = rank."""
    n = len(rows)

    def col(key, default=None):
        return [r.get(key, default) for r in rows]

    cols = {"rank": col("rank", 0), "ph": ["X"] * n, "name": col("name"), "cat": [None] * n, "ts": col("ts"),
            "dur": col("dur"), "pid": col("rank", 0), "tid": col("stream", 0), "id": [None] * n,
            "args": [None] * n, "extra": [None] * n, "kind": col("kind"), "device": col("rank", 0),
            "stream": col("stream"), "corr": col("corr"), "bytes": col("bytes"), "addr": col("addr"),
            "value": col("value"), "step": [None] * n}
    return build_table(cols, TraceMeta(source_format="chrome", extra=extra))


def findings(result, code):
    return [f for f in result.findings if f.code == code]


# ---------------------------------------------------------------- slow rank, by hand

def test_host_side_straggler_is_the_rank_the_others_wait_for():
    # Three ranks, three allreduces at 2, 4 and 6 ms (communicator 7, calls 0..2), each after the
    # step's kernel on the same stream. Ranks 0 and 1 reach each one 1.0 and 0.6 ms early and
    # wait in Notify_Wait (same corr as the collective) with their devices idle; rank 2 arrives
    # last and waits only for its own compute (an EVENT_WAIT with another corr: no peer wait).
    rows, corr = [], 100
    for seq, t in enumerate((2 * MS, 4 * MS, 6 * MS)):
        for rank, early in ((0, 1_000_000), (1, 600_000), (2, 0)):
            corr += 1
            rows.append({"rank": rank, "name": "fwd", "kind": "kernel", "ts": t - 1_500_000, "dur": 400_000,
                         "stream": 2, "corr": corr + 1000})
            if early:
                rows.append({"rank": rank, "name": "Notify_Wait", "kind": "wait", "ts": t - early, "dur": early,
                             "stream": 2, "corr": corr})
            else:
                rows.append({"rank": rank, "name": "EVENT_WAIT", "kind": "wait", "ts": t - 900_000, "dur": 900_000,
                             "stream": 2, "corr": corr + 5000})
            rows.append({"rank": rank, "name": "hcom_allReduce", "kind": "collective", "ts": t, "dur": 100_000,
                         "stream": 2, "corr": corr, "bytes": 4096, "addr": 7, "value": seq})
    result = run(table(rows), ["ranks"])
    (f,) = findings(result, "SLOW_RANK")
    assert f.rank == 2 and f.ranks == [0, 1]
    # Per allreduce, the others' devices sit idle 1.0 and 0.6 ms waiting for it: 0.8 ms on average.
    assert f.lost_ns == 3 * 800_000
    assert (f.ts_ns, f.ts_ns + f.dur_ns) == (2 * MS - 1_000_000, 6 * MS + 100_000)
    assert f.occurrences == []  # one straggler, one problem: the collectives it held up are evidence
    assert [(h["rank"], h["collective_stream"], h["ts"], h["dur"], h["lost_ns"])
            for h in result.metrics["ranks"]["held_up"]] == [
        (2, 2, t - 1_000_000, 1_000_000, 800_000) for t in (2 * MS, 4 * MS, 6 * MS)]
    assert len(f.evidence) == 3 and {e["lost_ns"] for e in f.evidence} == {800_000}
    span = 6 * MS + 100_000 - (2 * MS - 1_500_000)
    assert f.severity == Severity.CRITICAL and f.lost_ns / span >= 0.2
    rows_by_rank = {r["rank"]: r for r in result.metrics["ranks"]["ranks"]}
    assert rows_by_rank[0]["wait_ns"] == 3_000_000 and rows_by_rank[2]["wait_ns"] == 0
    assert result.metrics["ranks"]["caused_wait_ns"] == {2: 2_400_000}


def test_nccl_style_collective_kernels_that_spin_until_the_last_rank_arrives():
    # No wait tasks: each rank's kernel starts when it arrives and all end together; the next
    # gemm runs after the all-reduce on the same stream.
    rows = []
    for k in range(4):
        t = (k + 1) * 5 * MS
        for rank, start in ((0, t), (1, t + 300_000)):
            rows.append({"rank": rank, "name": "gemm", "kind": "kernel", "ts": t - 2 * MS, "dur": 1 * MS, "stream": 20})
            rows.append({"rank": rank, "name": "ncclKernel_AllReduce", "kind": "collective", "ts": start,
                         "dur": t + 500_000 - start, "stream": 20, "corr": 10 * k + rank, "addr": 84, "value": k})
    result = run(table(rows), ["ranks"])
    (f,) = findings(result, "SLOW_RANK")
    assert (f.rank, f.ranks, f.lost_ns, len(result.metrics["ranks"]["held_up"])) == (1, [0], 4 * 300_000, 4)
    assert f.severity == Severity.WARNING  # 1.2 ms of a 18.5 ms span: 6.5%, under the 20% critical line


def test_point_to_point_ops_with_other_peers_are_not_matched():
    # Rank 0's n-th send ends before rank 1's n-th starts: different peers, not one collective.
    rows = []
    for k in range(3):
        rows.append({"rank": 0, "name": "SendRecv", "kind": "collective", "ts": k * MS, "dur": 200_000, "stream": 9})
        rows.append({"rank": 1, "name": "SendRecv", "kind": "collective", "ts": k * MS + 500_000, "dur": 200_000,
                     "stream": 9})
    result = run(table(rows), ["ranks"])
    assert findings(result, "SLOW_RANK") == []
    assert result.metrics["ranks"]["collectives_matched"] == 0


def test_ranks_arriving_together_have_no_straggler():
    rows = []
    for k in range(5):
        for rank in range(4):
            jitter = (rank * 7 + k * 3) % 5 * 1000  # a few microseconds of arrival noise
            rows.append({"rank": rank, "name": "allreduce", "kind": "collective", "ts": k * MS + jitter,
                         "dur": 300_000 - jitter, "stream": 3, "bytes": 1 << 20})
    assert findings(run(table(rows), ["ranks"]), "SLOW_RANK") == []


# ---------------------------------------------------------------- slow rank, emulated

def _others_wait(trace, straggler):
    """Independent measurement: mean over the other ranks of their time in Notify_Wait tasks."""
    t = trace.table
    mask = pc.and_(pc.equal(t.column("kind").cast(pa.string()), "wait"),
                   pc.equal(t.column("name").cast(pa.string()), "Notify_Wait"))
    w = t.filter(mask).select(["rank", "dur"]).to_pandas()
    per_rank = w.groupby("rank")["dur"].sum().reindex(range(trace.meta.world_size), fill_value=0)
    return float(per_rank.drop(straggler).mean())


def _span(trace) -> int:
    ops = Frames(trace).device_ops
    return int(ops["end"].max() - ops["ts"].min())


@pytest.mark.parametrize("scenario", ["bert-train-dp", "llm-train-2server"])
def test_emulated_slow_npu_is_named_with_the_loss_the_others_wait(scenario):
    from runtime_emu import scenarios

    r = scenarios.run(scenario, switches=["slow-rank"], seed=0)
    (truth,) = [p for p in r.ground_truth["problems"] if p["problem"] == "slow-rank"]
    exp = truth["expected"]
    result = run(r.trace, ["ranks"])
    (f,) = findings(result, "SLOW_RANK")
    assert f.rank == exp["slow_rank"] and f.ranks == exp["waiting_ranks"]
    # The others waited (arrival to release) as long as they sat in Notify_Wait...
    waited = result.metrics["ranks"]["caused_wait_ns"][f.rank]
    assert waited == pytest.approx(_others_wait(r.trace, f.rank), rel=0.01)
    assert waited == pytest.approx(exp["others_mean_wait_ns"] * exp["collectives"], rel=0.01)
    # ...but much of that wait overlapped their own backward compute: the cost is their device
    # idle charged to the straggler, which is what the real fix (the same job without the slow
    # NPU) gives back: within 20% of it, where the waits overstate it about 1.85x.
    twin = scenarios.run(scenario, seed=0)
    saving = _span(r.trace) - _span(twin.trace)
    assert f.lost_ns < waited
    assert f.lost_ns == pytest.approx(saving, rel=0.2)
    when = truth["when"]
    assert f.ts_ns < when["end_ns"] and f.ts_ns + f.dur_ns > when["start_ns"]
    assert f.severity == Severity.CRITICAL


def test_straggler_slow_on_the_host_in_an_acl_program():
    from runtime_emu import Kernel, acl, hccl, topology

    acl.init(topology=topology.server(4), seed=0)

    def program(rank):
        acl.rt.set_device(rank)
        s = acl.rt.create_stream()
        comm = hccl.comm_init_all()
        buf = acl.rt.malloc(8 << 20)
        for _ in range(5):
            with acl.prof.step():
                acl.prof.host_work("load batch", 800_000 if rank == 2 else 100_000)  # rank 2 loads slowly
                acl.rt.launch_kernel(Kernel("fwd", 300_000), 20, s)
                hccl.all_reduce(buf, buf, 1 << 20, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, s)
                acl.rt.synchronize_stream(s)

    acl.current().run_ranks(program)
    trace = acl.finalize().trace
    result = run(trace, ["ranks"])
    (f,) = findings(result, "SLOW_RANK")
    assert f.rank == 2 and f.ranks == [0, 1, 3] and len(result.metrics["ranks"]["held_up"]) == 5
    assert f.lost_ns == pytest.approx(_others_wait(trace, 2), rel=0.01)  # 5 x 0.7 ms
    assert f.lost_ns == pytest.approx(5 * 700_000, rel=0.02)


@pytest.mark.parametrize("scenario,params", [("bert-train-dp", {}), ("bert-train-dp", {"intra": "pcie"}),
                                             ("llm-train-2server", {}),
                                             ("llm-train-2server", {"roce_over_pcie": True})])
def test_healthy_jobs_have_no_slow_rank_or_contention_warning(scenario, params):
    from runtime_emu import scenarios

    r = scenarios.run(scenario, seed=0, **params)
    result = run(r.trace, ["ranks", "bandwidth"])
    loud = [f for f in result.findings if f.code in ("SLOW_RANK", "BANDWIDTH_CONTENTION")
            and f.severity >= Severity.WARNING]
    assert loud == []
    assert result.metrics["ranks"]["collectives_matched"] > 0
    (low,) = findings(result, "LOW_OVERLAP")  # the grouped overlap finding: one, naming every rank
    assert sorted([low.rank, *low.ranks]) == list(range(r.trace.meta.world_size))
    assert low.ts_ns is not None and low.dur_ns > 0 and len(low.occurrences) == r.trace.meta.world_size


# ---------------------------------------------------------------- slow rank, real traces

def _merged(paths):
    """Per-rank Kineto traces as one table, on their common clock (the earliest origin)."""
    traces = [import_trace(p) for p in paths]
    origin = min(t.meta.origin_ns for t in traces)
    tables = []
    for t in traces:
        tab = t.table
        i = tab.schema.get_field_index("ts")
        tables.append(tab.set_column(i, "ts", pc.add(tab.column("ts"), t.meta.origin_ns - origin)))
    merged = pa.concat_tables([tb.cast(tables[0].schema) for tb in tables])
    return Trace(canonical_dictionaries(merged.combine_chunks()),
                 TraceMeta(origin_ns=origin, source_format="kineto", world_size=traces[0].meta.world_size))


def test_sampled_128rank_pair_agrees_with_hta_straggler(real_traces, tmp_path):
    paths = [real_traces / "kineto" / f"sampled_128rank_rank{r}.json.gz" for r in (0, 1)]
    result = run(_merged(paths), ["ranks"])
    # The SendRecv kernels pair up only where rank 0's and rank 1's parts overlap and end together
    # (2 on stream 84, 2 on stream 203); in all four, rank 1 started last.
    assert result.metrics["ranks"]["collectives_matched"] == 4
    (f,) = findings(result, "SLOW_RANK")
    # Rank 0 waited 27 ms for rank 1 in all, but none of its device idle waited on those
    # SendRecvs (its next kernels waited for their host or for nothing the trace records): the
    # straggler is named, at no cost.
    assert result.metrics["ranks"]["caused_wait_ns"] == {1: 27_006_000}
    assert (f.rank, f.ranks, f.lost_ns) == (1, [0], 0)
    assert f.severity == Severity.INFO
    from hta.trace_analysis import TraceAnalysis

    for p in paths:
        shutil.copy(p, tmp_path / p.name)
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hta = TraceAnalysis(trace_dir=str(tmp_path))
            theirs = hta.get_potential_stragglers(num_candidates=1)
    finally:
        logging.disable(previous)
    assert theirs == [f.rank]


# ---------------------------------------------------------------- bandwidth contention, by hand

def _copy(stream, ts, dur, nbytes, name="Memcpy HtoD", rank=0, kind="memcpy"):
    return {"rank": rank, "name": name, "kind": kind, "ts": ts, "dur": dur, "stream": stream, "bytes": nbytes}


def test_two_overlapping_copies_cost_one_copys_delay():
    # 2 MB each at 10 B/ns alone: 200 us. Sharing PCIe H2D, they end at 400 and 401 us.
    rows = [_copy(1, 0, 400_000, 2_000_000), _copy(2, 1_000, 400_000, 2_000_000),
            {"rank": 0, "name": "k", "kind": "kernel", "ts": 401_000, "dur": 599_000, "stream": 1}]
    result = run(table(rows, preset=PRESET), ["bandwidth"])
    (f,) = findings(result, "BANDWIDTH_CONTENTION")
    # Serialised, the pair would also end at 400 us; the work behind the later one waits 200 us, not 400.
    assert f.lost_ns == 200_000
    assert [(o["stream"], o["ts_ns"], o["dur_ns"], o["lost_ns"]) for o in f.occurrences] == [(1, 0, 400_000, 200_000)]
    assert (f.ts_ns, f.dur_ns, f.device) == (0, 400_000, 0)
    assert f.severity == Severity.CRITICAL  # 20% of the 1 ms span, >= the 10% line


def test_delays_add_up_along_a_stream_but_not_across_streams():
    # Stream 1: two 1 MB copies back to back, each 100 us alone, each 150 us while a 3 MB copy on
    # stream 2 (300 us alone) runs beside them for 400 us. Stream 1 is late 2 x 50 us, stream 2 100 us.
    rows = [_copy(1, 0, 150_000, 1_000_000), _copy(1, 150_000, 150_000, 1_000_000), _copy(2, 0, 400_000, 3_000_000),
            _copy(3, 2_000_000, 100_000, 1_000_000),  # alone: not slowed
            {"rank": 0, "name": "k", "kind": "kernel", "ts": 500_000, "dur": 3_500_000, "stream": 4}]
    (f,) = findings(run(table(rows, preset=PRESET), ["bandwidth"]), "BANDWIDTH_CONTENTION")
    assert f.lost_ns == 100_000  # max(stream 1: 50 + 50, stream 2: 100), once; no kernel ran meanwhile
    # The same copies under a kernel that runs throughout: nothing waited for them, nothing lost.
    rows[-1] = {"rank": 0, "name": "k", "kind": "kernel", "ts": 0, "dur": 4_000_000, "stream": 4}
    assert findings(run(table(rows, preset=PRESET), ["bandwidth"]), "BANDWIDTH_CONTENTION") == []
    assert f.severity == Severity.INFO  # 0.1 of the device's 4 ms: 2.5%, under the rule's 3% line


def test_slowed_copies_off_the_critical_path_cost_nothing():
    # The same two copies sharing PCIe H2D while the host decodes for 990 us and only then launches
    # the kernel: the device idles throughout, but it waits for the host, not for the copies (the
    # critical path runs through the decode and the launch), so serialising the copies gains nothing.
    rows = [_copy(1, 0, 400_000, 2_000_000), _copy(2, 1_000, 400_000, 2_000_000),
            {"rank": 0, "name": "decode", "kind": "data_load", "ts": 0, "dur": 990_000},
            {"rank": 0, "name": "aclrtLaunchKernel", "kind": "launch", "ts": 990_000, "dur": 5_000, "corr": 7},
            {"rank": 0, "name": "k", "kind": "kernel", "ts": 1_000_000, "dur": 100_000, "stream": 3, "corr": 7}]
    assert findings(run(table(rows, preset=PRESET), ["bandwidth"]), "BANDWIDTH_CONTENTION") == []
    # Launched at once instead, the kernel reads what the later copy brings (a stream-order
    # dependency: it runs after that copy on stream 2): the path runs through the copy, 200 us lost.
    rows = [_copy(1, 0, 400_000, 2_000_000), _copy(2, 1_000, 400_000, 2_000_000),
            {"rank": 0, "name": "k", "kind": "kernel", "ts": 401_000, "dur": 100_000, "stream": 2}]
    (f,) = findings(run(table(rows, preset=PRESET), ["bandwidth"]), "BANDWIDTH_CONTENTION")
    assert f.lost_ns == 200_000 and f.occurrences[0]["stream"] == 2


def test_a_collective_slowed_by_a_copy_on_its_pcie_link_costs_its_extra_time_on_the_critical_path():
    # A PCIe-card server: four 1 MB all-reduces on stream 5 take 100 us alone, the last 300 us beside
    # a 1 MB copy on stream 1 (the copy at its full 10 GB/s: not itself slowed). The all-reduces are
    # the rank's critical path and no kernel runs: 200 us of the 3.3 ms device time, 6.06%, a warning.
    colls = [{"rank": 0, "name": "allreduce", "kind": "collective", "ts": t, "dur": d, "stream": 5,
              "bytes": 1_000_000} for t, d in ((0, 100_000), (1_000_000, 100_000), (2_000_000, 100_000),
                                               (3_000_000, 300_000))]
    rows = [*colls, _copy(1, 3_000_000, 100_000, 1_000_000)]
    (f,) = findings(run(table(rows, preset=PRESET, topology={"intra": "pcie"}), ["bandwidth"]), "BANDWIDTH_CONTENTION")
    assert f.title == "Collectives slowed by copies on their PCIe link"
    assert (f.lost_ns, f.value, f.severity) == (200_000, 3.0, Severity.WARNING)
    assert [(o["ts_ns"], o["lost_ns"]) for o in f.occurrences] == [(3_000_000, 200_000)]
    # A kernel running through the slow all-reduce: the device still worked, nothing to get back.
    kernel = {"rank": 0, "name": "k", "kind": "kernel", "ts": 3_000_000, "dur": 300_000, "stream": 2}
    assert findings(run(table([*rows, kernel], preset=PRESET, topology={"intra": "pcie"}), ["bandwidth"]),
                    "BANDWIDTH_CONTENTION") == []


def test_copies_on_other_links_do_not_contend():
    rows = [_copy(1, 0, 400_000, 2_000_000), _copy(2, 0, 400_000, 2_000_000, name="Memcpy DtoH")]
    assert findings(run(table(rows, preset=PRESET), ["bandwidth"]), "BANDWIDTH_CONTENTION") == []


def test_without_a_preset_only_comparable_large_copies_that_ran_alone_set_the_reference():
    # Tiny copies alone at 0.5 GB/s say nothing about the link: large copies are not judged by them.
    tiny = [_copy(1, i * 10_000, 2_000, 1_000, name="Memcpy DtoD") for i in range(20)]
    big = [_copy(2, 1 * MS, 100_000, 4 << 20, name="Memcpy DtoD"), _copy(3, 1 * MS, 100_000, 4 << 20, name="Memcpy DtoD")]
    assert findings(run(table(tiny + big), ["bandwidth"]), "BANDWIDTH_CONTENTION") == []
    # With 2 MiB copies that ran alone at ~42 GB/s (50 us), two 4 MiB copies sharing HBM at 21 GB/s are
    # slowed: each took 200 us against 100 us alone.
    ref = [_copy(1, 5 * MS + i * MS, 50_000, 2 << 20, name="Memcpy DtoD") for i in range(3)]
    shared = [_copy(2, 1 * MS, 200_000, 4 << 20, name="Memcpy DtoD"), _copy(3, 1 * MS, 200_000, 4 << 20, name="Memcpy DtoD")]
    (f,) = findings(run(table(tiny + ref + shared), ["bandwidth"]), "BANDWIDTH_CONTENTION")
    assert f.lost_ns == 100_000 and len(f.occurrences) == 1 and f.occurrences[0]["ts_ns"] == 1 * MS
    # Overlapping copies that ran faster than the reference are never flagged.
    fast = [_copy(2, 1 * MS, 40_000, 4 << 20, name="Memcpy DtoD"), _copy(3, 1 * MS, 40_000, 4 << 20, name="Memcpy DtoD")]
    assert findings(run(table(tiny + ref + fast), ["bandwidth"]), "BANDWIDTH_CONTENTION") == []


# ---------------------------------------------------------------- bandwidth contention, emulated and real

def _idle_within(kernels, a: int, b: int) -> int:
    """Time in [a, b) during which none of `kernels` (rows with ts, dur) ran, by a plain sweep."""
    if b <= a:
        return 0
    busy, reach = 0, a
    for ts, end in sorted((int(t), int(t + d)) for t, d in zip(kernels["ts"], kernels["dur"]) if t < b and t + d > a):
        ts, end = max(ts, reach), min(end, b)
        if end > ts:
            busy += end - ts
            reach = end
    return (b - a) - busy


@pytest.mark.parametrize("scenario, share", [("resnet50-infer", 0.0283), ("yolo-pipeline", 0.0061)])
def test_emulated_contention_costs_the_victims_extra_time(scenario, share):
    from runtime_emu import scenarios

    r = scenarios.run(scenario, switches=["bandwidth-contention"], seed=0)
    truth = [p for p in r.ground_truth["problems"] if p["problem"] == "bandwidth-contention"
             and p["expected"]["manifested"]]
    (f,) = findings(run(r.trace, ["bandwidth"]), "BANDWIDTH_CONTENTION")
    # The loss on the critical path: the part of each victim's overhang past its alone time
    # during which no kernel ran (the cores waited for the late input: the path ran through the
    # copy), measured here by hand.
    df = r.trace.table.select(["kind", "ts", "dur", "rank", "device"]).to_pandas()
    kernels = df[df["kind"] == "kernel"]
    stalled = sum(_idle_within(kernels, p["expected"]["victim"]["start_ns"] + p["expected"]["alone_ns"],
                               p["expected"]["victim"]["end_ns"]) for p in truth)
    assert stalled > 0
    assert f.lost_ns == pytest.approx(stalled, rel=0.02)
    span = r.trace.meta.extra["end_ns"]
    assert f.lost_ns < span
    # Every injected victim lies inside one of the finding's occurrences, on its stream.
    for p in truth:
        w, where = p["when"], p["where"]
        assert any(o["stream"] == where["stream"] and o["ts_ns"] < w["end_ns"] and o["ts_ns"] + o["dur_ns"] > w["start_ns"]
                   for o in f.occurrences)
    # Double buffering hides every slowed input copy under compute but the first step's (the
    # pipeline fill): the emulator's own measure of what the contention cost is a few percent of
    # the device's time, under the rule's 3% line, and so is the finding's.
    assert f.lost_ns == pytest.approx(sum(p["expected"]["cost"]["ns"] for p in truth), rel=0.02)
    assert sum(p["expected"]["cost"]["share"] for p in truth) == pytest.approx(share, rel=0.02)
    assert f.value < 0.8 and f.severity == Severity.INFO


def test_emulated_prefetch_beside_collectives_on_pcie():
    from runtime_emu import scenarios

    r = scenarios.run("bert-train-dp", switches=["bandwidth-contention"], seed=0)
    # The same problem on every rank: one finding, its occurrences per rank.
    f, = findings(run(r.trace, ["bandwidth"]), "BANDWIDTH_CONTENTION")
    assert sorted([f.rank, *f.ranks]) == sorted({p["where"]["rank"] for p in r.ground_truth["problems"]})
    assert f.severity == Severity.CRITICAL
    for p in r.ground_truth["problems"]:
        e = p["expected"]
        occ = [o for o in f.occurrences if o["rank"] == p["where"]["rank"]]
        lost = sum(o["lost_ns"] for o in occ)
        assert {o["stream"] for o in occ} == {p["where"]["stream"]}
        # The prefetch copies run back to back on one stream beside the all-reduces on the rank's
        # critical path: their delays add up, as far as the cores waited through them (overhang
        # past the alone time with no kernel running), which is also the emulator's measure.
        df = r.trace.table.select(["kind", "ts", "dur", "rank", "device", "stream"]).to_pandas()
        mine = df[df["rank"] == p["where"]["rank"]]
        kernels = mine[mine["kind"] == "kernel"]
        victims = mine[(mine["kind"] == "memcpy") & (mine["stream"] == p["where"]["stream"])]
        stalled = sum(_idle_within(kernels, ts + e["alone_ns"], ts + dur) for ts, dur in zip(victims["ts"], victims["dur"]))
        assert 0 < lost <= e["copies"] * (e["mean_copy_ns"] - e["alone_ns"]) * 1.02
        assert lost == pytest.approx(stalled, rel=0.02) == e["cost"]["ns"]
        # Over 10% of the device's time, by the emulator's measure.
        assert e["cost"]["share"] >= 0.10
        # The job loses no more than its worst rank in any one stretch of time.
        assert f.lost_ns >= lost


@pytest.mark.parametrize("name", ["queue_16rank_rank0", "nccl_2rank_rank0", "ns_resolution_rank0",
                                  "sampled_128rank_rank0", "alexnet_critical_path"])
def test_real_traces_have_no_contention_judged_by_tiny_copies(real_traces, name):
    frames = Frames(import_trace(real_traces / "kineto" / f"{name}.json.gz"))
    result = run(frames.trace, ["bandwidth"], frames=frames)
    assert findings(result, "BANDWIDTH_CONTENTION") == []
    t0, t1 = frames.span
    assert all(f.lost_ns <= t1 - t0 for f in result.findings)
    assert np.isfinite([f.lost_ns for f in result.findings]).all()
