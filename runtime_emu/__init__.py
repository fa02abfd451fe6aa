"""runtime_emu: an instrumented emulator of an Ascend-like NPU runtime that records traces.

See `runtime_emu.acl` for the pyACL-shaped API and `Runtime` for the Python one.
"""

import simcore  # noqa: F401 - first: it decides, once, whether the compiled core or the .py files run
from runtime_emu import runtime as _runtime
from runtime_emu.device import Event, Kernel, Stream
from runtime_emu.errors import AclError, Deadlock
from runtime_emu.host import Thread
from runtime_emu.presets import PRESETS, Preset
from runtime_emu.recorder import Switches
from runtime_emu.runtime import EmuResult, Runtime

#: True when the emulator core runs compiled (mypyc), False when it runs as plain Python.
COMPILED = not _runtime.__file__.endswith(".py")

__all__ = ["AclError", "COMPILED", "Deadlock", "EmuResult", "Event", "Kernel", "PRESETS", "Preset", "Runtime", "Stream",
           "Switches", "Thread"]
