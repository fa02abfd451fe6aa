"""Memory findings under the one severity rule (analyzers.severity): a leak's or a failed
request's bytes as a share of the device's memory capacity, as the trace states it (the
emulator's preset, Kineto's deviceProperties), or of the run's peak when it does not."""

from __future__ import annotations

import pytest

from analyzers import Severity, run
from analyzers.frames import Frames
from analyzers.memory import capacities
from analyzers.severity import UNKNOWN_CAPACITY, UNKNOWN_COST, memory_severity
from msprof_py.trace.schema import COLUMN_NAMES, TraceMeta, build_table

MiB = 1 << 20
GiB = 1 << 30


def trace(rows: list[dict], *, extra: dict | None = None, source_meta: dict | None = None):
    rows = [{"rank": 0, "pid": 1, "tid": 1, **r} for r in rows]
    return build_table({c: [r.get(c) for r in rows] for c in COLUMN_NAMES},
                       TraceMeta(source_format="chrome", extra=extra or {}, source_meta=source_meta or {}))


def leaking(steps: int, per_step: int, device: int = 0, base: int = 64 * MiB) -> list[dict]:
    """`steps` steps of 1 ms, each keeping `per_step` bytes (never freed) beside a `base` buffer
    allocated before the first step and a workspace freed within each step."""
    rows = [{"ph": "i", "name": "[memory] weights", "kind": "alloc", "ts": 0, "bytes": base, "addr": 1 << 40,
             "device": device}]
    for i in range(steps):
        t = 1_000_000 * (i + 1)
        rows += [
            {"ph": "X", "name": f"ProfilerStep#{i}", "kind": "step", "ts": t, "dur": 1_000_000, "step": i},
            {"ph": "i", "name": "[memory] history", "kind": "alloc", "ts": t + 100, "bytes": per_step,
             "addr": (2 << 40) + i * per_step, "device": device, "step": i},
            {"ph": "i", "name": "[memory] workspace", "kind": "alloc", "ts": t + 200, "bytes": 8 * MiB,
             "addr": 3 << 40, "device": device, "step": i},
            {"ph": "i", "name": "[memory] workspace", "kind": "free", "ts": t + 300, "bytes": 8 * MiB,
             "addr": 3 << 40, "device": device, "step": i},
        ]
    return rows


def leak_of(tr):
    (f,) = [f for f in run(tr, ["memory"]).findings if f.code == "MEMORY_LEAK"]
    return f


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("lost, capacity, peak, expected", [
    (29 * MiB, 1000 * MiB, None, (Severity.INFO, 0.029)),
    (30 * MiB, 1000 * MiB, None, (Severity.WARNING, 0.03)),
    (100 * MiB, 1000 * MiB, None, (Severity.CRITICAL, 0.1)),
    (100 * MiB, 1000 * MiB, 200 * MiB, (Severity.CRITICAL, 0.1)),  # the capacity wins over the peak
    (100 * MiB, None, 200 * MiB, (UNKNOWN_CAPACITY, 0.5)),  # half the peak: an upper bound, at most a warning
    (2 * MiB, None, 200 * MiB, (Severity.INFO, 0.01)),
    (None, 1000 * MiB, None, (UNKNOWN_COST, None)),  # a failure whose free memory the trace does not show
    (100 * MiB, None, None, (UNKNOWN_COST, None)),
    (0, None, None, (Severity.INFO, 0.0)),  # nothing stranded: information, whatever the device
])
def test_memory_severity_is_the_one_rule_on_the_share_of_the_device(lost, capacity, peak, expected):
    assert memory_severity(lost, capacity, peak) == expected
    assert (UNKNOWN_CAPACITY, UNKNOWN_COST) == (Severity.WARNING, Severity.WARNING)


# ---------------------------------------------------------------- where the capacity comes from
def test_capacity_from_the_emulator_preset_or_kineto_device_properties():
    assert capacities(Frames(trace(leaking(1, MiB), extra={"preset": {"hbm_bytes": 2 * GiB}}))) == {None: 2 * GiB}
    props = {"deviceProperties": [{"id": 0, "name": "GPU", "totalGlobalMem": 40 * GiB},
                                  {"id": 1, "name": "GPU", "totalGlobalMem": 80 * GiB}, {"id": 2}]}
    assert capacities(Frames(trace(leaking(1, MiB), source_meta=props))) == {0: 40 * GiB, 1: 80 * GiB}
    assert capacities(Frames(trace(leaking(1, MiB)))) == {}  # torch_npu, msprof: not in the trace


# ---------------------------------------------------------------- leaks
def test_a_leak_is_its_bytes_as_a_share_of_the_preset_capacity():
    # 4 steps of 32 MiB kept: 128 MiB, 12.5% of a 1 GiB device (critical); of 64 GiB, 0.195% (info).
    f = leak_of(trace(leaking(4, 32 * MiB), extra={"preset": {"hbm_bytes": GiB}}))
    assert (f.lost_bytes, f.severity) == (128 * MiB, Severity.CRITICAL)
    assert f.message.endswith("128 MiB held by the end of the run, 12.5% of the device's 1,020 MiB")
    f = leak_of(trace(leaking(4, 32 * MiB), extra={"preset": {"hbm_bytes": 64 * GiB}}))
    assert (f.lost_bytes, f.severity) == (128 * MiB, Severity.INFO)
    assert f.message.endswith("0.195% of the device's 65,500 MiB")


def test_a_leak_on_a_kineto_device_is_a_share_of_its_total_global_mem():
    props = {"deviceProperties": [{"id": 0, "totalGlobalMem": 16 * GiB}, {"id": 1, "totalGlobalMem": 2 * GiB}]}
    # 128 MiB on device 1: 6.25% of its 2 GiB (device 0's 16 GiB would make it 0.78%).
    f = leak_of(trace(leaking(4, 32 * MiB, device=1), source_meta=props))
    assert (f.device, f.lost_bytes, f.severity) == (1, 128 * MiB, Severity.WARNING)
    assert f.message.endswith("6.25% of the device's 2,050 MiB")


def test_without_a_capacity_a_leak_is_a_share_of_the_runs_peak_and_at_most_a_warning():
    # Peak live: 64 MiB of weights + 4 x 32 MiB kept + the 8 MiB workspace = 200 MiB; 128 / 200 = 64%.
    f = leak_of(trace(leaking(4, 32 * MiB)))
    assert (f.lost_bytes, f.severity) == (128 * MiB, Severity.WARNING)
    assert f.message.endswith("64.0% of the run's peak of 200 MiB; the device's capacity is not in the trace")
    # A small leak beside a large peak stays information: 4 x 1 MiB of 1,032 MiB is 0.388%.
    f = leak_of(trace(leaking(4, MiB, base=1020 * MiB)))
    assert (f.lost_bytes, f.severity) == (4 * MiB, Severity.INFO)


# ---------------------------------------------------------------- fragmentation
def counters(ts: int, reserved: int, allocated: int, used: int) -> list[dict]:
    return [{"ph": "C", "name": name, "kind": "counter", "ts": ts, "value": float(v), "device": 0}
            for name, v in (("Device memory reserved", reserved), ("Device memory allocated", allocated),
                            ("Device memory used", used))]


def frag_of(tr):
    (f,) = [f for f in run(tr, ["memory"]).findings if f.code == "MEMORY_FRAGMENTATION"]
    return f


def test_a_failed_request_costs_the_free_memory_it_could_not_use_as_a_share_of_the_device():
    # At the failure: 600 MiB reserved, 200 allocated (400 in the cache's holes), 700 MiB used of a
    # 1 GiB device (324 MiB left in the driver): 724 MiB free, no block over 40 MiB for 64 MiB asked.
    rows = [*counters(10, 600 * MiB, 200 * MiB, 700 * MiB),
            {"ph": "i", "name": "oom", "kind": "alloc_fail", "ts": 50, "bytes": 64 * MiB, "value": float(40 * MiB),
             "device": 0}]
    f = frag_of(trace(rows, extra={"preset": {"hbm_bytes": GiB}}))
    assert (f.lost_bytes, f.severity) == (724 * MiB, Severity.CRITICAL)  # 70.7% of the device
    assert f.message.endswith("; 724 MiB free memory unusable, 70.7% of the device's 1,020 MiB")
    # Without the capacity only the cache's 400 MiB is known free; its share of the run's peak
    # (700 MiB used) is 57.1%: at most a warning.
    f = frag_of(trace(rows))
    assert (f.lost_bytes, f.severity) == (400 * MiB, Severity.WARNING)
    assert f.message.endswith("57.1% of the run's peak of 700 MiB; the device's capacity is not in the trace")


def test_a_cache_holding_much_more_than_it_hands_out_strands_nothing_until_a_request_fails():
    rows = [{"ph": "i", "name": "[memory] cache", "kind": "alloc", "ts": 5, "bytes": 100 * MiB, "addr": 1 << 40,
             "device": 0}, *counters(10, 600 * MiB, 100 * MiB, 700 * MiB)]
    f = frag_of(trace(rows, extra={"preset": {"hbm_bytes": GiB}}))
    assert (f.lost_bytes, f.severity, f.metric, f.value) == (0, Severity.INFO, "fragmentation_ratio", 0.833333)
    assert f.message == ("rank 0 device 0: 500 MiB reserved but not allocated (83.3% of reserved); no allocation "
                         "failed, so none of it was stranded")
