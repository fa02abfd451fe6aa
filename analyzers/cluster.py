"""msprof-analyze's cluster analyses from the trace table: slow ranks and slow links.

Both are statistics over the job's collectives, for Ascend (HCCL) and CUDA (NCCL) traces alike,
linear in the trace: each collective instance is looked at once, each link of each op once.

`slow_rank_stats` / `slow_ranks`: per matched collective (analyzers.ranks: the same collective on
every member rank, each member's arrival), is the last member to arrive an outlier among the
members' arrivals? `slow_link_stats`: per (op, src, dst, transport) link, is its transit time an
outlier among the links of its transport?
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, TypeAlias, TypeGuard

import numpy as np
import pandas as pd

from analyzers.frames import Frames
from analyzers.ranks import RankConfig, collective_parts, match_collectives

#: Dixon's Q (r10 = gap / range) critical values at 95% confidence, two-sided, by sample size n.
#: n = 3..30: Rorabacher, D. B. (1991), "Statistical treatment for rejection of deviant values:
#: critical values of Dixon's 'Q' parameter and related subrange ratios at the 95% confidence
#: level", Analytical Chemistry 63(2), 139-146, Table I (r10, alpha = 0.05).
#: n = 31..100: the same statistic's 95th percentile in normal samples, computed by simulation
#: (2e6 samples of n standard normal values per n, Q = max(x2 - x1, xn - xn-1) / (xn - x1)), the
#: method Rorabacher used; it reproduces his values for n = 3..30 to within 0.002.
DIXON_Q95: dict[int, float] = dict(zip(range(3, 31), (
    0.970, 0.829, 0.710, 0.625, 0.568, 0.526, 0.493, 0.466, 0.444, 0.426,  # 3..12
    0.410, 0.396, 0.384, 0.374, 0.365, 0.356, 0.349, 0.342, 0.337, 0.331,  # 13..22
    0.326, 0.321, 0.317, 0.312, 0.308, 0.305, 0.301, 0.298,                # 23..30
)))
DIXON_Q95.update(zip(range(31, 101), (
    0.295, 0.292, 0.289, 0.286, 0.284, 0.281, 0.279, 0.277, 0.275, 0.272,  # 31..40
    0.270, 0.269, 0.267, 0.265, 0.263, 0.262, 0.260, 0.259, 0.257, 0.256,  # 41..50
    0.254, 0.253, 0.252, 0.250, 0.249, 0.248, 0.247, 0.246, 0.244, 0.243,  # 51..60
    0.243, 0.241, 0.241, 0.239, 0.238, 0.238, 0.237, 0.236, 0.235, 0.234,  # 61..70
    0.233, 0.232, 0.231, 0.231, 0.230, 0.229, 0.229, 0.228, 0.227, 0.226,  # 71..80
    0.226, 0.225, 0.225, 0.224, 0.223, 0.222, 0.222, 0.221, 0.221, 0.220,  # 81..90
    0.220, 0.219, 0.218, 0.218, 0.218, 0.217, 0.216, 0.216, 0.215, 0.215,  # 91..100
)))

#: Above this many members, the last arrival is an outlier when it is more than 3 sigma above the
#: members' mean arrival (Dixon's table stops at 100).
DIXON_MAX_N = 100
SIGMAS = 3.0

SLOW_RANK_COLUMNS = ["rank", "collectives", "outlier_count", "lateness_ns", "ops", "chance"]
#: The significance at which a rank's outlier count says it is slow (`slow_ranks`).
SLOW_RANK_P = 0.01
#: The chance a member is flagged by the 95% tests (Dixon's Q, and the pair's gap) when no member
#: is late, spread over the members; beyond 100 members, 3 sigma's one-sided tail.
TEST_ALPHA = 0.05
SIGMA_TAIL = 0.00135
OUTLIER_COLUMNS = ["instance", "name", "members", "late_rank", "test", "statistic", "critical", "outlier",
                   "lateness_ns", "first_arrival_ns", "last_arrival_ns"]
SLOW_LINK_COLUMNS = ["op", "name", "src", "dst", "transport", "size_mb", "transit_ms", "bandwidth_gbps",
                     "samples", "mean_ms", "std_ms", "z", "judged", "slow"]


def dixon_q(values) -> tuple[float, float]:
    """Dixon's Q of the largest of `values` (3 <= n <= 100): (Q, 95% critical value), where
    Q = (largest - second largest) / (largest - smallest); Q is 0 when all values are equal.
    The largest is an outlier at 95% when Q > the critical value."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n < 3 or n > DIXON_MAX_N:
        raise ValueError(f"Dixon's Q test takes 3 to {DIXON_MAX_N} values, got {n}")
    spread = x[-1] - x[0]
    q = float((x[-1] - x[-2]) / spread) if spread > 0 else 0.0
    return q, DIXON_Q95[n]


Source: TypeAlias = Frames | pd.DataFrame


def instances(src: Source) -> pd.DataFrame:
    """The matched collective instances (analyzers.ranks.match_collectives) of a trace's frames, or
    of its collective parts (`collective_parts` of each rank partition, concatenated: what a
    partitioned run gathers on the driver)."""
    return match_collectives(src if isinstance(src, pd.DataFrame) else collective_parts(src))


def collective_outliers(src: Source, cfg: RankConfig | None = None) -> pd.DataFrame:
    """Per matched collective instance (OUTLIER_COLUMNS): its members, the rank that arrived last,
    the test that judged it and whether it is an outlier, and the lateness it caused (its arrival
    - the median arrival of the other members).

    The test by the number of members n: n = 2, the later rank is the outlier when it arrived at
    least `cfg.min_late_ns` after the other (statistic: the gap in ns); 3 <= n <= 100, Dixon's Q
    test at 95% (`dixon_q`); n > 100, the last arrival is more than 3 standard deviations (of all
    members' arrivals, population) above their mean (statistic: its z-score). For n >= 3 the last
    rank must also have arrived at least `cfg.min_late_ns` after the next-latest: a statistic
    over arrivals a few microseconds apart flags noise."""
    cfg = cfg or RankConfig()
    inst = src if _matched(src) else instances(src)
    if inst.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OUTLIER_COLUMNS})
    inst = inst.sort_values(["instance", "arrival_ns", "rank"], kind="stable")
    ids = inst["instance"].to_numpy()
    arrival = inst["arrival_ns"].to_numpy(np.int64)
    rank = inst["rank"].to_numpy(np.int64)
    name = inst["name"].to_numpy(dtype=object)
    bounds = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1], [True])))
    rows = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        arr = arrival[a:b]
        n = b - a
        last = int(arr[-1])
        others = arr[:-1]
        if n == 2:
            test, stat, crit = "pair", float(last - others[0]), float(cfg.min_late_ns)
            outlier = stat >= crit
        elif n <= DIXON_MAX_N:
            test = "dixon"
            stat, q95 = dixon_q(arr - arr[0])
            crit = float(q95 or 0.0)
            outlier = stat > crit
        else:
            test, crit = "3sigma", SIGMAS
            std = float(arr.std())
            stat = float((last - arr.mean()) / std) if std > 0 else 0.0
            outlier = stat > crit
        # Arrival order within noise is no straggler, whatever the statistic says: the last
        # rank must also have arrived at least `min_late_ns` after the next-latest (as SLOW_RANK).
        outlier = bool(outlier) and (n == 2 or last - int(arr[-2]) >= cfg.min_late_ns)
        rows.append({"instance": int(ids[a]), "name": str(name[a]), "members": int(n), "late_rank": int(rank[b - 1]),
                     "test": test, "statistic": round(float(stat), 6), "critical": crit, "outlier": bool(outlier),
                     "lateness_ns": int(last - np.median(others)), "first_arrival_ns": int(arr[0]),
                     "last_arrival_ns": last})
    return pd.DataFrame(rows, columns=OUTLIER_COLUMNS)


def _matched(src: Source) -> TypeGuard[pd.DataFrame]:
    return isinstance(src, pd.DataFrame) and "instance" in src.columns


def slow_rank_stats(src: Source, cfg: RankConfig | None = None) -> pd.DataFrame:
    """Per rank that took part in a matched collective (SLOW_RANK_COLUMNS): how many collectives
    it took part in, how many times it was the last to arrive *and* an outlier among the members'
    arrivals (`collective_outliers`: Dixon's Q test at 95% for 3..100 members, 3 sigma above the
    mean beyond 100, a gap of at least `RankConfig.min_late_ns` for a pair), the lateness it
    caused (sum over those collectives of its arrival - the median arrival of the other
    members: how late the typical member was kept), the names of those collectives, most
    frequent first (a tie in order of first occurrence), and `chance`: how likely a rank no later
    than the others would be an outlier that often (the tests' false-alarm rate, TEST_ALPHA over
    the members or 3 sigma's tail, summed over its collectives: Poisson's tail).

    A rank's arrival at a collective is the start of its part (analyzers.ranks.collective_parts:
    the wait tasks opening the op on Ascend, the kernel's start on NCCL, which spins until its
    peers arrive); collectives are matched across ranks by analyzers.ranks.match_collectives."""
    cfg = cfg or RankConfig()
    inst = src if _matched(src) else instances(src)
    out = collective_outliers(inst, cfg)
    if inst.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in SLOW_RANK_COLUMNS})
    taken = inst.groupby("rank")["instance"].nunique()
    flagged = out[out["outlier"]]
    # Under no delay a test flags some member of a collective of n by chance (TEST_ALPHA; 3 sigma's
    # tail beyond 100 members), each member alike: a rank expects the sum over its collectives.
    rate = np.where(out["members"].to_numpy(np.int64) > DIXON_MAX_N, SIGMA_TAIL,
                    TEST_ALPHA / out["members"].to_numpy(np.float64))
    expected = pd.Series(rate, index=out["instance"].to_numpy()).reindex(inst["instance"].to_numpy()).fillna(0.0)
    expected = expected.groupby(inst["rank"].to_numpy()).sum()
    rows = []
    for r, n in taken.items():
        mine = flagged[flagged["late_rank"] == int(r)]
        names = [name for name, _ in Counter(mine["name"]).most_common()]
        rows.append({"rank": int(r), "collectives": int(n), "outlier_count": int(len(mine)),
                     "lateness_ns": int(mine["lateness_ns"].sum()), "ops": names,
                     "chance": _poisson_tail(float(expected.get(r, 0.0)), int(len(mine)))})
    return pd.DataFrame(rows, columns=SLOW_RANK_COLUMNS).sort_values("rank", kind="stable").reset_index(drop=True)


def _poisson_tail(expected: float, k: int) -> float:
    """P(X >= k) for X ~ Poisson(`expected`): the chance a rank no slower than the others is an
    outlier `k` times or more (the sum of its collectives' small chances, Poisson's limit)."""
    if k <= 0:
        return 1.0
    if expected <= 0:
        return 0.0
    term = total = math.exp(-expected)
    for i in range(1, k):
        term *= expected / i
        total += term
    return max(0.0, 1.0 - total)


def slow_ranks(src: Source, cfg: RankConfig | None = None, stats: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The ranks an outlier more often than chance explains (`slow_rank_stats`, or the `stats`
    given: `chance` under SLOW_RANK_P; the tests flag some member now and then with no one late,
    so a rank of a long job is an outlier once or twice by chance), by the lateness they caused
    (most first, then by rank): rank, outlier_count, lateness_ns and top_op (its most frequent
    late op)."""
    stats = slow_rank_stats(src, cfg) if stats is None else stats
    hit = stats[(stats["outlier_count"] > 0) & (stats["chance"] < SLOW_RANK_P)].sort_values(["lateness_ns", "rank"], ascending=[False, True],
                                                       kind="stable")
    return [{"rank": int(r.rank), "outlier_count": int(r.outlier_count), "lateness_ns": int(r.lateness_ns),
             "top_op": r.ops[0] if r.ops else None} for r in hit.itertuples()]


def slow_link_stats(src: Source, matrix: dict | pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (op, src, dst, transport) link, its transit time and bandwidth, judged against the
    links of the same transport (SLOW_LINK_COLUMNS).

    With link figures (`matrix`: communication_matrix.json as msprof_py.communication writes it,
    {rank: {step: {"collective" | "p2p": {op: {"src-dst": {"Transport Type", "Transit Size(MB)",
    "Transit Time(ms)", "Bandwidth(GB/s)"}}}}}}), a link is one of those entries. Without them
    (CUDA traces, or a trace without link counters), a link is one rank's part of a matched
    collective: src the rank, dst -1 (the peers are not told apart), transport "NCCL" for NCCL
    kernels, else "unknown", size its bytes, transit time the part's time after its last member
    arrived (the kernel spins until then: that wait is the slow rank's, not the link's).

    Per transport, mean and standard deviation (population) of the transit times; a link's z is
    (transit - mean) / std, and it is slow when z > 3. A transport with fewer than 3 links, or
    whose links all took the same time, is not judged (judged False, z NaN)."""
    if isinstance(matrix, pd.DataFrame):  # the links already as a table (_matrix_links' columns)
        df = matrix.copy()
    else:
        df = _matrix_links(matrix) if matrix else pd.DataFrame()
    if df.empty:
        df = _collective_links(src if _matched(src) else instances(src))
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in SLOW_LINK_COLUMNS})
    g = df.groupby("transport")["transit_ms"]
    df["samples"] = g.transform("size").astype(np.int64)
    df["mean_ms"] = g.transform("mean")
    df["std_ms"] = g.transform(lambda s: float(np.std(s.to_numpy())))
    df["judged"] = (df["samples"] >= 3) & (df["std_ms"] > 0)
    df["z"] = np.where(df["judged"], (df["transit_ms"] - df["mean_ms"]) / df["std_ms"].where(df["judged"], 1.0), np.nan)
    df["slow"] = df["judged"] & (df["z"] > SIGMAS)
    return df[SLOW_LINK_COLUMNS].sort_values(["transport", "op", "src", "dst"], kind="stable").reset_index(drop=True)


def _has(matrix: dict | pd.DataFrame | None) -> bool:
    return len(matrix) > 0 if isinstance(matrix, pd.DataFrame) else bool(matrix)


def _matrix_links(matrix: dict) -> pd.DataFrame:
    rows = []
    for steps in matrix.values():
        for kinds in steps.values():
            for ops in kinds.values():
                for op, pairs in ops.items():
                    for pair, link in pairs.items():
                        src, dst = (int(x) for x in pair.split("-"))
                        rows.append({"op": op, "name": op.split("__")[0], "src": src, "dst": dst,
                                     "transport": link["Transport Type"], "size_mb": float(link["Transit Size(MB)"]),
                                     "transit_ms": float(link["Transit Time(ms)"]),
                                     "bandwidth_gbps": float(link["Bandwidth(GB/s)"])})
    return pd.DataFrame(rows)


def _collective_links(inst: pd.DataFrame) -> pd.DataFrame:
    if inst.empty:
        return pd.DataFrame()
    release = inst.groupby("instance")["arrival_ns"].transform("max")
    transit = (inst["end"] - np.maximum(release, inst["ts"])).clip(lower=0).to_numpy(np.int64)
    size_mb = np.where(inst["bytes"].to_numpy() >= 0, inst["bytes"].to_numpy(), 0) / (1024 * 1024)
    transit_ms = transit / 1e6
    names = inst["name"].astype(str)
    return pd.DataFrame({
        "op": names + "#" + inst["instance"].astype(str), "name": names, "src": inst["rank"].to_numpy(np.int64),
        "dst": -1, "transport": np.where(names.str.lower().str.contains("nccl"), "NCCL", "unknown"),
        "size_mb": size_mb, "transit_ms": transit_ms,
        "bandwidth_gbps": np.where(transit_ms > 0, np.round(size_mb / np.where(transit_ms > 0, transit_ms, 1), 4), 0.0)})


def report(src: Source, matrix: dict | pd.DataFrame | None = None, cfg: RankConfig | None = None) -> dict[str, Any]:
    """The cluster analyses as plain objects (what `msprof-py cluster` prints) of a trace's frames
    or of its ranks' collective parts gathered from their partitions: the slow ranks
    (`slow_ranks`), the per-rank statistics (`slow_rank_stats`), per transport the links' count,
    mean and standard deviation of transit time and how many are slow, and the slow links
    (`slow_link_stats`, the slowest first)."""
    inst = instances(src)
    stats = slow_rank_stats(inst, cfg)
    links = slow_link_stats(inst, matrix)
    transports = []
    for transport, g in links.groupby("transport", sort=True):
        transports.append({"transport": str(transport), "links": int(len(g)), "mean_ms": float(g["mean_ms"].iloc[0]),
                           "std_ms": float(g["std_ms"].iloc[0]), "judged": bool(g["judged"].iloc[0]),
                           "slow": int(g["slow"].sum()), "source": "matrix" if _has(matrix) and (g["dst"] >= 0).all()
                           else "collectives"})
    slow = links[links["slow"]].sort_values(["z", "op", "src", "dst"], ascending=[False, True, True, True],
                                             kind="stable")
    return {
        "slow_ranks": slow_ranks(inst, cfg, stats),
        "rank_stats": [{"rank": int(r.rank), "collectives": int(r.collectives), "outlier_count": int(r.outlier_count),
                        "lateness_ns": int(r.lateness_ns), "ops": list(r.ops), "chance": float(r.chance)}
                       for r in stats.itertuples()],
        "transports": transports,
        "slow_links": [{"op": str(r.op), "src": int(r.src), "dst": int(r.dst), "transport": str(r.transport),
                        "size_mb": float(r.size_mb), "transit_ms": float(r.transit_ms),
                        "bandwidth_gbps": float(r.bandwidth_gbps), "z": round(float(r.z), 4)}
                       for r in slow.itertuples()],
    }
