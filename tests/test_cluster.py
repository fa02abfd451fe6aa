"""msprof-analyze's cluster analyses from the trace table (analyzers.cluster, `msprof-py cluster`):
slow ranks by Dixon's Q test on the members' arrivals, slow links by 3 sigma per transport."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzers import Frames
from analyzers.cluster import DIXON_Q95, collective_outliers, dixon_q, slow_link_stats, slow_rank_stats, slow_ranks
from msprof_py import communication, loading
from msprof_py.cli import app
from msprof_py.summaries import Rows
from msprof_py.trace import read_trace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "emulated"
runner = CliRunner()

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def sample(name: str):
    trace = read_trace(SAMPLES / name / "trace")
    truth = json.loads((SAMPLES / name / "ground_truth.json").read_text())
    return trace, truth


# (a) Dixon's Q test -----------------------------------------------------------------------------

def test_dixon_table_is_rorabachers_and_covers_3_to_100() -> None:
    assert sorted(DIXON_Q95) == list(range(3, 101))
    assert [DIXON_Q95[n] for n in (3, 4, 5, 6, 7, 8, 9, 10)] == [0.970, 0.829, 0.710, 0.625, 0.568, 0.526, 0.493, 0.466]
    assert DIXON_Q95[20] == 0.342 and DIXON_Q95[30] == 0.298
    values = [DIXON_Q95[n] for n in range(3, 101)]
    assert values == sorted(values, reverse=True) and DIXON_Q95[100] > 0.15


def test_dixon_q_by_hand() -> None:
    # The classic textbook set (n = 10): is 0.167 an outlier? Q = (0.177 - 0.167) / (0.189 - 0.167)
    # = 0.4545 < 0.466: it is kept. The function tests the largest value, so the set is mirrored.
    data = [0.189, 0.167, 0.187, 0.183, 0.186, 0.182, 0.181, 0.184, 0.181, 0.177]
    q, crit = dixon_q([-x for x in data])
    assert q == pytest.approx(0.010 / 0.022) and crit == 0.466 and q < crit
    # Five replicates, one far off: Q = (12.0 - 10.5) / (12.0 - 10.2) = 0.8333 > 0.710.
    q, crit = dixon_q([10.2, 10.4, 10.5, 10.3, 12.0])
    assert q == pytest.approx(1.5 / 1.8) and crit == 0.710 and q > crit
    # Three values: Q = (9 - 2) / (9 - 1) = 0.875 < 0.970: not an outlier with so few.
    assert dixon_q([1, 2, 9]) == (pytest.approx(0.875), 0.970)
    assert dixon_q([5, 5, 5]) == (0.0, 0.970)
    for bad in ([1, 2], list(range(101))):
        with pytest.raises(ValueError):
            dixon_q(bad)


# (b) emulated runs ------------------------------------------------------------------------------

def test_the_injected_slow_rank_is_the_one_flagged() -> None:
    trace, truth = sample("bert-train-dp-slow-rank")
    injected = truth["problems"][0]["expected"]["slow_rank"]
    frames = Frames(trace)
    assert slow_ranks(frames) == [{"rank": injected, "outlier_count": 12, "lateness_ns": 27_935_051,
                                   "top_op": "hcom_allReduce"}]
    stats = slow_rank_stats(frames)
    assert stats["rank"].tolist() == list(range(8)) and (stats["collectives"] == 15).all()
    assert stats.set_index("rank")["outlier_count"].to_dict() == {r: 12 if r == 3 else 0 for r in range(8)}
    out = collective_outliers(frames)
    # 15 AllReduces of 8 members, all judged by Dixon's test; the 3 where rank 3 was not late are
    # those every rank reached at once (Q = 0).
    assert len(out) == 15 and (out["test"] == "dixon").all() and (out["critical"] == 0.526).all()
    assert sorted(out.loc[~out["outlier"], "statistic"]) == [0.0, 0.0, 0.0]


def test_a_healthy_run_flags_no_rank() -> None:
    trace, _ = sample("bert-train-dp")
    frames = Frames(trace)
    assert slow_ranks(frames) == []
    assert slow_link_stats(frames, communication.summaries(Rows(trace))[1])["slow"].sum() == 0


def test_the_slow_links_are_the_slow_nics() -> None:
    trace, truth = sample("llm-train-2server-slow-link")
    assert truth["problems"][0]["where"]["links"] == ["r8.roce_rx", "r8.roce_tx"]
    frames = Frames(trace)
    links = slow_link_stats(frames, communication.summaries(Rows(trace))[1])
    by_transport = links.groupby("transport").agg(n=("op", "size"), slow=("slow", "sum"))
    assert by_transport.to_dict("index") == {"HCCS": {"n": 2688, "slow": 0}, "RDMA": {"n": 384, "slow": 16}}
    slow = links[links["slow"]]
    # Rank 8's NIC both ways (its tx to rank 0, rank 0's sends into its rx), at a quarter of 25 GB/s:
    # flagged on the 8 of its 24 ops with the larger payload (7.8 MB: 1.31 ms against the RDMA links'
    # mean of 0.352 ms); on the 5.25 MB ops its 0.881 ms stays under 3 sigma (z = 1.97).
    assert sorted(set(zip(slow["src"], slow["dst"], slow["transport"]))) == [(0, 8, "RDMA"), (8, 0, "RDMA")]
    assert slow["bandwidth_gbps"].tolist() == [5.9605] * 16
    assert slow["z"].min() > 3.57 and links.loc[~links["slow"], "z"].max() < 3
    assert links.loc[(links["src"] == 8) & (links["transport"] == "RDMA"), "bandwidth_gbps"].max() == 5.9605
    # Its one slow-rank outlier is tiny and what chance gives: rank 4, 48 us late once in 24
    # collectives of 16 members, where a rank no later than the others is flagged once or more with
    # probability 1 - exp(-24 x 0.05 / 16) = 7.2%: not a slow rank.
    stats = slow_rank_stats(frames).set_index("rank")
    assert stats["outlier_count"].to_dict() == {r: int(r == 4) for r in range(16)}
    assert stats.loc[4, "lateness_ns"] == 47_856
    assert stats.loc[4, "chance"] == pytest.approx(1 - math.exp(-24 * 0.05 / 16), rel=1e-12)
    assert slow_ranks(frames) == []


def test_a_rank_is_slow_when_it_is_an_outlier_more_often_than_chance() -> None:
    from analyzers.cluster import _poisson_tail

    assert _poisson_tail(0.05, 0) == 1.0 and _poisson_tail(0.0, 1) == 0.0
    assert _poisson_tail(0.05, 2) == pytest.approx(1 - math.exp(-0.05) * 1.05, rel=1e-12)  # DLRM's rank 7: 0.0012
    # A long healthy job: 7,440 collectives of 64 ranks expect 5.8 chance outliers per rank; 12 is
    # still chance at 1% (p = 0.015), 14 is not.
    lam = 7440 * 0.05 / 64
    assert 0.01 < _poisson_tail(lam, 12) < 0.02 and _poisson_tail(lam, 14) < 0.01


# (c) a real 8-rank NCCL job ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def dlrm(real_traces):
    return loading.load_any(real_traces / "kineto" / "dlrm_8rank")


def test_dlrm_8rank(dlrm) -> None:
    frames = Frames(dlrm)
    out = collective_outliers(frames)
    # 8 collectives of all 8 ranks (5 SendRecv, 3 AllReduce); rank 7 reaches two SendRecvs last
    # by far (the others within a few us): Q = 0.964 and 0.992 > 0.526.
    assert len(out) == 8 and (out["members"] == 8).all()
    assert out.loc[out["outlier"], ["instance", "late_rank", "lateness_ns"]].values.tolist() == [[2, 7, 167_000],
                                                                                                 [3, 7, 124_000]]
    assert slow_ranks(frames) == [{"rank": 7, "outlier_count": 2, "lateness_ns": 291_000, "top_op": SENDRECV}]
    # No link counters: a link is a rank's part of a collective after its last member arrived.
    links = slow_link_stats(frames, communication.summaries(Rows(dlrm))[1])
    assert len(links) == 64 and set(links["transport"]) == {"NCCL"} and (links["dst"] == -1).all()
    assert links["judged"].all() and not links["slow"].any()
    assert links["z"].max() == pytest.approx(2.0906, abs=1e-4)


def test_dlrm_8rank_communication_time_splits_each_kernel_into_its_wait_for_the_last_rank_and_transit(dlrm) -> None:
    # NCCL records no wait of its own: a kernel spins from its start until its last peer arrives.
    # communication.json's synchronization (= wait) per op is that, over the instances the slow-rank
    # analysis matches, so the two agree to the nanosecond; elapse = transit + wait + idle.
    from analyzers.cluster import instances

    comm, _ = communication.summaries(Rows(dlrm))
    inst = instances(Frames(dlrm))
    last = inst.groupby("instance")["arrival_ns"].transform("max")
    waited = (last - inst["arrival_ns"]).clip(upper=inst["end"] - inst["ts"])
    by_op = waited.groupby(inst["name"].str.split("(").str[0]).sum()
    split = {r["op"].split("(")[0]: r for r in communication.op_time_split(comm)}
    assert sorted(split) == sorted(by_op.index) == [ALLREDUCE.split("(")[0], SENDRECV.split("(")[0]]
    for op, ns in by_op.items():
        row = split[op]
        assert row["Wait Time(ms)"] == pytest.approx(ns / 1e6, abs=1e-9)
        assert row["Synchronization Time(ms)"] == row["Wait Time(ms)"] > 0
        assert row["Elapse Time(ms)"] == pytest.approx(row["Transit Time(ms)"] + row["Wait Time(ms)"]
                                                       + row["Idle Time(ms)"], abs=1e-9)
    assert (round(split[SENDRECV.split("(")[0]]["Wait Time(ms)"], 3), round(split[ALLREDUCE.split("(")[0]]
            ["Wait Time(ms)"], 3)) == (37.601, 9.242)
    # Every op is one op of the 8 ranks: its members are the group in its name.
    names = {op for steps in comm.values() for kinds in steps.values() for ops in kinds.values() for op in ops}
    assert {n.split("@")[1] for n in names} == {"0-1-2-3-4-5-6-7"}


# (d) the command line ---------------------------------------------------------------------------

def test_cli_cluster_json() -> None:
    res = runner.invoke(app, ["cluster", str(SAMPLES / "bert-train-dp-slow-rank" / "trace"), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [r["rank"] for r in out["slow_ranks"]] == [3]
    assert len(out["steps"]) == 24 and out["slow_links"] == []
    assert out["transports"] == [{"transport": "HCCS", "links": 840, "mean_ms": pytest.approx(0.188613, abs=1e-6),
                                  "std_ms": pytest.approx(0.124086, abs=1e-6), "judged": True, "slow": 0,
                                  "source": "matrix"}]
    # The communication time per op: 15 all-reduces on each of 8 ranks; the waiting for rank 3
    # is the wait (all of it before the first transfer: synchronization), and the parts add up.
    (split,) = out["communication_time"]
    assert (split["op"], split["count"]) == ("hcom_allReduce", 120)
    assert split["Wait Time(ms)"] == split["Synchronization Time(ms)"] == pytest.approx(195.56244, abs=1e-5)
    assert split["Transit Time(ms)"] == pytest.approx(22.633536, abs=1e-6)
    assert split["Elapse Time(ms)"] == pytest.approx(
        split["Transit Time(ms)"] + split["Wait Time(ms)"] + split["Idle Time(ms)"], abs=1e-9)
    res = runner.invoke(app, ["cluster", str(SAMPLES / "bert-train-dp-slow-rank" / "trace")])
    assert res.exit_code == 0 and "slow ranks (an outlier more often than chance, p < 0.01): 3 (12x, 27.9 ms, hcom_allReduce)" in res.output
    assert "communication time per op" in res.output


@pytest.mark.parametrize("path, message", [
    (SAMPLES / "resnet50-infer" / "trace", "need a multi-rank trace; it holds 1 rank(s)"),
    (SAMPLES / "no-such-trace", "no such file or directory"),
])
def test_cli_cluster_bad_input(path: Path, message: str) -> None:
    res = runner.invoke(app, ["cluster", str(path)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msprof-py: error: ") and message in lines[0]
    assert "Traceback" not in res.output


def test_cli_cluster_on_the_torch_npu_2_rank_folder(real_traces) -> None:
    # Its HCCL ops sit on no stream (the HCCL planes): matching them across ranks keyed a NaN.
    res = runner.invoke(app, ["cluster", str(real_traces / "ascend" / "resnet_2rank_level1_text"), "-f", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert [(r["op"], r["count"]) for r in got["communication_time"]][:2] == [("hcom_allReduce", 8),
                                                                           ("Reduce_Inline", 72)]
    assert got["pipeline"] == [] and got["slow_ranks"] == []
