"""runtime_emu: an instrumented emulator of an Ascend-like NPU runtime that records traces.

See `runtime_emu.acl` for the pyACL-shaped API and `Runtime` for the Python one.
"""

from runtime_emu.device import Event, Kernel, Stream
from runtime_emu.errors import AclError, Deadlock
from runtime_emu.host import Thread
from runtime_emu.presets import PRESETS, Preset
from runtime_emu.recorder import Switches
from runtime_emu.runtime import EmuResult, Runtime

__all__ = ["AclError", "Deadlock", "EmuResult", "Event", "Kernel", "PRESETS", "Preset", "Runtime", "Stream",
           "Switches", "Thread"]
