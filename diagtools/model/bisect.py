"""Bisect results: the commits git bisect asked about and the first bad one.

Schema ``diagtools.bisect/1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagtools.model.scan import Culprit

__all__ = ["BISECT_SCHEMA", "BisectResult", "BisectStep"]

BISECT_SCHEMA = "diagtools.bisect/1"


@dataclass(frozen=True)
class BisectStep:
    """One commit git bisect asked about, and the verdict."""

    commit: str
    verdict: str
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "verdict": self.verdict, "status": self.status}


@dataclass(frozen=True)
class BisectResult:
    """The first bad commit (or the candidates when skips hide it) and its culprit."""

    target: str
    good: str
    bad: str
    first_bad: str | None
    subject: str
    files: tuple[str, ...]
    culprit: Culprit | None
    steps: tuple[BisectStep, ...]
    candidates: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": BISECT_SCHEMA,
            "target": self.target,
            "good": self.good,
            "bad": self.bad,
            "first_bad": self.first_bad,
            "subject": self.subject,
            "files": list(self.files),
            "culprit": self.culprit.to_json() if self.culprit else None,
            "steps": [step.to_json() for step in self.steps],
            "candidates": list(self.candidates),
        }
