"""Sweep results: one row per module scanned alone, and the whole table.

Schema ``diagtools.sweep/1`` (a JSON Lines journal: a header, then rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagtools.model._display import present
from diagtools.model.scan import Culprit, ScanResult

__all__ = ["SWEEP_SCHEMA", "SweepResult", "SweepRow"]

SWEEP_SCHEMA = "diagtools.sweep/1"


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

    @classmethod
    def from_scan(cls, module: str, result: ScanResult, started: float, finished: float) -> SweepRow:
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
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "status": self.status,
            "cuda_initialized": self.cuda_initialized,
            "culprit": self.culprit.to_json() if self.culprit else None,
            "import_s": round(self.import_s, 6),
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
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
        )


@dataclass(frozen=True)
class SweepResult:
    """All rows of a sweep, sorted by module, and how many came from an earlier run."""

    package: str
    rows: tuple[SweepRow, ...]
    resumed: int = 0
    seconds: float = 0.0

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
        return {"schema": SWEEP_SCHEMA, "package": self.package, "rows": [row.to_json() for row in self.rows]}
