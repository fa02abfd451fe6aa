"""The emulator core, SimPy style: run a tiny program, assert the exact (task, stream, start, end) log.

The preset uses round numbers so every expectation can be worked out by hand:
launch overhead 1000 ns, dispatch latency 500 ns, API overhead 100 ns, sync overhead 200 ns,
copy latency 0, PCIe 10 GB/s (10 bytes/ns), HBM 100 GB/s, 4 Cube + 2 Vector cores.
"""

from __future__ import annotations

import pytest

from runtime_emu import AclError, Deadlock, Kernel, Runtime, Thread, acl
from runtime_emu.presets import GiB, MiB, Preset

P = Preset("test", cube_cores=4, vector_cores=2, hbm_bytes=1 * GiB, hbm_gbps=100.0, pcie_gbps=10.0,
           huge_page_bytes=64 * MiB, queue_tasks=3, launch_overhead_ns=1000, api_overhead_ns=100,
           sync_overhead_ns=200, dispatch_latency_ns=500, copy_latency_ns=0)
K = Kernel("k", block_ns=10_000)  # 10 us per block, cube


def new(**kw) -> Runtime:
    rt = Runtime(preset=kw.pop("preset", P), **kw)
    rt.set_device(0)  # host clock 100
    return rt


def log(rt: Runtime, *, include_control: bool = False):
    return [e for e in rt.task_log if include_control or e[0] not in ("EVENT_RECORD", "EVENT_WAIT")]


def test_two_kernels_on_one_stream_serialize():
    rt = new()
    s = rt.create_stream()  # host 200
    rt.launch_kernel(Kernel("a", 10_000), 4, s)  # host 200..1200, arrives 1700, one wave
    rt.launch_kernel(Kernel("b", 5_000), 8, s)  # host 1200..2200, arrives 2700, two waves
    rt.finish()
    assert log(rt) == [("a", 1, 1_700, 11_700), ("b", 1, 11_700, 21_700)]
    causes = dict(zip(rt.ground_truth()["tasks"]["name"], rt.ground_truth()["tasks"]["cause"]))
    assert causes == {"a": "launch", "b": "stream"}


def test_event_wait_orders_two_streams():
    rt = new()
    s1, s2 = rt.create_stream(), rt.create_stream()  # host 300
    ev = rt.create_event()  # host 400
    rt.launch_kernel(Kernel("producer", 50_000), 4, s1)  # 400..1400, arrives 1900
    rt.record_event(ev, s1)  # 1400..2400, arrives 2900
    rt.stream_wait_event(s2, ev)  # 2400..3400, arrives 3900
    rt.launch_kernel(Kernel("consumer", 1_000), 2, s2)  # 3400..4400, arrives 4900
    rt.finish()
    # At 51_900 the producer's last wave ends; the record runs at once, which releases the wait,
    # and the consumer takes the cores the producer just gave back.
    assert log(rt, include_control=True) == [
        ("producer", 1, 1_900, 51_900),
        ("EVENT_RECORD", 1, 51_900, 51_900),
        ("EVENT_WAIT", 2, 3_900, 51_900),
        ("consumer", 2, 51_900, 52_900),
    ]
    gt = rt.ground_truth()["tasks"]
    row = gt["name"].index("consumer")
    assert (gt["cause"][row], gt["producer"][row]) == ("event", "kernel")


def test_full_queue_blocks_the_host_until_a_task_retires():
    rt = new()  # queue_tasks=3
    s = rt.create_stream()  # host 200
    for name in "abcd":
        rt.launch_kernel(Kernel(name, 100_000), 4, s)
    # a: 200..1200 (arrives 1700, runs 1700..101700); b: 1200..2200; c: 2200..3200; the 4th launch
    # finds 3 pending at 3200 and waits for a to retire at 101700, then pays its overhead.
    assert rt.now() == 102_700
    result = rt.finish()
    blocks = rt.ground_truth()["host_blocks"]
    assert list(zip(blocks["start_ns"], blocks["end_ns"], blocks["reason"])) == [(3_200, 101_700, "queue_full")]
    assert log(rt)[-1] == ("d", 1, 301_700, 401_700)
    assert api_slices(result, "aclrtLaunchKernel")[-1] == (3_200, 102_700)


def api_slices(result, name):
    df = result.trace.to_pandas()
    rows = df[(df.ph == "X") & (df.name == name)]
    return list(zip(rows.ts, rows.ts + rows.dur.astype(int)))


def test_synchronize_blocks_until_the_stream_drains():
    rt = new()
    s = rt.create_stream()  # 200
    rt.launch_kernel(K, 4, s)  # 200..1200, runs 1700..11700
    rt.synchronize_stream(s)
    assert rt.now() == 11_700 + 200
    assert api_slices(rt.finish(), "aclrtSynchronizeStream") == [(1_200, 11_900)]


def test_three_concurrent_copies_on_one_link_each_get_a_third():
    rt = new()
    host = rt.malloc_host(3_000_000)  # 200
    dev = rt.malloc(3_000_000)  # 300
    streams = [rt.create_stream() for _ in range(3)]  # 600
    # The copies arrive 1000 ns apart; alone each takes 100 us at 10 B/ns.
    for s in streams:
        rt.memcpy_async(dev, 3_000_000, host, 1_000_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    rt.finish()
    starts_ends = [(e[2], e[3]) for e in log(rt)]
    assert [se[0] for se in starts_ends] == [2_100, 3_100, 4_100]
    # Max-min sharing: copy A runs alone for 1000 ns (10_000 B), A and B at 5 B/ns for 1000 ns,
    # then all three at 10/3 B/ns: A (985_000 B left) ends after 295_500 ns. B and C, with
    # 10_000 and 15_000 B left, share 5 B/ns: B ends 2_000 ns later, C alone 500 ns after that.
    a_end, b_end, c_end = 4_100 + 295_500, 4_100 + 295_500 + 2_000, 4_100 + 295_500 + 2_000 + 500
    ends = [se[1] for se in starts_ends]
    assert all(abs(got - want) <= 1 for got, want in zip(ends, [a_end, b_end, c_end])), ends
    # Together they took as long as one link moving 3 MB: contention is real, nothing is lost.
    assert abs(starts_ends[2][1] - (2_100 + 300_000)) <= 2


def test_copy_from_pageable_memory_blocks_while_pinned_does_not():
    import numpy as np

    rt = new()
    dev = rt.malloc(1_000_000)  # 200
    s = rt.create_stream()  # 300
    rt.memcpy_async(dev, 1_000_000, np.zeros(1_000_000, np.uint8), 100_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    # 300..1300 launch, arrives 1800, 10 us copy: the call returns at 11_800.
    assert rt.now() == 11_800
    pinned = rt.malloc_host(100_000)  # 11_900
    rt.memcpy_async(dev, 1_000_000, pinned, 100_000, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    assert rt.now() == 12_900
    rt.finish()
    assert [r for r in rt.ground_truth()["host_blocks"]["reason"]] == ["pageable_copy"]


def test_priority_orders_dispatch_when_cores_are_short():
    rt = new()
    low, high = rt.create_stream(priority=7), rt.create_stream(priority=0)  # 300
    blocker = rt.create_stream()  # 400
    rt.launch_kernel(Kernel("blocker", 20_000), 4, blocker)  # 400..1400, runs 1900..21900 on all 4 cores
    rt.launch_kernel(Kernel("low", 1_000), 4, low)  # arrives 2900, waits for cores
    rt.launch_kernel(Kernel("high", 1_000), 4, high)  # arrives 3900, waits for cores
    rt.finish()
    assert log(rt) == [("blocker", 3, 1_900, 21_900), ("high", 2, 21_900, 22_900), ("low", 1, 22_900, 23_900)]
    gt = rt.ground_truth()["tasks"]
    assert [c for n, c in zip(gt["name"], gt["cause"]) if n in ("high", "low")] == ["cores", "cores"]


def test_partial_last_wave_and_vector_cores():
    rt = new()
    s = rt.create_stream()
    rt.launch_kernel(Kernel("five", 1_000, core="cube"), 5, s)  # 4 + 1: two waves on 4 cores
    rt.launch_kernel(Kernel("vec", 1_000, core="vector"), 3, s)  # 2 + 1 on 2 vector cores
    rt.finish()
    assert log(rt) == [("five", 1, 1_700, 3_700), ("vec", 1, 3_700, 5_700)]


def test_kernels_share_cores_in_normal_mode_and_wait_in_batch_mode():
    def run(batch: bool):
        rt = new(batch_mode=batch)
        a, b = rt.create_stream(), rt.create_stream()  # 300
        rt.launch_kernel(Kernel("a", 10_000), 3, a)  # arrives 1800, takes 3 cores
        rt.launch_kernel(Kernel("b", 10_000), 2, b)  # arrives 2800, wants 2: 1 free now
        rt.finish()
        return log(rt)

    assert run(False) == [("a", 1, 1_800, 11_800), ("b", 2, 2_800, 21_800)]  # 1 block then 1 more
    assert run(True) == [("a", 1, 1_800, 11_800), ("b", 2, 11_800, 21_800)]  # waits for both cores


def test_memory_policies_and_out_of_memory():
    rt = new()
    a = rt.malloc(40 * MiB, acl.ACL_MEM_MALLOC_HUGE_ONLY)
    b = rt.malloc(40 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST)  # 24 MiB of huge pages left: falls back
    with pytest.raises(AclError) as err:
        rt.malloc(40 * MiB, acl.ACL_MEM_MALLOC_HUGE_ONLY)
    assert err.value.name == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert "40.00 MiB" in str(err.value) and "HUGE_ONLY" in str(err.value)
    rt.free(a)
    rt.free(b)
    with pytest.raises(AclError, match="ACL_ERROR_RT_MEMORY_FREE"):
        rt.free(b)
    with pytest.raises(AclError, match="ACL_ERROR_RT_MEMORY_FREE"):
        rt.free(0x1234)
    with pytest.raises(AclError, match="out of device memory"):
        rt.malloc(2 * GiB)


def test_fragmentation_total_free_memory_suffices_but_no_block_does():
    rt = new(preset=P.with_(hbm_bytes=256 * MiB, huge_page_bytes=0))
    s = rt.create_stream()
    # 8 MiB requests share 20 MiB segments (two per segment) until device memory is full; freeing every other block
    # leaves half the memory free, in pieces no 30 MiB request fits.
    ptrs = []
    while True:
        try:
            ptrs.append(rt.cached_malloc(8 * MiB, s))
        except AclError:
            break
    for p in ptrs[::2]:
        rt.cached_free(p)
    with pytest.raises(AclError) as err:
        rt.cached_malloc(30 * MiB, s)
    text = str(err.value)
    assert "ACL_ERROR_RT_MEMORY_ALLOCATION" in text and "reserved" in text
    cache = rt.devices[(0, 0)].caching
    assert cache.reserved_bytes - cache.allocated_bytes >= 30 * MiB
    # Both failures are alloc_fail rows: the request, and the largest free block (too small).
    fails = rt.finish().trace.to_pandas().query("kind == 'alloc_fail'")
    assert fails["bytes"].tolist() == [8 * MiB, 30 * MiB]
    assert fails.name.unique().tolist() == ["[OutOfMemory]"] and fails.device.tolist() == [0, 0]
    assert fails.value.iloc[1] < 30 * MiB


def test_misuse_raises_clear_errors():
    rt = Runtime(preset=P)
    with pytest.raises(AclError, match="set_device"):
        rt.create_stream()
    rt.set_device(0)
    with pytest.raises(AclError, match="ACL_ERROR_RT_PARAM_INVALID.*device 3 does not exist"):
        rt.set_device(3)
    s = rt.create_stream()
    rt.destroy_stream(s)
    with pytest.raises(AclError, match="ACL_ERROR_RT_STREAM_CONTEXT.*destroyed"):
        rt.launch_kernel(K, 1, s)
    with pytest.raises(AclError, match="invalid stream handle"):
        rt.launch_kernel(K, 1, "stream0")
    with pytest.raises(AclError, match="invalid kernel handle"):
        rt.launch_kernel("k", 1, None)
    with pytest.raises(AclError, match="priority must be 0..7"):
        rt.create_stream(priority=9)
    dev = rt.malloc(1024)
    host = rt.malloc_host(1024)
    with pytest.raises(AclError, match="src is device memory and dst is device memory"):
        rt.memcpy(dev, 1024, dev, 10, acl.ACL_MEMCPY_HOST_TO_DEVICE)
    with pytest.raises(AclError, match="copy of 2048 bytes into a destination of 1024"):
        rt.memcpy(dev, 1024, host, 2048, acl.ACL_MEMCPY_HOST_TO_DEVICE)
    ev = rt.create_event()
    rt.destroy_event(ev)
    with pytest.raises(AclError, match="event 1 was destroyed"):
        rt.record_event(ev, None)


def test_host_work_and_data_loading_are_recorded_as_their_kinds():
    rt = new()  # host 100
    s = rt.create_stream()  # host 200
    acl._current = rt
    acl.prof.host_work("read batch", 4_000, kind="data_load")  # 200..4200
    rt.host_work("letterbox", 1_000)  # 4200..5200
    rt.launch_kernel(K, 1, s, reads=(0x100,), writes=(0x200, 0x300))  # 5200..6200
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_PARAM.*kind must be one of host_work, data_load, host_idle, op_compile"):
        rt.host_work("x", 10, kind="preprocess")
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_PARAM.*duration"):
        rt.host_work("x", -1, kind="data_load")
    df = rt.finish().trace.to_pandas()
    work = df[df.kind.isin(["host_work", "data_load"])]
    assert list(zip(work.name, work.kind, work.ts, work["dur"])) == [
        ("read batch", "data_load", 200, 4_000), ("letterbox", "host_work", 4_200, 1_000)]
    acc = df[df.kind.isin(["mem_read", "mem_write"])]
    corr = df[df.kind == "kernel"]["corr"].iloc[0]
    assert list(zip(acc.kind, acc.addr, acc["corr"])) == [
        ("mem_read", 0x100, corr), ("mem_write", 0x200, corr), ("mem_write", 0x300, corr)]


def test_waiting_for_something_that_never_happens_is_a_deadlock_not_a_hang():
    rt = new()
    s1, s2 = rt.create_stream(), rt.create_stream()
    ev = rt.create_event()
    rt.record_event(ev, s1)  # record #1 executes at once
    blocked = rt.create_event()
    blocked.record_seq = 5  # as if recorded on a stream that never gets there
    rt.stream_wait_event(s2, blocked)
    with pytest.raises(Deadlock, match="stream 2 never drains"):
        rt.synchronize_stream(s2)


def test_host_threads_interleave_in_virtual_time_deterministically():
    def program():
        rt = acl.init(preset=P)
        acl.rt.set_device(0)
        streams = [acl.rt.create_stream() for _ in range(2)]

        def worker(i):
            for _ in range(3):
                acl.prof.host_work(f"prep{i}", 3_000 if i == 0 else 5_000)
                acl.rt.launch_kernel(Kernel(f"w{i}", 2_000), 2, streams[i])

        threads = [Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result = acl.finalize()
        return rt.task_log, result.trace

    log1, trace1 = program()
    log2, trace2 = program()
    assert log1 == log2
    assert trace1.table.equals(trace2.table)
    # Thread 1 (3 us of prep per kernel) launches faster than thread 2 (5 us): its three
    # kernels start earlier, and both threads' kernels overlap on the 4 cube cores.
    w0 = [e for e in log1 if e[0] == "w0"]
    w1 = [e for e in log1 if e[0] == "w1"]
    assert len(w0) == len(w1) == 3
    assert all(a[2] < b[2] for a, b in zip(w0, w1))


def test_same_program_and_seed_give_byte_identical_parquet(tmp_path):
    from msprof_py.trace import write_trace

    def run(path):
        rt = new(seed=7)
        s = rt.create_stream()
        for i in range(50):
            with rt.step():
                rt.launch_kernel(Kernel(f"k{i % 3}", 1_000 + i), 1 + i % 7, s)
        rt.synchronize_stream(s)
        write_trace(rt.finish().trace, path)
        return path.read_bytes()

    assert run(tmp_path / "a.parquet") == run(tmp_path / "b.parquet")


def test_example_program_trace_opens_in_info_and_exports(tmp_path):
    """The examples/ program runs, and its trace goes through the CLI like any other."""
    import runpy
    import sys

    from typer.testing import CliRunner

    from msprof_py.cli import app
    from msprof_py.trace import import_trace

    out = tmp_path / "run"
    argv, sys.argv = sys.argv, ["two_streams.py", str(out)]
    try:
        runpy.run_path(str(_repo() / "examples" / "two_streams.py"), run_name="__main__")
    finally:
        sys.argv = argv
    runner = CliRunner()
    info = runner.invoke(app, ["info", str(out / "trace.parquet"), "--json"])
    assert info.exit_code == 0, info.output
    import json

    summary = json.loads(info.output)
    assert summary["source_format"] == "emulator"
    exported = runner.invoke(app, ["export", str(out / "trace.parquet"), "-o", str(tmp_path / "t.json")])
    assert exported.exit_code == 0, exported.output
    from msprof_py.trace import read_trace

    assert import_trace(tmp_path / "t.json").table.equals(read_trace(out / "trace.parquet").table)


def _repo():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def test_recorded_trace_links_launches_tasks_and_counts_queue_depth():
    rt = new()
    s = rt.create_stream()  # 200
    with rt.step():
        rt.launch_kernel(Kernel("a", 10_000), 4, s)  # 200..1200 -> 1700..11700
        rt.launch_kernel(Kernel("b", 10_000), 4, s)  # 1200..2200 -> 11700..21700
    df = rt.finish().trace.to_pandas()
    launches = df[df.kind == "launch"]
    tasks = df[df.kind == "kernel"]
    assert list(zip(tasks.name, tasks.ts, tasks.dur, tasks["corr"])) == [("a", 1_700, 10_000, 1), ("b", 11_700, 10_000, 2)]
    assert list(launches["corr"]) == [1, 2] and list(launches.ts) == [200, 1_200]
    flows = df[df.kind == "flow"]
    assert sorted(zip(flows.ph, flows.ts, flows["corr"])) == [("f", 1_700, 1), ("f", 11_700, 2), ("s", 200, 1), ("s", 1_200, 2)]
    assert set(tasks.step) == {0} and set(launches.step) == {0}
    depth = df[(df.kind == "counter") & (df.name == "Queue depth stream 1")]
    assert list(zip(depth.ts, depth.value)) == [(1_200, 1.0), (2_200, 2.0), (11_700, 1.0), (21_700, 0.0)]
    names = df[df.ph == "M"]
    assert {"Ascend Hardware", "CANN"} <= {__import__("json").loads(a)["name"] for a in names[names.name == "process_name"].args}


def test_result_saves_trace_and_ground_truth(tmp_path):
    import json

    from msprof_py.trace import read_trace

    rt = new()
    s = rt.create_stream()
    rt.launch_kernel(K, 4, s)
    result = rt.finish()
    out = result.save(tmp_path / "emu")
    assert read_trace(out / "trace").table.equals(result.trace.table)
    gt = json.loads((out / "ground_truth.json").read_text())
    assert gt["tasks"]["name"] == ["k"] and gt["tasks"]["cause"] == ["launch"]
    assert gt["tasks"]["start_ns"] == [1_700] and gt["problems"] == []


def test_recorder_counts_its_packed_rows_and_starts_over_after_building_the_table():
    rt = new(seed=3)
    s = rt.create_stream()
    for i in range(30):
        rt.launch_kernel(Kernel(f"k{i % 4}", 1_000), 4, s)
    rt.synchronize_stream(s)
    rec = rt.recorder
    # 30 launches: API slice, flow start, queue counter at launch; flow end, task, counter at finish.
    assert (len(rec.apis) // 8, len(rec.flows) // 8, len(rec.counters) // 8, len(rec.tasks) // 8) == (
        (2 + 30) * 17, 60 * 9, 60 * 9, 30 * 16)  # set_device, synchronize_stream + launches (create_stream
    # is a full row: its args carry the stream's priority and queue depth)
    n = len(rec)
    table = rt.finish().trace.table
    assert table.num_rows == n
    assert (table.column("kind").to_pylist().count("kernel"), len(rec)) == (30, 0)


def test_steps_are_numbered_per_rank_thread():
    from runtime_emu import topology

    rt = Runtime(preset=P, topology=topology.server(3))

    def program(rank):
        rt.set_device(rank)
        for _ in range(2):
            with rt.step():
                rt.host_work("w", 1_000)

    rt.run_ranks(program)
    df = rt.finish().trace.to_pandas()
    steps = df[df.kind == "step"]
    assert sorted(zip(steps["rank"], steps.name)) == [(r, f"ProfilerStep#{n}") for r in range(3) for n in range(2)]
