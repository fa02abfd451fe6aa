"""The trace tells the truth about the host and the streams.

Programs written the way a user writes them (runtime_emu.acl), checked against numbers worked
out here from the preset, not read back from the emulator: an API slice spans the whole time
its call held the thread (a blocking copy, a copy from pageable memory, a launch at a full
queue, a synchronize) and says why; stream creation records priority and queue depth; copies
carry their addresses; a synchronous aclrtMemcpy is ordered after no stream's work, as
AscendCL documents.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd

from runtime_emu import Kernel, acl
from runtime_emu.presets import preset

MiB = 1 << 20
P = preset("910B3")


def _copy_ns(nbytes: int) -> int:
    """One DMA copy alone on a PCIe direction: the fixed latency, then the bytes at link rate
    (GB/s is bytes per ns)."""
    return P.copy_latency_ns + math.ceil(nbytes / P.pcie_gbps)


def _frame(result) -> pd.DataFrame:
    df = result.trace.table.to_pandas()
    for col in ("name", "kind", "ph"):
        df[col] = df[col].astype(str)
    return df


def _api(df: pd.DataFrame, name: str) -> list[dict]:
    rows = df[(df["name"] == name) & (df["ph"] == "X")]
    return [dict(r, args=json.loads(r["args"])) for r in rows.to_dict("records")]


def test_a_blocking_memcpy_slice_spans_the_copy_and_says_why():
    acl.init(seed=0)
    acl.rt.set_device(0)
    host = acl.rt.malloc_host(8 * MiB)
    dev = acl.rt.malloc(8 * MiB)
    acl.rt.memcpy(dev, 8 * MiB, host, 8 * MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE)
    after = acl.rt.create_event()  # the next call starts where the copy let the thread go
    df = _frame(acl.finalize())
    (call,) = _api(df, "aclrtMemcpy")
    copy = _copy_ns(8 * MiB)  # 2 us + 8 MiB at 25 GB/s = 337,545 ns
    waited = P.dispatch_latency_ns + copy
    assert call["dur"] == P.launch_overhead_ns + waited  # 343,545 ns, not the 5 us launch
    assert call["kind"] == "sync"
    assert call["args"]["Blocked"] == "copy" and call["args"]["Blocked (ns)"] == waited
    (task,) = df[df["kind"] == "memcpy"].to_dict("records")
    assert task["ts"] + task["dur"] == call["ts"] + call["dur"]  # the host is let go as the copy ends
    (create,) = _api(df, "aclrtCreateEvent")
    assert create["ts"] == call["ts"] + call["dur"]
    assert after is not None


def test_an_async_copy_from_pageable_memory_holds_the_thread_for_the_copy():
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    pinned = acl.rt.malloc_host(4 * MiB)
    pageable = 0x10_0000  # plain host memory, not from aclrtMallocHost
    dev = acl.rt.malloc(4 * MiB)
    acl.rt.memcpy_async(dev, 4 * MiB, pinned, 4 * MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    acl.rt.synchronize_stream(s)
    acl.rt.memcpy_async(dev, 4 * MiB, pageable, 4 * MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    acl.rt.synchronize_stream(s)
    df = _frame(acl.finalize())
    fast, slow = _api(df, "aclrtMemcpyAsync")
    # From pinned memory the call only launches; from pageable memory it returns with the copy.
    assert fast["dur"] == P.launch_overhead_ns and "Blocked" not in fast["args"]
    waited = P.dispatch_latency_ns + _copy_ns(4 * MiB)
    assert slow["dur"] == P.launch_overhead_ns + waited  # 175,773 ns
    assert slow["args"]["Blocked"] == "pageable host memory" and slow["args"]["Blocked (ns)"] == waited
    assert slow["kind"] == "launch"  # still the call that put the copy on the stream
    # Its stream had drained: the synchronize after it did not wait.
    assert "Blocked" not in _api(df, "aclrtSynchronizeStream")[1]["args"]


def test_a_launch_at_a_full_queue_spans_the_wait_for_space():
    acl.init(seed=0, preset=replace(P, queue_tasks=2))
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    k = Kernel("MatMul", block_ns=100_000, core="cube")
    for _ in range(3):
        acl.rt.launch_kernel(k, 1, s)
    acl.rt.synchronize_stream(s)
    df = _frame(acl.finalize())
    launches = _api(df, "aclrtLaunchKernel")
    first_kernel = df[df["kind"] == "kernel"].sort_values("ts").iloc[0]
    assert [("Blocked" in c["args"]) for c in launches] == [False, False, True]
    third = launches[2]
    # The queue holds two tasks; the third launch waits until the first kernel retires.
    freed = int(first_kernel["ts"] + first_kernel["dur"])
    assert third["args"]["Blocked"] == "queue full" and third["args"]["Blocked (ns)"] == freed - third["ts"]
    assert third["ts"] + third["dur"] == freed + P.launch_overhead_ns
    (sync,) = _api(df, "aclrtSynchronizeStream")
    assert sync["args"]["Blocked"] == "synchronize"
    assert sync["dur"] == sync["args"]["Blocked (ns)"] + P.sync_overhead_ns


def test_stream_creation_records_priority_and_queue_depth():
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream(priority=5)
    df = _frame(acl.finalize())
    (create,) = _api(df, "aclrtCreateStream")
    assert create["args"] == {"Thread Id": create["tid"], "Stream Id": s.id, "Priority": 5, "Queue Depth": P.queue_tasks}
    assert create["stream"] == s.id and create["kind"] == "api"
    names = df[(df["name"] == "thread_name") & (df["pid"] == create["device"] + 2_000_000)]
    attrs = {json.loads(a)["name"]: json.loads(a) for a in names["args"]}
    # The default stream is made with the device, by no API call: its track says it too.
    assert attrs["Stream 0"]["Priority"] == 0 and attrs["Stream 0"]["Queue Depth"] == P.queue_tasks
    assert attrs[f"Stream {s.id}"]["Priority"] == 5


def test_copies_carry_their_source_and_destination_addresses():
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    host = acl.rt.malloc_host(MiB)
    dev = acl.rt.malloc(MiB)
    out = acl.rt.malloc_host(MiB)
    acl.rt.memcpy_async(dev, MiB, host, MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)
    acl.rt.memcpy_async(out, MiB, dev, MiB, acl.ACL_MEMCPY_DEVICE_TO_HOST, s)
    acl.rt.synchronize_stream(s)
    df = _frame(acl.finalize())
    h2d, d2h = _api(df, "aclrtMemcpyAsync")
    assert (h2d["args"]["Src Addr"], h2d["args"]["Dst Addr"], h2d["addr"]) == (host, dev, dev)
    assert (d2h["args"]["Src Addr"], d2h["args"]["Dst Addr"], d2h["addr"]) == (dev, out, out)


def test_a_synchronous_memcpy_waits_for_no_stream():
    """AscendCL: aclrtMemcpy copies at once, with no implicit device or stream synchronisation,
    and does not use the default stream. A kernel still running on the default stream or on
    another stream neither delays the copy nor the host."""
    acl.init(seed=0)
    acl.rt.set_device(0)
    s = acl.rt.create_stream()
    big = Kernel("Conv2D", block_ns=2_000_000, core="cube")
    acl.rt.launch_kernel(big, 1, None)  # the default stream
    acl.rt.launch_kernel(big, 1, s)
    host = acl.rt.malloc_host(MiB)
    dev = acl.rt.malloc(MiB)
    acl.rt.memcpy(dev, MiB, host, MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE)
    acl.rt.memcpy(host, MiB, dev, MiB, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    acl.rt.synchronize_device()
    df = _frame(acl.finalize())
    kernels = df[df["kind"] == "kernel"]
    copies = df[df["kind"] == "memcpy"].sort_values("ts")
    kernel_end = int((kernels["ts"] + kernels["dur"]).min())
    # Both copies ran, one after the other, while the 2 ms kernels still ran.
    assert (copies["ts"] + copies["dur"]).max() < kernel_end
    assert set(copies["stream"]) .isdisjoint(set(kernels["stream"]))
    first, second = _api(df, "aclrtMemcpy")
    assert first["dur"] == P.launch_overhead_ns + P.dispatch_latency_ns + _copy_ns(MiB)
    assert second["ts"] == first["ts"] + first["dur"]
    assert second["ts"] + second["dur"] < kernel_end  # the host came back before the kernels ended
    # The copies' queue is the device's own, named as such on its track.
    names = df[(df["name"] == "thread_name") & (df["tid"] == int(copies["stream"].iloc[0]))
               & (df["pid"] >= 2_000_000)]
    assert json.loads(names["args"].iloc[0])["Used By"] == "aclrtMemcpy"


# ---------------------------------------------------------------------- a copy racing a kernel
def _copy_then_kernel(wait: bool):
    """A user's mistake, and its fix: an 8 MiB upload on a copy stream, then a kernel on the compute
    stream that reads the uploaded buffer, with or without waiting for the copy's event."""
    acl.init(seed=0)
    acl.rt.set_device(0)
    host = acl.rt.malloc_host(8 * MiB)
    buf = acl.rt.malloc(8 * MiB)
    out = acl.rt.malloc(MiB)
    copy_stream, compute = acl.rt.create_stream(), acl.rt.create_stream()
    uploaded = acl.rt.create_event()
    acl.rt.memcpy_async(buf, 8 * MiB, host, 8 * MiB, acl.ACL_MEMCPY_HOST_TO_DEVICE, copy_stream)
    acl.rt.record_event(uploaded, copy_stream)
    if wait:
        acl.rt.stream_wait_event(compute, uploaded)
    acl.rt.launch_kernel(Kernel("Conv2D", block_ns=50_000, core="cube"), 1, compute, reads=(buf,), writes=(out,))
    acl.rt.synchronize_device()
    return buf, out, acl.finalize()


def test_a_copy_records_the_device_buffers_it_reads_and_writes():
    buf, out, result = _copy_then_kernel(wait=True)
    df = _frame(result)
    acc = df[df["kind"].isin(["mem_read", "mem_write"])]
    copy = df[df["kind"] == "memcpy"].iloc[0]
    kernel = df[df["kind"] == "kernel"].iloc[0]
    # The upload writes the device buffer (its host source is no device memory); the kernel
    # reads it and writes its output.
    assert sorted((r.kind, int(r.addr), int(r.corr)) for r in acc.itertuples()) == sorted([
        ("mem_write", buf, int(copy["corr"])), ("mem_read", buf, int(kernel["corr"])),
        ("mem_write", out, int(kernel["corr"]))])


def test_a_kernel_that_reads_a_buffer_still_being_copied_is_a_missing_sync():
    from analyzers import run

    buf, _out, result = _copy_then_kernel(wait=False)
    races = [f for f in run(result.trace, ["sync"]).findings if f.code == "MISSING_SYNC"]
    assert len(races) == 1
    df = _frame(result)
    copy = df[df["kind"] == "memcpy"].iloc[0]
    kernel = df[df["kind"] == "kernel"].iloc[0]
    # Without the wait the kernel starts while the upload (337,545 ns at 25 GB/s) is running.
    assert kernel["ts"] < copy["ts"] + copy["dur"] == copy["ts"] + _copy_ns(8 * MiB)
    assert races[0].stream == int(kernel["stream"])
    _buf, _out, fixed = _copy_then_kernel(wait=True)
    assert [f for f in run(fixed.trace, ["sync"]).findings if f.code == "MISSING_SYNC"] == []
