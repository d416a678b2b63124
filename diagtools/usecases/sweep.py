"""Sweep: every submodule of a package scanned alone, in parallel, resumably.

Modules are found by walking the package's files, never by importing it
(:mod:`diagtools.usecases.sweep_discover`).  Each one is imported alone, so
one culprit cannot hide another: by default in a child forked from a zygote
that preloaded the heavy shared imports once (:mod:`diagtools.usecases.sweep_forked`),
or, with ``fresh=True`` or when preloading is refused, in a fresh subkernel.
Rows are appended to a JSON Lines journal as they finish
(:mod:`diagtools.usecases.sweep_journal`); a rerun skips the rows whose files
did not change.
"""

from __future__ import annotations

import importlib.machinery
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from diagtools.driver import DriverSetup, resolve_driver
from diagtools.errors import SweepInterrupted, UsageError
from diagtools.model.options import DEFAULT_TIMEOUT_S
from diagtools.model.sweep import SCANNING_STAGE, SweepResult, SweepRow
from diagtools.model.verdict import ScanStatus
from diagtools.runner.kept import abort_all
from diagtools.usecases.options import ScanOptions, validate_targets
from diagtools.usecases.scan import scan_with
from diagtools.usecases.sweep_discover import SweptTree, discover_modules, locate_tree
from diagtools.usecases.sweep_environment import environment_of
from diagtools.usecases.sweep_forked import (
    CheckedPreload,
    ZygoteJob,
    ZygotePass,
    check_preload_here,
    in_package_deps,
    zygote_pass,
)
from diagtools.usecases.sweep_journal import Fingerprints, Journal, Learned, Reused

__all__ = ["default_preload", "discover_modules", "sweep"]

Progress = Callable[[int, int, "SweepRow"], None]
_CHUNKS_PER_WORKER = 4  # executor tasks per worker in zygote mode: each task preloads once
_MIN_CHUNK = 16


def default_preload(tree: SweptTree, roots: Iterable[str] = ()) -> tuple[str, ...]:
    """``torch`` when the package's sources import it and it can be found (not imported here), then
    the package and its parents."""
    parts = tree.package.split(".")
    parents = tuple(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    if "torch" not in tree.imported_names:
        return parents
    found = importlib.machinery.PathFinder.find_spec("torch", [*roots, *[p for p in sys.path if p]])
    return (*(("torch",) if found is not None else ()), *parents)


def _preload_list(tree: SweptTree, roots: tuple[str, ...], preload: str | Sequence[str] | None) -> tuple[str, ...]:
    if preload is None or preload == "auto":
        return default_preload(tree, roots)
    if preload == "none":
        return ()
    names = tuple(p.strip() for p in preload.split(",")) if isinstance(preload, str) else tuple(preload)
    return validate_targets([n for n in names if n]) if any(names) else ()


@dataclass(frozen=True)
class _Plan:
    """How to scan: picklable, so executor tasks get everything in one argument."""

    package: str
    root: str
    options: ScanOptions  # roots, driver, timeout, the user's packages (): the swept package's top level), python
    jobs: int
    preload: tuple[str, ...] | None  # None: fresh subkernels only
    adapt: bool = True  # grow the preload from what the first children import
    learned: Learned | None = None  # what the journal's last adaptive run learned to preload
    watched: tuple[str, ...] = ()  # what the checked preload's zygote watched, watched in every row

    @property
    def tree(self) -> SweptTree:
        return SweptTree(self.package, Path(self.root), {})


def _scan_fresh(module: str, plan: _Plan) -> SweepRow:
    started = time.time()
    result = scan_with((module,), plan.options)
    row = SweepRow.from_scan(module, result, started, time.time())
    return replace(row, deps=in_package_deps(plan.tree, [node.file for node in result.modules]))


def _sweep_one(module: str, plan: _Plan) -> dict[str, Any]:
    """Scan one module in a fresh subkernel; module-level and JSON-returning so any executor can run it."""
    return _scan_fresh(module, plan).to_json()


def _zygote_chunk(modules: list[str], plan: _Plan) -> dict[str, Any]:
    """One executor task: a zygote over ``modules``, one child at a time, fresh scans for what it left."""
    rows: list[SweepRow] = []
    setup = resolve_driver(plan.options.driver)
    job = ZygoteJob(plan.tree, plan.options, setup, plan.preload or (), 1, rows.append, watched=plan.watched)
    done = zygote_pass(modules, job)
    rows += [_scan_fresh(m, plan) for m in done.leftover]
    return {
        "rows": [row.to_json() for row in rows],
        "preload": list(done.preload),
        "fallback": done.fallback,
        "used": done.used,
    }


@dataclass
class _Run:
    """The sweep in progress: rows so far, the journal, the progress callback."""

    modules: tuple[str, ...]
    rows: dict[str, SweepRow]
    journal: Journal
    fingerprints: Fingerprints
    progress: Progress | None

    def record(self, row: SweepRow) -> None:
        row = replace(row, fingerprint=self.fingerprints.of(row))
        self.rows[row.module] = row
        self.journal.append(row)
        if self.progress is not None:
            self.progress(len(self.rows), len(self.modules), row)


def _run_fresh(plan: _Plan, pending: Sequence[str], run: _Run, executor: Executor | None) -> None:
    pool = executor or ThreadPoolExecutor(max_workers=plan.jobs)
    try:
        futures = {pool.submit(_sweep_one, m, plan): m for m in pending}
        for future in as_completed(futures):
            run.record(_row_of(futures[future], future))
    except BaseException:
        abort_all()  # an interrupt: the subkernels still running are killed, so the workers return now
        raise
    finally:
        if executor is None:
            pool.shutdown(cancel_futures=True)


def _row_of(module: str, future: Future[dict[str, Any]]) -> SweepRow:
    """The finished module's row; a failure of diagtools itself becomes that row's error, not the sweep's."""
    try:
        return SweepRow.from_json(future.result())
    except Exception as exc:  # one bad module never stops the sweep
        return SweepRow(module, ScanStatus.ERROR, False, None, 0.0, error=f"{type(exc).__name__}: {exc}")


def _zygote_job(plan: _Plan, run: _Run, tree: SweptTree, stage: Callable[[str], object] | None) -> ZygoteJob:
    """What every zygote pass of this sweep is given: the tree, the driver, the preload, where rows go, which
    stage they come from, what the journal's last run learned, and which modules already failed alone."""
    assert plan.preload is not None
    return ZygoteJob(
        tree,
        plan.options,
        resolve_driver(plan.options.driver),
        plan.preload,
        plan.jobs,
        run.record,
        stage=stage,
        learned=(plan.learned.learned, plan.learned.libraries) if plan.learned else None,  # used when adapting
        failed_alone=[m for m, row in run.rows.items() if row.status != "ok"],
    )


def _run_zygote_here(
    plan: _Plan, pending: Sequence[str], run: _Run, tree: SweptTree, stage: Callable[[str], object] | None
) -> ZygotePass:
    done = zygote_pass(pending, _zygote_job(plan, run, tree, stage), adapt=plan.adapt)
    if done.leftover:
        _run_fresh(plan, done.leftover, run, None)
    return done


def _check_here(
    plan: _Plan, pending: Sequence[str], run: _Run, tree: SweptTree, stage: Callable[[str], object] | None
) -> CheckedPreload | None:
    """Before chunks go to an executor: learn the preload from a sample scanned on this machine (or take the
    one the journal remembers) and check it here, so that every task's zygote imports it as given."""
    if not plan.adapt or plan.preload is None:
        return None
    return check_preload_here(pending, _zygote_job(plan, run, tree, stage))


def _run_zygote_chunks(
    plan: _Plan,
    pending: Sequence[str],
    run: _Run,
    executor: Executor,
    *,
    tree: SweptTree,
    stage: Callable[[str], object] | None = None,
) -> ZygotePass:
    checked = _check_here(plan, pending, run, tree, stage)
    if checked is not None:
        plan = replace(plan, preload=checked.done.preload, watched=checked.done.watched)
        if checked.done.leftover:  # rows the check's children left to a fresh scan: their modules are preloaded
            _run_fresh(plan, checked.done.leftover, run, None)
        if stage is not None:
            stage(
                f"{SCANNING_STAGE} in executor tasks, each preloading the {len(checked.done.learned)} checked module(s)"
            )
    pending = [m for m in pending if m not in run.rows]
    size = max(_MIN_CHUNK, math.ceil(len(pending) / (plan.jobs * _CHUNKS_PER_WORKER)))
    chunks = [list(pending[i : i + size]) for i in range(0, len(pending), size)]
    futures: dict[Future[dict[str, Any]], list[str]] = {
        executor.submit(_zygote_chunk, chunk, plan): chunk for chunk in chunks
    }
    preloads, fallbacks, used = set(), [], False
    for future in as_completed(futures):
        try:
            chunk = future.result()
        except Exception as exc:  # a lost worker costs its chunk's rows, never the sweep
            for module in futures[future]:
                run.record(SweepRow(module, ScanStatus.ERROR, False, None, 0.0, error=f"{type(exc).__name__}: {exc}"))
            continue
        for record in chunk["rows"]:
            run.record(SweepRow.from_json(record))
        preloads.add(tuple(chunk["preload"]))
        used = used or chunk["used"]
        fallbacks += [chunk["fallback"]] if chunk["fallback"] and chunk["fallback"] not in fallbacks else []
    preload = min(preloads, key=len) if preloads else tuple(plan.preload or ())
    done = ZygotePass(preload if used else (), "; ".join(fallbacks), (), used)
    if checked is None:
        return done
    kept = tuple(name for name in checked.done.learned if name in preload)
    libraries = tuple(name for name in checked.done.libraries if name in kept)
    return replace(done, notes=checked.done.notes, learned=kept, libraries=libraries)


def sweep(
    package: str,
    *,
    path: Iterable[str | os.PathLike[str]] = (),
    jobs: int | None = None,
    executor: Executor | None = None,
    driver: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
    json_path: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    preload: str | Sequence[str] | None = "auto",
    fresh: bool = False,
    exclude: Iterable[str] = (),
    own: str | Iterable[str] = (),
    python: str | os.PathLike[str] | None = None,
    adapt: bool = True,
    cuts: bool = False,
    phase: Callable[[str], object] | None = None,
    stage: Callable[[str], object] | None = None,
) -> SweepResult:
    """Scan every submodule of ``package`` alone, ``jobs`` at a time (or on ``executor``).

    Parameters
    ----------
    preload
        What the zygote imports once before forking: ``"auto"`` (torch when
        installed, then the package and its parents), ``"none"``, or module
        names (a list or ``"a,b"``).
    fresh
        Scan every module in its own fresh subkernel instead (slower; no zygote).
    exclude
        Globs on dotted module names (``pkg.tests.*``) left out of the sweep.
    json_path
        A JSON Lines journal: rows are appended as they finish; a rerun keeps
        the rows whose files did not change and scans the rest.  The journal
        is locked while the sweep runs.
    executor
        Any ``concurrent.futures.Executor``: fresh mode submits one task per
        module, zygote mode one task per chunk of modules.
    progress
        ``progress(done, total, row)``, called after each module.
    own
        The user's own packages (names or globs); each row's line to change is
        the last line on its chain in them.  Default: the swept package's top level.
    python
        The interpreter of the subkernels and the zygote (default: this one).
    adapt
        In zygote mode, on a package of at least 100 modules: learn from a
        sample of children which of the package's modules most of them import,
        and preload those too (each checked clean in the zygote);
        ``result.preload_notes`` says what was added and why.  With an
        executor the sample is scanned and each candidate checked on this
        machine first, and every task's zygote imports the checked list.
    cuts
        After the sweep, search and verify the cut of each root cause on one of
        its modules (:func:`diagtools.scan` with ``cuts``): its nearest cut
        becomes the cause's line to change, with how many swept modules it
        reaches.  Each search is a few more subkernel runs per cause.
    phase
        ``phase(text)`` hears what starts before the first row and after the last: finding the modules, the
        preload and the scanning, the cut searches.
    stage
        ``stage(text)`` hears which stage of an adaptive sweep the next rows come from: learning what to
        preload, checking the learned preloads, scanning.
    """
    say = phase or (lambda text: None)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    options = ScanOptions.of(path=tuple(path), driver=driver, timeout=timeout, own=own, python=python)
    say(f"finding the modules of {package}")
    tree = locate_tree(package, options.roots, exclude)
    setup = resolve_driver(driver)  # built once, before the workers start
    seen_driver = setup.info
    plan = _Plan(
        tree.package,
        str(tree.root),
        options,
        jobs or os.cpu_count() or 1,
        None if fresh else _preload_list(tree, options.roots, preload),
        bool(adapt),
    )
    journal = Journal(Path(json_path) if json_path is not None else None, tree.package, options.roots)
    fingerprints = Fingerprints(tree)
    started = time.perf_counter()
    with journal:
        reused = _reuse(journal, fingerprints, options, tree, setup)
        rows = {m: r for m, r in reused.rows.items() if m in tree.files}
        resumed = len(rows)
        run = _Run(tree.modules, rows, journal, fingerprints, progress)
        pending = [m for m in tree.modules if m not in rows]
        rescanned = {m: reused.stale.get(m, "it was not in the journal") for m in pending} if reused.journaled else {}
        if plan.preload is not None and preload in (None, "auto") and pending:
            plan = replace(plan, learned=reused.learned)
        say(_start_words(plan, len(pending), resumed))
        try:
            done = _dispatch(plan, pending, run, executor, tree, stage=stage)
        except KeyboardInterrupt as exc:
            stopped = ZygotePass(plan.preload or (), "", ())
            partial = replace(_result(tree, run, resumed, started, plan=plan, done=stopped), driver=seen_driver)
            raise SweepInterrupted(partial, getattr(exc, "signum", None)) from exc
        journal.remember(Learned(done.learned, done.libraries))
    result = _result(tree, run, resumed, started, plan=plan, done=done)
    result = replace(result, driver=seen_driver, rescanned=rescanned)
    if cuts and result.causes:
        say(f"searching the cuts of {len(result.causes)} root cause(s)")
    return _with_cuts(result, plan) if cuts else result


def _reuse(
    journal: Journal, fingerprints: Fingerprints, options: ScanOptions, tree: SweptTree, setup: DriverSetup
) -> Reused:
    """What the journal (when there is one) gives this run, its rows checked against this run's environment
    (the driver this run resolved included)."""
    if journal.path is None:
        return Reused()
    environment = environment_of(options.python, options.roots, setup, tree.package)
    return journal.reuse(fingerprints, environment)


def _start_words(plan: _Plan, pending: int, resumed: int) -> str:
    """What the sweep does before its first row, in words: the preload is where a zygote spends its first
    seconds (a minute on a large package)."""
    kept = f" ({resumed} kept from the journal)" if resumed else ""
    scanning = f"scanning {pending} module(s), {plan.jobs} at a time{kept}"
    if plan.preload is None or not pending:
        return scanning
    shown = ", ".join(plan.preload[:4]) + (f" and {len(plan.preload) - 4} more" if len(plan.preload) > 4 else "")
    return f"preloading {shown or 'nothing'} in the zygote, then {scanning}"


def _with_cuts(result: SweepResult, plan: _Plan) -> SweepResult:
    """``result`` with a verified cut search for each root cause, made on its representative module."""
    searches = {}
    for cause in result.causes:
        if cause.representative is None:
            continue
        options = replace(plan.options, own=plan.options.own or (plan.package.split(".", 1)[0],))
        scanned = scan_with((cause.representative,), options, sweep=result.rows)
        if scanned.cuts is not None:
            searches[cause.key] = scanned.cuts
    return replace(result, cuts=searches)


def _result(tree: SweptTree, run: _Run, resumed: int, started: float, *, plan: _Plan, done: ZygotePass) -> SweepResult:
    """The rows so far in module order; ``interrupted`` counts the modules without one."""
    ordered = tuple(run.rows[m] for m in tree.modules if m in run.rows)
    mode = "zygote" if plan.preload is not None and done.used else "fresh"
    return SweepResult(
        tree.package,
        ordered,
        resumed,
        time.perf_counter() - started,
        mode,
        done.preload,
        done.fallback,
        interrupted=len(tree.modules) - len(ordered),
        preload_notes=done.notes,
    )


def _dispatch(
    plan: _Plan,
    pending: Sequence[str],
    run: _Run,
    executor: Executor | None,
    tree: SweptTree,
    *,
    stage: Callable[[str], object] | None = None,
) -> ZygotePass:
    if not pending:
        return ZygotePass(plan.preload or (), "", ())
    if plan.preload is None:
        _run_fresh(plan, pending, run, executor)
        return ZygotePass((), "", (), used=False)
    if executor is not None:
        return _run_zygote_chunks(plan, pending, run, executor, tree=tree, stage=stage)
    return _run_zygote_here(plan, pending, run, tree, stage)
