"""The fix for a culprit: the nearest verified cut as a patch, its own verification, the callers, the guard.

:class:`FixResult` is what ``diagtools fix`` and :func:`diagtools.fix` return;
its document's schema is ``diagtools.fix/1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.cuts import Cut, Outcome
from diagtools.model.scan import ScanResult
from diagtools.model.serial import Serial
from diagtools.model.site import Site

__all__ = ["FIX_SCHEMA", "Caller", "FileChange", "FixResult", "NameCheck", "PatchCheck"]

FIX_SCHEMA = "diagtools.fix/1"


@dataclass(frozen=True)
class FileChange(Serial):
    """One file the patch changes: ``path`` as the patch names it; the names it makes lazy; the
    ``(name, function)`` pairs whose import it moves into a function."""

    file: str
    path: str
    lazy: tuple[str, ...] = ()
    moved: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NameCheck(Serial):
    """Whether ``from module import name`` still resolves with the patch applied (``error`` when not)."""

    module: str
    name: str
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class PatchCheck(Serial):
    """The patch applied to a temporary copy: the rescan's outcome, and each re-exported name's check.

    ``reason`` says what went wrong when the rescan is not clean or a check
    could not run.
    """

    rescan: Outcome
    names: tuple[NameCheck, ...] = ()
    reason: str = ""
    copy: str = ""  # the temporary copy's import root (removed afterwards)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rescan", Outcome(self.rescan))

    @property
    def passed(self) -> bool:
        return self.rescan == Outcome.CLEAN and all(check.ok for check in self.names) and not self.reason


@dataclass(frozen=True)
class Caller(Serial):
    """A statement in the same source tree that imports cut names from the changed module: it keeps working
    with the lazy attributes, and would break if the re-export were deleted instead."""

    site: Site
    module: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class FixResult(Serial):
    """The fix for a scan's culprit, or why there is none (``reason``).

    ``patch`` is a unified diff relative to ``root`` (apply it there with
    ``git apply`` or ``patch -p1``); ``guard`` is the regression test, meant
    to be saved as ``guard_file``.
    """

    SCHEMA: ClassVar[str] = FIX_SCHEMA

    scan: ScanResult
    cut: Cut | None = None
    root: str = ""
    patch: str = ""
    changes: tuple[FileChange, ...] = ()
    check: PatchCheck | None = None
    callers: tuple[Caller, ...] = ()
    guard: str = ""
    guard_file: str = ""
    reason: str = ""

    @property
    def verified(self) -> bool:
        """A patch exists, and with it applied the target scans clean and every re-exported name resolves."""
        return bool(self.patch) and self.check is not None and self.check.passed

    def _json_extra(self) -> dict[str, Any]:
        return {"verified": self.verified, "line_to_change": self.cut.line if self.cut else None}

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view (saved beside the HTML): the report with relative paths."""
        printer.text(str(present("fix.shareable", self)))

    def _repr_html_(self) -> str:
        return str(present("fix.html", self))

    def __str__(self) -> str:
        return str(present("fix.text", self))
