"""What a postmortem says, before it is written: the analysis's results and the sentences made of them.

:class:`Postmortem` holds the scans, the replay, the fix and the timing; its
methods choose the line to change (by the one rule), the summary's sentences,
the timeline and the source excerpt.  :mod:`diagtools.render.postmortem`
writes it as HTML and Markdown.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import Any

from diagtools.model.bisect import BisectResult
from diagtools.model.cuts import Headline, headline
from diagtools.model.diff import ScanDiff, diff_scans
from diagtools.model.fix import FixResult
from diagtools.model.replay import ReplayComparison
from diagtools.model.scan import Culprit, ScanResult, Site
from diagtools.render.lines import headline_words
from diagtools.render.paths import shareable
from diagtools.render.text import terminal_safe

__all__ = ["Postmortem"]


@dataclass(frozen=True)
class Postmortem:
    """What the postmortem is made of; ``after`` and ``replay`` are optional.

    The scans are kept as given; :attr:`shown_before` and :attr:`shown_after`
    are their shareable copies (relative paths, no driver cache path) that
    every section renders.
    """

    title: str
    before: ScanResult
    after: ScanResult | None = None
    replay: ReplayComparison | None = None
    fix: FixResult | None = None
    bisect: BisectResult | None = None
    bench_rows: tuple[dict[str, Any], ...] = ()
    bench_note: str = ""
    bench_device: str = ""

    def __post_init__(self) -> None:
        if self.bench_device.strip().lower() == "cpu" and self.bench_rows:  # CPU times mean nothing in a postmortem
            note = "Measured on a CPU only, where kernel times are not meaningful: none are shown."
            object.__setattr__(self, "bench_rows", ())
            object.__setattr__(self, "bench_note", note)

    @property
    def target(self) -> str:
        return " ".join(self.before.targets)

    @property
    def shown_before(self) -> ScanResult:
        return shareable(self.before)

    @property
    def shown_after(self) -> ScanResult | None:
        return shareable(self.after) if self.after is not None else None

    @property
    def diff(self) -> ScanDiff | None:
        after = self.shown_after
        return diff_scans(self.shown_before, after) if after is not None else None

    def impact(self) -> list[str]:
        """What failed, for whom, and what the fix changed for them: one sentence each, from the replay when one
        ran (never claimed without it)."""
        target = _code(self.target)
        said = []
        if self.replay is not None:
            said += _replay_impact(self.replay, target)
        elif self.before.cuda_initialized:
            said.append(
                f"Not replayed in this analysis: a process forked after importing {target} holds a driver it cannot "
                f"use (`diagtools replay {self.target}` shows the failure)."
            )
        if self.before.cuda_initialized:
            said.append(
                f"Who is hit: every process that forks after importing {target}: vLLM's EngineCore workers started "
                "with `multiprocessing` fork, `multiprocessing` fork pools, pytest-forked tests, servers that fork "
                "workers. Children started with spawn or forkserver start a fresh interpreter and are not hit."
            )
        return said

    def incident(self) -> list[tuple[str, str]]:
        """(when, what) for the incident itself: the last good and first bad commits when a bisect found them,
        the fix and the guard; empty when neither a bisect nor a fix is at hand."""
        if self.bisect is None and self.diff is None and self.fix is None:
            return []
        events = _bisect_events(self.bisect) if self.bisect is not None else []
        if self.diff is not None or self.fix is not None:
            events.append(("the fix", _the_fix(self)))
        events.append(("the guard", f"`diagtools scan {self.target} --fail-on-cuda` in CI keeps it fixed"))
        return events

    def timeline(self) -> list[tuple[str, str]]:
        """(time, what happened) for each analysis step, in the order they ran."""
        events = [(self.before.started_at, f"scan before the fix: {_verdict(self.before)}")]
        if self.replay is not None:
            for label, run in self.replay.runs:
                events.append((run.started_at, f"replay {label}/{run.start_method}: {run.status}"))
        if self.after is not None:
            events.append((self.after.started_at, f"scan after the fix: {_verdict(self.after)}"))
        return sorted(events, key=lambda event: event[0])  # stable: same instant keeps the order the steps ran

    @property
    def headline(self) -> Headline:
        """The line to change by the one rule: the regression edge against the fixed tree when one is compared,
        else the nearest verified cut (of the fix, or of the scan); paths as a reader sees them."""
        fixed = shareable(self.fix.scan) if self.fix is not None else None
        return _chosen_headline(self.shown_before, self.shown_after, fixed)

    @property
    def change(self) -> str:
        """The change shown under "How to fix": the diff of the compared trees' changed files, else the patch."""
        if self.after is not None:
            from diagtools.usecases.fix import changed_files

            return changed_files(self.before, self.after)
        return self.fix.patch if self.fix is not None else ""

    def guard_snippet(self) -> str:
        from diagtools.usecases.fix import guard_test

        test = self.fix.guard if self.fix is not None else guard_test(self.target)
        name = self.fix.guard_file if self.fix is not None else f"test_{self.target.replace('.', '_')}_cuda_free.py"
        return f"# tests/{name}\n{test}\n# CI step\ndiagtools scan {self.target} --fail-on-cuda --no-cuts\n"

    def summary(self) -> list[tuple[str, str]]:
        """(heading, one or two sentences): what broke, the line to change, the fix, the guard."""
        before, culprit = self.shown_before, self.shown_before.culprit
        items = [("What broke", _what_broke(self, before, culprit))]
        line = _line_to_change(self.headline, culprit)
        items.append(("The line to change", line or "no culprit line was recorded"))
        items.append(("The fix", _the_fix(self)))
        items.append(
            (
                "The guard",
                f"`diagtools scan {self.target} --fail-on-cuda` in CI, and a test calling "
                f"`assert_import_cuda_free({self.target!r})` (below).",
            )
        )
        return items

    def marked_line(self) -> Site | None:
        """The line the source excerpt is centred on: the line to change, else where CUDA was initialized."""
        line = self._raw_headline().line
        if line is not None:
            return line
        culprit = self.before.culprit
        return culprit.initialized_at if culprit is not None else None

    def _raw_headline(self) -> Headline:
        """:attr:`headline` with the files as scanned (absolute), to read the source from."""
        return _chosen_headline(self.before, self.after, self.fix.scan if self.fix is not None else None)

    def source_context(self) -> list[tuple[int, str]]:
        """The line to change and three lines either side, read from the scanned file."""
        site = self.marked_line()
        return [] if site is None else _source_context(site.file, site.line)


def _code(text: object) -> str:
    """Inline Markdown code that no backtick inside the text can close early."""
    flat = terminal_safe(str(text)).replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or fence != "`" else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~])")
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def _md_text(text: str) -> str:
    """Prose for Markdown: ``code`` spans kept, every other character Markdown would read as markup escaped.

    ``package __init__`` would otherwise render as "package **init**".
    """
    out, position = [], 0
    for span in _CODE_SPAN.finditer(text):
        out += [_MD_SPECIAL.sub(r"\\\1", text[position : span.start()]), span.group(0)]
        position = span.end()
    return "".join([*out, _MD_SPECIAL.sub(r"\\\1", text[position:])])


def _chosen_headline(before: ScanResult, after: ScanResult | None, fixed: ScanResult | None) -> Headline:
    """The one rule, on these scans: the regression edge against ``after``, else the fix's verified cut, else the
    scan's own headline."""
    if after is not None:
        diff = diff_scans(before, after)
        if diff.regression is not None:
            return diff.headline
    if fixed is not None and fixed.cuts is not None and fixed.cuts.nearest is not None:
        return headline(fixed.cuts)
    return before.headline


def _line_to_change(head: Headline, culprit: Culprit | None) -> str:
    """The line to change by the one rule, and where CUDA was initialized, once each."""
    at = culprit.initialized_at if culprit is not None else None
    initialized = ""
    if at is not None and culprit is not None:
        initialized = f"CUDA initialized at {_code(f'{at.file}:{at.line}')} in {_code(culprit.module)}"
        initialized += f": {_code(at.source.strip())}" if at.source.strip() else ""
    if head.line is None:
        return f"none verified ({head.reason}); {initialized}" if initialized else ""
    site = head.line
    words = headline_words(head)  # the words every report uses for the rule that chose it
    said = f"{_code(f'{site.file}:{site.line}')}: {_code(site.source.strip())} ({words})"
    same = at is not None and (at.file, at.line) == (site.file, site.line)
    return said if same or not initialized else f"{said}; {initialized}"


def _what_broke(report: Postmortem, before: ScanResult, culprit: Culprit | None) -> str:
    if not before.cuda_initialized:
        return f"Importing {_code(report.target)} did not initialize CUDA in this analysis ({before.verdict})."
    who = f" through {_code(culprit.module)}" if culprit and culprit.module else ""
    text = f"Importing {_code(report.target)} initializes the CUDA driver{who}, so a process forked after that import "
    if report.replay is not None and any(r.reproduced for _, r in report.replay.runs):
        run = next(r for _, r in report.replay.runs if r.reproduced)
        error = f" ({_code(run.child.short().removeprefix('fails: '))})" if run.child is not None else ""
        return text + f"gets a poisoned driver{error}. {report.replay.headline()}."
    return (
        text + "gets a poisoned driver (CUDA_ERROR_NOT_INITIALIZED, 'Cannot re-initialize CUDA in forked subprocess')."
    )


def _the_fix(report: Postmortem) -> str:
    diff = report.diff
    if diff is None and report.fix is not None and report.fix.patch:
        check = "verified: with it the import scans clean and every re-exported name resolves"
        state = check if report.fix.verified else "NOT verified (see its check)"
        return f"the patch under How to fix, {state}."
    if diff is None:
        return "not analysed yet: scan the fixed tree and pass it as `after`, or pass `fix=diagtools.fix(...)`."
    if diff.fixed and diff.regression is not None:
        found = diff.regression
        where = _code(f"{found.line.file}:{found.line.line}")
        what = (
            f"{_code(found.edge.importer)} no longer imports {_code(found.edge.imported)} at import time ({where})"
            if found.edge is not None
            else f"the culprit's own line {where} no longer runs at import"
        )
        return (
            f"{what}; after the fix the import initializes no CUDA and {len(diff.removed_modules)} modules are no "
            "longer imported (the change is under How to fix)."
        )
    return diff.summary()


def _verdict(result: ScanResult) -> str:
    if result.verdict == "unknown":
        return "unknown: " + "; ".join(result.doubts())
    if not result.cuda_initialized:
        return "CUDA not initialized"
    culprit = result.culprit
    return f"CUDA initialized by {culprit.module}" if culprit else "CUDA initialized"


def _replay_impact(replay: ReplayComparison, target: str) -> list[str]:
    """What the replay saw fail, and how the last variant (the fix) fared: only what ran is said."""
    said = []
    first, last = replay.variants[0], replay.variants[-1]
    failed = [run for run in replay.runs_of(first) if run.reproduced]
    if failed:
        child = failed[0].child
        error = child.short().removeprefix("fails: ").removeprefix("failed: ") if child is not None else "failed"
        methods = ", ".join(sorted({r.start_method for r in failed}))
        said.append(f"What failed: a child started with {methods} after importing {target} ({first}): {_code(error)}.")
    else:
        said.append(f"The replay of {first} reproduced no failure of a forked child.")
    if last != first:
        passed = all(run.child is not None and run.child.status == "ok" for run in replay.runs_of(last))
        state = "every child works" if passed else "not every child works (see Replay)"
        said.append(f"After the fix ({last}): {state}.")
    return said


def _bisect_events(found: BisectResult) -> list[tuple[str, str]]:
    events = [(f"commit {found.good[:12]}", f"last known good: importing {_code(found.target)} initialized no CUDA")]
    if found.first_bad is not None:
        line = found.headline.line
        added = f"; the line it added to the chain: {_code(f'{line.file}:{line.line}')}" if line is not None else ""
        events.append((f"commit {found.first_bad[:12]}", f"first bad commit: {_code(found.subject)}{added}"))
    elif found.candidates:
        shown = ", ".join(commit[:12] for commit in found.candidates)
        events.append(("commits", f"the first bad commit is one of {shown} (skips hid which)"))
    events.append((f"commit {found.bad[:12]}", "the failing state that was bisected"))
    return events


def _source_context(file: str, line: int, around: int = 3) -> list[tuple[int, str]]:
    first = max(1, line - around)
    return [
        (n, linecache.getline(file, n).rstrip("\n"))
        for n in range(first, line + around + 1)
        if linecache.getline(file, n)
    ]
