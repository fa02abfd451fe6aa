"""Each analyzer on a tiny emulated program whose right answer is worked out by hand.

Preset: launch overhead 1000 ns, dispatch 500 ns, API overhead 100 ns, sync overhead 200 ns,
copy latency 0, PCIe 10 B/ns, HBM 100 B/ns, 4 Cube + 2 Vector cores.
"""

from __future__ import annotations

import pytest

from analyzers import Frames, Severity, run
from analyzers.frames import gaps, union_ns
from runtime_emu import Kernel, Runtime, acl, topology
from runtime_emu.presets import GiB, MiB, Preset

P = Preset("test", cube_cores=4, vector_cores=2, hbm_bytes=1 * GiB, hbm_gbps=100.0, pcie_gbps=10.0,
           huge_page_bytes=64 * MiB, queue_tasks=8, launch_overhead_ns=1000, api_overhead_ns=100,
           sync_overhead_ns=200, dispatch_latency_ns=500, copy_latency_ns=0)


def new(**kw) -> Runtime:
    rt = Runtime(preset=kw.pop("preset", P), **kw)
    rt.set_device(0)
    return rt


def findings(result, code):
    return [f for f in result.findings if f.code == code]


def test_interval_helpers():
    import numpy as np

    ts, end = np.array([0, 5, 6, 20]), np.array([10, 7, 12, 25])
    assert gaps(ts, end).tolist() == [0, 0, 0, 8]
    assert union_ns(ts, end) == 17


def test_bubble_from_host_preprocessing_is_classified_as_data_loading():
    rt = new()
    s = rt.create_stream()  # host 200
    for _ in range(3):
        with rt.step():
            rt.host_work("preprocess", 100_000)
            rt.launch_kernel(Kernel("k", 20_000), 4, s)
            rt.synchronize_stream(s)
    result = run(rt.finish().trace, ["bubbles"])
    data = findings(result, "BUBBLE_DATA")
    assert len(data) == 1
    # Measured on the device: from a kernel's end, the sync returns (0.2 us), 100 us of
    # preprocessing, launch (1 us) + dispatch (0.5 us) before the next kernel; each part is its
    # own cause, and the launch call is the sync's (it waited 20 us for the kernel: without it
    # the host would have launched while the kernel ran). The idle before the first kernel is
    # pipeline fill: in no step window.
    assert data[0].lost_ns == 2 * 100_000
    gaps = result.metrics["bubbles"]["idle_by_cause_ns"]
    assert gaps == {"data": 200_000, "launch": 1_000, "sync": 2_400}
    assert [r["idle_ns"] for r in result.metrics["bubbles"]["per_step"]] == [0, 101_700, 101_700]
    assert [r["step_ns"] for r in result.metrics["bubbles"]["per_step"]] == [20_000, 121_700, 121_700]
    assert [(o["step"], o["ts_ns"], o["lost_ns"]) for o in data[0].occurrences] == [(1, 121_700, 100_000),
                                                                                  (2, 243_400, 100_000)]
    assert data[0].severity == Severity.CRITICAL  # 200 of 263.4 us of device step time
    assert data[0].lookup.remedy.startswith("Overlap preprocessing")


def test_bubble_waiting_on_a_copy_on_another_stream():
    rt = new()
    copy_s, compute_s = rt.create_stream(), rt.create_stream()
    ev = rt.create_event()
    host = rt.malloc_host(1_000_000)
    dev = rt.malloc(1_000_000)
    with rt.step():
        rt.launch_kernel(Kernel("warm", 10_000), 4, compute_s)
        rt.memcpy_async(dev, 1_000_000, host, 1_000_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, copy_s)
        rt.record_event(ev, copy_s)
        rt.stream_wait_event(compute_s, ev)
        rt.launch_kernel(Kernel("use", 10_000), 4, compute_s)
        rt.synchronize_device()
    result = run(rt.finish().trace, ["bubbles"])
    assert findings(result, "BUBBLE_COPY") and not findings(result, "BUBBLE_EVENT")


def test_queue_congestion_when_the_host_floods_a_stream():
    rt = new()  # queue_tasks=8
    s = rt.create_stream()
    for _ in range(40):
        rt.launch_kernel(Kernel("k", 50_000), 4, s)
    rt.synchronize_stream(s)
    result = run(rt.finish().trace, ["queue"])
    (f,) = findings(result, "QUEUE_CONGESTION")
    assert f.stream == 1 and f.value == 8.0 and f.threshold == pytest.approx(7.6)  # 95% of the limit
    # 32 launches waited for a retiring task; each blocked most of a 50 us kernel.
    assert f.lost_ns > 32 * 40_000
    assert result.metrics["queue"]["queue_limit"] == 8


def test_memory_leak_grows_by_the_leaked_buffer_each_step():
    rt = new()
    s = rt.create_stream()
    for _ in range(6):
        with rt.step():
            keep = rt.cached_malloc(2 * MiB, s, tag="activations")  # never freed
            tmp = rt.cached_malloc(4 * MiB, s, tag="workspace")
            rt.launch_kernel(Kernel("k", 10_000), 4, s)
            rt.cached_free(tmp)
            del keep
    result = run(rt.finish().trace, ["memory"])
    (f,) = findings(result, "MEMORY_LEAK")
    assert f.value == pytest.approx(2 * MiB + 512, rel=1e-6)  # the caching allocator rounds up
    assert f.evidence[0]["name"] == "[memory] activations" and f.evidence[0]["count"] == 6
    # 6 x (2 MiB + 512) of the 1 GiB device: 1.17%, under the severity rule's 3% line
    assert f.lost_bytes == 6 * (2 * MiB + 512) and f.severity == Severity.INFO


def test_cache_warming_up_is_not_a_leak():
    rt = new()
    s = rt.create_stream()
    bufs = []
    for i in range(8):
        with rt.step():
            if i < 3:  # a pool fills during warm-up, then stays flat
                bufs.append(rt.cached_malloc(8 * MiB, s, tag="pool"))
            rt.launch_kernel(Kernel("k", 10_000), 4, s)
    assert not findings(run(rt.finish().trace, ["memory"]), "MEMORY_LEAK")


def test_two_copies_sharing_pcie_are_contention():
    rt = new()
    a, b = rt.create_stream(), rt.create_stream()
    host = rt.malloc_host(4_000_000)
    dev = rt.malloc(4_000_000)
    rt.memcpy_async(dev, 4_000_000, host, 2_000_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, a)
    rt.memcpy_async(dev, 4_000_000, host, 2_000_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, b)
    rt.synchronize_device()
    result = run(rt.finish().trace, ["bandwidth"])
    (f,) = findings(result, "BANDWIDTH_CONTENTION")
    # Alone each takes 200 us. Sharing, the first ends after 1 us alone + ~398 us at half, the second
    # ~2 us later. Serialised they would end at the same time: the work behind the later copy waits
    # ~200 us, once (not the sum of both copies' extra time).
    assert f.lost_ns == pytest.approx(200_000, rel=0.01)
    assert len(f.occurrences) == 1 and f.occurrences[0]["lost_ns"] == f.lost_ns


def test_tiny_kernels_are_launch_bound():
    rt = new()
    s = rt.create_stream()
    for _ in range(50):
        rt.launch_kernel(Kernel("add", 300), 4, s)  # 0.3 us of work per 1 us launch
    rt.synchronize_stream(s)
    (f,) = findings(run(rt.finish().trace, ["launch"]), "LAUNCH_BOUND")
    assert f.lost_ns == 49 * 700  # each gap: 1000 ns launch - 300 ns of work
    # Share of the device's time from the first kernel's start (1.7 us) to the last one's end.
    assert f.value == round(49 * 700 / (51_000 - 1_700), 6) and f.severity == Severity.CRITICAL


def test_sync_stall_and_missing_sync():
    rt = new()
    prod, cons = rt.create_stream(), rt.create_stream()
    buf = rt.malloc(4_000_000)
    rt.launch_kernel(Kernel("producer", 100_000), 4, prod, writes=(buf,))
    # no event between them; the consumer runs on the Vector cores, so nothing else orders them
    rt.launch_kernel(Kernel("consumer", 1_000, core="vector"), 2, cons, reads=(buf,))
    host = rt.malloc_host(4_000_000)
    for _ in range(5):
        # Reading results back with a sync while no kernel runs: the cores idle for it.
        rt.memcpy_async(host, 4_000_000, buf, 4_000_000, acl.ACL_MEMCPY_DEVICE_TO_HOST, prod)
        rt.synchronize_stream(prod)
        rt.launch_kernel(Kernel("k", 40_000), 4, prod)
    result = run(rt.finish().trace, ["sync"])
    (race,) = findings(result, "MISSING_SYNC")
    assert race.evidence[0]["writer"] == "producer" and race.evidence[0]["reader"] == "consumer"
    (stall,) = findings(result, "SYNC_STALL")
    assert stall.value > 0.8  # share of the thread's span spent syncing with idle cores


def test_slow_rank_in_a_two_rank_job():
    from runtime_emu import hccl

    rt = Runtime(preset=P, topology=topology.server(2))

    def program(rank):
        rt.set_device(rank)
        s = rt.create_stream()
        comm = hccl.comm_init_all()
        buf = rt.malloc(1 << 20)
        for _ in range(4):
            rt.launch_kernel(Kernel("fwd", 300_000 if rank == 1 else 100_000), 4, s)
            hccl.all_reduce(buf, buf, 1024, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, s)
        rt.synchronize_stream(s)

    acl._current = rt
    rt.run_ranks(program)
    result = run(rt.finish().trace, ["ranks"])
    (f,) = findings(result, "SLOW_RANK")
    assert f.rank == 1 and f.severity == Severity.CRITICAL


def test_analyzers_without_their_inputs_are_skipped_with_a_reason():
    rt = new()
    rt.host_work("only host work", 1_000)
    result = run(rt.finish().trace)
    assert result.findings == [] or all(f.severity == Severity.INFO for f in result.findings)
    assert result.skipped["memory"].startswith("no alloc/free events")
    assert result.skipped["ranks"] == "fewer than two ranks in the trace"
    assert "no device ops" in result.skipped["bubbles"]


def test_unknown_analyzer_name_is_a_clear_error():
    rt = new()
    with pytest.raises(ValueError, match="unknown analyzer"):
        run(rt.finish().trace, ["nope"])


def test_every_finding_code_has_a_lookup_entry_covering_the_domain_rows():
    from analyzers import lookup_table

    table = lookup_table()
    for code in ("BUBBLE_HOST_LAUNCH", "BUBBLE_COPY", "BUBBLE_EVENT", "BUBBLE_COLLECTIVE", "BUBBLE_SYNC", "BUBBLE_DATA",
                 "BUBBLE_OTHER", "QUEUE_CONGESTION", "MEMORY_LEAK", "MEMORY_FRAGMENTATION", "BANDWIDTH_CONTENTION",
                 "LOW_OVERLAP", "LAUNCH_BOUND", "SLOW_RANK", "SYNC_STALL", "MISSING_SYNC", "MULTI_TENANT"):
        assert table[code].symptom and table[code].cause and table[code].remedy and table[code].references
    assert "fragmentation" in table["MEMORY_FRAGMENTATION"].cause.lower()
    assert Frames  # the public view analyzers share


def test_slow_link_found_from_link_counters_and_healthy_links_pass():
    from runtime_emu import hccl

    def job(overrides):
        rt = Runtime(preset=P, topology=topology.server(4, overrides=overrides))
        acl._current = rt

        def program(rank):
            rt.set_device(rank)
            s = rt.create_stream()
            comm = hccl.comm_init_all()
            buf = rt.malloc(64 << 20)
            for _ in range(2):
                hccl.all_reduce(buf, buf, 4 << 20, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, s)
            rt.synchronize_stream(s)

        rt.run_ranks(program)
        return run(rt.finish().trace, ["links"])

    assert findings(job({}), "SLOW_LINK") == []
    (f,) = findings(job({"r1->r2.hccs": 7.0}), "SLOW_LINK")
    assert f.rank == 1 and f.value == 0.25 and f.severity == Severity.CRITICAL
