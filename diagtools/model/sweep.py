"""Sweep results: one row per module scanned alone, and the whole table.

Schema ``diagtools.sweep/1`` (a JSON Lines journal: a header, then rows).
A row says whether the module initializes CUDA itself or inherits it from a
parent package's import (``cuda_source``), and whether it was scanned in a
fresh subkernel or in a child of the preloading zygote (``mode``), or was
itself preloaded there (``preloaded``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.cuts import CutSearch, Headline, headline
from diagtools.model.scan import Culprit, DriverInfo, ScanResult, Site
from diagtools.model.serial import Serial
from diagtools.model.verdict import ScanStatus, Verdict, combine

__all__ = [
    "CUDA_SOURCES",
    "SCANNING_STAGE",
    "SWEEP_SCHEMA",
    "RootCause",
    "SweepResult",
    "SweepRow",
    "cause_key",
    "cuda_source",
    "rate_holds",
]

SWEEP_SCHEMA = "diagtools.sweep/1"
CUDA_SOURCES = ("none", "self", "parent", "startup", "unknown")
SWEEP_MODES = ("fresh", "zygote")
SCANNING_STAGE = "scanning"  # the stage of an adaptive sweep that scans the rows left, with the preload settled


def rate_holds(stage: str) -> bool:
    """Whether the rows of ``stage`` come at the rate the rows after them will, so a time left measured on
    them holds: those of a sweep without stages (``""``) and of its scanning stage do; a learning or
    checking stage's rows do not (each sampled child imports the heavy modules itself, and a candidate's
    rows are scanned from the state before it), so their rate says nothing of the rest.
    """
    return stage == "" or stage.startswith(SCANNING_STAGE)


def _is_parent_package(name: str, module: str) -> bool:
    return module.startswith(name + ".")


def cuda_source(module: str, result: ScanResult) -> str:
    """Who initialized CUDA when ``module`` was imported alone: one of :data:`CUDA_SOURCES`.

    ``parent``: the culprit chain starts at one of the module's parent
    packages (imported first, as ``import a.b.c`` imports ``a`` and ``a.b``)
    and never passes through the module itself; ``self``: the module's own
    import led to it.
    """
    if not result.cuda_initialized:
        return "none"
    culprit = result.culprit
    if culprit is None:
        return "unknown"
    if culprit.phase == "startup":
        return "startup"
    chain = culprit.chain or ((culprit.module,) if culprit.module else ())
    if module in chain or not chain:
        return "self"
    return "parent" if _is_parent_package(chain[0], module) else "self"


@dataclass(frozen=True)
class SweepRow(Serial):
    """One module's verdict: did importing it alone initialize CUDA, and who did.

    A journal line is this row's ``to_json``.  Rows written by older versions
    may lack ``culprit``, ``import_s``, ``verdict``, ``cuda_source``, ``mode``
    or ``deps``: they read with today's defaults, the verdict judged again
    from the row and ``cuda_source`` taken as ``self`` when CUDA was initialized.
    ``import_s`` is kept to the microsecond, as the journal has always written it.
    """

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"culprit": None, "import_s": 0.0}
    _READ_AS: ClassVar[str] = SWEEP_SCHEMA  # a journal line: its errors are the sweep document's

    module: str
    status: ScanStatus
    cuda_initialized: bool
    culprit: Culprit | None
    import_s: float
    error: str = ""
    started: float = 0.0
    finished: float = 0.0
    verdict: Verdict | None = None  # not given: derived in __post_init__, never None after it
    cuda_source: str = field(default="none", metadata={"choices": CUDA_SOURCES})
    mode: str = field(default="fresh", metadata={"choices": SWEEP_MODES})
    preloaded: bool = False
    fingerprint: str = ""
    deps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ScanStatus(self.status))  # accepts the JSON spelling too
        object.__setattr__(self, "import_s", round(self.import_s, 6))
        if self.verdict is not None:
            object.__setattr__(self, "verdict", Verdict(self.verdict))
        elif self.cuda_initialized:  # a row not built from a scan is judged by what it says
            object.__setattr__(self, "verdict", Verdict.INITIALIZES_CUDA)
        else:
            object.__setattr__(self, "verdict", Verdict.CLEAN if self.status == "ok" else Verdict.UNKNOWN)

    @property
    def judged(self) -> Verdict:
        """The row's verdict: as given, or as derived when the row was made (never ``None`` then)."""
        assert self.verdict is not None
        return self.verdict

    @classmethod
    def _json_upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and "cuda_source" not in data and data.get("cuda_initialized") is True:
            data = {**data, "cuda_source": "self"}  # written before the source was recorded
        return data

    @classmethod
    def from_scan(
        cls, module: str, result: ScanResult, started: float, finished: float, mode: str = "fresh"
    ) -> SweepRow:
        node = next((n for n in result.modules if n.name == module), None)
        return cls(
            module=module,
            status=result.status,
            cuda_initialized=result.cuda_initialized,
            culprit=result.culprit,
            import_s=node.cumulative_s if node else 0.0,
            error=result.error.message if result.error else "",
            started=started,
            finished=finished,
            verdict=result.verdict,
            cuda_source=cuda_source(module, result),
            mode=mode,
        )

    @classmethod
    def preloaded_in_zygote(cls, module: str, import_s: float, at: float) -> SweepRow:
        """A module the zygote imported before forking, with CUDA still uninitialized afterwards."""
        return cls(
            module,
            ScanStatus.OK,
            False,
            None,
            import_s,
            started=at,
            finished=at,
            verdict=Verdict.CLEAN,
            mode="zygote",
            preloaded=True,
        )

    @property
    def inherited_from(self) -> str | None:
        """The parent package whose import initialized CUDA, for ``cuda_source == "parent"``."""
        if self.cuda_source != "parent" or self.culprit is None or not self.culprit.chain:
            return None
        return self.culprit.chain[0]


UNKNOWN_CAUSE = "(no culprit was recorded)"


def _module_of(culprit: Culprit, site: Site) -> str:
    """The chain module whose source holds ``site``: the culprit's own file, else an importer's."""
    if culprit.module_site is not None and site.file == culprit.module_site.file and culprit.module:
        return culprit.module
    for importer, _, line in culprit.import_edges():
        if line is not None and line.file == site.file:
            return importer
    return site.file.rsplit("/", 1)[-1]


def cause_key(culprit: Culprit | None) -> str:
    """A root cause's identity, the same on any machine and after unrelated edits move lines.

    ``first-party module: `source line` <- initializing module``: the module and
    text of the line where the user's code reaches the initializer (its number
    when the source is unavailable) and the module whose code initialized CUDA.
    """
    if culprit is None:
        return UNKNOWN_CAUSE
    change, module = culprit.own_line, culprit.module or "?"
    if change is None:
        return f"{module} ({culprit.phase})"
    text = change.source.strip() or f"line {change.line}"
    return f"{_module_of(culprit, change)}: `{text}` <- {module}"


@dataclass(frozen=True)
class RootCause(Serial):
    """One reason modules initialize CUDA, listed once however many modules reach it.

    ``modules`` are every swept module whose import reaches it;
    ``through_parent`` those among them that reach it only because a parent
    package's import does (``cuda_source == "parent"``).  ``own_line`` is
    where the user's code reaches the initializer, ``initialized_at`` the
    line that led into the driver.  ``cuts`` (``sweep --cuts``) is the cut
    search made on ``representative``, one of the modules, whose nearest cut
    is the cause's line to change.
    """

    key: str
    culprit: str | None
    own_line: Site | None
    initialized_at: Site | None
    modules: tuple[str, ...]
    through_parent: tuple[str, ...] = ()
    representative: str | None = None
    cuts: CutSearch | None = None

    @classmethod
    def group(cls, rows: Iterable[SweepRow], cuts: Mapping[str, CutSearch] | None = None) -> tuple[RootCause, ...]:
        """The causes behind ``rows`` that initialize CUDA, most modules first, then by key.

        ``cuts`` maps a cause's key to the cut search made for it, when one was."""
        found: dict[str, list[SweepRow]] = {}
        for row in rows:
            if row.cuda_initialized:
                found.setdefault(cause_key(row.culprit), []).append(row)
        causes = [cls._of(key, members, (cuts or {}).get(key)) for key, members in found.items()]
        return tuple(sorted(causes, key=lambda cause: (-len(cause.modules), cause.key)))

    @classmethod
    def _of(cls, key: str, rows: list[SweepRow], cuts: CutSearch | None) -> RootCause:
        own = [row for row in rows if row.cuda_source != "parent" and row.culprit]
        chosen = min(own or rows, key=lambda row: (len(row.culprit.chain) if row.culprit else 0, row.module))
        culprit = chosen.culprit
        return cls(
            key=key,
            culprit=culprit.module if culprit else None,
            own_line=culprit.own_line if culprit else None,
            initialized_at=culprit.initialized_at if culprit else None,
            modules=tuple(sorted(row.module for row in rows)),
            through_parent=tuple(sorted(row.module for row in rows if row.cuda_source == "parent")),
            representative=chosen.module,
            cuts=cuts,
        )

    @property
    def headline(self) -> Headline:
        """The cause's line to change by the one rule: its nearest verified cut, when one was searched."""
        return headline(self.cuts)

    def _json_extra(self) -> dict[str, Any]:
        return {"count": len(self.modules)}


@dataclass(frozen=True)
class SweepResult(Serial):
    """All rows of a sweep, sorted by module, and how many came from an earlier run.

    ``mode`` is ``zygote`` when a preloading worker forked the children (with
    ``preload`` the modules it imported once) and ``fresh`` when every module
    got a fresh subkernel; ``fallback`` says why the zygote was not (or not
    fully) used, and is empty when nothing went wrong.

    The summary (``--summary``) is this result's ``to_json``: the fields, then
    the derived ``verdict`` and ``causes`` (ignored on reading, computed again);
    ``seconds`` is kept to the millisecond, as the summary has always written it.
    """

    SCHEMA: ClassVar[str] = SWEEP_SCHEMA

    package: str
    rows: tuple[SweepRow, ...]
    resumed: int = 0
    seconds: float = 0.0
    mode: str = field(default="fresh", metadata={"choices": SWEEP_MODES})
    preload: tuple[str, ...] = ()
    fallback: str = ""
    interrupted: int = 0  # modules left unscanned by an interrupt (0: the sweep finished)
    preload_notes: tuple[str, ...] = ()
    cuts: dict[str, CutSearch] = field(default_factory=dict)  # cause key -> its cut search (sweep --cuts)
    driver: DriverInfo | None = None  # the driver the subkernels saw (None: a summary written before it was kept)
    rescanned: dict[str, str] = field(default_factory=dict)  # module -> why its journal row was not reused

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", round(self.seconds, 3))

    @property
    def causes(self) -> tuple[RootCause, ...]:
        """The root causes, each once: its initializer, where the user's code reaches it, the modules that
        reach it, and its verified cut when one was searched."""
        return RootCause.group(self.rows, self.cuts)

    def new_causes(self, known: Iterable[str]) -> tuple[RootCause, ...]:
        """The causes whose key is not among ``known`` (a baseline's keys)."""
        seen = set(known)
        return tuple(cause for cause in self.causes if cause.key not in seen)

    @property
    def verdict(self) -> Verdict:
        """``initializes-cuda`` if any module does; ``clean`` only when every module was seen clean."""
        return combine(row.judged for row in self.rows)

    @property
    def culprits(self) -> tuple[SweepRow, ...]:
        return tuple(row for row in self.rows if row.cuda_initialized)

    @property
    def failures(self) -> tuple[SweepRow, ...]:
        return tuple(row for row in self.rows if row.status != "ok")

    def row(self, module: str) -> SweepRow:
        for row in self.rows:
            if row.module == module:
                return row
        raise KeyError(module)

    def __str__(self) -> str:
        return str(present("sweep.text", self))

    def _repr_html_(self) -> str:
        return str(present("sweep.html", self))

    def _json_extra(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "causes": self.causes}
