"""Command-line values converted without pydantic, so the CLI starts fast.

Typer converts every parameter value through a pydantic TypeAdapter, and importing pydantic
costs about as much as the rest of `msprof-py --help` together (measure it with
`python -X importtime`). The CLI's parameters are all of a few plain kinds (str, int with
bounds, bool, Path, a str Enum, a list of those); for those this module installs a converter
that gives the same values and the same kind of error (click's BadParameter, one line, exit 2).
A parameter of any other kind keeps Typer's own converter.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

from typer import BadParameter

try:
    from typer._coercion import RuntimeParam
except ImportError:  # a Typer that converts with click (no pydantic): nothing to replace
    RuntimeParam = None

_INT = re.compile(r"([+-]?[0-9](?:_?[0-9])*)(?:\.0+)?")

#: A Path parameter with any of these set needs Typer's checks (existence, dash, resolving).
_PATH_FLAGS = {"exists": False, "writable": False, "resolve_path": False, "allow_dash": False,
               "path_type": None, "file_okay": True, "dir_okay": True, "readable": True}


def install(command: Any, ctx: Any) -> None:
    """Give each plain parameter of `command` and of its subcommands (with their `--help`
    options, which click adds per context) the fast converter."""
    if RuntimeParam is None:
        return
    for param in command.get_params(ctx):
        # Only where Typer would build its own converter lazily (its `_runtime_param` is None).
        descriptor = getattr(param, "type_descriptor", None)
        if (descriptor is not None and getattr(param, "_runtime_param", True) is None
                and _plain(descriptor.annotation, descriptor.parameter_info)):
            param._runtime_param = _PlainParam(parameter_info=param.type_descriptor.parameter_info,
                                               annotation=param.type_descriptor.annotation)
    for sub in getattr(command, "commands", {}).values():
        install(sub, ctx)


def _plain(annotation: Any, info: Any) -> bool:
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return get_origin(item) is None and _plain(item, info)
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
        return False
    if annotation is int:
        return not info.clamp
    if annotation is Path:
        return all(getattr(info, k, v) == v for k, v in _PATH_FLAGS.items())
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return issubclass(annotation, str) and info.case_sensitive
    return annotation in (str, bool)


class _PlainParam(RuntimeParam or object):  # type: ignore[misc]
    """Converts a value of one of the plain kinds `_plain` accepts."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if get_origin(self.annotation) is list:
            (item,) = get_args(self.annotation)
            values = value if isinstance(value, (list, tuple)) else [value]
            return [_convert(item, v, self.parameter_info, param, ctx) for v in values]
        return _convert(self.annotation, value, self.parameter_info, param, ctx)


def _convert(annotation: Any, value: Any, info: Any, param: Any, ctx: Any) -> Any:
    if annotation is str:
        return value if isinstance(value, str) else str(value)
    if annotation is Path:
        return value if isinstance(value, Path) else Path(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "t", "yes", "y", "on"):
            return True
        if text in ("", "0", "false", "f", "no", "n", "off"):
            return False
        raise BadParameter(f"{value!r} is not a valid boolean.", ctx=ctx, param=param)
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:  # what Typer's pydantic accepts: ASCII digits, a sign, '_' between digits, '.0' after
            match = _INT.fullmatch(str(value).strip())
            if match is None:
                raise BadParameter(f"{value!r} is not a valid integer.", ctx=ctx, param=param)
            number = int(match.group(1).replace("_", ""))
        if info.min is not None and number < info.min:
            raise BadParameter(f"{number} is smaller than the minimum {info.min}.", ctx=ctx, param=param)
        if info.max is not None and number > info.max:
            raise BadParameter(f"{number} is larger than the maximum {info.max}.", ctx=ctx, param=param)
        return number
    # a str Enum: exact, case-sensitive choice, as Typer does by default
    if isinstance(value, annotation):
        return value
    for member in annotation:
        if member.value == value:
            return member
    from msprof_py.choices import NOUNS

    noun = NOUNS.get(annotation) or f"{param.opts[0] if param.opts else param.name} value"
    raise UnknownChoice(f"unknown {noun} {value!r}; choose one of {', '.join(m.value for m in annotation)}",
                        ctx=ctx, param=param)


class UnknownChoice(BadParameter):
    """A value that is none of an enum's: the message names the choices, so it stands alone."""

    def format_message(self) -> str:
        return self.message
