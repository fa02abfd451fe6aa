"""Host threads with virtual clocks, run one at a time in virtual-time order.

Each host thread has its own clock. A runtime call first waits until its thread is the
earliest runnable one (ties by creation order) and the device has been simulated up to
that time, so several OS threads give the same trace on every run. With a single host
thread none of this costs anything: the thread simply drives the engine.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from runtime_emu.errors import ACL_ERROR_RT_INTERNAL_ERROR, AclError, Deadlock

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

READY, RUNNING, BLOCKED, DONE = "ready", "running", "blocked", "done"


class HostThread:
    __slots__ = ("ident", "tid", "clock", "state", "pred", "what", "error", "device", "rank", "step", "name")

    def __init__(self, ident: int, tid: int, clock: int, rank: int = 0) -> None:
        self.ident = ident
        self.tid = tid
        self.clock = clock
        self.state = RUNNING
        self.pred: Callable[[], bool] | None = None
        self.what = ""
        self.error: BaseException | None = None
        self.device: Any = None
        self.rank = rank
        self.step: int | None = None
        self.name = f"Thread {tid}"


class Coordinator:
    """Serialises host threads in virtual-time order and advances the engine between them."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.threads: dict[int, HostThread] = {}
        self.order: list[HostThread] = []
        self.cv = threading.Condition()
        self.baton: HostThread | None = None
        self.live = 0  # threads not DONE

    @property
    def single(self) -> bool:
        """Only one live host thread: it drives the engine directly, no turn-taking."""
        return self.live <= 1

    def register(self, ident: int, clock: int, rank: int = 0) -> HostThread:
        th = HostThread(ident, len(self.order) + 1, clock, rank)
        self.threads[ident] = th
        self.order.append(th)
        self.live += 1
        return th

    def current(self) -> HostThread:
        th = self.threads.get(threading.get_ident())
        if th is None:
            raise AclError(ACL_ERROR_RT_INTERNAL_ERROR,
                           "runtime call from a thread the runtime does not know; start host threads with "
                           "runtime_emu.Thread")
        return th

    # ---------------------------------------------------------------- turns
    def enter(self, th: HostThread) -> None:
        """Called at every runtime call: wait for this thread's turn at its clock."""
        if self.single:
            self.rt.engine.run_until(th.clock)
            return
        with self.cv:
            th.state = READY
            self._schedule()
            self._wait(th)

    def block(self, th: HostThread, pred: Callable[[], bool], what: str) -> None:
        """Block until pred() holds; the thread's clock moves to the moment it does."""
        engine = self.rt.engine
        if self.single:
            if not engine.run_while(lambda: not pred()):
                raise Deadlock(f"host thread {th.tid} waits forever: {what} (no device work left that could end it)")
            if engine.now > th.clock:
                th.clock = engine.now
            return
        with self.cv:
            th.state, th.pred, th.what = BLOCKED, pred, what
            self._schedule()
            self._wait(th)

    def finish_thread(self, th: HostThread) -> None:
        with self.cv:
            self._done(th)
            self._schedule()

    def _done(self, th: HostThread) -> None:
        if th.state != DONE:
            th.state = DONE
            self.live -= 1

    def _wait(self, th: HostThread) -> None:
        while self.baton is not th and th.error is None:
            self.cv.wait()
        if th.error is not None:
            err, th.error = th.error, None
            self._done(th)
            raise err
        th.state = RUNNING

    def _schedule(self) -> None:
        """Pick who runs next, simulating the device in between. Caller holds the cv."""
        engine = self.rt.engine
        self.baton = None
        while True:
            for b in self.order:
                if b.state == BLOCKED and b.pred():
                    b.state, b.pred = READY, None
                    if engine.now > b.clock:
                        b.clock = engine.now
            ready = [t for t in self.order if t.state == READY]
            nxt = engine.next_time()
            first = min(ready, key=lambda t: (t.clock, t.tid)) if ready else None
            if nxt is not None and (first is None or nxt <= first.clock):
                engine.step()
                continue
            if first is None:
                blocked = [t for t in self.order if t.state == BLOCKED]
                for b in blocked:
                    b.error = Deadlock(f"host thread {b.tid} waits forever: {b.what}")
                self.cv.notify_all()
                return
            engine.run_until(first.clock)
            self.baton = first
            self.cv.notify_all()
            return


class Thread(threading.Thread):
    """A host thread of an emulated program (use it instead of threading.Thread)."""

    def __init__(self, target: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
                 name: str | None = None) -> None:
        super().__init__(target=target, args=args, kwargs=kwargs or {}, name=name, daemon=True)
        from runtime_emu import acl

        self._rt = acl.current()
        self._host: HostThread | None = None
        self._exc: BaseException | None = None

    def start(self) -> None:
        rt = self._rt
        parent = rt.coord.current()
        rt.coord.enter(parent)
        parent.clock += rt.api_overhead_ns
        self._started_at = parent.clock
        self._parent = parent
        super().start()
        # The new thread registers itself; wait until it has, so the schedule knows it.
        while self._host is None:
            self._ready.wait()

    def run(self) -> None:  # noqa: D401 - threading API
        rt = self._rt
        coord = rt.coord
        with coord.cv:
            host = coord.register(threading.get_ident(), self._started_at, self._parent.rank)
            host.state = READY
            host.device = self._parent.device  # the device context is inherited, for convenience
            self._host = host
        self._ready.set()
        try:
            with coord.cv:
                coord._wait(self._host)
            super().run()
        except BaseException as exc:  # reported by join()
            self._exc = exc
        finally:
            coord.finish_thread(self._host)

    def join(self, timeout: float | None = None) -> None:
        rt = self._rt
        coord = rt.coord
        me = coord.current()
        coord.enter(me)
        coord.block(me, lambda: self._host is not None and self._host.state == DONE,
                    f"join of host thread {self._host.tid if self._host else '?'}")
        super().join(timeout)
        if self._exc is not None:
            raise self._exc

    @property
    def _ready(self) -> threading.Event:
        ev = self.__dict__.get("_ready_ev")
        if ev is None:
            ev = self.__dict__["_ready_ev"] = threading.Event()
        return ev
