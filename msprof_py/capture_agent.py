"""The profiled program's side of `msprof-py --application=...`.

The capture runs the program unchanged, with MSPROF_PY_CAPTURE_DIR naming a staging directory
and `msprof_py/_capture_boot` first on PYTHONPATH: that directory's `sitecustomize` calls
`install()` as every Python process of the program starts, which adds `attach` to
`runtime_emu.acl.on_init` once the program imports `runtime_emu.acl` (the runtime offers the
hook; it never imports this module). So every acl.init() of the program attaches its runtime.
From then on what the runtime records reaches that directory, one
`session-{k}-{pid}/` per acl.init():

- `trace.parquet`: the trace table, written at acl.finalize(), and before that as a periodic
  snapshot (every MSPROF_PY_FLUSH_S seconds, default 2, backing off to 4x the time a snapshot
  takes) so that even a `kill -9` of the program leaves what was recorded up to the last flush;
- `state.json`: whether the session was finalized, and if not, why it stopped.

At interpreter exit a session the program never finalized is finalized (device work drained)
when the program ended normally, and saved as recorded so far when it died of an exception;
SIGTERM saves what was recorded and then lets the signal kill the process as it would have.
Every file is written atomically, so the capture never finds a half-written one.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ENV_DIR = "MSPROF_PY_CAPTURE_DIR"
ENV_FLUSH_S = "MSPROF_PY_FLUSH_S"
DEFAULT_FLUSH_S = 2.0
#: A snapshot rebuilds the whole table: wait at least this many times its cost before the next.
BACKOFF = 4.0


class _Session:
    """One runtime's recording and where it goes."""

    def __init__(self, agent: "_Agent", directory: Path, runtime: Any) -> None:
        self.agent, self.dir, self.rt = agent, directory, runtime
        self.dir.mkdir(parents=True, exist_ok=True)
        self.done = False
        self.saved_revision: tuple = ()  # the recorder's when the last snapshot was saved
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._flush_loop, name="msprof-py flush", daemon=True)
        self.thread.start()

    # -------------------------------------------------------------- writing
    def save(self, trace: Any, *, final: bool, reason: str) -> None:
        """Write the trace, then the state that describes it (both atomically)."""
        from msprof_py.trace import write_trace
        from msprof_py.trace.atomic import atomic_file

        write_trace(trace, self.dir / "trace.parquet")
        state = {"final": final, "reason": reason, "rows": len(trace), "pid": os.getpid(),
                 "written_at": time.time()}
        with atomic_file(self.dir / "state.json") as tmp:
            tmp.write_text(json.dumps(state), encoding="utf-8")

    def save_snapshot(self, reason: str) -> None:
        with self.agent.lock:
            if self.done:
                return
            self.save(self.rt.snapshot(), final=False, reason=reason)

    def finalize(self, trace: Any, reason: str = "finalized") -> None:
        with self.agent.lock:
            if self.done:
                return
            self.done = True
            self.stop.set()
            self.save(trace, final=True, reason=reason)

    def _flush_loop(self) -> None:
        wait = self.agent.flush_s
        while not self.stop.wait(wait):
            revision = self.rt.recorder.revision()
            if revision == self.saved_revision:
                continue
            t0 = time.monotonic()
            try:
                self.save_snapshot("stopped before acl.finalize(); data up to the last periodic flush")
            except Exception:  # never let profiling break the program; the next flush retries
                continue
            self.saved_revision = revision
            wait = max(self.agent.flush_s, BACKOFF * (time.monotonic() - t0))


class _Agent:
    """Process-wide: the staging directory, the sessions, and the exit / signal hooks."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.lock = threading.RLock()  # RLock: a SIGTERM may arrive while the main thread saves
        self.sessions: list[_Session] = []
        self.crash: str | None = None
        self.flush_s = float(os.environ.get(ENV_FLUSH_S) or DEFAULT_FLUSH_S)
        # Import now what saving needs: at interpreter exit, imports that start threads (pandas,
        # which pyarrow loads on first use) fail.
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        import msprof_py.trace  # noqa: F401
        from runtime_emu import acl

        acl.on_finalize.append(self._on_finalize)
        atexit.register(self._at_exit)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    @property
    def current(self) -> _Session | None:
        return self.sessions[-1] if self.sessions else None

    def attach(self, runtime: Any) -> None:
        prev = self.current
        if prev is not None and not prev.done:
            # The program started a new runtime without finalizing the old one: keep what it had.
            prev.save_snapshot("replaced by a new acl.init() before acl.finalize()")
            prev.done = True
            prev.stop.set()
        # The pid too: a child process that inherits the environment gets sessions of its own.
        self.sessions.append(_Session(self, self.dir / f"session-{len(self.sessions)}-{os.getpid()}", runtime))

    def _on_finalize(self, result: Any) -> None:
        s = self.current
        if s is not None and not s.done:
            s.finalize(result.trace)

    def _excepthook(self, exc_type, exc, tb) -> None:
        self.crash = f"the program raised {exc_type.__name__}: {exc}"
        self._previous_hook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        s = self.current
        if s is None or s.done:
            return
        if self.crash is None and not s.rt.finished:
            try:
                s.finalize(s.rt.finish().trace, "finalized at exit: the program did not call acl.finalize()")
                return
            except Exception as exc:  # a runtime left mid-call cannot drain: keep what it recorded
                self.crash = f"the runtime could not be finalized at exit ({exc})"
        s.save_snapshot(self.crash or "the program exited before acl.finalize()")
        s.done = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        s = self.current
        if s is not None and not s.done:
            s.save_snapshot("saved at SIGTERM: the data stops there")
            s.done = True
        # Die of the signal, as the program would have without the profiler.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


_agent: _Agent | None = None
ACL_MODULE = "runtime_emu.acl"
#: The directory the capture puts first on PYTHONPATH: its sitecustomize calls install().
BOOT_DIR = Path(__file__).resolve().parent / "_capture_boot"


def install() -> None:
    """Attach to every runtime this process starts, when the capture asked for it.

    Runs at interpreter start-up in every Python process of the captured program, and most of
    them (a `python -c` helper, a data loader) never start a runtime: so until the program
    imports runtime_emu.acl this imports nothing but the standard library, and then only adds
    `attach` to its `on_init` hooks.
    """
    if not os.environ.get(ENV_DIR):
        return
    acl = sys.modules.get(ACL_MODULE)
    if acl is not None:
        _hook(acl)
    elif not any(isinstance(f, _HookOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _HookOnImport())


def _hook(acl: Any) -> None:
    if attach not in acl.on_init:
        acl.on_init.append(attach)


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Finds runtime_emu.acl as the rest of sys.meta_path would, and hooks `attach` into the
    module right after it has run (there is no post-import hook in the standard library)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != ACL_MODULE:
            return None
        sys.meta_path.remove(self)  # once is enough, and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def attach(runtime: Any) -> None:
    """Record `runtime` into the capture's staging directory (an acl.on_init hook)."""
    global _agent
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    if _agent is None:
        _agent = _Agent(Path(directory))
    _agent.attach(runtime)
