"""Collectives matched across ranks: a rank's part of a collective and its peers' parts.

Every producer types a collective row with its communicator (`addr`) and its call's sequence
number in that communicator (`value`): the emulator from HCCL's own numbering, Kineto from the
"Process Group Name" (else the communicator's stream) and the calls' order, torch_npu from the
HCCL op's name. One (communicator, sequence) across ranks is one collective: it cannot finish
anywhere before its last rank arrived, so that arrival releases everyone, and the time a rank
spent between its own arrival and the release is time it waited for the last rank.

A rank arrives when its part begins: the collective row's start, or a device wait that opens it
(HCCL's Notify_Wait, a wait sharing the collective's stream and correlation id).

`match` is the one rule that says which parts are one collective, for every reader of collectives
across ranks (the slow-rank analysis, the cluster analyses, communication.json and its matrix):
the recorded (communicator, sequence) where the trace has them, and only where it has none the
n-th op of the same stream, name and size on each rank.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzers.frames import Frames

PART_COLUMNS = ["rank", "group", "seq", "name", "stream", "corr", "ts", "end", "arrive", "release", "last_rank",
                "ranks", "waited_ns"]


#: Where a partition's Frames hold the other partitions' arrivals (see `arrivals`): a rank
#: analyzed apart from its peers still knows when each of them reached each collective.
PEERS_KEY = ("causality.peer_arrivals",)
ARRIVAL_COLUMNS = ["rank", "group", "seq", "arrive", "end"]
#: The columns `arrivals` reads.
ARRIVAL_READ = ["rank", "ph", "name", "kind", "ts", "dur", "stream", "corr", "addr", "value"]


def parts(frames: Frames) -> pd.DataFrame:
    """One row per rank's part of a typed collective (PART_COLUMNS): `arrive` (this rank's
    arrival), `release` (the last rank's arrival), `last_rank` (who arrived last), `ranks` (how
    many ranks took part, those of the trace and of the arrivals under PEERS_KEY) and `waited_ns`
    (release - arrive, 0 for the last rank). Parts are one collective as `match` says (their
    recorded communicator and number, and they ran together); a part that met no other rank's (a
    collective the trace holds on one rank only, or calls a sampled window numbered alike that
    never met) has its own arrival as release. Cached per frames."""
    key = ("causality.collective_parts",)
    if key in frames._cache:
        return frames._cache[key]
    df = _own_parts(frames.table, frames.kind_mask(("collective",)), frames.kind_mask(("wait",)))
    if df.empty:
        out = pd.DataFrame(columns=PART_COLUMNS)
        frames._cache[key] = out
        return out
    pool = df[ARRIVAL_COLUMNS]
    peers = frames._cache.get(PEERS_KEY)
    if peers is not None and len(peers):
        pool = pd.concat([pool, peers[~peers["rank"].isin(df["rank"].unique())][ARRIVAL_COLUMNS]],
                         ignore_index=True)
    # Which parts are one collective: `match`, the one rule (here every part has its recorded
    # communicator and number; parts that never ran together are not one).
    met = match(pool.assign(arrival_ns=pool["arrive"]))
    g = met.groupby(["group", "seq"], sort=False)
    pooled = pd.DataFrame({"release": g["arrive"].max(), "ranks": g["rank"].size()})
    # The last to arrive (the lowest rank among ties).
    last = met.sort_values(["arrive", "rank"], ascending=[False, True], kind="stable").drop_duplicates(["group", "seq"])
    pooled["last_rank"] = last.set_index(["group", "seq"])["rank"]
    df = df.join(pooled, on=["group", "seq"])
    # A part no other rank's met: its own arrival releases it.
    alone = df["release"].isna()
    df.loc[alone, "release"] = df.loc[alone, "arrive"]
    df.loc[alone, "ranks"] = 1
    df.loc[alone, "last_rank"] = df.loc[alone, "rank"]
    df["waited_ns"] = (df["release"] - df["arrive"]).to_numpy(np.int64)
    out = df[PART_COLUMNS].sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    for c in ("release", "ranks", "last_rank"):
        out[c] = out[c].astype(np.int64)
    frames._cache[key] = out
    return out


def arrivals(table: pa.Table) -> pd.DataFrame:
    """Each rank's arrival at each typed collective of `table` (ARRIVAL_COLUMNS; it needs the
    columns ARRIVAL_READ): the small summary a partition gives its peers' analysis."""
    kind = table.column("kind")
    if isinstance(kind, pa.ChunkedArray):
        kind = kind.combine_chunks()
    text = kind.dictionary.to_pylist() if pa.types.is_dictionary(kind.type) else None
    if text is not None:
        codes = kind.indices.to_numpy(zero_copy_only=False)

        def mask(k: str) -> np.ndarray:
            return codes == text.index(k) if k in text else np.zeros(len(codes), dtype=bool)
    else:
        values = np.asarray(kind.to_pylist(), dtype=object)

        def mask(k: str) -> np.ndarray:
            return values == k
    df = _own_parts(table, mask("collective"), mask("wait"))
    return df[ARRIVAL_COLUMNS].reset_index(drop=True)


def _own_parts(t: pa.Table, coll: np.ndarray, wait: np.ndarray) -> pd.DataFrame:
    """The table's own parts: rank, group, seq, name, device, stream, corr, ts, end, arrive."""
    mask = coll & t.column("addr").is_valid().to_numpy(zero_copy_only=False)
    mask &= t.column("value").is_valid().to_numpy(zero_copy_only=False)
    if not mask.any():
        return pd.DataFrame(columns=["rank", "group", "seq", "name", "device", "stream", "corr", "ts", "end", "arrive"])
    cols = ["rank", "ph", "name", "ts", "dur", "stream", "corr", "addr", "value"]
    df = t.select(cols).filter(pa.array(mask)).to_pandas()
    df = df[df["ph"].astype(str) == "X"]
    df = pd.DataFrame({
        "rank": df["rank"].to_numpy(np.int64), "group": df["addr"].to_numpy(np.int64),
        "seq": df["value"].to_numpy(np.float64).astype(np.int64), "name": df["name"].astype(str).to_numpy(),
        "stream": df["stream"].to_numpy(np.float64),
        "corr": df["corr"].to_numpy(np.float64), "ts": df["ts"].to_numpy(np.int64),
        "end": (df["ts"] + df["dur"].fillna(0)).to_numpy(np.int64),
    })
    # A part split over rows (pieces of one call) is one part: its first start, its last end.
    df = (df.sort_values(["rank", "group", "seq", "ts"], kind="stable")
            .groupby(["rank", "group", "seq"], as_index=False, sort=False)
            .agg(name=("name", "first"), stream=("stream", "first"), corr=("corr", "first"),
                 ts=("ts", "min"), end=("end", "max")))
    df["arrive"] = np.minimum(df["ts"].to_numpy(np.int64), _opening_waits(t, wait, df))
    return df


def _opening_waits(t: pa.Table, wait: np.ndarray, df: pd.DataFrame) -> np.ndarray:
    """Per part: the start of the earliest device wait on its stream with its correlation id
    (int64 max where there is none)."""
    none = np.full(len(df), np.iinfo(np.int64).max, dtype=np.int64)
    mask = wait & t.column("stream").is_valid().to_numpy(zero_copy_only=False)
    mask &= t.column("corr").is_valid().to_numpy(zero_copy_only=False)
    if not mask.any() or df["corr"].isna().all():
        return none
    w = t.select(["rank", "ts", "stream", "corr"]).filter(pa.array(mask)).to_pandas()
    first = w.groupby([w["rank"].astype(np.int64), w["stream"].astype(np.float64), w["corr"].astype(np.float64)])["ts"].min()
    idx = pd.MultiIndex.from_arrays([df["rank"].to_numpy(np.int64), df["stream"].to_numpy(np.float64),
                                     df["corr"].to_numpy(np.float64)])
    at = first.reindex(idx).to_numpy(np.float64)
    found = ~np.isnan(at)
    none[found] = at[found].astype(np.int64)
    return none


def waits(frames: Frames) -> pd.DataFrame:
    """The parts that waited for a peer (waited_ns > 0), longest first: who waited, at which
    collective, for which rank."""
    p = parts(frames)
    p = p[(p["waited_ns"] > 0) & (p["ranks"] > 1)]
    return p.sort_values(["waited_ns", "rank"], ascending=[False, True], kind="stable").reset_index(drop=True)


def match(parts: pd.DataFrame) -> pd.DataFrame:
    """`parts` (rank, stream, name, bytes, arrival_ns, end, and `group` / `seq` where the trace
    records the communicator and the call's number in it) with an `instance` id: the same
    collective on every rank that took part. Sorted by rank and arrival; instance ids in order of
    first appearance.

    Parts with a recorded (group, seq) are one instance per pair (a send and its receive,
    differently named, included). The others are matched by (stream, name, bytes, the n-th such op
    on the rank's stream), or when that matches nothing by (name, bytes, n-th on the rank). An
    instance is kept only when it has two or more ranks and all its parts ended at or after its
    last arrival (they ran together): a numbering that counts calls from the start of a sampled
    window (Kineto's, where the trace has no sequence number) can pair calls that never met."""
    if parts.empty:
        return parts.assign(instance=pd.Series(dtype=np.int64))
    p = parts.sort_values(["rank", "arrival_ns"], kind="stable").copy()
    rec = (p["group"].notna() & p["seq"].notna()).to_numpy() if "group" in p and "seq" in p else \
        np.zeros(len(p), dtype=bool)
    key = np.full(len(p), -1, dtype=np.int64)  # a provisional id per part: recorded first, then guessed
    ok = np.zeros(len(p), dtype=bool)
    if rec.any():
        r = p[rec]
        g = r.groupby(["group", "seq"], sort=False)
        key[rec] = g.ngroup().to_numpy()
        ok[rec] = ((g["rank"].transform("nunique") >= 2) & _overlap(g)).to_numpy()
    rest = p[~rec]
    if len(rest):
        base = int(key.max()) + 1
        for keys in (["stream", "name", "bytes"], ["name", "bytes"]):
            q = rest.copy()
            # A part without a stream (an op on HCCL's planes, as torch_npu records it) keys as one.
            q["nth"] = q.groupby(["rank", *keys], dropna=False).cumcount()
            g = q.groupby([*keys, "nth"], sort=False, dropna=False)
            ids = g.ngroup()
            good = (g["rank"].transform("nunique") >= 2) & _overlap(g)
            good = good.groupby(ids).transform("all")
            if good.any():
                key[~rec] = base + ids.to_numpy()
                ok[~rec] = good.to_numpy()
                break
    kept = p[ok].copy()
    # Ids in order of first appearance (rank, arrival), recorded and guessed alike.
    kept["instance"] = pd.factorize(key[ok])[0].astype(np.int64)
    return kept.reset_index(drop=True)


def _overlap(g) -> pd.Series:
    """Per part of the grouped parts: whether its instance's parts all ended at or after its last
    arrival."""
    return g["end"].transform("min") >= g["arrival_ns"].transform("max")
