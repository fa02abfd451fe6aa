"""Streams and host threads: the state a kernel launch and a kernel's lifecycle share.

With the C core built (runtime_emu/_core.c) they are its types, `_core.Stream` and
`_core.HostThread`: the same attributes, held as C fields, so the core's launch and its
kernels read and write them without a Python object in between (the compiled modules read
them as attributes, like any object's). Without it (not built, or MSPROF_PY_PURE=1 when the
package is imported), they are the classes below. This module is never compiled: the compiled
modules see these names as plain Python classes, whichever of the two the process uses.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from runtime_emu._loader import native

#: A host thread's states.
READY = "ready"
RUNNING = "running"
BLOCKED = "blocked"
DONE = "done"


class PyStream:
    """An emulated stream (device.Stream): a FIFO of tasks and what the dispatcher knows of it."""

    __slots__ = ("id", "device", "priority", "queue", "busy", "pending", "capacity", "destroyed", "last_end_ns",
                 "last_kind", "last_cause", "last_producer", "last_record", "qcode", "launches", "launches_at")

    def __init__(self, stream_id: int, device: Any, priority: int, capacity: int) -> None:
        self.id = stream_id
        self.device = device
        self.priority = priority
        #: FIFO of the stream's tasks: a Task, or the Kernel of a launch not reached yet (its
        #: numbers are the next LAUNCH row of `launches`, from byte `launches_at`).
        self.queue: deque[Any] = deque()
        self.launches = bytearray()
        self.launches_at = 0
        self.busy = False
        self.pending = 0  # launched by the host and not yet retired
        self.capacity = capacity
        self.destroyed = False
        self.last_end_ns = -1
        self.last_kind = ""
        self.last_cause = ""
        self.last_producer = ""
        self.last_record = 0  # the `record` of the task that finished last
        self.qcode = -1  # recorder string code of the stream's queue-depth counter, set by the runtime


class PyHostThread:
    """A host thread of the emulated program (host.HostThread): its virtual clock and turn state."""

    __slots__ = ("glet", "tid", "clock", "state", "pred", "what", "error", "device", "rank", "step", "name",
                 "busy_from", "named")

    def __init__(self, glet: Any, tid: int, clock: int, rank: int = 0) -> None:
        self.glet = glet
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
        self.busy_from = clock  # the clock when the thread's latest runtime call began
        self.named = False  # its track's name is recorded (at its first runtime call)


if TYPE_CHECKING:
    Stream = PyStream
    HostThread = PyHostThread
else:
    _core = native("_core")
    Stream = PyStream if _core is None else _core.Stream
    HostThread = PyHostThread if _core is None else _core.HostThread


def state() -> str:
    """Which streams and host threads this process uses: "native" (the C core's) or "Python"."""
    return "Python" if Stream is PyStream else "native"
