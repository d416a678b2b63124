"""Fork-replay results: the parent's state, the child's outcome, and comparisons.

Schema ``diagtools.replay/1`` for one replay, ``diagtools.replay-comparison/1``
for a before/after, fork/spawn grid.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from diagtools.model._display import present
from diagtools.model.options import START_METHODS
from diagtools.model.scan import DriverInfo, TargetFailure
from diagtools.model.serial import Serial
from diagtools.model.verdict import Label, Tone, Verdict, combine

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
    "Tone",
]

REPLAY_SCHEMA = "diagtools.replay/1"
COMPARISON_SCHEMA = "diagtools.replay-comparison/1"
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


#: One part of a headline: its words and how they read.
Part = tuple[str, Tone]

#: Traceback frames from diagtools' own replay agents: kept in the JSON, left out of what a reader sees.
_AGENT_ERROR = re.compile(r"^diagtools\.agents\.\w+\.")
_AGENT_FRAME = re.compile(r'^  File "[^"]*[/\\]diagtools[/\\]agents[/\\][^"]*"')


def user_traceback(traceback: str) -> str:
    """``traceback`` without diagtools' own agent frames and without the ``^^^^`` position markers.

    A reader should see the driver's answer and their own code, not the replay
    child that hosted it (which reads as if the tool crashed).
    """
    kept: list[str] = []
    skipping = False
    for line in traceback.splitlines():
        if line.startswith("  File "):
            skipping = bool(_AGENT_FRAME.match(line))
            if skipping:
                continue
        elif skipping and line.startswith("    "):
            continue
        else:
            skipping = False
        if line.strip() and set(line.strip()) <= set("^~"):
            continue
        kept.append(line)
    kept = [_AGENT_ERROR.sub("", line) for line in kept]
    frames = [line for line in kept if line.startswith("  File ")]
    if not frames:
        kept = [line for line in kept if not line.startswith("Traceback (most recent call last)")]
    return "\n".join(kept)


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

    @property
    def shown_traceback(self) -> str:
        """The child's traceback as a reader should see it: their frames and the driver's answer."""
        return user_traceback(self.traceback)

    def short(self) -> str:
        """A table cell: ``ok (1 device(s))``, or what failed as the driver answered it."""
        failed_calls = [call for call in self.driver_calls if call.code != 0]
        if self.status == "failed" and failed_calls:
            return f"fails: {failed_calls[-1].call} -> {failed_calls[-1].name}"
        return self.summary()

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
    error: TargetFailure | None = None
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

    def headline(self) -> Part:
        """One sentence a reader cannot misread: did the child fail, and why it matters."""
        method = self.start_method
        if self.reproduced and self.child is not None:
            return f"Reproduced: the {method} child fails ({self.child.short().removeprefix('fails: ')})", Tone.BAD
        if self.status == ReplayStatus.OK and self.parent is not None:
            why = (
                f"{method} starts a fresh interpreter, though the import initializes CUDA in the parent"
                if self.parent.cuda_initialized and method != "fork"
                else "the parent did not initialize CUDA"
                if not self.parent.cuda_initialized
                else "the parent initialized CUDA, yet the child worked"
            )
            return f"Passes: the {method} child works ({why})", Tone.GOOD
        return f"Not judged: replay {method} ended {self.status}", Tone.UNKNOWN

    def _json_extra(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reproduced": self.reproduced}

    def _repr_html_(self) -> str:
        return str(present("replay.html", self))

    def __str__(self) -> str:
        return str(present("replay.text", self))


@dataclass(frozen=True)
class ComparisonRun(Serial):
    """One run of a comparison: its variant label and the replay; reads as the pair ``(variant, replay)``."""

    variant: str
    replay: ReplayResult

    def __iter__(self) -> Iterator[Any]:
        return iter((self.variant, self.replay))

    def __getitem__(self, index: int) -> Any:
        return (self.variant, self.replay)[index]

    def __len__(self) -> int:
        return 2


@dataclass(frozen=True)
class ReplayComparison(Serial):
    """The same replay before and after a fix, under several start methods.

    ``runs`` may be given as ``(variant, replay)`` pairs; each is kept as a :class:`ComparisonRun`.
    """

    SCHEMA: ClassVar[str] = COMPARISON_SCHEMA

    target: str
    runs: tuple[ComparisonRun, ...]

    def __post_init__(self) -> None:
        runs = tuple(run if isinstance(run, ComparisonRun) else ComparisonRun(*run) for run in self.runs)
        object.__setattr__(self, "runs", runs)

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

    def headline_parts(self) -> tuple[Part, ...]:
        """The one verdict, in parts: what failed (red), whether the fix passes (green), what was not judged.

        For example ``Reproduced: before/fork fails; fixed: after passes fork and spawn``.
        """
        failing = [f"{label}/{r.start_method}" for label, r in self.runs if r.reproduced]
        fixed = self.variants[-1] if len(self.variants) > 1 else None
        first = [f for f in failing if fixed is None or not f.startswith(f"{fixed}/")]
        parts: list[Part] = []
        if first:
            parts.append((f"Reproduced: {_and(first)} {'fails' if len(first) == 1 else 'fail'}", Tone.BAD))
        elif self.runs:
            parts.append(("Not reproduced: no child failed before the fix", Tone.UNKNOWN))
        if fixed is not None:
            parts.append(self._fix_part(fixed))
        unjudged = [f"{label}/{r.start_method} ({r.status})" for label, r in self.runs if r.verdict == Verdict.UNKNOWN]
        unjudged = [u for u in unjudged if u.split(" ")[0] not in failing]
        if unjudged:
            parts.append((f"not judged: {', '.join(unjudged)}", Tone.UNKNOWN))
        return tuple(parts)

    def _fix_part(self, variant: str) -> Part:
        runs = self.runs_of(variant)
        methods = _and([r.start_method for r in runs])
        if any(r.reproduced for r in runs):
            still = _and([f"{variant}/{r.start_method}" for r in runs if r.reproduced])
            return f"not fixed: {still} still fails", Tone.BAD
        if all(r.status == ReplayStatus.OK for r in runs):
            return f"fixed: {variant} passes {methods}", Tone.GOOD
        return f"{variant} not judged", Tone.UNKNOWN

    def headline(self) -> str:
        """The one verdict as a sentence: the same words in the notebook, the panel, the CLI and the postmortem."""
        return "; ".join(text for text, _ in self.headline_parts())

    def explanation(self) -> tuple[str, ...]:
        """The headline, then one line per fact: what the parent did in each variant, and why spawn passes."""
        lines = [self.headline()]
        for variant in self.variants:
            parent = self.runs_of(variant)[0].parent
            if parent is not None:
                did = "initialized CUDA" if parent.cuda_initialized else "did not initialize CUDA"
                lines.append(f"{variant}: the parent {did} before starting the child")
        if any(r.start_method != "fork" and r.status == ReplayStatus.OK for r in self.runs_of("before")):
            lines.append("spawn-like start methods avoid it: the child starts a fresh interpreter")
        return tuple(lines)

    def runs_of(self, variant: str) -> tuple[ReplayResult, ...]:
        return tuple(result for label, result in self.runs if label == variant)

    def _json_extra(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "variant_verdicts": self.variant_verdicts(),
            "headline": self.headline(),
            "explanation": self.explanation(),
        }

    def _repr_html_(self) -> str:
        return str(present("comparison.html", self))

    def __str__(self) -> str:
        return str(present("comparison.text", self))


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
