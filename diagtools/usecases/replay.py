"""The fork-replay use case: reproduce the poisoned-fork failure in a subkernel.

The subkernel plays the parent (it imports the setup target), then starts a
child with a ``multiprocessing`` start method, as vLLM starts EngineCore, and
the child performs one CUDA action.  Nothing of it runs in the caller's
process, so a notebook can replay the failure without poisoning itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from diagtools import agents, protocol
from diagtools.driver import build_probe_extension, resolve_driver
from diagtools.errors import UsageError
from diagtools.model.common import iso_time
from diagtools.model.replay import (
    CHILD_ACTIONS,
    START_METHODS,
    ChildOutcome,
    ChildStatus,
    ComparisonRun,
    ParentState,
    ReplayComparison,
    ReplayResult,
    ReplayStatus,
)
from diagtools.model.scan import DriverInfo, TargetFailure
from diagtools.runner.subkernel import RawRun, SubkernelRequest, run_subkernel
from diagtools.usecases.assemble import CHANNEL_LOST_MESSAGE, channel_lost, subkernel_failure
from diagtools.usecases.interpreter import validate_python
from diagtools.usecases.options import validate_paths, validate_targets, validate_timeout

__all__ = ["ReplaySpec", "assemble_replay", "compare_replays", "replay_fork"]

REPLAY_PROGRAM = agents.program("replay_parent")
Runner = Callable[[SubkernelRequest], RawRun]
PathArg = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def _validate_child(child: str) -> str:
    if child in CHILD_ACTIONS:
        return child
    module, sep, function = child.partition(":")
    if sep and function.isidentifier() and all(part.isidentifier() for part in module.split(".")):
        return child
    raise UsageError(f"unknown child action {child!r}: use {', '.join(CHILD_ACTIONS)} or module:function")


def _validate_start_method(start_method: str) -> str:
    if start_method not in START_METHODS:
        raise UsageError(f"unknown start method {start_method!r}: use {', '.join(START_METHODS)}")
    return start_method


@dataclass(frozen=True)
class ReplaySpec:
    """What one replay does: the parent's setup import, the child's action, the start method."""

    target: str
    roots: tuple[str, ...]
    child: str
    start_method: str
    python: str = sys.executable

    def request(self, env: dict[str, str], timeout: float, scratch: str = "") -> SubkernelRequest:
        settings = {
            protocol.REPLAY_SCRATCH: scratch,
            protocol.REPLAY_TARGET: self.target,
            protocol.REPLAY_PATH: "\n".join(self.roots),
            protocol.REPLAY_CHILD: self.child,
            protocol.REPLAY_START_METHOD: self.start_method,
            protocol.REPLAY_CHILD_TIMEOUT: str(max(1.0, timeout / 2)),
            protocol.CUPROBE: str(build_probe_extension()),
        }
        return SubkernelRequest(REPLAY_PROGRAM, settings, env, timeout, python=self.python)


def replay_fork(
    setup: str,
    *,
    child: str = "cuinit",
    start_method: str = "fork",
    path: PathArg = (),
    driver: str = "auto",
    timeout: float = 60.0,
    runner: Runner = run_subkernel,
    python: str | os.PathLike[str] | None = None,
) -> ReplayResult:
    """Import ``setup`` in a fresh parent, start a child with ``start_method``, run ``child``.

    Parameters
    ----------
    setup
        The module the parent imports first (what the server imports before forking).
    child
        ``cuinit`` (cuda-python), ``ctypes`` (raw libcuda, as Triton), ``torch``
        (only with a CUDA torch on a real GPU) or ``module:function``.
    start_method
        ``fork``, ``spawn`` or ``forkserver``.
    timeout
        Seconds for the whole replay; the child gets half of it.
    python
        The interpreter of the parent and child (default: this one).
    """
    (target,) = validate_targets(setup)
    timeout = validate_timeout(timeout)
    spec = ReplaySpec(
        target,
        validate_paths(path),
        _validate_child(child),
        _validate_start_method(start_method),
        validate_python(python),
    )
    setup_driver = resolve_driver(driver)
    with tempfile.TemporaryDirectory(prefix="diagtools-replay-") as scratch:
        raw = runner(spec.request(setup_driver.env, timeout, scratch))
    return assemble_replay(raw, spec, setup_driver.info)


def assemble_replay(raw: RawRun, spec: ReplaySpec, driver: DriverInfo) -> ReplayResult:
    """The replay result from one subkernel's events, keeping whatever was recorded."""
    events = {event.get("e"): event for event in raw.events}
    parent = ParentState.from_json(events["parent"]) if "parent" in events else None
    outcome = ChildOutcome.from_json(events["child"]) if "child" in events else None
    status, error = _replay_status(raw, events, outcome)
    return ReplayResult(
        spec.target,
        spec.roots,
        spec.child,
        spec.start_method,
        driver,
        status,
        parent,
        outcome,
        error,
        raw.duration_s,
        iso_time(raw.started_at),
    )


_CHILD_TO_REPLAY = {
    ChildStatus.CRASHED: ReplayStatus.CHILD_CRASHED,
    ChildStatus.TIMEOUT: ReplayStatus.CHILD_TIMEOUT,
    ChildStatus.EXITED: ReplayStatus.CHILD_EXITED,
}


def _replay_status(
    raw: RawRun, events: dict[Any, dict[str, Any]], outcome: ChildOutcome | None
) -> tuple[ReplayStatus, TargetFailure | None]:
    setup = events.get("setup")
    if setup is not None and not setup.get("ok"):
        return ReplayStatus.SETUP_ERROR, TargetFailure(
            "import-error", setup.get("error", ""), setup.get("traceback", "")
        )
    failure = subkernel_failure(raw)
    if failure is not None:
        status, error = failure
        return ReplayStatus(status.value), error
    if "done" not in events and channel_lost(raw, set(events)):
        return ReplayStatus.CHANNEL_LOST, TargetFailure(
            "channel-lost", CHANNEL_LOST_MESSAGE, raw.stderr.text[-4000:], exitcode=raw.returncode
        )
    if outcome is None or "done" not in events:
        message = f"the replay's parent ended before reporting (exit code {raw.returncode})"
        return ReplayStatus.EXITED, TargetFailure("exited", message, raw.stderr.text[-4000:], exitcode=raw.returncode)
    return _CHILD_TO_REPLAY.get(outcome.status, ReplayStatus(outcome.status.value)), None


def compare_replays(
    setup: str,
    *,
    before: PathArg,
    after: PathArg,
    child: str = "cuinit",
    start_methods: Sequence[str] = ("fork", "spawn"),
    path: PathArg = (),
    driver: str = "auto",
    timeout: float = 60.0,
    runner: Runner = run_subkernel,
    python: str | os.PathLike[str] | None = None,
) -> ReplayComparison:
    """The same replay on the ``before`` and ``after`` trees under each start method."""
    shared = validate_paths(path)
    same: dict[str, Any] = {"child": child, "driver": driver, "timeout": timeout, "runner": runner, "python": python}
    runs = []
    for label, roots in (("before", before), ("after", after)):
        variant_roots = (*validate_paths(roots), *shared)
        for method in start_methods:
            result = replay_fork(setup, start_method=method, path=variant_roots, **same)
            runs.append(ComparisonRun(label, result))
    return ReplayComparison(setup, tuple(runs))
