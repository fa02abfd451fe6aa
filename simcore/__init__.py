"""simcore: the discrete-event simulation core the emulator (`runtime_emu`) and the replay
(`analyzers.causality.replay`) both run on, so a trace is re-timed by the same engine, link
sharing and core pools that made it.

* `simcore.engine`: the event loop (integer nanoseconds, callbacks ordered by time, then by
  scheduling order);
* `simcore.links`: links shared by concurrent transfers, max-min fair;
* `simcore.cores`: a device's core pools (blocks dispatched one core at a time, run to completion
  or preemptive by priority).

It imports nothing of the project. Its modules are compiled with the emulator's (see
`simcore._loader`).
"""

from simcore import _loader

_loader.choose()  # compiled or pure Python: decided before any compiled module loads
