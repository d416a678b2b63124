"""Fork-replay results: the parent's state, the child's outcome, and comparisons.

Schema ``diagtools.replay/1`` for one replay, ``diagtools.replay-comparison/1``
for a before/after, fork/spawn grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.common import check_schema
from diagtools.model.scan import DriverInfo, RunError
from diagtools.model.serial import Serial, load
from diagtools.model.verdict import Label, Verdict, combine

__all__ = [
    "CHILD_ACTIONS",
    "REPLAY_SCHEMA",
    "START_METHODS",
    "ChildOutcome",
    "ChildStatus",
    "DriverCall",
    "ParentState",
    "ReplayComparison",
    "ReplayResult",
    "ReplayStatus",
]

REPLAY_SCHEMA = "diagtools.replay/1"
COMPARISON_SCHEMA = "diagtools.replay-comparison/1"
START_METHODS = ("fork", "spawn", "forkserver")
CHILD_ACTIONS = ("cuinit", "ctypes", "torch")


class ChildStatus(Label):
    """How the child's CUDA action ended."""

    OK = "ok"
    FAILED = "failed"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    EXITED = "exited"
    UNAVAILABLE = "unavailable"


class ReplayStatus(Label):
    """How a whole replay ended: the child's outcome, or why there was none."""

    OK = "ok"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"
    SETUP_ERROR = "setup-error"
    CHILD_CRASHED = "child-crashed"
    CHILD_TIMEOUT = "child-timeout"
    CHILD_EXITED = "child-exited"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    EXITED = "exited"
    CHANNEL_LOST = "channel-lost"


#: The child ran and its CUDA action did not succeed: the poisoned-fork failure, reproduced.
CHILD_FAILURES = frozenset(
    {ReplayStatus.FAILED, ReplayStatus.CHILD_CRASHED, ReplayStatus.CHILD_TIMEOUT, ReplayStatus.CHILD_EXITED}
)
#: The replay itself broke: no child outcome to judge.
REPLAY_BROKEN = frozenset(
    {
        ReplayStatus.SETUP_ERROR,
        ReplayStatus.CRASHED,
        ReplayStatus.TIMEOUT,
        ReplayStatus.EXITED,
        ReplayStatus.CHANNEL_LOST,
    }
)


@dataclass(frozen=True)
class DriverCall(Serial):
    """One driver call the child made and the driver's answer; written as ``[call, code, name]``."""

    _JSON_AS_LIST: ClassVar[bool] = True

    call: str
    code: int
    name: str


@dataclass(frozen=True)
class ParentState(Serial):
    """What the parent looked like when it started the child."""

    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"cuda_initialized": False}

    cuda_initialized: bool
    driver_state: int | None = None
    torch_cuda_initialized: bool | None = None
    threads: tuple[str, ...] = ()
    modules: int = 0


@dataclass(frozen=True)
class ChildOutcome(Serial):
    """How the child's CUDA action ended: ``ok``, ``failed``, ``crashed``, ``timeout``,
    ``exited`` (no result) or ``unavailable`` (cannot run on this machine)."""

    status: ChildStatus
    exitcode: int | None = None
    signal: int | None = None
    error_type: str = ""
    error: str = ""
    traceback: str = ""
    stdout: str = ""
    stderr: str = ""
    detail: str = ""
    driver_state_at_start: int | None = None
    driver_calls: tuple[DriverCall, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ChildStatus(self.status))

    @property
    def ok(self) -> bool:
        return self.status == ChildStatus.OK

    def _json_extra(self) -> dict[str, Any]:
        return {"ok": self.ok}

    def summary(self) -> str:
        if self.status == "ok":
            return f"ok ({self.detail})" if self.detail else "ok"
        if self.status == "failed":
            return f"failed: {self.error_type}: {self.error}"
        if self.status == "crashed":
            return f"crashed by signal {self.signal}"
        if self.status == "unavailable":
            return f"unavailable: {self.detail}"
        return f"{self.status} (exit code {self.exitcode})"


@dataclass(frozen=True)
class ReplayResult(Serial):
    """One replay: the setup import, the parent's state, the child's outcome.

    ``status``: ``ok`` (the child's action worked), ``failed`` (it failed: the
    bug reproduced), ``unavailable``, ``setup-error`` (the target did not
    import), or ``crashed``/``timeout``/``exited`` for the replay itself.
    """

    SCHEMA: ClassVar[str] = REPLAY_SCHEMA
    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {"path": (), "parent": None, "child": None}

    target: str
    path: tuple[str, ...]
    child_action: str
    start_method: str
    driver: DriverInfo
    status: ReplayStatus
    parent: ParentState | None
    child: ChildOutcome | None
    error: RunError | None = None
    duration_s: float = 0.0
    started_at: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ReplayStatus(self.status))

    @property
    def reproduced(self) -> bool:
        """True when the child ran and its CUDA action failed, crashed, hung or exited early."""
        return self.status in CHILD_FAILURES and self.child is not None

    @property
    def verdict(self) -> Verdict:
        """``initializes-cuda`` when the parent initialized CUDA before starting the child.

        ``clean`` only when the parent did not and the child's action then
        worked; anything the replay could not see (setup error, crash, no
        child, an unavailable action, a failure the parent's state does not
        explain) is ``unknown``.
        """
        if self.status in REPLAY_BROKEN or self.parent is None:
            return Verdict.UNKNOWN
        if self.parent.cuda_initialized:
            return Verdict.INITIALIZES_CUDA
        return Verdict.CLEAN if self.status == ReplayStatus.OK else Verdict.UNKNOWN

    def _json_extra(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reproduced": self.reproduced}

    def _repr_html_(self) -> str:
        return str(present("replay.html", self))

    def __str__(self) -> str:
        return str(present("replay.text", self))


@dataclass(frozen=True)
class _ComparisonRun(Serial):
    """One run of a comparison document: its variant label and the replay."""

    variant: str
    replay: ReplayResult


@dataclass(frozen=True)
class _ComparisonDocument(Serial):
    """The fields a comparison document is read from (the rest is derived again)."""

    target: str
    runs: tuple[_ComparisonRun, ...]


@dataclass(frozen=True)
class ReplayComparison(Serial):
    """The same replay before and after a fix, under several start methods."""

    target: str
    runs: tuple[tuple[str, ReplayResult], ...]

    def run(self, variant: str, start_method: str) -> ReplayResult:
        for label, result in self.runs:
            if label == variant and result.start_method == start_method:
                return result
        raise KeyError(f"{variant}/{start_method}")

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(label for label, _ in self.runs))

    @property
    def start_methods(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(result.start_method for _, result in self.runs))

    @property
    def verdict(self) -> Verdict:
        """The verdict on the last variant (the fix): all its start methods must agree to be ``clean``."""
        if not self.runs:
            return Verdict.UNKNOWN
        return combine(result.verdict for result in self.runs_of(self.variants[-1]))

    def variant_verdicts(self) -> dict[str, Verdict]:
        return {variant: combine(r.verdict for r in self.runs_of(variant)) for variant in self.variants}

    def explanation(self) -> tuple[str, ...]:
        """A headline, then one line per fact: which runs failed, which could not be judged, and why."""
        failing = [f"{label}/{r.start_method}" for label, r in self.runs if r.reproduced]
        unjudged = [f"{label}/{r.start_method} ({r.status})" for label, r in self.runs if r.verdict == Verdict.UNKNOWN]
        headline = f"{', '.join(failing)} failed" if failing else "no child failed"
        lines = [headline + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")]
        for variant in self.variants:
            parent = self.runs_of(variant)[0].parent
            if parent is not None:
                did = "initialized CUDA" if parent.cuda_initialized else "did not initialize CUDA"
                lines.append(f"{variant}: the parent {did} before starting the child")
        after = self.variant_verdicts().get("after")
        if after == Verdict.CLEAN:
            lines.append("after the fix every start method passes")
        if any(r.start_method != "fork" and r.status == ReplayStatus.OK for r in self.runs_of("before")):
            lines.append("spawn-like start methods avoid it: the child starts a fresh interpreter")
        return tuple(lines)

    def runs_of(self, variant: str) -> tuple[ReplayResult, ...]:
        return tuple(result for label, result in self.runs if label == variant)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": COMPARISON_SCHEMA,
            "target": self.target,
            "runs": [_ComparisonRun(label, result).to_json() for label, result in self.runs],
            "verdict": self.verdict.value,
            "variant_verdicts": {variant: verdict.value for variant, verdict in self.variant_verdicts().items()},
            "explanation": list(self.explanation()),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayComparison:
        check_schema(data, COMPARISON_SCHEMA)
        document = load(_ComparisonDocument, data, COMPARISON_SCHEMA)
        return cls(document.target, tuple((run.variant, run.replay) for run in document.runs))

    def _repr_html_(self) -> str:
        return str(present("comparison.html", self))

    def __str__(self) -> str:
        return str(present("comparison.text", self))
