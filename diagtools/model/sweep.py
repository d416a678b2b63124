"""Sweep results: one row per module scanned alone, and the whole table.

Schema ``diagtools.sweep/1`` (a JSON Lines journal: a header, then rows).
A row says whether the module initializes CUDA itself or inherits it from a
parent package's import (``cuda_source``), and whether it was scanned in a
fresh subkernel or in a child of the preloading zygote (``mode``), or was
itself preloaded there (``preloaded``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagtools.model._display import TextReport, present
from diagtools.model.scan import Culprit, ScanResult
from diagtools.model.verdict import Verdict, combine

__all__ = ["CUDA_SOURCES", "SWEEP_SCHEMA", "SweepResult", "SweepRow", "cuda_source"]

SWEEP_SCHEMA = "diagtools.sweep/1"
CUDA_SOURCES = ("none", "self", "parent", "startup", "unknown")


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
class SweepRow:
    """One module's verdict: did importing it alone initialize CUDA, and who did."""

    module: str
    status: str
    cuda_initialized: bool
    culprit: Culprit | None
    import_s: float
    error: str = ""
    started: float = 0.0
    finished: float = 0.0
    verdict: Verdict = None  # type: ignore[assignment]  # not given: derived in __post_init__
    cuda_source: str = "none"
    mode: str = "fresh"
    preloaded: bool = False
    fingerprint: str = ""
    deps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict is not None:
            object.__setattr__(self, "verdict", Verdict(self.verdict))
        elif self.cuda_initialized:  # a row not built from a scan is judged by what it says
            object.__setattr__(self, "verdict", Verdict.INITIALIZES_CUDA)
        else:
            object.__setattr__(self, "verdict", Verdict.CLEAN if self.status == "ok" else Verdict.UNKNOWN)

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
            "ok",
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

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "verdict": self.verdict.value,
            "status": self.status,
            "cuda_initialized": self.cuda_initialized,
            "culprit": self.culprit.to_json() if self.culprit else None,
            "import_s": round(self.import_s, 6),
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
            "cuda_source": self.cuda_source,
            "mode": self.mode,
            "preloaded": self.preloaded,
            "fingerprint": self.fingerprint,
            "deps": list(self.deps),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepRow:
        culprit = data.get("culprit")
        return cls(
            module=data["module"],
            status=data["status"],
            cuda_initialized=bool(data["cuda_initialized"]),
            culprit=Culprit.from_json(culprit) if culprit else None,
            import_s=float(data.get("import_s", 0.0)),
            error=data.get("error", ""),
            started=float(data.get("started", 0.0)),
            finished=float(data.get("finished", 0.0)),
            verdict=Verdict(data["verdict"]) if "verdict" in data else None,  # type: ignore[arg-type]
            cuda_source=data.get("cuda_source", "self" if data["cuda_initialized"] else "none"),
            mode=data.get("mode", "fresh"),
            preloaded=bool(data.get("preloaded", False)),
            fingerprint=data.get("fingerprint", ""),
            deps=tuple(data.get("deps", ())),
        )


@dataclass(frozen=True)
class SweepResult(TextReport):
    """All rows of a sweep, sorted by module, and how many came from an earlier run.

    ``mode`` is ``zygote`` when a preloading worker forked the children (with
    ``preload`` the modules it imported once) and ``fresh`` when every module
    got a fresh subkernel; ``fallback`` says why the zygote was not (or not
    fully) used, and is empty when nothing went wrong.
    """

    package: str
    rows: tuple[SweepRow, ...]
    resumed: int = 0
    seconds: float = 0.0
    mode: str = "fresh"
    preload: tuple[str, ...] = ()
    fallback: str = ""

    @property
    def verdict(self) -> Verdict:
        """``initializes-cuda`` if any module does; ``clean`` only when every module was seen clean."""
        return combine(row.verdict for row in self.rows)

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

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SWEEP_SCHEMA,
            "package": self.package,
            "verdict": self.verdict.value,
            "mode": self.mode,
            "preload": list(self.preload),
            "fallback": self.fallback,
            "rows": [row.to_json() for row in self.rows],
        }
