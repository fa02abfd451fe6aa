"""Host threads with virtual clocks, run one at a time in virtual-time order.

Each host thread (and each rank of a multi-rank job) is a greenlet with its own clock. A
runtime call first lets the earliest runnable thread go (ties by creation order), with the
device simulated up to that time in between, so a program gives the same trace on every run.
Switching greenlets costs well under a microsecond, so a 16-rank job interleaves its ranks at
every call without real threads. With one live host thread none of this costs anything: the
thread simply drives the engine.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Final

import greenlet

from runtime_emu import state
from runtime_emu.errors import ACL_ERROR_RT_INTERNAL_ERROR, AclError, Deadlock
from runtime_emu.state import HostThread

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

#: The running greenlet (Final: compiled code calls it without a module attribute lookup).
_getcurrent: Final = greenlet.getcurrent

#: `busy_from` of a thread whose call in progress records no row at its start (a join).
NO_ROW_PENDING: Final = 1 << 62

#: A host thread's states (Final here, so compiled code reads them without a global lookup).
READY: Final = state.READY
RUNNING: Final = state.RUNNING
BLOCKED: Final = state.BLOCKED
DONE: Final = state.DONE


#: Which runtime each host-thread greenlet belongs to (weak: finished jobs are collected).
_RUNTIMES: "weakref.WeakKeyDictionary[Any, Runtime]" = weakref.WeakKeyDictionary()


def runtime_of_current_thread() -> "Runtime | None":
    rt = _RUNTIMES.get(greenlet.getcurrent())
    return rt if rt is not None and not rt.finished else None


class Coordinator:
    """Serialises host threads in virtual-time order and advances the engine between them."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.threads: dict[Any, HostThread] = {}
        self.order: list[HostThread] = []
        self.live = 0  # threads not DONE
        #: The C core (runtime_emu._core.Core) when it runs, told how many threads are live: its
        #: launch path is for a lone host thread, which drives the engine without taking turns.
        self.native: Any = None

    @property
    def single(self) -> bool:
        """Only one live host thread: it drives the engine directly, no turn-taking."""
        return self.live <= 1

    def register(self, glet: Any, clock: int, rank: int = 0) -> HostThread:
        tid = sum(1 for t in self.order if t.rank == rank) + 1
        th = HostThread(glet, tid, clock, rank)
        self.threads[glet] = th
        if glet is not greenlet.getcurrent():  # a spawned host thread or rank (not the main one)
            _RUNTIMES[glet] = self.rt
        self.order.append(th)
        self.live += 1
        if self.native is not None:
            self.native.threads_live = self.live
        return th

    def current(self) -> HostThread:
        th = self.threads.get(_getcurrent())
        if th is None:
            raise AclError(ACL_ERROR_RT_INTERNAL_ERROR,
                           "runtime call from a thread the runtime does not know; start host threads with "
                           "runtime_emu.Thread")
        return th

    # ---------------------------------------------------------------- turns
    def enter(self, th: HostThread) -> None:
        """Called at every runtime call: wait for this thread's turn at its clock."""
        th.busy_from = th.clock
        if self.live <= 1:
            self.rt.engine.run_until(th.clock)
            return
        th.state = READY
        self._hand_over(th)

    def block(self, th: HostThread, pred: Callable[[], bool], what: str) -> None:
        """Block until pred() holds; the thread's clock moves to the moment it does."""
        engine = self.rt.engine
        if self.live <= 1:
            if not engine.run_while(lambda: not pred()):
                raise Deadlock(f"host thread {th.tid} waits forever: {what} (no device work left that could end it)")
            if engine.now > th.clock:
                th.clock = engine.now
            return
        th.state, th.pred, th.what = BLOCKED, pred, what
        self._hand_over(th)

    def finish_thread(self, th: HostThread) -> Any:
        """Mark th done and return the greenlet that runs next (the caller switches to it)."""
        self._done(th)
        nxt = self._pick()
        return nxt.glet if nxt is not None else None

    def _done(self, th: HostThread) -> None:
        if th.state != DONE:
            th.state = DONE
            self.live -= 1
            if self.native is not None:
                self.native.threads_live = self.live

    def _hand_over(self, th: HostThread) -> None:
        nxt = self._pick()
        if nxt is not th and nxt is not None:
            nxt.glet.switch()
        if th.error is not None:
            err, th.error = th.error, None
            raise err
        th.state = RUNNING

    def _pick(self) -> HostThread | None:
        """Simulate the device until a host thread can run; return the earliest one."""
        if self.native is not None:  # the same loop in C, over the C core's host threads
            picked: HostThread | None = self.native.pick(self.order)
            return picked if picked is not None else self._stuck()
        engine = self.rt.engine
        while True:
            first = None
            for t in self.order:
                if t.state == BLOCKED and t.pred is not None and t.pred():
                    t.state, t.pred = READY, None
                    if engine.now > t.clock:
                        t.clock = engine.now
                if t.state == READY and (first is None or t.clock < first.clock):
                    first = t
            nxt = engine.next_time()
            if nxt is not None and (first is None or nxt <= first.clock):
                engine.step()
                continue
            if first is None:
                return self._stuck()
            engine.run_until(first.clock)
            first.state = RUNNING
            return first

    def _stuck(self) -> HostThread | None:
        """No host thread can run and no device work is left: None if none waits, else every
        waiting thread raises Deadlock where it waits (the first of them runs next)."""
        blocked = [t for t in self.order if t.state == BLOCKED]
        if not blocked:
            return None
        for b in blocked:
            b.error = Deadlock(f"host thread {b.tid} (rank {b.rank}) waits forever: {b.what}")
            b.state = READY
        return blocked[0]


class Thread:
    """A host thread of an emulated program (in place of threading.Thread).

    `rank` puts the thread in another rank of a multi-rank job (default: the creator's rank).
    """

    def __init__(self, target: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
                 name: str | None = None, rank: int | None = None, runtime: "Runtime | None" = None) -> None:
        if runtime is None:
            from runtime_emu import acl

            runtime = acl.current()
        self._rt = runtime
        self._target, self._args, self._kwargs = target, args, kwargs or {}
        self.name = name
        self._rank = rank
        self._host: HostThread | None = None
        self._exc: BaseException | None = None
        self._result: Any = None

    def start(self) -> None:
        rt = self._rt
        coord = rt.coord
        parent = rt._enter()
        parent.clock += rt.api_overhead_ns
        glet = greenlet.greenlet(self._run)
        rank = parent.rank if self._rank is None else self._rank
        host = coord.register(glet, parent.clock, rank)
        host.state = READY
        if rank == parent.rank:
            host.device = parent.device  # the device context is inherited, for convenience
        if self.name:
            host.name = self.name
        self._host = host

    def _run(self) -> Any:
        coord = self._rt.coord
        host = self._host
        assert host is not None, "a thread runs only after start()"
        try:
            self._result = self._target(*self._args, **self._kwargs)
        except BaseException as exc:  # reported by join()
            self._exc = exc
        nxt = coord.finish_thread(host)
        if nxt is not None:
            greenlet.getcurrent().parent = nxt  # returning resumes the next thread
        return None

    def join(self) -> Any:
        if self._host is None:
            raise RuntimeError("join() of a thread that was never started")
        rt = self._rt
        me = rt._enter()
        me.busy_from = NO_ROW_PENDING  # a join records nothing: it holds back no trace rows meanwhile
        host = self._host
        rt.coord.block(me, lambda: host.state == DONE, f"join of host thread {host.tid}")
        if self._exc is not None:
            raise self._exc
        return self._result

    def is_alive(self) -> bool:
        return self._host is not None and self._host.state != DONE
