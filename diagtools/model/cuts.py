"""Where to change: cuts through a culprit's import chain, and the one rule that picks the line to change.

An *edge* is one import statement on the culprit chain: the line of the
importer's module body that imported the next module.  A *cut* is a set of
edges that, once they no longer run at import time, leaves the target clean.
Every cut here was verified by running the target's real code in a fresh
subkernel with just those statements deferred (:mod:`diagtools.usecases.cuts`);
each try is kept with its outcome.

The headline "line to change" follows one rule, :func:`headline`:

1. with a known-good state at hand (a diff of two scans, a sweep's baseline,
   a bisect's first bad commit): the *regression edge*, the first import on
   the bad chain whose module the good state does not import at all; when the
   good state imports every module of the chain and stays clean, the
   culprit's own line, which it no longer runs at import;
2. otherwise, the first edge of the nearest verified cut (the deepest
   first-party cut is shown beside it);
3. otherwise no line, and the reason (no cut was searched, every try broke
   the import...): never a guess.

The line that called into the driver stays visible as "CUDA initialized at"
(:attr:`~diagtools.model.scan.Culprit.initialized_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagtools.model.serial import Serial
from diagtools.model.site import Site, is_own, own_patterns
from diagtools.model.verdict import Label

if TYPE_CHECKING:
    from diagtools.model.scan import ScanResult

__all__ = [
    "Cut",
    "CutKind",
    "CutSearch",
    "CutTry",
    "Edge",
    "Headline",
    "HeadlineRule",
    "Outcome",
    "Regression",
    "chain_edges",
    "headline",
    "regression",
    "unsearched",
]


class Outcome(Label):
    """What one try of a cut found when the target ran with those statements deferred."""

    CLEAN = "clean"  # the target imported and left CUDA uninitialized
    STILL_INITIALIZES = "still-initializes"  # CUDA was initialized through another chain (``chain``)
    BREAKS = "breaks"  # the import failed (``reason``, at ``at``)
    CANNOT_DEFER = "cannot-defer"  # not run: a statement cannot wait (``reason``, at ``at``)
    UNKNOWN = "unknown"  # the try could not see (a crash, a timeout, no driver)


class CutKind(Label):
    """Which of the two answers a cut is."""

    NEAREST = "nearest"  # the change closest to the target: what both seed fixes did
    DEEPEST = "deepest"  # the change closest to the initializer: the fix for everyone importing that module


class HeadlineRule(Label):
    """Which step of :func:`headline` chose the line to change."""

    REGRESSION = "regression-edge"
    NEAREST_CUT = "nearest-cut"
    NONE = "none"


@dataclass(frozen=True)
class Edge(Serial):
    """One import statement on a culprit chain: ``importer``'s line ``site`` imported ``imported``.

    ``first_party``: the statement is in the user's own code (``--own``, by
    default the target's top-level package), the only code a cut changes.
    """

    importer: str
    imported: str
    site: Site
    first_party: bool = True

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} at {self.site.file}:{self.site.line}"


@dataclass(frozen=True)
class CutTry(Serial):
    """One verification run: the target with ``edges`` deferred, and what happened.

    ``chain`` is the new culprit chain (``still-initializes``); ``at`` the line
    it initialized CUDA at, the error's line (``breaks``) or the refused
    statement's line (``cannot-defer``); ``reason`` the error or the refusal.
    """

    edges: tuple[Edge, ...]
    outcome: Outcome
    reason: str = ""
    chain: tuple[str, ...] = ()
    at: Site | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))


@dataclass(frozen=True)
class Cut(Serial):
    """A minimal set of edges whose deferral left the target clean in a verification run.

    ``reach``, when a sweep was at hand: how many swept modules that
    initialize CUDA have one of these edges on their culprit chain.
    """

    kind: CutKind
    edges: tuple[Edge, ...]
    verified: Outcome = Outcome.CLEAN
    reach: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CutKind(self.kind))
        object.__setattr__(self, "verified", Outcome(self.verified))

    @property
    def line(self) -> Site:
        """The first edge's statement: the headline line of a nearest cut."""
        return self.edges[0].site


@dataclass(frozen=True)
class CutSearch(Serial):
    """The cuts found for one scan's culprit, every try made, and why there is none when there is none."""

    nearest: Cut | None = None
    deepest: Cut | None = None
    tries: tuple[CutTry, ...] = ()
    reason: str = ""
    seconds: float = 0.0

    @property
    def cuts(self) -> tuple[Cut, ...]:
        return tuple(cut for cut in (self.nearest, self.deepest) if cut is not None)

    @property
    def same(self) -> bool:
        """The nearest cut is the deepest one too."""
        return self.nearest is not None and self.deepest is not None and self.nearest.edges == self.deepest.edges


@dataclass(frozen=True)
class Regression(Serial):
    """What a known-good state points at: the first import on the bad chain it does not run.

    ``edge`` is ``None`` when the good state imports every module of the chain
    and stays clean: then ``line`` is the culprit's own line, which the good
    state no longer runs at import.  ``good`` names the good state.
    """

    line: Site
    edge: Edge | None = None
    good: str = ""


@dataclass(frozen=True)
class Headline(Serial):
    """The line to change, the rule that chose it, the deepest cut beside it, or why there is none."""

    rule: HeadlineRule
    line: Site | None = None
    edge: Edge | None = None
    deepest: Edge | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", HeadlineRule(self.rule))


NOT_SEARCHED = "no cut was searched (diagtools fix TARGET verifies one)"


def unsearched(chain: tuple[str, ...]) -> Headline:
    """The headline of a culprit no cut was searched for (``diagtools run``'s): no line, and the command that
    verifies one for the first importable module of its chain."""
    module = next((name for name in chain if not name.startswith("__")), None)
    reason = f"no cut was searched: diagtools fix {module} verifies one" if module else NOT_SEARCHED
    return Headline(HeadlineRule.NONE, reason=reason)


def headline(cuts: CutSearch | None, found: Regression | None = None) -> Headline:
    """The one rule: a known-good state's regression edge, else the nearest verified cut, else none."""
    if found is not None:
        return Headline(HeadlineRule.REGRESSION, found.line, found.edge)
    if cuts is not None and cuts.nearest is not None:
        deepest = cuts.deepest.edges[-1] if cuts.deepest is not None and not cuts.same else None
        return Headline(HeadlineRule.NEAREST_CUT, cuts.nearest.line, cuts.nearest.edges[0], deepest)
    return Headline(HeadlineRule.NONE, reason=cuts.reason if cuts is not None else NOT_SEARCHED)


def chain_edges(result: ScanResult) -> tuple[Edge, ...]:
    """The import statements of the first culprit's chain, outermost first.

    Each edge's line is the importer's own module-body frame on the culprit's
    stack (the statement its body was running), else the recorded import line.
    Only a culprit caught during the import phase has edges.
    """
    culprit = result.culprit
    if culprit is None or culprit.phase != "import":
        return ()
    files = {node.name: node.file for node in result.modules}
    bodies = {site.file: site for site in culprit.stack if site.function == "<module>"}
    own = own_patterns(result.targets, result.own)
    edges = []
    for importer, imported, line in culprit.import_edges():
        file = files.get(importer)
        site = bodies.get(file) if file is not None else None
        site = site or line
        if site is None:
            continue
        first_party = is_own(importer, own) and site.file == file
        edges.append(Edge(importer, imported, site, first_party))
    return tuple(edges)


def regression(bad: ScanResult, good: ScanResult, label: str = "") -> Regression | None:
    """The regression edge of ``bad`` against the known-good ``good`` (both scans of the same target).

    ``None`` unless ``bad`` initializes CUDA and ``good`` was seen clean.
    """
    from diagtools.model.verdict import Verdict

    culprit = bad.culprit
    if culprit is None or not bad.cuda_initialized or good.verdict != Verdict.CLEAN:
        return None
    imported = set(good.module_names())
    for edge in chain_edges(bad):
        if edge.imported not in imported:
            return Regression(edge.site, edge, label)
    own_line = culprit.initialized_at
    if culprit.module in imported and own_line is not None:
        return Regression(own_line, None, label)
    return None


def edge_keys(edges: Any) -> frozenset[tuple[str, str]]:
    """``(importer, imported)`` of each edge: how a sweep row's chain is matched against a cut."""
    return frozenset((edge.importer, edge.imported) for edge in edges)
