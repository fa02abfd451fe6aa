"""runtime_emu: an instrumented emulator of an Ascend-like NPU runtime that records traces.

See `runtime_emu.acl` for the pyACL-shaped API and `Runtime` for the Python one.
"""

from runtime_emu import _loader

_loader.choose()  # compiled core or pure Python: decided before any of those modules loads

from runtime_emu import runtime as _runtime  # noqa: E402
from runtime_emu.device import Event, Kernel, Stream  # noqa: E402
from runtime_emu.errors import AclError, Deadlock  # noqa: E402
from runtime_emu.host import Thread  # noqa: E402
from runtime_emu.presets import PRESETS, Preset  # noqa: E402
from runtime_emu.recorder import Switches  # noqa: E402
from runtime_emu.runtime import EmuResult, Runtime  # noqa: E402

#: True when the emulator core runs compiled (mypyc), False when it runs as plain Python.
COMPILED = not _runtime.__file__.endswith(".py")

__all__ = ["AclError", "COMPILED", "Deadlock", "EmuResult", "Event", "Kernel", "PRESETS", "Preset", "Runtime", "Stream",
           "Switches", "Thread"]
