"""Event semantics of the emulated runtime, as AscendCL documents them for reusable events (and
CUDA has them): `stream_wait_event(B, e)` captures the most recent `record_event(e, ...)` made
before it on the host, and B's later work starts once that record has executed. Records made
after the wait do not affect it; an event never recorded has nothing to wait for.

Each test is a user program against `runtime_emu.acl`. Expected times are worked out by hand
from the preset below (round numbers, a queue deep enough that the host never blocks):
API overhead 100 ns, launch overhead 1000 ns, dispatch latency 500 ns, so a task launched at
host time t reaches its stream at t + 1500; 4 Cube + 2 Vector cores. Producers run on the Cube
cores and consumers on the Vector cores, so a consumer never waits for cores and its start is
the event alone.
"""

from __future__ import annotations

import pandas as pd

from runtime_emu import Kernel, acl
from runtime_emu.presets import GiB, MiB, Preset

P = Preset("events", cube_cores=4, vector_cores=2, hbm_bytes=1 * GiB, hbm_gbps=100.0, pcie_gbps=10.0,
           huge_page_bytes=64 * MiB, queue_tasks=64, launch_overhead_ns=1000, api_overhead_ns=100,
           sync_overhead_ns=200, dispatch_latency_ns=500, copy_latency_ns=0)
API, LAUNCH, DISPATCH = 100, 1000, 500


def producer(name: str, ns: int) -> Kernel:
    """4 blocks on the 4 Cube cores: one wave of `ns`."""
    return Kernel(name, block_ns=ns, core="cube")


CONSUMER = Kernel("consumer", block_ns=10_000, core="vector")  # 2 blocks on 2 Vector cores: 10 us


def device_rows(result) -> pd.DataFrame:
    df = result.trace.to_pandas()
    return df[df.kind.isin(["kernel", "marker", "wait"])].sort_values(["ts", "corr"])


def span(rows: pd.DataFrame, name: str) -> tuple[int, int]:
    """(start, end) of the only device row called `name`."""
    row = rows[rows.name == name]
    assert len(row) == 1, row
    return int(row.ts.iloc[0]), int(row.ts.iloc[0] + row.dur.iloc[0])


def gt_of(result, corr: int) -> dict:
    tasks = result.ground_truth["tasks"]
    i = tasks["corr"].index(corr)
    return {k: v[i] for k, v in tasks.items()}


def test_a_wait_after_a_re_record_waits_for_the_second_record():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b = acl.rt.create_stream(), acl.rt.create_stream()  # 300
    e = acl.rt.create_event()  # 400
    acl.rt.launch_kernel(producer("first", 100_000), 4, a)  # 400..1400, arrives 1900: runs 1900..101_900
    acl.rt.record_event(e, a)  # 1400..2400: executes at 101_900
    acl.rt.launch_kernel(producer("second", 300_000), 4, a)  # 2400..3400: runs 101_900..401_900
    acl.rt.record_event(e, a)  # 3400..4400: executes at 401_900
    acl.rt.stream_wait_event(b, e)  # 4400..5400, arrives 5900: captures the second record
    consumer = acl.rt.launch_kernel(CONSUMER, 2, b)  # 5400..6400, arrives 6900
    result = acl.finalize()

    rows = device_rows(result)
    first_end = 400 + LAUNCH + DISPATCH + 100_000
    second_end = first_end + 300_000
    assert span(rows, "first") == (1_900, first_end)
    assert span(rows, "second") == (first_end, second_end)
    # The first record does not release it (the bug: the consumer started at 101_900).
    assert span(rows, "consumer") == (second_end, second_end + 10_000)
    records = rows[rows.name == "EVENT_RECORD"]
    assert records.ts.tolist() == [first_end, second_end]
    waits = rows[rows.name == "EVENT_WAIT"]
    assert (waits.ts.tolist(), (waits.ts + waits.dur).tolist()) == ([5_900], [second_end])
    # The ground truth names the record waited for, and what ran before it.
    second_record = int(records["corr"].iloc[1])
    assert gt_of(result, int(waits["corr"].iloc[0]))["record"] == second_record
    gt = gt_of(result, consumer)
    assert (gt["cause"], gt["producer"], gt["record"]) == ("event", "kernel", second_record)


def test_a_wait_issued_between_two_records_waits_for_the_first_only():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b, c = acl.rt.create_stream(), acl.rt.create_stream(), acl.rt.create_stream()  # 400
    e = acl.rt.create_event()  # 500
    acl.rt.launch_kernel(producer("first", 100_000), 4, a)  # 500..1500, arrives 2000: runs 2000..102_000
    acl.rt.record_event(e, a)  # 1500..2500: executes at 102_000
    acl.rt.stream_wait_event(b, e)  # 2500..3500: captures the first record
    early = acl.rt.launch_kernel(CONSUMER, 2, b)  # 3500..4500, arrives 5000
    acl.rt.launch_kernel(producer("second", 300_000), 4, a)  # 4500..5500: runs 102_000..402_000
    acl.rt.record_event(e, a)  # 5500..6500: executes at 402_000
    acl.rt.stream_wait_event(c, e)  # 6500..7500: captures the second record
    late = acl.rt.launch_kernel(Kernel("late consumer", 10_000, core="vector"), 2, c)  # 7500..8500
    result = acl.finalize()

    rows = device_rows(result)
    first_end = 500 + LAUNCH + DISPATCH + 100_000
    second_end = first_end + 300_000
    assert span(rows, "first") == (2_000, first_end)
    assert span(rows, "second") == (first_end, second_end)
    # The second record, made after the wait, does not hold B back.
    assert span(rows, "consumer") == (first_end, first_end + 10_000)
    assert span(rows, "late consumer") == (second_end, second_end + 10_000)
    first_record, second_record = rows[rows.name == "EVENT_RECORD"]["corr"].astype(int).tolist()
    assert gt_of(result, early)["record"] == first_record
    assert gt_of(result, late)["record"] == second_record


def test_record_before_wait_still_running_holds_the_waiting_stream():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b = acl.rt.create_stream(), acl.rt.create_stream()  # 300
    e = acl.rt.create_event()  # 400
    acl.rt.launch_kernel(producer("producer", 50_000), 4, a)  # 400..1400, arrives 1900: runs 1900..51_900
    acl.rt.record_event(e, a)  # 1400..2400
    acl.rt.stream_wait_event(b, e)  # 2400..3400, arrives 3900
    consumer = acl.rt.launch_kernel(CONSUMER, 2, b)  # 3400..4400, arrives 4900
    result = acl.finalize()

    rows = device_rows(result)
    end = 400 + LAUNCH + DISPATCH + 50_000
    assert span(rows, "producer") == (1_900, end)
    assert span(rows, "EVENT_WAIT") == (3_400 + DISPATCH, end)
    assert span(rows, "consumer") == (end, end + 10_000)
    gt = gt_of(result, consumer)
    assert (gt["cause"], gt["producer"]) == ("event", "kernel")


def test_record_already_executed_when_the_wait_arrives_costs_nothing():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b = acl.rt.create_stream(), acl.rt.create_stream()  # 300
    e = acl.rt.create_event()  # 400
    acl.rt.launch_kernel(producer("producer", 1_000), 4, a)  # 400..1400, arrives 1900: runs 1900..2900
    acl.rt.record_event(e, a)  # 1400..2400, arrives 2900: executes at 2900
    acl.prof.host_work("host", 10_000)  # 2400..12_400
    acl.rt.stream_wait_event(b, e)  # 12_400..13_400, arrives 13_900: already satisfied
    consumer = acl.rt.launch_kernel(CONSUMER, 2, b)  # 13_400..14_400, arrives 14_900
    result = acl.finalize()

    rows = device_rows(result)
    assert span(rows, "producer") == (1_900, 2_900)
    assert span(rows, "consumer") == (14_900, 24_900)
    # A satisfied wait takes no device time, and the device logs it all the same (as msprof's
    # task data holds every EVENT_WAIT): the trace's evidence of what the consumer waited for.
    assert span(rows, "EVENT_WAIT") == (13_900, 13_900)
    assert rows[rows.name == "EVENT_WAIT"]["addr"].tolist() == rows[rows.name == "EVENT_RECORD"]["addr"].tolist()
    record = int(rows[rows.name == "EVENT_RECORD"]["corr"].iloc[0])
    wait = result.ground_truth["tasks"]["kind"].index("wait")
    assert result.ground_truth["tasks"]["record"][wait] == record
    assert gt_of(result, consumer)["cause"] == "launch"


def test_the_dependency_graph_reads_a_wait_that_took_no_time_as_a_link_to_the_events_producer():
    from analyzers import Frames
    from analyzers.causality.graph import passed_wait_sources, stream_tasks

    acl.init(preset=P)
    acl.rt.set_device(0)
    a, b = acl.rt.create_stream(), acl.rt.create_stream()
    e = acl.rt.create_event()
    acl.rt.launch_kernel(producer("producer", 1_000), 4, a)  # runs 1900..2900
    acl.rt.record_event(e, a)
    acl.rt.launch_kernel(producer("busy", 20_000), 4, b)  # b is busy past the record
    acl.rt.stream_wait_event(b, e)  # satisfied when b reaches it
    acl.rt.launch_kernel(CONSUMER, 2, b)
    frames = Frames(acl.finalize().trace)
    t = stream_tasks(frames)
    names = t["name"].astype(str).tolist()
    assert "EVENT_WAIT" not in names  # a link, not a task
    src = passed_wait_sources(frames, 0, t)
    assert {names[j]: names[s] for j, s in enumerate(src.tolist()) if s >= 0} == {"consumer": "producer"}


def test_a_wait_before_any_record_completes_at_once():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b = acl.rt.create_stream(), acl.rt.create_stream()  # 300
    e = acl.rt.create_event()  # 400
    acl.rt.launch_kernel(producer("producer", 300_000), 4, a)  # 400..1400, arrives 1900: runs 1900..301_900
    acl.rt.stream_wait_event(b, e)  # 1400..2400, arrives 2900: the event has no record, nothing to wait for
    consumer = acl.rt.launch_kernel(CONSUMER, 2, b)  # 2400..3400, arrives 3900
    acl.rt.record_event(e, a)  # 3400..4400: made after the wait, does not affect it
    result = acl.finalize()

    rows = device_rows(result)
    assert span(rows, "producer") == (1_900, 301_900)
    assert span(rows, "consumer") == (2_400 + LAUNCH + DISPATCH, 13_900)
    assert span(rows, "EVENT_WAIT") == (2_900, 2_900)  # logged, no time
    wait = result.ground_truth["tasks"]["kind"].index("wait")
    assert result.ground_truth["tasks"]["record"][wait] is None
    gt = gt_of(result, consumer)
    assert (gt["cause"], gt["record"]) == ("launch", None)


def test_a_later_record_that_executes_first_does_not_release_the_wait():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, b, c = acl.rt.create_stream(), acl.rt.create_stream(), acl.rt.create_stream()  # 400
    e = acl.rt.create_event()  # 500
    acl.rt.launch_kernel(producer("producer", 300_000), 4, a)  # 500..1500, arrives 2000: runs 2000..302_000
    acl.rt.record_event(e, a)  # 1500..2500: executes at 302_000
    acl.rt.stream_wait_event(b, e)  # 2500..3500: captures the record on A
    acl.rt.launch_kernel(CONSUMER, 2, b)  # 3500..4500, arrives 5000
    acl.rt.record_event(e, c)  # 4500..5500, arrives 6000: C is idle, it executes at once
    result = acl.finalize()

    rows = device_rows(result)
    assert rows[rows.name == "EVENT_RECORD"].ts.tolist() == [6_000, 302_000]
    assert span(rows, "consumer") == (302_000, 312_000)


def test_cross_device_event_orders_a_stream_of_another_device():
    acl.init(preset=P, devices=2)
    acl.rt.set_device(0)  # host 100
    a = acl.rt.create_stream()  # 200, device 0
    e = acl.rt.create_event()  # 300
    acl.rt.launch_kernel(producer("first", 100_000), 4, a)  # 300..1300, arrives 1800: runs 1800..101_800
    acl.rt.record_event(e, a)  # 1300..2300: executes at 101_800
    acl.rt.launch_kernel(producer("second", 300_000), 4, a)  # 2300..3300: runs 101_800..401_800
    acl.rt.record_event(e, a)  # 3300..4300: executes at 401_800
    acl.rt.set_device(1)  # 4300..4400
    b = acl.rt.create_stream()  # 4400..4500, device 1
    acl.rt.stream_wait_event(b, e)  # 4500..5500, arrives 6000: captures the second record
    consumer = acl.rt.launch_kernel(producer("consumer", 10_000), 4, b)  # 5500..6500: device 1's own cores
    result = acl.finalize()

    rows = device_rows(result)
    first_end = 300 + LAUNCH + DISPATCH + 100_000
    second_end = first_end + 300_000
    assert span(rows, "second") == (first_end, second_end)
    assert span(rows, "consumer") == (second_end, second_end + 10_000)
    assert rows[rows.name == "consumer"].device.tolist() == [1]
    assert rows[rows.name == "second"].device.tolist() == [0]
    second_record = int(rows[rows.name == "EVENT_RECORD"]["corr"].iloc[1])
    gt = gt_of(result, consumer)
    assert (gt["device"], gt["cause"], gt["producer"], gt["record"]) == (1, "event", "kernel", second_record)


def test_synchronize_event_waits_for_the_latest_record_only():
    acl.init(preset=P)
    acl.rt.set_device(0)  # host 100
    a, c = acl.rt.create_stream(), acl.rt.create_stream()  # 300
    e = acl.rt.create_event()  # 400
    acl.rt.launch_kernel(producer("long", 300_000), 4, a)  # 400..1400, arrives 1900: runs 1900..301_900
    acl.rt.record_event(e, a)  # 1400..2400: executes at 301_900
    acl.rt.record_event(e, c)  # 2400..3400, arrives 3900: C is idle, it executes at once
    acl.rt.synchronize_event(e)  # from 3400 until 3900, then its 200 ns
    assert acl.prof.now() == 3_900 + 200
    acl.finalize()
