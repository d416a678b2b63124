"""Colour by structure: a renderer marks what a span means; only a terminal's printer turns marks into colour.

A renderer calls :func:`toned` where its own structure knows the meaning (the
verdict word, the "CUDA initialized" line, a replay's headline); it never
colours by matching words in the finished text, so a user's module named
``clean`` or ``failed`` is printed as it is.  Outside :func:`coloured`,
:func:`toned` returns the text untouched: reports written to files, JSON,
HTML and notebooks never carry a mark.  Inside, each mark carries a random
key of that render, so no text a target wrote (a module name, an exception
message) can open or close a colour: only marks with the key are turned into
colour, and the renderers' escaping of control characters has already run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from diagtools.model.verdict import VERDICT_TONES, Tone, Verdict

__all__ = ["HTML_COLOURS", "Styling", "coloured", "paint", "toned", "use_color", "verdict_toned", "visible_len"]

_ANSI = {Tone.BAD: "\x1b[31m", Tone.GOOD: "\x1b[32m", Tone.UNKNOWN: "\x1b[33m"}
#: the same palette in HTML: every page, panel and postmortem colours a tone with these
HTML_COLOURS = {Tone.BAD: "#b00020", Tone.GOOD: "#1b7f3b", Tone.UNKNOWN: "#a15c00"}
_RESET = "\x1b[0m"
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: printable, so the escaping of controls keeps them
_ANY_MARK = re.compile(f"{_OPEN}[0-9a-f]{{16}}(?:bad|good|unknown)?{_CLOSE}")


class Styling:
    """One coloured render: its random key, and the way back from marks to colour."""

    def __init__(self) -> None:
        self.key = os.urandom(8).hex()
        self._marks = re.compile(f"{_OPEN}{self.key}(bad|good|unknown)?{_CLOSE}")

    def mark(self, text: str, tone: Tone) -> str:
        return f"{_OPEN}{self.key}{tone.value}{_CLOSE}{text}{_OPEN}{self.key}{_CLOSE}"

    def ansi(self, text: str) -> str:
        """``text`` with this render's marks turned into terminal colours."""
        return self._marks.sub(lambda match: _ANSI[Tone(match.group(1))] if match.group(1) else _RESET, text)


_ACTIVE: ContextVar[Styling | None] = ContextVar("diagtools_styling", default=None)


def toned(text: str, tone: Tone) -> str:
    """``text`` marked with how it reads, inside :func:`coloured`; untouched anywhere else."""
    styling = _ACTIVE.get()
    return text if styling is None or not text else styling.mark(text, tone)


def verdict_toned(verdict: Verdict | str, text: str | None = None) -> str:
    """``text`` (by default the verdict's own word) in the verdict's tone."""
    word = Verdict(verdict)
    return toned(str(word) if text is None else text, VERDICT_TONES[word])


@contextlib.contextmanager
def coloured(enabled: bool = True) -> Iterator[Styling | None]:
    """Render inside this block to get marks; turn them into colour with the yielded :class:`Styling`."""
    if not enabled:
        yield None
        return
    styling = Styling()
    token = _ACTIVE.set(styling)
    try:
        yield styling
    finally:
        _ACTIVE.reset(token)


def visible_len(text: str) -> int:
    """How many columns ``text`` takes on a terminal once its marks are colour (none)."""
    return len(_ANY_MARK.sub("", text)) if _OPEN in text else len(text)


_RED, _GREEN, _AMBER = _ANSI[Tone.BAD], _ANSI[Tone.GOOD], _ANSI[Tone.UNKNOWN]
_PAINT = (
    (
        _RED,
        r"Reproduced: [^;\n]*|not fixed: [^;\n]*"
        r"|CUDA initialized: YES|(?<!not )(?<!no longer )initializes CUDA|initializes-cuda|CUDA initialized(?!:)"
        r"|\bUNEXPECTED\b|\bYES\b|poisoned-fork|poisoned fork",
    ),
    (
        _GREEN,
        r"(?<!not )fixed: [^;\n]*|Passes: [^;\n]*"
        r"|CUDA initialized: no|does not initialize CUDA|no longer initializes CUDA|CUDA not initialized|\bclean\b"
        r"|status: ok\b|\[ok \]|\bok \(\d+ device\(s\)\)",
    ),
    (
        _AMBER,
        r"[Nn]ot (?:judged|reproduced)\b[^;\n]*|\bunknown\b|(?<!\b0 )\bfailed\b|\bimport-error\b|\bcrashed\b"
        r"|\btimeout\b|\bexited\b|\bFAILED\b",
    ),
)


@functools.cache
def _painter() -> re.Pattern[str]:
    """The colouring pattern, compiled on first use: a report to a pipe or a file is never painted."""
    return re.compile("|".join(f"(?P<c{i}>{pattern})" for i, (_, pattern) in enumerate(_PAINT)))


def paint(text: str) -> str:
    """Text rendered without marks (written by other code), coloured by its words: red where CUDA got
    initialized, green where clean, amber for failed/unknown.

    The reports of diagtools' own commands never go through it: they are coloured by structure
    (:func:`toned`, :func:`coloured`), so a name a user chose is never taken for a verdict.
    """

    def colour(match: re.Match[str]) -> str:
        group = next(name for name, value in match.groupdict().items() if value is not None)
        return f"{_PAINT[int(group[1:])][0]}{match.group(0)}{_RESET}"

    return _painter().sub(colour, text)


def use_color(isatty: bool, environ: Mapping[str, str]) -> bool:
    """Colour a terminal unless ``NO_COLOR`` is set; ``FORCE_COLOR`` colours even a pipe."""
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    return isatty and environ.get("TERM") != "dumb"
