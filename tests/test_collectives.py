"""Collectives across ranks: every producer types a collective row with its communicator (`addr`)
and its call's sequence number (`value`); the parts of one collective are matched across ranks,
the last rank to arrive is named as what the others waited for, and the job's critical path
runs through it (analyzers.causality.collectives, critical_path.critical_paths)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzers import Frames
from analyzers.causality import attribution
from analyzers.causality.collectives import parts, waits
from analyzers.causality.critical_path import CP_CAUSES, critical_paths, job_step_paths
from msprof_py.loading import load_any
from msprof_py.trace.importers import import_trace
from msprof_py.trace.schema import Trace, canonical_dictionaries, communicator_id
from tests.conftest import REAL_TRACES

ROOT = Path(__file__).resolve().parents[1]
DLRM = sorted((REAL_TRACES / "kineto" / "dlrm_8rank").glob("*.json.gz"))
RESNET = [REAL_TRACES / "ascend" / "resnet_2rank_level1_text" / f"rank{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
          / "trace_view.json" for r in (0, 1)]


def collective_rows(trace: Trace):
    df = trace.to_pandas()
    return df[(df["kind"] == "collective") & df["addr"].notna()].sort_values(["rank", "ts"], kind="stable")


def merged(paths, ranks=None) -> Trace:
    """One table of per-rank files on a common clock (each file's origin kept), as a job's."""
    traces = [import_trace(p) for p in paths]
    origin = min(t.meta.origin_ns for t in traces)
    tables = []
    for i, t in enumerate(traces):
        tab = t.table
        tab = tab.set_column(tab.schema.get_field_index("ts"), "ts",
                             pc.add(tab.column("ts"), pa.scalar(t.meta.origin_ns - origin, pa.int64())))
        if ranks is not None:
            tab = tab.set_column(0, "rank", pa.array(np.full(tab.num_rows, ranks[i], dtype=np.int32)))
        tables.append(canonical_dictionaries(tab))
    meta = traces[0].meta
    meta.origin_ns = origin
    return Trace(canonical_dictionaries(pa.concat_tables(tables, promote_options="permissive").combine_chunks()),
                 meta)


# -- the producers fill the communicator and the sequence ------------------------------------------------------


def test_kineto_names_the_process_group_and_numbers_its_calls_in_time_order(real_traces):
    rows = collective_rows(import_trace(real_traces / "kineto" / "nccl_2rank_rank0.json.gz"))
    assert len(rows) == 21
    assert set(rows["addr"].astype(np.int64)) == {communicator_id("0")} == {0}
    assert rows["value"].astype(int).tolist() == list(range(21))


def test_kineto_kernels_without_a_group_name_take_the_name_their_stream_carries_elsewhere(real_traces):
    # The first 5 all-reduces of this trace carry no "Process Group Name"; the 12 after do ("0"),
    # all on stream 4: one communicator, numbered 0..16.
    rows = collective_rows(import_trace(real_traces / "kineto" / "mi300_resnet_ddp_rank0.json.gz"))
    assert len(rows) == 17
    assert set(rows["addr"].astype(np.int64)) == {0}
    assert rows["value"].astype(int).tolist() == list(range(17))


def test_old_kineto_traces_name_the_communicator_by_its_stream_the_same_on_every_rank(real_traces):
    ids = set()
    for path in DLRM:
        rows = collective_rows(import_trace(path))
        assert rows["value"].astype(int).tolist() == list(range(8))
        ids |= set(rows["addr"].astype(np.int64))
    assert ids == {communicator_id("stream 84")}


def test_torch_npu_hccl_ops_give_their_communicator_and_call_number_in_the_name(real_traces):
    for path in RESNET:
        rows = collective_rows(import_trace(path))
        assert rows["name"].astype(str).tolist() == [f"hcom_allReduce__586_{i}_1" for i in range(4)]
        assert rows["addr"].astype(int).tolist() == [586] * 4
        assert rows["value"].astype(int).tolist() == [0, 1, 2, 3]


def test_the_emulator_types_each_collective_with_its_communicator_and_sequence():
    trace = load_any(ROOT / "sample_traces" / "emulated" / "bert-train-dp")
    rows = collective_rows(trace)
    per_rank = rows.groupby("rank")["value"].apply(lambda v: v.astype(int).tolist())
    assert len(per_rank) == 8
    assert all(v == per_rank.iloc[0] for v in per_rank)
    assert sorted(set(per_rank.iloc[0])) == list(range(len(set(per_rank.iloc[0]))))
    assert set(rows["addr"].astype(int)) == {0}


# -- matching parts across ranks -------------------------------------------------------------------------------


def test_the_slow_rank_is_the_last_to_arrive_and_the_others_waited_for_it():
    frames = Frames(load_any(ROOT / "sample_traces" / "emulated" / "bert-train-dp-slow-rank"))
    p = parts(frames)
    assert set(p["ranks"]) == {8}
    w = waits(frames)
    # Rank 3 (40% slower) arrives last at every all-reduce; the waiting is the others'.
    assert set(w["last_rank"]) == {3} and 3 not in set(w["rank"])
    assert (w["release"] - w["arrive"] == w["waited_ns"]).all()
    assert (p.loc[p["rank"] == p["last_rank"], "waited_ns"] == 0).all()


def test_the_time_a_collective_waited_for_a_peer_names_that_peer_and_is_conserved():
    frames = Frames(load_any(ROOT / "sample_traces" / "emulated" / "bert-train-dp-slow-rank"))
    a = attribution(frames)
    coll = a[a["cause"] == "collective"]
    waited = coll[coll["peer"] >= 0]
    assert set(waited["peer"]) == {3} and 3 not in set(waited["rank"])
    assert set(coll.loc[coll["rank"] == 3, "peer"]) == {-1}
    # Each waiting piece lies before its collective's release: never more than the rank waited.
    p = waits(frames)
    for rank, g in waited.groupby("rank"):
        assert g["idle_ns"].sum() <= p.loc[p["rank"] == rank, "waited_ns"].sum()
    # A piece split at the release stays whole: its parts tile it, with no overlap.
    assert (coll["idle_ns"] == coll["end"] - coll["ts"]).all()
    for _, g in coll.groupby(["rank", "device"]):
        g = g.sort_values("ts")
        assert (g["ts"].to_numpy()[1:] >= g["end"].to_numpy()[:-1]).all()


# -- the job's critical path -----------------------------------------------------------------------------------


def rotating_straggler():
    """4 ranks, 4 steps: in step s rank s loads its batch 3 ms slower; the others wait at the
    all-reduce for it."""
    from runtime_emu import Kernel, acl, hccl, topology

    forward = Kernel("Forward", block_ns=100_000, core="cube")
    optimizer = Kernel("AdamW", block_ns=20_000, core="vector")

    def train(rank: int) -> None:
        acl.rt.set_device(rank)
        comm = hccl.comm_init_all()
        stream = acl.rt.create_stream()
        grads = acl.rt.malloc(1 << 22)
        for step in range(4):
            with acl.prof.step():
                acl.prof.host_work("load_batch", 200_000 + (3_000_000 if rank == step else 0), kind="data_load")
                for _ in range(4):
                    acl.rt.launch_kernel(forward, 20, stream)
                hccl.all_reduce(grads, grads, 1 << 20, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, stream)
                acl.rt.launch_kernel(optimizer, 20, stream)
                acl.rt.synchronize_stream(stream)

    rt = acl.init(seed=0, topology=topology.server(4))
    rt.run_ranks(train)
    return acl.finalize().trace


def check_path(cp) -> None:
    blame = cp.blame()
    assert list(blame.index) == list(CP_CAUSES)
    assert int(blame.sum()) == cp.region_ns and (blame >= 0).all()
    seg = cp.segments
    assert (seg["end"] >= seg["ts"]).all() and (seg["ts"].diff().fillna(0) >= 0).all()


def test_the_job_path_runs_through_whichever_rank_each_step_waited_for():
    frames = Frames(rotating_straggler())
    per, job = critical_paths(frames)
    check_path(job)
    # Each rank alone: one slow load (3.2 ms), three fast ones and 4 steps of device work, the
    # same for all; the job: every step's slow rank, one after the other.
    assert sorted({cp.length_ns for cp in per.values()}) == [5_956_432]
    assert job.length_ns > 14_900_000 and job.region_ns - job.length_ns < 20_000
    assert job.blame()["data"] == 4 * 3_200_000  # the 4 slow loads, one per rank
    by = job.by_rank()
    assert sorted(by.index) == [0, 1, 2, 3] and (by > 3_700_000).all()
    crossings = job.segments[job.segments["where"].str.startswith("waiting for rank")]
    assert crossings[["rank", "where"]].values.tolist() == [[1, "waiting for rank 0"], [2, "waiting for rank 1"],
                                                             [3, "waiting for rank 2"], [0, "waiting for rank 3"]]
    for step, cp in job_step_paths(frames):
        check_path(cp)
        assert cp.by_rank().index[0] == step and cp.by_rank().iloc[0] >= 0.96 * cp.length_ns


def test_one_rank_alone_has_no_job_path():
    frames = Frames(load_any(ROOT / "sample_traces" / "emulated" / "resnet50-infer"))
    assert critical_paths(frames)[1] is None


@pytest.mark.parametrize("which", ["dlrm_8rank", "resnet_2rank"])
def test_the_job_path_on_real_multi_rank_jobs_is_conserved(which):
    trace = merged(DLRM) if which == "dlrm_8rank" else merged(RESNET, ranks=[0, 1])
    frames = Frames(trace)
    p = parts(frames)
    assert set(p["ranks"]) == ({8} if which == "dlrm_8rank" else {2})
    per, job = critical_paths(frames)
    check_path(job)
    assert job.length_ns >= max(cp.length_ns for cp in per.values())
    assert set(job.by_rank().index) <= set(per)


def test_cli_names_the_rank_that_set_each_step():
    sample = ROOT / "sample_traces" / "emulated" / "bert-train-dp-slow-rank"
    out = subprocess.run([sys.executable, "-m", "msprof_py.cli", "critical-path", str(sample), "--json", "--top", "2"],
                         capture_output=True, text=True, check=True)
    job = json.loads(out.stdout)["job"]
    assert job["top_rank"] == 3 and list(job["by_rank_ns"]) == ["3"]
    assert sum(job["blame_ns"].values()) == job["region_ns"]
    assert {o["rank"] for o in job["top_ops"]} == {3}
    steps = subprocess.run([sys.executable, "-m", "msprof_py.cli", "critical-path", str(sample), "--per-step", "--json"],
                           capture_output=True, text=True, check=True)
    assert [s["job"]["top_rank"] for s in json.loads(steps.stdout)["steps"]] == [3, 3, 3]
