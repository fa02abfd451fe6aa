"""The API of events and synchronisation (aclrtCreateEvent .. aclrtSynchronizeDevice).

Records and waits are stream tasks the dispatcher runs; the synchronize calls hold the
calling thread until the device has done what they wait for, and their API slice says so.
`Runtime` offers these as its methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime_emu import errors as E
from runtime_emu.device import RECORD, WAIT, Event, Stream
from runtime_emu.errors import AclError
from runtime_emu.host import HostThread

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime


def check_event(event: Any) -> Event:
    """`event` as a live Event, or the AclError for a bad handle."""
    if not isinstance(event, Event):
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"invalid event handle {event!r}")
    if event.destroyed:
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"event {event.id} was destroyed")
    return event


def create_event(rt: Runtime) -> Event:
    th = rt._enter()
    t0 = th.clock
    rt.events_made += 1
    ev = Event(rt.events_made, rt._device(th))
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtCreateEvent", t0)
    return ev


def destroy_event(rt: Runtime, event: Any) -> None:
    th = rt._enter()
    ev = check_event(event)
    t0 = th.clock
    ev.destroyed = True
    th.clock += rt.api_overhead_ns
    rt.rows.api(th, "aclrtDestroyEvent", t0)


def record_event(rt: Runtime, event: Any, stream: Any) -> None:
    th = rt._enter()
    ev = check_event(event)
    s = rt._check_stream(th, stream)
    t0 = th.clock
    ev.record_seq += 1
    task = rt.dispatch.new_task(RECORD, "EVENT_RECORD", s, t0)
    task.event, task.event_seq = ev, ev.record_seq
    ev.last_record = task.corr
    rt.dispatch.launch(th, task, "aclrtRecordEvent", t0)


def stream_wait_event(rt: Runtime, stream: Any, event: Any) -> None:
    th = rt._enter()
    ev = check_event(event)
    s = rt._check_stream(th, stream)
    t0 = th.clock
    task = rt.dispatch.new_task(WAIT, "EVENT_WAIT", s, t0)
    task.event, task.event_seq = ev, ev.record_seq
    task.record = ev.last_record
    rt.dispatch.launch(th, task, "aclrtStreamWaitEvent", t0)


def synchronize_event(rt: Runtime, event: Any) -> None:
    th = rt._enter()
    ev = check_event(event)
    t0 = th.clock
    target = ev.record_seq
    rt.coord.block(th, lambda: ev.executed(target), f"event {ev.id} is never reached")
    _sync_done(rt, th, t0, "aclrtSynchronizeEvent", None)


def synchronize_stream(rt: Runtime, stream: Any) -> None:
    th = rt._enter()
    s = rt._check_stream(th, stream)
    t0 = th.clock
    rt.coord.block(th, rt.dispatch.drained((s,)), f"stream {s.id} never drains")
    _sync_done(rt, th, t0, "aclrtSynchronizeStream", s)


def synchronize_device(rt: Runtime) -> None:
    th = rt._enter()
    dev = rt._device(th)
    t0 = th.clock
    streams = list(dev.streams.values())
    rt.coord.block(th, rt.dispatch.drained(tuple(streams)), f"device {dev.id} never drains")
    _sync_done(rt, th, t0, "aclrtSynchronizeDevice", None)


def _sync_done(rt: Runtime, th: HostThread, t0: int, name: str, stream: Stream | None) -> None:
    """A synchronize call returns: its wait goes to the ground truth, its slice spans it."""
    waited = th.clock - t0
    if waited > 0 and rt.truth.keep:
        rt.truth.host_blocks.append((th.rank, th.tid, t0, th.clock, "sync", stream.id if stream else None, None))
    th.clock += rt.preset.sync_overhead_ns
    rt.rows.api(th, name, t0, "sync", stream=stream, blocked="synchronize", blocked_ns=waited)
