"""Pipeline parallelism as the trace records it: stages, micro-batches, and what more of them save.

A pipeline is a chain of ranks that hand each micro-batch on with point-to-point transfers:
typed collectives whose names say send or receive (HCCL's hcom_send / hcom_receive, NCCL's
Send / Recv kernels; a SendRecv names no direction and is not one), matched in pairs by their
channel and call number (`transfers`: one sending and one receiving rank). The ranks the
channels join form a path, and the end that sends before it receives is stage 0 (`chains`). The
micro-batches per step (M) are the first stage's sends to the second (their median over steps),
and the schedule is GPipe when the last stage received every forward before it sent its first
backward, else one-forward-one-backward (1F1B). Each rank partition gives its own parts
(`own_transfers`) and kernel time per step (`stage_work`), so a partitioned run builds the same
pipelines on the driver (`build`).

`schedule_ns` is the pipeline's model: every stage computes each micro-batch's forward in
W / (3 M) and its backward in 2 W / (3 M), where W is the stage's kernel time in the step (a
backward costs twice its forward); a receive starts when the sender's compute ended, the
sender's previous send in that direction left and the receiver's stream reached it (as HcclRecv
on the compute stream and HcclSend on a send stream per direction do), and lasts the step's
median transfer into that stage in that direction, scaled by the micro-batch's size. With K
micro-batches each unit shrinks by M / K; the fill and drain ((P - 1) units at each end) shrink
with them, which is the saving. The model's own span for M is the baseline, so its errors (the
update and the data loading spread over the micro-batches, launches that more micro-batches
add) largely cancel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzers.causality.collectives import parts
from analyzers.frames import Frames

#: A point-to-point transfer's name: it sends or receives (never both: NCCL's SendRecv is a collective).
SEND = re.compile(r"send", re.I)
RECV = re.compile(r"recv|receive", re.I)
#: The micro-batch count more-micro-batches aims at by default: 4 per stage (Megatron-LM's advice,
#: the bubble (P - 1) / (M + P - 1) under about 16%).
PER_STAGE = 4


@dataclass
class Pipeline:
    """One pipeline: its ranks in stage order, micro-batches per step, schedule, and per step and
    stage the kernel time and median transfers (`steps`: step, stage, rank, work_ns, fwd_ns,
    bwd_ns (transfer into the stage forward / backward, 0 where none), start, end)."""

    stages: tuple[int, ...]
    micro_batches: int
    schedule: str
    steps: pd.DataFrame

    @property
    def bubble_share(self) -> float:
        """The ideal bubble share of a step: (P - 1) / (M + P - 1)."""
        p = len(self.stages)
        return (p - 1) / (self.micro_batches + p - 1)


def transfers(own: pd.DataFrame) -> pd.DataFrame:
    """Every rank's point-to-point parts (`own_transfers` of each partition, concatenated), matched
    in pairs: a channel's call (group, seq) with one sending and one receiving rank. Adds `peer`
    (the other rank) and `release` (the later arrival of the two)."""
    if own.empty:
        return own.assign(peer=pd.Series(dtype=np.int64), release=pd.Series(dtype=np.int64))
    pairs = own.groupby(["group", "seq"])
    ok = (pairs["rank"].transform("nunique") == 2) & (pairs["sending"].transform("sum") == 1)
    t = own[ok].copy()
    g = t.groupby(["group", "seq"])
    t["release"] = g["arrive"].transform("max").astype(np.int64)
    t["peer"] = (g["rank"].transform("sum") - t["rank"]).astype(np.int64)
    return t.reset_index(drop=True)


def stage_work(frames: Frames) -> pd.DataFrame:
    """Per rank and step: its kernels' busy time (`work_ns`) and its device ops' first start and
    last end: what the schedule model reads of each stage."""
    ops = frames.device_ops
    ops = ops[ops["step"].notna()]
    cols = ["step", "rank", "work_ns", "start", "end"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    key = [ops["step"].astype(np.int64), ops["rank"].astype(np.int64)]
    out = ops.groupby(key).agg(start=("ts", "min"), end=("end", "max"))
    # Kernel busy time per (step, rank): each kernel adds what it runs past the latest end before
    # it in its group (a union of intervals, in one sorted pass).
    k = ops[ops["kind"].astype(str) == "kernel"]
    k = pd.DataFrame({"step": k["step"].to_numpy(np.int64), "rank": k["rank"].to_numpy(np.int64),
                      "ts": k["ts"].to_numpy(np.int64), "end": k["end"].to_numpy(np.int64)})
    k = k.sort_values(["step", "rank", "ts"], kind="stable")
    g = k.groupby(["step", "rank"], sort=False)["end"]
    before = g.cummax().groupby([k["step"], k["rank"]], sort=False).shift(1)
    k["add"] = (k["end"] - np.maximum(k["ts"], before.fillna(np.iinfo(np.int64).min))).clip(lower=0)
    out["work_ns"] = k.groupby(["step", "rank"])["add"].sum().reindex(out.index, fill_value=0).astype(np.int64)
    out = out.reset_index()
    out.columns = ["step", "rank", *out.columns[2:]]
    return out[cols].astype(np.int64).sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def find(frames: Frames) -> list[Pipeline]:
    """The trace's pipelines (see the module docstring); cached per frames."""
    key = ("causality.pipelines",)
    if key not in frames._cache:
        frames._cache[key] = build(own_transfers(frames), stage_work(frames))
    return frames._cache[key]


def build(own: pd.DataFrame, work: pd.DataFrame) -> list[Pipeline]:
    """The pipelines of every rank's `own_transfers` and `stage_work` (a whole trace's, or every
    partition's concatenated)."""
    t = transfers(own)
    out = [_pipeline(t[t["rank"].isin(order)], work[work["rank"].isin(order)], order) for order in chains(t)]
    return [p for p in out if p is not None]


def chains(t: pd.DataFrame) -> list[list[int]]:
    """The stage orders of `transfers`' ranks: each set of ranks the transfers join that forms a
    path, from the end that sends before it receives (stage 0) to the other."""
    adj: dict[int, set[int]] = {}
    for r, q in t[["rank", "peer"]].drop_duplicates().itertuples(index=False):
        adj.setdefault(int(r), set()).add(int(q))
    out, seen = [], set()
    for r0 in sorted(adj):
        if r0 in seen:
            continue
        comp, todo = set(), [r0]
        while todo:
            r = todo.pop()
            if r not in comp:
                comp.add(r)
                todo += adj[r] - comp
        seen |= comp
        ends = [r for r in comp if len(adj[r]) == 1]
        if len(comp) < 2 or len(ends) != 2 or any(len(adj[r]) > 2 for r in comp):
            continue  # not a chain (a ring or a tree of transfers is no pipeline)
        head = [r for r in ends if bool(t[t["rank"] == r].sort_values("ts")["sending"].iloc[0])]
        if len(head) != 1:
            continue
        order, prev = [head[0]], None
        while len(order) < len(comp):
            nxt = [q for q in adj[order[-1]] if q != prev]
            prev = order[-1]
            order.append(nxt[0])
        out.append(order)
    return out


def _pipeline(t: pd.DataFrame, work: pd.DataFrame, order: list[int]) -> Pipeline | None:
    stage = {r: s for s, r in enumerate(order)}
    t = t[t["step"] >= 0]
    if t.empty:
        return None
    # Per step: micro-batches = the first stage's sends downstream.
    s0 = t[(t["rank"] == order[0]) & t["sending"]]
    per_step = s0.groupby("step").size()
    if per_step.empty:
        return None
    m = int(per_step.median())
    # GPipe's last stage receives every forward before it sends its first backward; 1F1B's sends
    # a backward after each forward (after the first P - 1 on earlier stages).
    last = t[t["rank"] == order[-1]]
    schedule = "gpipe"
    for _, g in last.groupby("step"):
        sends = g.loc[g["sending"], "arrive"]
        if len(sends) and int((g.loc[~g["sending"], "arrive"] < sends.min()).sum()) < min(m, (~g["sending"]).sum()):
            schedule = "1f1b"
            break
    recv = t[~t["sending"]].copy()
    recv["transfer"] = recv["end"] - np.maximum(recv["ts"], recv["release"])
    recv["forward"] = recv["peer"].map(stage) < recv["rank"].map(stage)
    fwd = recv[recv["forward"]].groupby(["step", "rank"])["transfer"].median()
    bwd = recv[~recv["forward"]].groupby(["step", "rank"])["transfer"].median()
    steps = work.assign(stage=work["rank"].map(stage).astype(np.int64))
    steps["fwd_ns"] = [int(fwd.get((st, r), 0)) for st, r in zip(steps["step"], steps["rank"])]
    steps["bwd_ns"] = [int(bwd.get((st, r), 0)) for st, r in zip(steps["step"], steps["rank"])]
    steps = steps[["step", "stage", "rank", "work_ns", "fwd_ns", "bwd_ns", "start", "end"]]
    if steps.empty:
        return None
    full = steps.groupby("step")["stage"].nunique() == len(order)  # a step every stage ran
    steps = steps[steps["step"].isin(full[full].index)].sort_values(["step", "stage"]).reset_index(drop=True)
    if steps.empty:
        return None
    return Pipeline(tuple(order), m, schedule, steps)


def _orders(p: int, k: int, schedule: str) -> list[list[tuple[str, int]]]:
    """Per stage, its micro-batch units in the order the schedule runs them."""
    out = []
    for s in range(p):
        if schedule == "gpipe":
            out.append([("F", j) for j in range(k)] + [("B", j) for j in range(k)])
            continue
        warm = min(p - s - 1, k)
        units = [("F", j) for j in range(warm)]
        for j in range(k - warm):
            units += [("F", warm + j), ("B", j)]
        units += [("B", j) for j in range(k - warm, k)]
        out.append(units)
    return out


def schedule_ns(work: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, m: int, k: int, schedule: str) -> int:
    """The modelled span of one step's pipeline phase with `k` micro-batches, from stage kernel
    times `work` and transfers `fwd` / `bwd` recorded with `m` (see the module docstring)."""
    p = len(work)
    scale = m / k
    f = work / (3 * m) * m / k
    b = 2 * work / (3 * m) * m / k
    cf, cb = fwd * scale, bwd * scale
    orders = _orders(p, k, schedule)
    end: dict[tuple[str, int, int], float] = {}
    free = np.zeros(p)  # each stage's compute stream
    sent = {"F": np.zeros(p), "B": np.zeros(p)}  # each stage's send streams, one per direction
    idx = [0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(p):
            while idx[s] < len(orders[s]):
                kind, j = orders[s][idx[s]]
                src = s - 1 if kind == "F" else s + 1
                if 0 <= src < p:
                    dep = end.get((kind, src, j))
                    if dep is None:
                        break
                    start = max(dep, sent[kind][src], free[s])
                    sent[kind][src] = start + (cf[s] if kind == "F" else cb[s])
                    start = sent[kind][src]
                else:
                    start = free[s]
                free[s] = end[kind, s, j] = start + (f[s] if kind == "F" else b[s])
                idx[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("the pipeline schedule deadlocks")  # cannot happen for GPipe / 1F1B
    return int(round(max(end.values())))


def savings(pipe: Pipeline, k: int) -> pd.DataFrame:
    """Per step: the phase (start, end over the stages) and what `k` micro-batches save
    (`saving_ns`, never below 0: fewer micro-batches than recorded save nothing)."""
    rows = []
    for step, g in pipe.steps.groupby("step"):
        work, fwd, bwd = (g[c].to_numpy(np.float64) for c in ("work_ns", "fwd_ns", "bwd_ns"))
        before = schedule_ns(work, fwd, bwd, pipe.micro_batches, pipe.micro_batches, pipe.schedule)
        after = schedule_ns(work, fwd, bwd, pipe.micro_batches, k, pipe.schedule) if k > pipe.micro_batches \
            else before
        rows.append({"step": int(step), "start": int(g["start"].min()), "end": int(g["end"].max()),
                     "model_ns": before, "new_model_ns": after, "saving_ns": max(0, before - after)})
    return pd.DataFrame(rows, columns=["step", "start", "end", "model_ns", "new_model_ns", "saving_ns"])


def default_micro_batches(pipe: Pipeline, per_stage: int = PER_STAGE) -> int:
    """More micro-batches' default target: `per_stage` per stage, at least the recorded count."""
    return max(per_stage * len(pipe.stages), pipe.micro_batches)


# ---------------------------------------------------------------- the stage x micro-batch view
VIEW_COLUMNS = ["stage", "rank", "step", "micro_batch", "direction", "peer", "arrive", "end", "waited_ns",
                "transfer_ns"]
#: What a rank partition gives the view (`own_transfers`), before its peers' parts are known.
OWN_COLUMNS = ["rank", "group", "seq", "name", "sending", "arrive", "ts", "end", "step"]


def own_transfers(frames: Frames) -> pd.DataFrame:
    """This table's point-to-point parts (OWN_COLUMNS), matched with no other rank: what each rank
    partition contributes to `view`."""
    p = parts(frames)
    if p.empty:
        return pd.DataFrame(columns=OWN_COLUMNS)
    names = p["name"].astype(str)
    send, recv = names.str.contains(SEND), names.str.contains(RECV)
    p = p[send ^ recv].assign(sending=send[send ^ recv].to_numpy())
    ops = frames.device_ops
    key = ops[["rank", "corr", "step"]].dropna(subset=["corr"]).drop_duplicates(["rank", "corr"])
    p = p.merge(key, on=["rank", "corr"], how="left")
    p["step"] = p["step"].fillna(-1).astype(np.int64)
    return p[OWN_COLUMNS].reset_index(drop=True)


def view(own: pd.DataFrame) -> pd.DataFrame:
    """The pipeline's hand-overs, stage by stage and micro-batch by micro-batch (VIEW_COLUMNS): each
    receive of a stage, the peer that sent it, when the stage reached it (`arrive`), how long it
    waited for the sender (`waited_ns`: the sender's arrival after its own, the bubble before that
    micro-batch) and the transfer after both arrived. `micro_batch` counts a stage's receives of
    one direction in a step. Built from every rank's `own_transfers` (concatenated); empty when
    the transfers form no chain."""
    t = transfers(own)
    stage = {r: n for order in chains(t) for n, r in enumerate(order)}
    m = t[~t["sending"] & t["rank"].isin(stage) & t["peer"].isin(stage)].copy()
    if m.empty:
        return pd.DataFrame(columns=VIEW_COLUMNS)
    m["stage"] = m["rank"].map(stage).astype(np.int64)
    m["direction"] = np.where(m["peer"].map(stage) < m["stage"], "forward", "backward")
    m["waited_ns"] = (m["release"] - m["arrive"]).astype(np.int64)
    m["transfer_ns"] = np.maximum(0, m["end"] - m["release"]).astype(np.int64)
    m = m.sort_values(["stage", "step", "direction", "arrive"], kind="stable")
    m["micro_batch"] = m.groupby(["stage", "step", "direction"]).cumcount().astype(np.int64)
    return m[VIEW_COLUMNS].sort_values(["step", "stage", "direction", "micro_batch"], ascending=[True, True, False,
                                                                                                  True]).reset_index(drop=True)


def view_cells(v: pd.DataFrame) -> list[dict]:
    """`view` as the cluster analyses print it: per stage, direction and micro-batch, the mean over
    steps of the wait for the peer and of the transfer (ns), stages in order, forward first."""
    if v.empty:
        return []
    g = v.groupby(["stage", "rank", "direction", "micro_batch"], sort=False)
    out = g.agg(peer=("peer", "first"), steps=("step", "nunique"), waited_ns=("waited_ns", "mean"),
                transfer_ns=("transfer_ns", "mean")).reset_index()
    out["order"] = (out["direction"] == "backward").astype(int)
    out = out.sort_values(["stage", "order", "micro_batch"], kind="stable")
    return [{"stage": int(r.stage), "rank": int(r.rank), "direction": str(r.direction), "micro_batch": int(r.micro_batch),
             "peer": int(r.peer), "steps": int(r.steps), "waited_ns": int(round(r.waited_ns)),
             "transfer_ns": int(round(r.transfer_ns))} for r in out.itertuples()]
