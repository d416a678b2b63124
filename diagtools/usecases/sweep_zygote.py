"""Sweep through the preloading zygote: the heavy imports once, one forked child per module.

Each child's events are assembled exactly as a fresh subkernel's, so the
verdicts match fresh mode.  When the zygote refuses (preloading initialized
CUDA, started a thread, or failed) the pass is retried with the preloads
before the one that failed, and when none is left the modules go back to
fresh subkernels; the reasons are kept for the result.  Modules whose
culprit was caught only by the state probe are also left to a fresh scan,
which refines the site with a line-traced rerun.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagtools import agents, protocol
from diagtools.driver import DriverSetup, build_probe_extension
from diagtools.model.scan import ScanResult
from diagtools.model.sweep import SweepRow
from diagtools.runner.subkernel import RawRun, SubkernelRequest
from diagtools.runner.zygote import ZygoteOutcome, run_zygote
from diagtools.usecases.assemble import assemble
from diagtools.usecases.scan import DEFAULT_SETTLE_S, SCAN_PROBE
from diagtools.usecases.sweep_discover import SweptTree

__all__ = ["SWEEP_ZYGOTE", "ZygotePass", "in_package_deps", "zygote_pass"]

SWEEP_ZYGOTE = agents.program("sweep_zygote")
PRELOAD_TIMEOUT_MIN_S = 300.0
# OpenBLAS (loaded by numpy under torch) starts a worker thread at load unless told to use one;
# the zygote must have no thread but its own when it forks.  A value the user set is kept.
_ONE_THREAD = ("OPENBLAS_NUM_THREADS",)


@dataclass(frozen=True)
class ZygotePass:
    """What one zygote pass did: the modules it preloaded, why it fell back, what is left to scan fresh."""

    preload: tuple[str, ...]
    fallback: str
    leftover: tuple[str, ...]
    used: bool = True  # False: the zygote was refused and every module went to fresh subkernels
    notes: tuple[str, ...] = ()  # what was preloaded beyond the list given, and why


def in_package_deps(tree: SweptTree, files: Sequence[str | None]) -> tuple[str, ...]:
    """The files among ``files`` that lie inside the swept package, relative to its import root."""
    return tuple(sorted({rel for rel in (tree.relative(f) for f in files) if rel is not None}))


def _row(
    module: str, raw: RawRun, setup: DriverSetup, tree: SweptTree, outcome: ZygoteOutcome, *, own: tuple[str, ...]
) -> SweepRow:
    result: ScanResult = assemble(raw, (module,), setup.info, own)
    row = SweepRow.from_scan(module, result, raw.started_at, time.time(), mode="zygote")
    files = [node.file for node in result.modules] + [file for _, file in outcome.inside]
    return _with_deps(row, in_package_deps(tree, files))


def _with_deps(row: SweepRow, deps: tuple[str, ...]) -> SweepRow:
    from dataclasses import replace

    return replace(row, deps=deps)


def _needs_fresh_scan(row: SweepRow) -> bool:
    return row.culprit is not None and row.culprit.evidence == "state-probe"


class _Collector:
    """Turns the zygote's children into rows; remembers the modules a fresh scan must redo."""

    def __init__(
        self,
        modules: Sequence[str],
        setup: DriverSetup,
        tree: SweptTree,
        on_row: Callable[[SweepRow], None],
        own: tuple[str, ...] = (),
    ):
        self.modules, self.setup, self.tree, self.on_row, self.own = modules, setup, tree, on_row, own
        self.redo: list[str] = []

    def __call__(self, index: int, raw: RawRun | None, outcome: ZygoteOutcome) -> None:
        module = self.modules[index]
        if raw is None:
            seconds = dict(outcome.preloaded).get(module, 0.0)
            row = SweepRow.preloaded_in_zygote(module, seconds, time.time())
            self.on_row(_with_deps(row, in_package_deps(self.tree, [f for _, f in outcome.inside])))
            return
        row = _row(module, raw, self.setup, self.tree, outcome, own=self.own)
        if _needs_fresh_scan(row):
            self.redo.append(module)
        else:
            self.on_row(row)


def _request(setup: DriverSetup, roots: tuple[str, ...], timeout: float, python: str) -> SubkernelRequest:
    settings = {
        protocol.CUPROBE: str(build_probe_extension()),
        protocol.SCAN_PATH: "\n".join(roots),
        protocol.SCAN_SETTLE: repr(DEFAULT_SETTLE_S),  # as a fresh scan waits for the threads a module started
    }
    env = {**{name: os.environ.get(name) or "1" for name in _ONE_THREAD}, **setup.env}
    limit = max(timeout, PRELOAD_TIMEOUT_MIN_S)
    return SubkernelRequest(SWEEP_ZYGOTE, settings, env, limit, flags=("-S",), python=python)


def zygote_pass(
    modules: Sequence[str],
    *,
    tree: SweptTree,
    roots: tuple[str, ...],
    setup: DriverSetup,
    preload: Sequence[str],
    jobs: int,
    timeout: float,
    on_row: Callable[[SweepRow], None],
    own: tuple[str, ...] = (),
    python: str = sys.executable,
) -> ZygotePass:
    """Scan ``modules`` in children of a zygote that preloaded ``preload``; ``on_row`` gets each row."""
    attempt, notes = list(preload), []
    request = _request(setup, roots, timeout, python)
    while True:
        collector = _Collector(modules, setup, tree, on_row, own)
        outcome = run_zygote(
            request,
            modules,
            preload=attempt,
            package=tree.package,
            probe=SCAN_PROBE,
            jobs=jobs,
            timeout=timeout,
            on_child=collector,
        )
        if outcome.ready:
            break
        notes.append(outcome.refused)
        cut = attempt.index(outcome.refused_item) if outcome.refused_item in attempt else 0
        if cut == 0:
            notes.append("every module was scanned in a fresh subkernel")
            return ZygotePass((), "; ".join(notes), tuple(modules), used=False)
        attempt = attempt[:cut]
        notes.append(f"preloaded {', '.join(attempt)} only")
    leftover = [modules[i] for i in outcome.unfinished] + collector.redo
    if outcome.unfinished:
        notes.append(f"{outcome.detail}; those were scanned in fresh subkernels")
    return ZygotePass(tuple(attempt), "; ".join(notes), tuple(leftover))
