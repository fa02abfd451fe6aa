"""Runtime errors shaped like AscendCL's: a named error code and a message saying what was wrong."""

from __future__ import annotations

# aclError codes (AscendCL, acl/acl_base.h); only the ones the emulator raises.
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_HANDLE = 107017
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207003
ACL_ERROR_RT_DEV_SETUP_ERROR = 507033
ACL_ERROR_RT_INTERNAL_ERROR = 507899
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_UNINITIALIZE = 100001

_NAMES = {v: k for k, v in dict(globals()).items() if k.startswith("ACL_ERROR_")}


class AclError(RuntimeError):
    """A failed runtime call: `code` is the aclError value, `name` its symbolic name."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.name = _NAMES.get(code, "ACL_ERROR")
        super().__init__(f"{self.name} ({code}): {message}")


class Deadlock(AclError):
    """Every host thread waits and no device work is left that could wake one."""

    def __init__(self, message: str) -> None:
        super().__init__(ACL_ERROR_RT_INTERNAL_ERROR, message)
