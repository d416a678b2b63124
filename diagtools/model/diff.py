"""What a fix changed in the import tree: two scans in, one verdict out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.scan import ScanResult
from diagtools.model.serial import Serial
from diagtools.model.verdict import Verdict

__all__ = ["DIFF_SCHEMA", "ScanDiff", "diff_scans"]

DIFF_SCHEMA = "diagtools.diff/1"


@dataclass(frozen=True)
class ScanDiff(Serial):
    """Modules and importer edges the fix removed or added, and where the culprit chain broke.

    ``broken_edge`` is the first importer -> imported edge of the before
    culprit chain that the after scan no longer has: the line the fix cut.

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

    def summary(self) -> str:
        """One sentence: what the fix changed."""
        unseen = [name for name, scan in (("before", self.before), ("after", self.after)) if scan.doubts()]
        if unseen and not (self.before.cuda_initialized or self.after.cuda_initialized):
            return f"cannot compare: the {' and '.join(unseen)} scan could not see everything"
        before, after = self.before.cuda_initialized, self.after.cuda_initialized
        if before and not after:
            cut = f": the chain is broken at {self.broken_edge[0]} -> {self.broken_edge[1]}" if self.broken_edge else ""
            return f"no longer initializes CUDA{cut}"
        if not before and after:
            culprit = self.after.culprit.module if self.after.culprit else "?"
            return f"now initializes CUDA (culprit {culprit}): a regression"
        if before and after:
            return "still initializes CUDA"
        if unseen:
            return f"initializes CUDA in neither, but the {' and '.join(unseen)} scan could not see everything"
        return "initializes CUDA in neither"

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
        }


def _edges(result: ScanResult) -> set[tuple[str, str]]:
    return {(node.parent, node.name) for node in result.modules if node.parent is not None}


def _broken_edge(before: ScanResult, after_edges: set[tuple[str, str]]) -> tuple[str, str] | None:
    culprit = before.culprit
    if culprit is None:
        return None
    for edge in zip(culprit.chain, culprit.chain[1:], strict=False):
        if edge not in after_edges:
            return edge
    return None


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
        broken_edge=_broken_edge(before, after_edges),
    )
