"""communication.json and communication_matrix.json of a 2-server run agree: both come from one
computation of the links each rank sent on during each op (msprof_py.communication)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from msprof_py import prof_dir
from msprof_py.communication import TRANSPORTS, MiB
from runtime_emu import scenarios

#: Bytes each rank sent per transport over its 6 ops (3 ReduceScatters, 3 AllGathers of one
#: step): the intra-server halves over HCCS, the inter-server quarters over the RoCE NIC, as the
#: link counters integrate them (a few bytes above the buffers' shares: the counters' rates are floats).
SENT = {"HCCS": 350_236_768, "RDMA": 175_118_350}
#: What a link at its nominal rate shows: msprof-analyze's bandwidth is MB (2^20 bytes) per ms.
AT_NOMINAL = {"HCCS": round(28e9 / MiB / 1e3, 4), "RDMA": round(25e9 / MiB / 1e3, 4)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 ranks on 2 servers of 2 NPUs, one decoder layer, one step: the exports read back."""
    result = scenarios.run("llm-train-2server", steps=1, ranks=4, layers=1, servers=2)
    prof = prof_dir.new_prof_dir(tmp_path_factory.mktemp("out"))
    files = {f.name: f for f in prof_dir.write_exports(prof, result.trace, stamp="20250101120000")}
    comm = json.loads(Path(files["communication.json"]).read_text())
    matrix = json.loads(Path(files["communication_matrix.json"]).read_text())
    return comm, matrix, result.trace.meta.extra, result.ground_truth


def ops(comm: dict, matrix: dict):
    """(rank, op, its communication.json entry, its matrix links) for every op of every rank."""
    assert comm.keys() == matrix.keys()
    for rank, steps in comm.items():
        assert steps.keys() == matrix[rank].keys()
        for step, kinds in steps.items():
            for kind, entries in kinds.items():
                assert entries.keys() == matrix[rank][step][kind].keys()
                for op, entry in entries.items():
                    yield int(rank), op, entry, matrix[rank][step][kind][op]


def test_every_op_has_its_links_on_both_transports(run) -> None:
    comm, matrix, _, _ = run
    seen = [(rank, op.split("@")[0], sorted((pair, link["Transport Type"]) for pair, link in links.items()))
            for rank, op, _, links in ops(comm, matrix)]
    names = [f"hcom_{n}__{k}" for n in ("reduceScatter", "allGather") for k in range(3)]
    peer = {0: 1, 1: 0, 2: 3, 3: 2}  # the other NPU of the same server
    remote = {0: 2, 1: 3, 2: 0, 3: 1}  # the NPU in the same position on the other server
    assert sorted(seen) == sorted(
        (r, name, sorted([(f"{r}-{peer[r]}", "HCCS"), (f"{r}-{remote[r]}", "RDMA")])) for r in range(4) for name in names)


def test_bytes_per_transport_are_the_matrix_links_sums(run) -> None:
    comm, matrix, _, truth = run
    sent: dict[tuple[int, str], int] = {}
    for rank, op, entry, links in ops(comm, matrix):
        info = entry["Communication Bandwidth Info"]
        assert list(info) == list(TRANSPORTS)
        for transport in TRANSPORTS:
            mine = [link for link in links.values() if link["Transport Type"] == transport]
            assert all(link["Op Name"] == op for link in mine)
            assert info[transport]["Transit Size(MB)"] == sum((link["Transit Size(MB)"] for link in mine), 0.0)
            assert info[transport]["Transit Time(ms)"] == sum((link["Transit Time(ms)"] for link in mine), 0.0)
            assert info[transport]["Size Distribution"] == (
                {f"{mine[0]['Transit Size(MB)']:g}": [1, mine[0]["Transit Time(ms)"]]} if mine else {})
            sent[rank, transport] = sent.get((rank, transport), 0) + round(info[transport]["Transit Size(MB)"] * MiB)
    assert sent == {(r, t): SENT.get(t, 0) for r in range(4) for t in TRANSPORTS}
    # The emulator's own count of what each link moved, to the counters' float rounding.
    links = truth["hccl"]["link_bytes"]
    for r in range(4):
        assert sent[r, "HCCS"] == pytest.approx(sum(v for k, v in links.items() if k.startswith(f"r{r}->")), rel=1e-6)
        assert sent[r, "RDMA"] == pytest.approx(links[f"r{r}.roce_tx"], rel=1e-6)


def test_bandwidth_is_bytes_over_time_and_no_link_beats_its_nominal(run) -> None:
    comm, matrix, extra, _ = run
    topo, preset = extra["topology"], extra["preset"]
    nominal = {"HCCS": topo["hccs_gbps"], "RDMA": topo["roce_gbps"], "PCIE": preset["pcie_gbps"]}
    for _, _, entry, links in ops(comm, matrix):
        for info in entry["Communication Bandwidth Info"].values():
            size, time = info["Transit Size(MB)"], info["Transit Time(ms)"]
            assert info["Bandwidth(GB/s)"] == (round(size / time, 4) if time else 0.0)
        for link in links.values():
            size, time, kind = link["Transit Size(MB)"], link["Transit Time(ms)"], link["Transport Type"]
            assert link["Bandwidth(GB/s)"] == round(size / time, 4) == AT_NOMINAL[kind]
            assert size * MiB / (time * 1e6) <= nominal[kind] * (1 + 1e-6)  # bytes per ns: 10^9 bytes/s
            assert link["Bandwidth(GB/s)"] <= nominal[kind]


def test_time_split_is_msprof_analyzes(run) -> None:
    """Elapse = the wait before the op + the op = transit + wait + idle; transit is the time some
    link the op sent on was busy (their union), so links idle during part of the op give idle > 0;
    synchronization is the opening wait; the ratios are msprof-analyze's."""
    comm, matrix, _, _ = run
    idle = []
    for _, _, entry, links in ops(comm, matrix):
        t = entry["Communication Time Info"]
        assert t["Elapse Time(ms)"] == pytest.approx(
            t["Transit Time(ms)"] + t["Wait Time(ms)"] + t["Idle Time(ms)"], abs=1e-6)
        assert t["Idle Time(ms)"] >= 0 and t["Transit Time(ms)"] > 0
        # No wait tasks inside the ops of this run: the only wait is the opening one.
        assert t["Synchronization Time(ms)"] == t["Wait Time(ms)"]
        # The union of the links' busy time: at least the busiest link's, at most all of them summed.
        busy = [link["Transit Time(ms)"] for link in links.values()]
        assert max(busy) - 1e-6 <= t["Transit Time(ms)"] <= sum(busy) + 1e-6
        wait, transit, sync = t["Wait Time(ms)"], t["Transit Time(ms)"], t["Synchronization Time(ms)"]
        assert t["Wait Time Ratio"] == round(wait / (wait + transit), 4)
        assert t["Synchronization Time Ratio"] == round(sync / (sync + transit), 4)
        idle.append(t["Idle Time(ms)"])
    # The links are idle during part of every op (the algorithm's steps wait on their peers' notifies).
    assert min(idle) > 0


@pytest.fixture(scope="module")
def job16(tmp_path_factory):
    """16 ranks on 2 servers of 8 NPUs with rank 8's NIC slow: exports, dashboard and findings."""
    import analyzers

    result = scenarios.run("llm-train-2server", switches=["slow-link"], steps=1, layers=1, seed=0)
    assert result.trace.meta.extra["topology"]["servers"] == 2
    prof = prof_dir.new_prof_dir(tmp_path_factory.mktemp("out16"))
    files = {f.name: f for f in prof_dir.write_exports(prof, result.trace, stamp="20250101120000")}
    comm = json.loads(Path(files["communication.json"]).read_text())
    matrix = json.loads(Path(files["communication_matrix.json"]).read_text())
    found = analyzers.run(result.trace, ["links"]).findings
    return comm, matrix, result.trace.meta.extra, found


def test_a_16_rank_job_s_files_dashboard_and_findings_agree_per_transport_and_link(job16) -> None:
    from dashboard.figures_resources import link_matrices

    comm, matrix, extra, found = job16
    topo, preset = extra["topology"], extra["preset"]
    nominal = {"HCCS": topo["hccs_gbps"], "RDMA": topo["roce_gbps"], "PCIE": preset["pcie_gbps"]}
    ranks = sorted(int(r) for r in comm)
    assert ranks == list(range(16))
    file_mb: dict[str, float] = {}
    file_ms: dict[str, float] = {}
    link_mb: dict[str, float] = {}
    link_ms: dict[str, float] = {}
    pair_mb: dict[tuple[int, int, str], float] = {}
    for _, _, entry, links in ops(comm, matrix):
        for transport, info in entry["Communication Bandwidth Info"].items():
            file_mb[transport] = file_mb.get(transport, 0.0) + info["Transit Size(MB)"]
            file_ms[transport] = file_ms.get(transport, 0.0) + info["Transit Time(ms)"]
        for pair, link in links.items():
            t = link["Transport Type"]
            link_mb[t] = link_mb.get(t, 0.0) + link["Transit Size(MB)"]
            link_ms[t] = link_ms.get(t, 0.0) + link["Transit Time(ms)"]
            src, dst = (int(x) for x in pair.split("-"))
            pair_mb[src, dst, t] = pair_mb.get((src, dst, t), 0.0) + link["Transit Size(MB)"]
            # No link of any op beats its transport's nominal rate (bytes per ns = GB/s).
            assert link["Transit Size(MB)"] * MiB / (link["Transit Time(ms)"] * 1e6) <= nominal[t] * (1 + 1e-6)
    # communication.json per transport == the matrix's links summed, bytes and time (so bandwidth).
    assert set(link_mb) == {"HCCS", "RDMA"}
    for t in TRANSPORTS:
        assert file_mb[t] == pytest.approx(link_mb.get(t, 0.0), rel=1e-12, abs=1e-9)
        assert file_ms[t] == pytest.approx(link_ms.get(t, 0.0), rel=1e-12, abs=1e-9)
    # Traffic crosses the servers, on RDMA only, between NPUs in the same position.
    cross = {(s, d) for (s, d, t) in pair_mb if s // 8 != d // 8}
    assert cross == {(r, (r + 8) % 16) for r in range(16)}
    assert all(t == "RDMA" for (s, d, t) in pair_mb if s // 8 != d // 8)
    # The dashboard's bytes matrix is the matrix file's links, pair by pair (GiB).
    m = link_matrices(matrix, ranks)["bytes"].z
    per_pair: dict[tuple[int, int], float] = {}
    for (s, d, _), mb in pair_mb.items():
        per_pair[s, d] = per_pair.get((s, d), 0.0) + mb
    for (s, d), mb in per_pair.items():
        assert m[s, d] * 1024 == pytest.approx(mb)
    assert int((~np.isnan(m)).sum()) == len(per_pair)
    # The SLOW_LINK finding names rank 8's NIC, and what it says the link carried is what the
    # matrix's links out of it over RDMA sum to (the same counter, the same integration).
    (f,) = [f for f in found if f.code == "SLOW_LINK"]
    by_link = {e["link"]: e for e in f.evidence}
    # (rank 8's NIC is slow: its peer across the servers, rank 0, sends to and receives from it
    # at the same rate, one fault seen from both ends).
    assert set(by_link) == {"r0.roce_rx", "r0.roce_tx", "r8.roce_rx", "r8.roce_tx"}
    for name, e in by_link.items():
        rank = int(name[1:].split(".")[0])
        if name.endswith("_tx"):
            moved = sum(v for (s, _, t), v in pair_mb.items() if s == rank and t == "RDMA")
        else:
            moved = sum(v for (_, d, t), v in pair_mb.items() if d == rank and t == "RDMA")
        assert e["bytes"] / MiB == pytest.approx(moved, rel=1e-6)
        assert e["gbps"] == pytest.approx(6.25, rel=1e-6) and e["gbps"] <= e["nominal_gbps"] == 25.0
    assert "the busiest carrying 41.8 MB" in f.message
