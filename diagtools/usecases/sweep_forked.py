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

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from diagtools import agents
from diagtools.driver import DriverSetup
from diagtools.model.scan import ScanResult
from diagtools.model.sweep import SCANNING_STAGE, SweepRow
from diagtools.model.verdict import Evidence
from diagtools.runner.subkernel import RawRun, SubkernelRequest
from diagtools.runner.zygote_host import ZygoteOutcome, run_zygote
from diagtools.usecases.assemble import assemble
from diagtools.usecases.options import ScanOptions
from diagtools.usecases.scan import DEFAULT_SETTLE_S, SCAN_PROBE, probe_request
from diagtools.usecases.sweep_discover import SweptTree
from diagtools.usecases.sweep_learning import (
    ADAPT_SHARE,
    Candidates,
    Learned,
    Learner,
    Recorder,
    adapt_notes,
    spread,
)

__all__ = [
    "ADAPT_MIN_MODULES",
    "SWEEP_ZYGOTE",
    "ZygoteJob",
    "ZygotePass",
    "check_preload_here",
    "in_package_deps",
    "package_notes",
    "zygote_pass",
]

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
    passed_over: Mapping[str, str] = field(default_factory=dict)  # candidates not preloaded, and why
    learned: tuple[str, ...] = ()  # what learning added to the preload and kept (libraries among them)
    libraries: tuple[str, ...] = ()
    watched: tuple[str, ...] = ()  # what the preload's zygote watched (ZygoteOutcome.watched_lines), for others


def in_package_deps(tree: SweptTree, files: Sequence[str | None]) -> tuple[str, ...]:
    """The files among ``files`` that lie inside the swept package, relative to its import root."""
    return tuple(sorted({rel for rel in (tree.relative(f) for f in files) if rel is not None}))


def _row(
    module: str,
    raw: RawRun,
    setup: DriverSetup,
    tree: SweptTree,
    inside: Sequence[tuple[str, str | None]],
    *,
    own: tuple[str, ...],
) -> tuple[SweepRow, ScanResult]:
    """The row of a zygote's child; ``inside`` is what its zygote had loaded of the package."""
    result: ScanResult = assemble(raw, (module,), setup.info, own)
    row = SweepRow.from_scan(module, result, raw.started_at, time.time(), mode="zygote")
    files = [node.file for node in result.modules] + [file for _, file in inside]
    return _with_deps(row, in_package_deps(tree, files)), result


class _Ready(Exception):  # noqa: N818 - control flow that stops a zygote, not an error
    """Raised from a zygote's child callback, in a pass that only checks its preload (the rest goes elsewhere),
    once the preload is checked and every row its candidates loaded is in: stops that zygote.  ``outcome`` says
    what it preloaded; ``redo`` are the modules its children left to a fresh scan."""

    def __init__(self, outcome: ZygoteOutcome, redo: tuple[str, ...]) -> None:
        super().__init__("the preload was checked")
        self.outcome, self.redo = outcome, redo


def _with_deps(row: SweepRow, deps: tuple[str, ...]) -> SweepRow:
    return replace(row, deps=deps)


def _needs_fresh_scan(row: SweepRow) -> bool:
    return row.culprit is not None and row.culprit.evidence is Evidence.STATE_PROBE


class _Collector:
    """Turns the zygote's children into rows; remembers the modules a fresh scan must redo."""

    def __init__(
        self,
        modules: Sequence[str],
        setup: DriverSetup,
        tree: SweptTree,
        on_row: Callable[[SweepRow], None],
        *,
        own: tuple[str, ...] = (),
        learner: Learner | None = None,
        stop_when_ready: bool = False,
    ):
        self.modules, self.setup, self.tree, self.on_row, self.own = modules, setup, tree, on_row, own
        self.learner, self.stop_when_ready = learner, stop_when_ready
        self.redo: list[str] = []
        self.given: set[str] = set()  # modules whose row went to ``on_row``
        self.alias_rows: list[tuple[str, str]] = []  # (module, the watched module its child looked up): redone

    def __call__(self, index: int, raw: RawRun | None, outcome: ZygoteOutcome) -> None:
        if raw is not None and index in outcome.looked_up:  # its row made a lookup that calls for a fresh scan
            self.alias_rows.append((self.modules[index], outcome.looked_up[index]))
            self.redo.append(self.modules[index])
        else:
            self._take(index, raw, outcome)
        if self.stop_when_ready and outcome.ready:  # the children forked while preloading were all reaped before
            raise _Ready(outcome, tuple(self.redo))

    def _take(self, index: int, raw: RawRun | None, outcome: ZygoteOutcome) -> None:
        module = self.modules[index]
        if raw is None:
            seconds = dict(outcome.preloaded).get(module, 0.0)
            row = SweepRow.preloaded_in_zygote(module, seconds, time.time())
            self.given.add(module)
            self.on_row(_with_deps(row, in_package_deps(self.tree, [f for _, f in outcome.inside])))
            if self.learner is not None:
                self.learner.observe(module, None)
                self._decide(outcome)
            return
        inside = outcome.inside_of(index)
        row, result = _row(module, raw, self.setup, self.tree, inside, own=self.own)
        if self.learner is not None:
            self.learner.observe(module, result)
        if _needs_fresh_scan(row):
            self.redo.append(module)
        else:
            self.given.add(module)
            self.on_row(row)
        if self.learner is not None:
            self._decide(outcome)

    def _decide(self, outcome: ZygoteOutcome) -> None:
        """Let the learner decide, given what this zygote passed over and what starting another would cost."""
        assert self.learner is not None
        if self.learner.decided:  # every row after the sample's: nothing to add up
            return
        restart_s = sum(seconds for _, seconds in outcome.preloaded)
        rows_left = len(self.modules) - len(self.given) - len(self.redo)
        self.learner.decide(dict(outcome.passed_over), restart_s, rows_left)


def _request(setup: DriverSetup, options: ScanOptions) -> SubkernelRequest:
    """The scan's own request, run by the zygote: each child settles as a fresh scan waits for the threads a
    module started; the preload gets at least :data:`PRELOAD_TIMEOUT_MIN_S`."""
    env = {**{name: os.environ.get(name) or "1" for name in _ONE_THREAD}, **setup.env}
    limit = max(options.timeout, PRELOAD_TIMEOUT_MIN_S)
    return probe_request((), options.roots, env, limit, DEFAULT_SETTLE_S, python=options.python, program=SWEEP_ZYGOTE)


@dataclass(frozen=True)
class _Sweep:
    """What every pass of one sweep shares: the tree, the driver, the limits, where rows go."""

    tree: SweptTree
    setup: DriverSetup
    options: ScanOptions  # each child's timeout, and whose code is the user's
    request: SubkernelRequest
    jobs: int
    on_row: Callable[[SweepRow], None]
    names_imported: tuple[str, ...] = ()  # top-level names the package's sources import (learned candidates)
    watched: tuple[str, ...] = ()  # what a preload checked elsewhere watched (executor tasks)
    stage: Callable[[str], object] = lambda text: None  # hears which stage the next rows come from


@dataclass(frozen=True)
class ZygoteJob:
    """What a zygote pass is given: the tree, each child's options, the driver, the preload, how many
    children at once, where rows go; ``stage`` hears which stage (learning, checking the candidates,
    scanning) the next rows come from; ``learned`` is what an earlier run learned (its modules and, among
    them, its libraries); ``failed_alone`` names modules known to fail to import on their own; ``watched``
    is what the zygote that checked the preload watched (:meth:`ZygoteOutcome.watched_lines`)."""

    tree: SweptTree
    options: ScanOptions
    setup: DriverSetup
    preload: Sequence[str]
    jobs: int
    on_row: Callable[[SweepRow], None]
    stage: Callable[[str], object] | None = None
    learned: tuple[Sequence[str], Sequence[str]] | None = None
    failed_alone: Sequence[str] = ()
    watched: Sequence[str] = ()

    def sweep(self) -> _Sweep:
        """What every pass of this job shares."""
        request = _request(self.setup, self.options)
        shared = _Sweep(
            self.tree, self.setup, self.options, request, self.jobs, self.on_row, watched=tuple(self.watched)
        )
        return shared if self.stage is None else replace(shared, stage=self.stage)

    @property
    def remembered(self) -> bool:
        """Whether an earlier run's learned preload is given (checked as learned, no sample to learn from)."""
        return self.learned is not None and bool(self.learned[0])


def zygote_pass(modules: Sequence[str], job: ZygoteJob, *, adapt: bool = False) -> ZygotePass:
    """Scan ``modules`` in children of a zygote that preloaded ``job.preload``; ``job.on_row`` gets each row.

    With ``adapt`` (and at least :data:`ADAPT_MIN_MODULES` modules), the
    preload grows: see :func:`_adaptive_pass`.  With ``job.learned``, those are
    preloaded at once, checked as learned ones are, whatever the number of
    modules.  A row whose lookup of a module ``job.watched`` names calls for it
    is scanned again in a fresh subkernel.
    """
    sweep = job.sweep()
    if adapt and job.remembered:
        assert job.learned is not None
        return _remembered_pass(sweep, modules, list(job.preload), job.learned, job.failed_alone)
    if adapt and len(modules) >= ADAPT_MIN_MODULES:
        return _adaptive_pass(sweep, modules, list(job.preload))
    return _pass(sweep, modules, list(job.preload))


ADAPT_MIN_MODULES = 100  # below this, learning costs more zygote starts than it saves
ADAPT_SAMPLE = 8  # children observed before choosing what else to preload
ADAPT_MORE_SAMPLE = 16  # children of the zygote that preloads it, observed before choosing more


def _adaptive_pass(sweep: _Sweep, modules: Sequence[str], preload: list[str]) -> ZygotePass:
    """Learn from a sample of children which in-package modules most of them import, then preload those.

    1. A zygote with ``preload`` scans an evenly spread sample first, counting
       the package's modules each child imported (never one on a culprit
       chain); when none is worth preloading, the same zygote goes on with the
       rest, so learning costs nothing more.
    2. Otherwise that zygote is stopped, and one that also preloads the
       candidates scans what is left (children it had in flight included); it checks each
       one clean (no CUDA, no thread) as it preloads, and a refused one is
       dropped with those after it, as for any preload.  A candidate whose own
       row is still to do is scanned by a child forked just before the zygote
       preloads it, so no row is a preloaded one and every row is what a fresh
       subkernel would give.
    3. That zygote scans a second, larger sample first, whose children cost
       little now that the heavy imports are preloaded.  What most of them
       still import is preloaded by a third zygote (the candidates checked
       again, then these), only when it saves the rows left more than that
       zygote's start costs; otherwise the second zygote goes on.

    The first sample is small because each of its children imports the heavy
    modules itself; the second, cheap, catches what a small sample missed.
    """
    sample = spread(modules, ADAPT_SAMPLE)
    learner = _sample_learner(sweep, sample, preload)
    ordered = [*sample, *(m for m in modules if m not in set(sample))]
    record = Recorder(sweep.on_row)
    sweep.stage(f"learning what to preload from {len(sample)} sampled modules")
    try:  # when nothing is worth preloading, the same zygote goes on scanning past the sample
        first = _pass(
            replace(
                sweep,
                on_row=_announcing(record, set(sample), lambda: sweep.stage(SCANNING_STAGE), lambda: learner.decided),
            ),
            ordered,
            preload,
            learner,
        )
    except Learned:
        pass
    else:  # nothing worth preloading: the one zygote scanned everything
        return replace(first, notes=(*adapt_notes(learner, [], first.preload, len(sample)), *first.notes))
    candidates = Candidates.learned_by(learner)
    recording = replace(sweep, on_row=record)
    sweep.stage(candidates.checking)
    rest = [m for m in ordered if m not in record.recorded]
    checked = set(candidates.names)
    pool = [m for m in rest if m not in checked]  # empty when the candidates' rows are all that is left
    more = spread(pool, ADAPT_MORE_SAMPLE) if pool else []
    again = Learner(learner.package, more, ADAPT_SHARE, [*preload, *candidates.names], jobs=sweep.jobs)
    first_of_rest = set(more)
    rest = [*more, *(m for m in rest if m not in first_of_rest)]
    try:
        done = _checked_pass(recording, rest, preload, candidates, failed_alone=record.failed, learner=again)
    except Learned:
        pass
    else:
        outcome = candidates.outcome(done)
        return replace(outcome, notes=(*outcome.notes, again.declined)) if again.declined else outcome
    candidates = candidates.then(Candidates.learned_by(again))
    sweep.stage(candidates.checking)
    rest = [m for m in rest if m not in record.recorded]
    return candidates.outcome(_checked_pass(recording, rest, preload, candidates, failed_alone=record.failed))


def _sample_learner(sweep: _Sweep, sample: Sequence[str], preload: Sequence[str]) -> Learner:
    top = sweep.tree.package.split(".", 1)[0]  # a subpackage's sweep learns from its whole package
    return Learner(top, sample, ADAPT_SHARE, preload)


@dataclass(frozen=True)
class CheckedPreload:
    """A preload learned and checked on the sweeping machine, for zygotes elsewhere (executor tasks) to import
    as given: ``done.preload`` (the list given first, then each kept candidate), with what was learned, kept
    and why; ``done.leftover`` are modules to scan in fresh subkernels here."""

    done: ZygotePass


def check_preload_here(modules: Sequence[str], job: ZygoteJob) -> CheckedPreload | None:
    """Learn a larger preload from a sample of ``modules`` scanned here (or take ``job.learned``, what the
    journal remembers), then check each candidate here as an adaptive sweep does, and stop once the zygote
    is ready: the rest goes elsewhere, where every zygote imports the checked list as given.

    A task could not check a candidate itself: the rows its import loads (each scanned first, and
    failing alone keeps it out) may belong to another task's chunk.  Here every row still to do is in
    reach.  None when there is nothing to add (a small package, nothing common, a refused zygote).
    """
    sweep, preload = job.sweep(), job.preload
    record = Recorder(job.on_row, job.failed_alone)
    sweep = replace(sweep, on_row=record)
    if job.learned is not None and job.remembered:
        candidates = Candidates.remembered(job.learned, preload)
    elif len(modules) >= ADAPT_MIN_MODULES:
        candidates = _learn_from_sample(sweep, modules, preload)
    else:
        return None
    if not candidates.names:
        return None
    sweep.stage(candidates.checking)
    rest = [m for m in modules if m not in record.recorded]
    try:
        done = _checked_pass(sweep, rest, list(preload), candidates, failed_alone=record.failed, stop_when_ready=True)
    except _Ready as ready:
        passed = dict(ready.outcome.passed_over)
        preloaded = {name for name, _ in ready.outcome.preloaded}
        kept = tuple(n for n in [*preload, *candidates.names] if n in preloaded and n not in passed)
        done = ZygotePass(kept, "", ready.redo, passed_over=passed, watched=ready.outcome.watched_lines())
    if not done.used:  # refused here: each task starts from the list given, checked there as any preload
        return None
    return CheckedPreload(candidates.outcome(done))


def _learn_from_sample(sweep: _Sweep, modules: Sequence[str], preload: Sequence[str]) -> Candidates:
    """Scan an evenly spread sample of ``modules`` and no more: the candidates it taught (none when nothing
    is common enough)."""
    sample = spread(modules, ADAPT_SAMPLE)
    learner = _sample_learner(sweep, sample, preload)
    sweep.stage(f"learning what to preload from {len(sample)} sampled modules")
    with contextlib.suppress(Learned):  # raised once the whole sample was seen: that zygote has no more
        _pass(sweep, sample, list(preload), learner)
    if not learner.decided:
        return Candidates((), (), learner)
    return Candidates.learned_by(learner)


def _checked_pass(
    sweep: _Sweep,
    modules: Sequence[str],
    preload: list[str],
    candidates: Candidates,
    *,
    failed_alone: Iterable[str],
    stop_when_ready: bool = False,
    learner: Learner | None = None,
) -> ZygotePass:
    """A zygote that also preloads the candidates, each imported once with a stopped copy of the zygote to go
    back to (the rows still to do that its import loaded, its own included, scanned by that copy; passed over
    when it does harm), then scans the rest of ``modules`` (or, with ``stop_when_ready``, stops there);
    ``learner`` learns from its children what more to preload."""
    learned = (lambda: learner.decided) if learner is not None else (lambda: True)  # its sample is checking
    scanning = _announcing(sweep.on_row, set(candidates.names), lambda: sweep.stage(SCANNING_STAGE), learned)
    return _pass(
        replace(
            sweep,
            names_imported=tuple(sorted(sweep.tree.imported_names)),
            on_row=sweep.on_row if stop_when_ready else scanning,  # stopping there, it never scans the rest
        ),
        modules,
        [*preload, *candidates.names],
        learner,
        scan_first=candidates.names,
        failed_alone=sorted(failed_alone),
        libraries=candidates.libraries,
        stop_when_ready=stop_when_ready,
    )


def _remembered_pass(
    sweep: _Sweep,
    modules: Sequence[str],
    preload: list[str],
    learned: tuple[Sequence[str], Sequence[str]],
    failed_alone: Sequence[str],
) -> ZygotePass:
    """Preload what an earlier run learned, checked as a learned preload is (a candidate whose row is to do
    is scanned first; one that now does harm is passed over), then scan ``modules``: no sample to learn from,
    so a rerun of a few rows pays no learning."""
    candidates = Candidates.remembered(learned, preload)
    sweep.stage(candidates.checking)
    return candidates.outcome(_checked_pass(sweep, modules, preload, candidates, failed_alone=failed_alone))


def _announcing(
    on_row: Callable[[SweepRow], None],
    first: set[str],
    then: Callable[[], object],
    ready: Callable[[], bool] = lambda: True,
) -> Callable[[SweepRow], None]:
    """``on_row`` that calls ``then`` once, at the first row of a module outside ``first`` once ``ready()``."""
    told: list[bool] = []

    def record(row: SweepRow) -> None:
        if not told and row.module not in first and ready():
            told.append(True)
            then()
        on_row(row)

    return record


def _pass(
    sweep: _Sweep,
    modules: Sequence[str],
    preload: list[str],
    learner: Learner | None = None,
    *,
    scan_first: Sequence[str] = (),
    failed_alone: Sequence[str] = (),
    libraries: Sequence[str] = (),
    stop_when_ready: bool = False,
) -> ZygotePass:
    """One zygote over ``modules``, retried with a shorter preload while the zygote refuses one."""
    attempt, notes = list(preload), []
    redo: list[str] = []  # modules a refused zygote's children left to a fresh scan
    tree, setup, request, on_row, own = sweep.tree, sweep.setup, sweep.request, sweep.on_row, sweep.options.own
    jobs, timeout = sweep.jobs, sweep.options.timeout
    while True:
        collector = _Collector(modules, setup, tree, on_row, own=own, learner=learner, stop_when_ready=stop_when_ready)
        outcome = run_zygote(
            request,
            modules,
            preload=attempt,
            package=tree.package,
            probe=SCAN_PROBE,
            jobs=jobs,
            timeout=timeout,
            on_child=collector,
            scan_first=scan_first,
            failed_alone=failed_alone,
            libraries=libraries,
            names_imported=sweep.names_imported,
            watched=sweep.watched,
        )
        if outcome.ready:
            break
        notes.append(outcome.refused)
        redo += collector.redo
        done = collector.given | set(collector.redo)  # what the refused zygote's children scanned: never again
        modules = [module for module in modules if module not in done]
        cut = attempt.index(outcome.refused_item) if outcome.refused_item in attempt else 0
        if cut == 0:
            notes.append("every module was scanned in a fresh subkernel")
            return ZygotePass((), "; ".join(notes), (*modules, *redo), used=False)
        attempt = attempt[:cut]
        notes.append(f"preloaded {', '.join(attempt)} only")
    leftover = [modules[i] for i in outcome.unfinished] + redo + collector.redo
    if outcome.unfinished:
        notes.append(f"{outcome.detail}; those were scanned in fresh subkernels")
    passed = dict(outcome.passed_over)
    used = tuple(name for name in attempt if name not in passed)
    kept = tuple(
        f"{name}: preloaded though its import sets {', '.join(names)}, a name no file a row could run holds"
        for name, names in outcome.environment_kept
    )
    searched = tuple(
        f"{name}: {rows} row(s) still to do were scanned while the search for the names its import sets ran "
        f"({seconds:.1f} s past its own rows)"
        for name, rows, seconds in outcome.scanned_while_searching
    )
    return ZygotePass(
        used,
        "; ".join(notes),
        tuple(leftover),
        notes=(*kept, *searched, *_alias_notes(outcome, collector.alias_rows), *package_notes(outcome, modules)),
        passed_over=passed,
        watched=outcome.watched_lines(),
    )


def _alias_notes(outcome: ZygoteOutcome, rows: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The modules a preload loaded that are watched in every row (the aliases it registered, the modules
    that fail alone it guards): which rows made a lookup of them that sent them to a fresh subkernel."""
    aliases = tuple(
        f"{name or 'the preload'}: preloaded though its import registers a module as {', '.join(names)}; "
        + _looked(
            (row for row, looked in rows if looked in names),
            f"looked {'it' if len(names) == 1 else 'one'} up" + (f" before {name}" if name else ""),
        )
        for name, names in outcome.watching
    )
    guarded = tuple(
        f"{name}: preloaded though it loads {'; '.join(why or module for module, why in modules)}; "
        + _looked(
            (row for row, looked in rows if looked in {module for module, _ in modules}),
            f"imported {'it' if len(modules) == 1 else 'one'} before {name}",
        )
        for name, modules in outcome.guarding
    )
    return (*aliases, *guarded)


def _looked(rows: Iterable[str], did: str = "looked one up") -> str:
    shown = list(rows)
    names = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
    return f"{len(shown)} row(s) {did} and were scanned in fresh subkernels" + (f": {names}" if shown else "")


def package_notes(outcome: ZygoteOutcome, modules: Sequence[str]) -> tuple[str, ...]:
    """How the package zygotes went: the packages imported once for the modules below them, and the rest."""
    done = [p for p in outcome.packages.values() if p.seconds is not None]
    continued = [p for p in done if p.continued]
    whole = [p for p in done if not p.before_cuda and not p.continued]
    beside = [p for p in done if p.before_cuda]
    refused = {i: p for i, p in outcome.packages.items() if p.seconds is None}
    notes = []
    if continued:
        handed = [p for p in continued if p.handed_cuda]
        notes.append(
            f"{len(continued)} package(s) imported once, by their own row, whose process went on to scan the "
            f"{sum(p.served for p in continued)} module(s) below them"
            + (f" ({len(handed)} of them had initialized the simulated driver, handed on to each)" if handed else "")
        )
    if whole:
        notes.append(
            f"{len(whole)} package(s) imported once in a zygote of their own for the "
            f"{sum(p.served for p in whole)} module(s) below them ({sum(p.seconds or 0.0 for p in whole):.1f} s)"
        )
    if beside:
        notes.append(
            f"{len(beside)} package(s) that initialize CUDA: what they import before that "
            f"was imported once for the {sum(p.served for p in beside)} module(s) below them"
        )
    if refused:
        shown = ", ".join(f"{modules[i]} ({p.refused})" for i, p in list(refused.items())[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        notes.append(f"{len(refused)} package(s) imported in each child below them: {shown}{more}")
    return tuple(notes)
