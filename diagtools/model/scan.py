"""The scan's data model: frozen dataclasses, JSON in and out.

A :class:`ScanResult` is everything one subkernel run recorded: the import tree
(:class:`ImportNode`), who initialized CUDA (:class:`Culprit`, with its
:class:`Site`), and how the run ended.  JSON goes in and out through the one
derived mapping of :mod:`diagtools.model.serial`; the document schema is
``diagtools.scan/1``.  :class:`Culprit` is also what ``diagtools run``
reports for each process's first cuInit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.cuts import CutSearch, Headline, HeadlineRule, headline, unsearched
from diagtools.model.driver import DriverInfo
from diagtools.model.serial import Serial
from diagtools.model.site import Site
from diagtools.model.verdict import Evidence, ScanStatus, Verdict

__all__ = [
    "SCAN_SCHEMA",
    "AliveThread",
    "Culprit",
    "DriverInfo",
    "ImportNode",
    "ScanResult",
    "Site",
    "StartupInfo",
    "TargetError",
    "TargetFailure",
]

SCAN_SCHEMA = "diagtools.scan/1"


@dataclass(frozen=True)
class ImportNode(Serial):
    """A module the subkernel imported for the first time, with its importer and cost.

    ``parent`` is the module whose code was executing when this one was
    imported (``None``: imported by the scan request or by start-up itself).
    ``initializes_cuda`` is true only for the module whose own top-level code
    was running when the driver went from uninitialized to initialized.
    """

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"parent": None, "file": None, "self_s": 0.0, "cumulative_s": 0.0}

    name: str
    parent: str | None
    file: str | None
    self_s: float
    cumulative_s: float
    initializes_cuda: bool = False
    threads_started: int = 0
    phase: str = "import"
    complete: bool = True


@dataclass(frozen=True)
class Culprit(Serial):
    """Who initialized the CUDA driver, and from where.

    ``module`` is the innermost module whose top-level code was executing (for
    a thread, the module whose import started it; at shutdown, the module
    that defined the code running); ``chain`` runs from the scanned target
    down to ``module``; ``module_site`` is the innermost frame in
    ``module``'s own source ("CUDA initialized at"); ``site`` is the innermost Python frame
    that made the call (``via``: often inside a library); ``stack`` is the
    whole Python stack, outermost first.  For a thread, ``thread`` is its
    name, ``thread_started_at`` the line that started it and ``thread_started_by``
    the module whose code started it (``start-up`` outside any import).  ``evidence`` says
    how the moment was caught (:class:`~diagtools.model.verdict.Evidence`).
    ``stack_dropped`` counts the outermost frames left out of a very deep stack.
    ``context`` says what the watcher knew was going on (``diagtools run`` and
    ``pytest --cuda-watch``: a pytest node id, ``pytest start-up: conftest.py``).

    ``chain_imports`` runs beside ``chain``: item ``i`` is the statement that
    imported ``chain[i]`` (``None`` where unknown, as for the scanned target
    itself).  ``first_party`` is the last frame on the chain in the user's
    own packages (the scanned target's top-level package, or ``--own``
    patterns; for ``diagtools run``, code outside installed packages and the
    standard library): the line a user can edit, when the initializer itself
    (``initialized_in``) lies in a third-party package.

    The scan and ``diagtools run`` both build it with
    :func:`diagtools.usecases.attribution.attribute`: one rule, one type.
    """

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {
        "module": None,
        "chain": (),
        "site": None,
        "stack": (),
        "phase": "import",
    }

    module: str | None
    chain: tuple[str, ...]
    site: Site | None
    stack: tuple[Site, ...]
    phase: str
    thread: str = "MainThread"
    evidence: Evidence = Evidence.DRIVER_HOOK
    module_site: Site | None = None
    thread_started_at: Site | None = None
    thread_started_by: str | None = None
    stack_dropped: int = 0
    context: str | None = None
    chain_imports: tuple[Site | None, ...] = ()
    first_party: Site | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", Evidence(self.evidence))

    @classmethod
    def _json_upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and str(data.get("evidence", "")).startswith("driver-hook, inferred"):
            data = {**data, "evidence": Evidence.INFERRED.value}  # written as a sentence before it was a word
        return data

    @property
    def thread_described(self) -> str:
        """The thread in words for a report: its name, and who started it when not the main thread."""
        name = self.thread or "an unnamed thread"
        return f"{name} (started by {self.thread_started_by})" if self.thread_started_by else name

    @property
    def initialized_at(self) -> Site | None:
        """The culprit module's own line that led into the driver ("CUDA initialized at"), else the call."""
        return self.module_site or self.site

    @property
    def initialized_in(self) -> Site | None:
        """The library line that made the call ("initialized in"), when it is not :attr:`initialized_at`."""
        at = self.initialized_at
        return self.site if self.site is not None and self.site != at else None

    @property
    def own_line(self) -> Site | None:
        """The last line on the chain in the user's own code, else :attr:`initialized_at`: where the user's code
        reaches the initializer (a sweep's root cause is named by it).  Not the line to change: that is a
        verified cut's, or a regression edge's (:mod:`diagtools.model.cuts`)."""
        return self.first_party or self.initialized_at

    def with_sites(self, move: Callable[[Site], Site]) -> Culprit:
        """This culprit with ``move`` applied to every site it holds (relative paths, a rewrite's lines)."""

        def maybe(site: Site | None) -> Site | None:
            return None if site is None else move(site)

        return replace(
            self,
            site=maybe(self.site),
            module_site=maybe(self.module_site),
            first_party=maybe(self.first_party),
            thread_started_at=maybe(self.thread_started_at),
            stack=tuple(map(move, self.stack)),
            chain_imports=tuple(map(maybe, self.chain_imports)),
        )

    def import_edges(self) -> tuple[tuple[str, str, Site | None], ...]:
        """``(importer, imported, import line)`` for each edge of the chain, outermost first."""
        lines = self.chain_imports + (None,) * (len(self.chain) - len(self.chain_imports))
        return tuple((self.chain[i - 1], self.chain[i], lines[i]) for i in range(1, len(self.chain)))

    def _json_extra(self) -> dict[str, Any]:
        return {"own_line": self.own_line, "initialized_at": self.initialized_at, "initialized_in": self.initialized_in}


@dataclass(frozen=True)
class AliveThread(Serial):
    """A thread the target started that was still running when the scan stopped watching."""

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"name": "", "starter": None, "started_at": None}

    name: str
    starter: str | None
    started_at: Site | None


@dataclass(frozen=True)
class StartupInfo(Serial):
    """What interpreter start-up (``site``, ``.pth`` files, sitecustomize) did."""

    cuda_initialized: bool = False
    modules: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class TargetFailure(Serial):
    """Why a target did not import cleanly: the exception, exit code, signal or hang (data, never raised)."""

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"message": ""}

    kind: str  # how the target's run ended, in the words of ScanStatus: import-error, crashed, timeout, ...
    message: str
    traceback: str = ""
    file: str | None = None
    line: int | None = None
    exitcode: int | None = None
    signal: int | None = None
    where: str = ""


TargetError = TargetFailure  # its first name, kept for code written against it: it is data, not an exception


@dataclass(frozen=True)
class ScanResult(Serial):
    """Everything one scan recorded, whatever way the subkernel ended."""

    SCHEMA: ClassVar[str] = SCAN_SCHEMA
    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"targets": ()}

    targets: tuple[str, ...]
    status: ScanStatus
    driver: DriverInfo
    cuda_initialized: bool
    modules: tuple[ImportNode, ...] = ()
    culprits: tuple[Culprit, ...] = ()
    startup: StartupInfo = field(default_factory=StartupInfo)
    error: TargetFailure | None = None
    torch_cuda_initialized: bool | None = None
    exitcode: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    python: str = ""
    started_at: str = ""
    threads_alive: tuple[AliveThread, ...] = ()
    simulation_gaps: tuple[str, ...] = ()
    skipped_events: int = 0
    own: tuple[str, ...] = ()
    cuts: CutSearch | None = None
    blind_spots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ScanStatus(self.status))  # accepts the JSON spelling too

    @property
    def headline(self) -> Headline:
        """The line to change by the one rule (:func:`diagtools.model.cuts.headline`): the nearest verified cut."""
        if not self.cuda_initialized:
            return Headline(HeadlineRule.NONE, reason="nothing to change: CUDA was not seen initialized")
        return headline(self.cuts) if self.cuts is not None else unsearched(self.targets)

    @property
    def line_to_change(self) -> Site | None:
        """The first edge of the nearest verified cut; ``None`` when no cut was searched or none verified."""
        return self.headline.line

    def with_cuts(self, cuts: CutSearch | None) -> ScanResult:
        return replace(self, cuts=cuts)

    @property
    def ok(self) -> bool:
        """True when every target imported and the subkernel finished normally."""
        return self.status == ScanStatus.OK

    @property
    def verdict(self) -> Verdict:
        """``initializes-cuda`` when the driver was seen initialized; ``clean`` only when the run could see."""
        if self.cuda_initialized:
            return Verdict.INITIALIZES_CUDA
        return Verdict.UNKNOWN if self.doubts() else Verdict.CLEAN

    def doubts(self) -> tuple[str, ...]:
        """Why a run that saw no initialization cannot be called clean (empty: it can)."""
        reasons = []
        if self.status != ScanStatus.OK:
            reasons.append(self.error.message if self.error else f"the run ended as {self.status}")
        if self.driver.blind:
            reasons.append(self.driver.blind)
        reasons += [f"a library failed under the simulated driver: {gap}" for gap in self.simulation_gaps]
        reasons += list(self.blind_spots)
        return tuple(reasons)

    @property
    def culprit(self) -> Culprit | None:
        """The first culprit, or ``None`` when CUDA was never initialized."""
        return self.culprits[0] if self.culprits else None

    def module(self, name: str) -> ImportNode:
        """The node for ``name``; raises ``KeyError`` when it was not imported."""
        for node in self.modules:
            if node.name == name:
                return node
        raise KeyError(name)

    def module_names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.modules)

    def with_culprits(self, culprits: tuple[Culprit, ...]) -> ScanResult:
        return replace(self, culprits=culprits)

    def _json_extra(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "doubts": self.doubts(), "headline": self.headline}

    def graph(self, view: str = "culprits", *, max_children: int = 12) -> Any:
        """The import tree as a ``graphviz.Digraph`` (needs the ``notebook`` extra)."""
        return present("scan.graph", self, view=view, max_children=max_children)

    def to_dot(self, view: str = "culprits") -> str:
        """The graph's DOT source: sorted, so it is stable across runs."""
        return str(self.graph(view).source)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view (saved beside the HTML): the report with relative paths, not the fields."""
        printer.text(str(present("scan.shareable", self)))

    def _repr_html_(self) -> str:
        return str(present("scan.html", self, graph=True))

    def __str__(self) -> str:
        return str(present("scan.text", self))
