"""Bisect results: the commits git bisect asked about and the first bad one.

Schema ``diagtools.bisect/1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diagtools.model._display import present
from diagtools.model.cuts import Headline, Regression, headline
from diagtools.model.scan import Culprit
from diagtools.model.serial import Serial

__all__ = ["BISECT_SCHEMA", "BisectResult", "BisectStep"]

BISECT_SCHEMA = "diagtools.bisect/1"


@dataclass(frozen=True)
class BisectStep(Serial):
    """One commit git bisect asked about, and the verdict."""

    commit: str
    verdict: str  # good, bad or skip: what the step told git bisect
    status: str
    error: str = ""  # why a skipped commit could not be judged


@dataclass(frozen=True)
class BisectResult(Serial):
    """The first bad commit (or the candidates when skips hide it) and its culprit.

    ``regression`` is the first import on the culprit chain that the first bad
    commit's parent (``parent``, the known-good state) does not run at
    import: the headline line to change, with paths relative to the repository.
    """

    SCHEMA: ClassVar[str] = BISECT_SCHEMA

    target: str
    good: str
    bad: str
    first_bad: str | None
    subject: str
    files: tuple[str, ...]
    culprit: Culprit | None
    steps: tuple[BisectStep, ...]
    candidates: tuple[str, ...] = ()
    parent: str | None = None
    regression: Regression | None = None

    @property
    def headline(self) -> Headline:
        """The line to change by the one rule: the regression edge against the first bad commit's parent."""
        return headline(None, self.regression)

    def __str__(self) -> str:
        return str(present("bisect.text", self))
