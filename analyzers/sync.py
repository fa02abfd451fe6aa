"""Host synchronisation stalls, and missing synchronisation between streams."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analyzers.causality import happens_before
from analyzers.finding import Finding, Severity, Skipped, register
from analyzers.frames import Frames, cover, merge_intervals, union_ns
from msprof_py.trace.units import ms, pct


@dataclass
class SyncConfig:
    stall_ratio: float = 0.3  # share of a host thread's span spent blocked in syncs (informational)
    min_stall_ns: int = 1_000_000
    min_calls: int = 3  # one sync at the end of a program that ran ahead is how programs end, not a stall
    evidence: int = 5


@register("sync", SyncConfig)
def analyze(frames: Frames, cfg: SyncConfig):
    """Synchronisation stalls and missing synchronisation.

    Pattern (stall): a host thread spends a large share of its time inside synchronize calls
    and blocking copies, so it launches nothing while it waits.
    Pattern (missing sync): a task reads a buffer while the task writing it on another stream
    is still running, although the host issued the write first: the dependency between the
    streams was never declared (no event record / wait).

    Algorithm: per host thread, the share of its span spent inside `sync` calls; at or above
    `stall_ratio` it is reported as information. It carries no time lost: what a sync costs is
    the device idle it causes (nothing queued behind it), which the bubble analyzer measures
    and reports as BUBBLE_SYNC.
    For missing sync, buffer accesses (kinds `mem_read` / `mem_write`: the buffer address and the
    task's corr id, as a sanitizer records them) are joined to their tasks; a read of a buffer that
    a task on another stream wrote, the write launched first, with no chain of recorded releases
    (stream order, event waits, host synchronizes) from the write to the read, is a race
    (analyzers.causality.happens_before: vector clocks, linear in tasks and accesses), whether
    the two overlapped in this run or the write finished first only by luck.
    """
    host = frames.host_calls
    acc = frames.accesses
    if host.empty and acc.empty:
        raise Skipped("no host calls and no buffer-access records in the trace")
    findings = []
    stalls = []
    if not host.empty:
        for (rank, _pid, tid), g in host.groupby(["rank", "pid", "tid"]):
            sync = g[g["kind"].astype(str) == "sync"]
            span = int((g["ts"] + g["dur"].fillna(0)).max() - g["ts"].min()) or 1
            # Nested calls (an AscendCL synchronize wrapping the runtime's) count once.
            stalled = union_ns(sync["ts"].to_numpy(), (sync["ts"] + sync["dur"].fillna(0)).to_numpy())
            stalls.append({"rank": int(rank), "tid": int(tid), "sync_ns": stalled, "span_ns": span})
            # A host blocked in syncs is an observation about the host, not a cost by itself:
            # the device idle it causes (nothing queued behind the sync) is measured by the
            # bubble analyzer as BUBBLE_SYNC, so this finding is informational and carries no
            # time of its own (counting it twice would rank the problem twice).
            if len(sync) >= cfg.min_calls and stalled >= cfg.min_stall_ns and stalled >= cfg.stall_ratio * span:
                idle_in_sync = _device_idle_during(frames, rank, sync)
                top = sync.sort_values("dur", ascending=False).head(cfg.evidence)
                findings.append(Finding(
                    code="SYNC_STALL", severity=Severity.INFO, title="Host stalls in synchronize calls",
                    message=(f"rank {rank} thread {tid}: {ms(stalled)} ({pct(stalled / span)} of its span) "
                             f"inside {len(sync)} synchronize calls, {ms(idle_in_sync)} of it with no "
                             f"kernel running; the device idle they cause is reported as BUBBLE_SYNC"),
                    rank=int(rank), ts_ns=int(g["ts"].min()), dur_ns=span, metric="sync_share",
                    value=round(stalled / span, 4), threshold=cfg.stall_ratio,
                    evidence=[{"ts": int(r.ts), "dur": int(r.dur), "name": str(r.name)} for r in top.itertuples()]))
    races = happens_before.races(frames)
    # One missing dependency (reader stream -> writer stream) races once per reading task, on
    # as many buffers as that task reads: one finding per stream pair, one occurrence per
    # reading task (its earliest read to the last write it overlapped).
    for (rank, device, r_stream, w_stream), g in (races.groupby(["rank", "device", "r_stream", "w_stream"])
                                                  if not races.empty else []):
        first = g.iloc[0]
        per_read = g.groupby("r_corr").agg(ts=("r_ts", "min"), end=("w_end", "max"), buffers=("addr", "nunique"))
        per_read = per_read.sort_values("ts")
        findings.append(Finding(
            code="MISSING_SYNC", severity=Severity.CRITICAL, title="Read before the producing task finished",
            message=(f"rank {rank}: {len(per_read)} task(s) on stream {r_stream} read {g['addr'].nunique()} "
                     + (f"buffer(s) while stream {w_stream} was still writing them (e.g. {first.r_name!r} started "
                        f"reading {int(first.addr):#x} {ms(first.w_end - first.r_ts)} before "
                        f"{first.w_name!r} finished writing it)" if first.w_end > first.r_ts else
                        f"buffer(s) that stream {w_stream} wrote, ordered only by luck (e.g. {first.r_name!r} read "
                        f"{int(first.addr):#x} {ms(first.r_ts - first.w_end)} after {first.w_name!r} finished "
                        f"writing it, with nothing making it wait)")
                     + f"; no event orders stream {r_stream} after stream {w_stream}"),
            rank=int(rank), device=int(device), stream=int(r_stream), ts_ns=int(per_read["ts"].min()),
            dur_ns=int(per_read["end"].max() - per_read["ts"].min()),
            metric="overlap_ns", value=float(max((g["w_end"] - g["r_ts"]).max(), 0)), threshold=0.0,
            evidence=[{"writer_corr": int(r.w_corr), "writer": r.w_name, "reader_corr": int(r.r_corr), "reader": r.r_name,
                       "addr": int(r.addr), "overlap_ns": max(int(r.w_end - r.r_ts), 0)}
                      for r in g.head(cfg.evidence).itertuples()],
            occurrences=[{"rank": int(rank), "device": int(device), "stream": int(r_stream), "ts_ns": int(r.ts), "dur_ns": int(r.end - r.ts),
                          "reader_corr": int(corr), "buffers": int(r.buffers)} for corr, r in per_read.iterrows()]))
    return findings, {"host_threads": stalls, "races": len(races)}


def _device_idle_during(frames: Frames, rank: int, calls: pd.DataFrame) -> int:
    """Time inside `calls` during which no kernel ran on the rank's devices."""
    if calls.empty:
        return 0
    ops = frames.device_ops
    k = ops[(ops["rank"] == rank) & (ops["kind"].astype(str) == "kernel")]
    a, b = merge_intervals(calls["ts"].to_numpy(), (calls["ts"] + calls["dur"].fillna(0)).to_numpy())
    busy = cover(k).between(a, b) if len(k) else 0
    return int(((b - a) - busy).sum())
