"""What a fix changed in the import tree: two scans in, one verdict out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.cuts import Headline, Regression, headline, regression
from diagtools.model.scan import ScanResult
from diagtools.model.serial import Serial
from diagtools.model.verdict import Verdict

__all__ = ["DIFF_SCHEMA", "ScanDiff", "diff_scans"]

DIFF_SCHEMA = "diagtools.diff/1"


@dataclass(frozen=True)
class ScanDiff(Serial):
    """Modules and importer edges the fix removed or added, and where the culprit chain broke.

    ``broken_edge`` is the regression edge's ``(importer, imported)``: the
    first edge of the initializing side's culprit chain whose module the
    clean side does not import (:func:`diagtools.model.cuts.regression`);
    :attr:`regression` gives its import line, the headline line to change.

    The document holds both scans (``before``, ``after``) so it reads back
    whole, beside the derived keys it has always had (``verdict``,
    ``summary``, ``fixed``, ``before_culprit``, ``after_culprit``), which
    readers ignore and compute again.
    """

    SCHEMA: ClassVar[str] = DIFF_SCHEMA

    before: ScanResult
    after: ScanResult
    removed_modules: tuple[str, ...]
    added_modules: tuple[str, ...]
    removed_edges: tuple[tuple[str, str], ...]
    added_edges: tuple[tuple[str, str], ...]
    broken_edge: tuple[str, str] | None

    @property
    def fixed(self) -> bool:
        """The before scan initialized CUDA and the after scan is clean (both sides could see)."""
        return self.before.verdict == Verdict.INITIALIZES_CUDA and self.after.verdict == Verdict.CLEAN

    @property
    def verdict(self) -> Verdict:
        """The after scan's verdict; ``unknown`` when either side could not see."""
        if Verdict.UNKNOWN in (self.before.verdict, self.after.verdict):
            return Verdict.UNKNOWN
        return self.after.verdict

    @property
    def regression(self) -> Regression | None:
        """The line the clean side no longer runs at import, on the initializing side's chain (the fix's
        line for a fix, the regression's for a regression); ``None`` unless exactly one side is clean."""
        if self.before.cuda_initialized and not self.after.cuda_initialized:
            return regression(self.before, self.after, "the after scan")
        if self.after.cuda_initialized and not self.before.cuda_initialized:
            return regression(self.after, self.before, "the before scan")
        return None

    @property
    def headline(self) -> Headline:
        """The line to change by the one rule: the regression edge, known from the clean side."""
        found = self.regression
        if found is not None:
            return headline(None, found)
        return headline(self.after.cuts if self.after.cuda_initialized else self.before.cuts)

    def summary(self) -> str:
        """One sentence: what the fix changed."""
        unseen = [name for name, scan in (("before", self.before), ("after", self.after)) if scan.doubts()]
        if unseen and not (self.before.cuda_initialized or self.after.cuda_initialized):
            return f"cannot compare: the {' and '.join(unseen)} scan could not see everything"
        before, after = self.before.cuda_initialized, self.after.cuda_initialized
        if before and not after:
            return f"no longer initializes CUDA{self._where()}"
        if not before and after:
            culprit = self.after.culprit.module if self.after.culprit else "?"
            return f"now initializes CUDA (culprit {culprit}): a regression{self._where()}"
        if before and after:
            return "still initializes CUDA"
        if unseen:
            return f"initializes CUDA in neither, but the {' and '.join(unseen)} scan could not see everything"
        return "initializes CUDA in neither"

    def _where(self) -> str:
        found = self.regression
        if found is None:
            return ""
        line = f"{found.line.file.rsplit('/', 1)[-1]}:{found.line.line}"  # the headline gives the whole path
        if found.edge is not None:
            return f": the chain is broken at {found.edge.importer} -> {found.edge.imported} ({line})"
        return f": the culprit's own code at {line} no longer runs at import"

    def graph(self) -> Any:
        """The before graph with the removed modules and edges marked."""
        return present("diff.graph", self)

    def _repr_html_(self) -> str:
        return str(present("diff.html", self, graph=True))

    def __str__(self) -> str:
        return str(present("diff.text", self))

    def _json_extra(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary(),
            "fixed": self.fixed,
            "before_culprit": self.before.culprit,
            "after_culprit": self.after.culprit,
            "regression": self.regression,
            "headline": self.headline,
        }


def _edges(result: ScanResult) -> set[tuple[str, str]]:
    return {(node.parent, node.name) for node in result.modules if node.parent is not None}


def _broken_edge(before: ScanResult, after: ScanResult) -> tuple[str, str] | None:
    """The regression edge's two modules (a fix's when ``before`` initializes CUDA, a regression's otherwise)."""
    bad, good = (before, after) if before.cuda_initialized else (after, before)
    found = regression(bad, good)
    return (found.edge.importer, found.edge.imported) if found is not None and found.edge is not None else None


def _chain_first(names: set[str], before: ScanResult) -> tuple[str, ...]:
    """The culprit chain's modules first (in chain order), then the rest sorted."""
    chain = before.culprit.chain if before.culprit else ()
    return tuple(m for m in chain if m in names) + tuple(sorted(names - set(chain)))


def diff_scans(before: ScanResult, after: ScanResult) -> ScanDiff:
    """Compare two scans of the same target; every list comes out in a stable order."""
    before_names, after_names = set(before.module_names()), set(after.module_names())
    before_edges, after_edges = _edges(before), _edges(after)
    return ScanDiff(
        before=before,
        after=after,
        removed_modules=_chain_first(before_names - after_names, before),
        added_modules=tuple(sorted(after_names - before_names)),
        removed_edges=tuple(sorted(before_edges - after_edges)),
        added_edges=tuple(sorted(after_edges - before_edges)),
        broken_edge=_broken_edge(before, after),
    )
