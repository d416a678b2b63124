"""A Python source location, and whose code it is: the two facts every result type points with.

Here, not in :mod:`diagtools.model.scan` (which re-exports :class:`Site`), so
that the cut model can name lines without importing the scan's result types.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from diagtools.model.serial import Serial

__all__ = ["Site", "is_own", "own_patterns"]


@dataclass(frozen=True)
class Site(Serial):
    """One Python source location: a stack frame or the line that made a call."""

    file: str
    line: int
    function: str
    source: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def own_patterns(targets: Sequence[str], own: Iterable[str] = ()) -> tuple[str, ...]:
    """The user's own packages: ``own`` when given, else the targets' top-level packages."""
    given = tuple(pattern for pattern in own if pattern)
    return given or tuple(dict.fromkeys(target.split(".", 1)[0] for target in targets))


def is_own(module: str, patterns: Sequence[str]) -> bool:
    """``module`` is one of ``patterns`` (a package and its submodules, or a glob on dotted names)."""
    return any(module == p or module.startswith(p + ".") or fnmatch.fnmatchcase(module, p) for p in patterns)
