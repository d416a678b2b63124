"""Escaping for the terminal: text a target controls never reaches it as a control sequence.

Module names, file paths, source lines, messages and captured output come
from the target: every report shows their control characters as ``\\xNN``
escapes, so no ANSI or OSC sequence, carriage return or bidi override
reaches the terminal.  Colour is added afterwards, by structure
(:mod:`diagtools.render.style`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import ParamSpec

__all__ = ["WIDTH", "one_line", "safe_output", "terminal_safe"]

_P = ParamSpec("_P")
WIDTH = 100  # the columns a table row may take
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[{_CONTROL}]")  # newline and tab are kept
_CONTROLS_AND_BREAKS = re.compile(f"[{_CONTROL}\n\t]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab shown as an escape."""
    return _CONTROLS.sub(_escape, text)


def one_line(text: object) -> str:
    """A single-line field (a name, a path, a source line): line breaks are escaped too."""
    return _CONTROLS_AND_BREAKS.sub(_escape, str(text))


def safe_output(render: Callable[_P, str]) -> Callable[_P, str]:
    @functools.wraps(render)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> str:
        return terminal_safe(render(*args, **kwargs))

    return wrapper


_safe = safe_output  # the name the renderers use
