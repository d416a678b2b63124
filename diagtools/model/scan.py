"""The scan's data model: frozen dataclasses, JSON in and out.

A :class:`ScanResult` is everything one subkernel run recorded: the import tree
(:class:`ImportNode`), who initialized CUDA (:class:`Culprit`, with its
:class:`Site`), and how the run ended.  Each type owns one ``to_json`` /
``from_json`` pair; the document schema is ``diagtools.scan/1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from diagtools.model._display import present
from diagtools.model.common import check_fields, check_schema
from diagtools.model.verdict import ScanStatus, Verdict

__all__ = [
    "SCAN_SCHEMA",
    "AliveThread",
    "Culprit",
    "DriverInfo",
    "ImportNode",
    "RunError",
    "ScanResult",
    "Site",
    "StartupInfo",
]

SCAN_SCHEMA = "diagtools.scan/1"

# what from_json requires of a document, field by field ("?": may be absent)
_OPT_STR = (str, None)
_OPT_INT = (int, None)
_SITE = {"file": str, "line": int, "function": str, "source?": str}
_DOCUMENT = {
    "targets?": [str],
    "status": str,
    "driver": {"kind": frozenset({"real", "simulated", "none"}), "requested?": str, "library?": _OPT_STR},
    "cuda_initialized": bool,
    "torch_cuda_initialized?": (bool, None),
    "startup?": {"cuda_initialized?": bool, "modules?": int, "seconds?": float},
    "modules?": [
        {
            "name": str,
            "parent?": _OPT_STR,
            "file?": _OPT_STR,
            "self_s?": float,
            "cumulative_s?": float,
            "initializes_cuda?": bool,
            "threads_started?": int,
            "phase?": str,
            "complete?": bool,
        }
    ],
    "culprits?": [
        {
            "module?": _OPT_STR,
            "chain?": [str],
            "site?": (_SITE, None),
            "stack?": [_SITE],
            "phase?": str,
            "thread?": str,
            "evidence?": str,
            "stack_dropped?": int,
        }
    ],
    "error?": (
        {
            "kind": str,
            "message?": str,
            "traceback?": str,
            "file?": _OPT_STR,
            "line?": _OPT_INT,
            "exitcode?": _OPT_INT,
            "signal?": _OPT_INT,
            "where?": str,
        },
        None,
    ),
    "exitcode?": _OPT_INT,
    "stdout?": str,
    "stderr?": str,
    "duration_s?": float,
    "python?": str,
    "started_at?": str,
    "skipped_events?": int,
}


@dataclass(frozen=True)
class Site:
    """One Python source location: a stack frame or the line that made a call."""

    file: str
    line: int
    function: str
    source: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Site:
        return cls(data["file"], int(data["line"]), data["function"], data.get("source", ""))

    @classmethod
    def optional(cls, data: dict[str, Any] | None) -> Site | None:
        return cls.from_json(data) if data else None


@dataclass(frozen=True)
class ImportNode:
    """A module the subkernel imported for the first time, with its importer and cost.

    ``parent`` is the module whose code was executing when this one was
    imported (``None``: imported by the scan request or by start-up itself).
    ``initializes_cuda`` is true only for the module whose own top-level code
    was running when the driver went from uninitialized to initialized.
    """

    name: str
    parent: str | None
    file: str | None
    self_s: float
    cumulative_s: float
    initializes_cuda: bool = False
    threads_started: int = 0
    phase: str = "import"
    complete: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "parent": self.parent,
            "file": self.file,
            "self_s": round(self.self_s, 6),
            "cumulative_s": round(self.cumulative_s, 6),
            "initializes_cuda": self.initializes_cuda,
            "threads_started": self.threads_started,
            "phase": self.phase,
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImportNode:
        return cls(
            name=data["name"],
            parent=data.get("parent"),
            file=data.get("file"),
            self_s=float(data.get("self_s", 0.0)),
            cumulative_s=float(data.get("cumulative_s", 0.0)),
            initializes_cuda=bool(data.get("initializes_cuda", False)),
            threads_started=int(data.get("threads_started", 0)),
            phase=data.get("phase", "import"),
            complete=bool(data.get("complete", True)),
        )


@dataclass(frozen=True)
class Culprit:
    """Who initialized the CUDA driver, and from where.

    ``module`` is the innermost module whose top-level code was executing (for
    a thread, the module whose import started it; at shutdown, the module
    that defined the code running); ``chain`` runs from the scanned target
    down to ``module``; ``module_site`` is the line to change: the innermost
    frame in ``module``'s own source; ``site`` is the innermost Python frame
    that made the call (``via``: often inside a library); ``stack`` is the
    whole Python stack, outermost first.  For a thread, ``thread`` is its
    name and ``thread_started_at`` the line that started it.  ``evidence`` says
    how the moment was caught: ``driver-hook`` (the driver called back during
    cuInit), ``trace`` (a line-traced rerun) or ``state-probe`` (the driver's
    state changed between two observations).
    ``stack_dropped`` counts the outermost frames left out of a very deep stack.
    """

    module: str | None
    chain: tuple[str, ...]
    site: Site | None
    stack: tuple[Site, ...]
    phase: str
    thread: str = "MainThread"
    evidence: str = "driver-hook"
    module_site: Site | None = None
    thread_started_at: Site | None = None
    stack_dropped: int = 0

    @property
    def line_to_change(self) -> Site | None:
        """Where to edit: the culprit module's own line, else the calling line."""
        return self.module_site or self.site

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "chain": list(self.chain),
            "site": self.site.to_json() if self.site else None,
            "module_site": self.module_site.to_json() if self.module_site else None,
            "stack": [frame.to_json() for frame in self.stack],
            "phase": self.phase,
            "thread": self.thread,
            "thread_started_at": self.thread_started_at.to_json() if self.thread_started_at else None,
            "evidence": self.evidence,
            "stack_dropped": self.stack_dropped,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Culprit:
        return cls(
            module=data.get("module"),
            chain=tuple(data.get("chain", ())),
            site=Site.optional(data.get("site")),
            stack=tuple(Site.from_json(frame) for frame in data.get("stack", ())),
            phase=data.get("phase", "import"),
            thread=data.get("thread", "MainThread"),
            evidence=data.get("evidence", "driver-hook"),
            module_site=Site.optional(data.get("module_site")),
            thread_started_at=Site.optional(data.get("thread_started_at")),
            stack_dropped=int(data.get("stack_dropped", 0)),
        )


@dataclass(frozen=True)
class AliveThread:
    """A thread the target started that was still running when the scan stopped watching."""

    name: str
    starter: str | None
    started_at: Site | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "starter": self.starter,
            "started_at": self.started_at.to_json() if self.started_at else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AliveThread:
        return cls(data.get("name", ""), data.get("starter"), Site.optional(data.get("started_at")))


@dataclass(frozen=True)
class DriverInfo:
    """Which CUDA driver the subkernel saw: ``real``, ``simulated`` or ``none``."""

    kind: str
    requested: str
    library: str | None = None
    libraries: tuple[str, ...] = ()

    def describe(self) -> str:
        where = f" ({self.library})" if self.library else ""
        label = {
            "simulated": "simulated driver, a libcuda.so.1 stand-in with no GPU",
            "real": "real CUDA driver",
            "none": "no CUDA driver",
        }[self.kind]
        extra = [name for name in self.libraries if not name.startswith("libcuda.")]
        also = f"; also simulated: {', '.join(extra)}" if extra else ""
        return f"{label}{where}{also}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "requested": self.requested,
            "library": self.library,
            "libraries": list(self.libraries),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriverInfo:
        return cls(
            data["kind"], data.get("requested", data["kind"]), data.get("library"), tuple(data.get("libraries", ()))
        )


@dataclass(frozen=True)
class StartupInfo:
    """What interpreter start-up (``site``, ``.pth`` files, sitecustomize) did."""

    cuda_initialized: bool = False
    modules: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "cuda_initialized": self.cuda_initialized,
            "modules": self.modules,
            "seconds": round(self.seconds, 6),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StartupInfo:
        return cls(
            bool(data.get("cuda_initialized", False)), int(data.get("modules", 0)), float(data.get("seconds", 0.0))
        )


@dataclass(frozen=True)
class RunError:
    """Why a target did not import cleanly: the exception, exit code, signal or hang."""

    kind: str
    message: str
    traceback: str = ""
    file: str | None = None
    line: int | None = None
    exitcode: int | None = None
    signal: int | None = None
    where: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "traceback": self.traceback,
            "file": self.file,
            "line": self.line,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "where": self.where,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunError:
        return cls(
            kind=data["kind"],
            message=data.get("message", ""),
            traceback=data.get("traceback", ""),
            file=data.get("file"),
            line=data.get("line"),
            exitcode=data.get("exitcode"),
            signal=data.get("signal"),
            where=data.get("where", ""),
        )


@dataclass(frozen=True)
class ScanResult:
    """Everything one scan recorded, whatever way the subkernel ended."""

    targets: tuple[str, ...]
    status: ScanStatus
    driver: DriverInfo
    cuda_initialized: bool
    modules: tuple[ImportNode, ...] = ()
    culprits: tuple[Culprit, ...] = ()
    startup: StartupInfo = field(default_factory=StartupInfo)
    error: RunError | None = None
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ScanStatus(self.status))  # accepts the JSON spelling too

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
        if self.driver.kind == "none":
            reasons.append("no driver was loaded, so a cuInit could not be observed")
        reasons += [f"a library failed under the simulated driver: {gap}" for gap in self.simulation_gaps]
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

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCAN_SCHEMA,
            "targets": list(self.targets),
            "status": self.status.value,
            "verdict": self.verdict.value,
            "doubts": list(self.doubts()),
            "driver": self.driver.to_json(),
            "cuda_initialized": self.cuda_initialized,
            "torch_cuda_initialized": self.torch_cuda_initialized,
            "startup": self.startup.to_json(),
            "modules": [node.to_json() for node in self.modules],
            "culprits": [culprit.to_json() for culprit in self.culprits],
            "error": self.error.to_json() if self.error else None,
            "exitcode": self.exitcode,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration_s": round(self.duration_s, 6),
            "python": self.python,
            "started_at": self.started_at,
            "threads_alive": [thread.to_json() for thread in self.threads_alive],
            "simulation_gaps": list(self.simulation_gaps),
            "skipped_events": self.skipped_events,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanResult:
        check_schema(data, SCAN_SCHEMA)
        check_fields(data, _DOCUMENT, SCAN_SCHEMA)
        error = data.get("error")
        return cls(
            targets=tuple(data.get("targets", ())),
            status=ScanStatus(data["status"]),
            driver=DriverInfo.from_json(data["driver"]),
            cuda_initialized=bool(data["cuda_initialized"]),
            modules=tuple(ImportNode.from_json(node) for node in data.get("modules", ())),
            culprits=tuple(Culprit.from_json(culprit) for culprit in data.get("culprits", ())),
            startup=StartupInfo.from_json(data.get("startup", {})),
            error=RunError.from_json(error) if error else None,
            torch_cuda_initialized=data.get("torch_cuda_initialized"),
            exitcode=data.get("exitcode"),
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            duration_s=float(data.get("duration_s", 0.0)),
            python=data.get("python", ""),
            started_at=data.get("started_at", ""),
            threads_alive=tuple(AliveThread.from_json(thread) for thread in data.get("threads_alive", ())),
            simulation_gaps=tuple(data.get("simulation_gaps", ())),
            skipped_events=int(data.get("skipped_events", 0)),
        )

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
