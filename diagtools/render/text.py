"""Terminal rendering of a scan, a replay, a comparison and a diff.

Everything here may carry text the target controls, so every public function
returns text escaped by :mod:`diagtools.render.escape`.  The pieces a report
is made of are in :mod:`diagtools.render.lines`; the sweep's tables in
:mod:`diagtools.render.sweep_text`; colour in :mod:`diagtools.render.style`.
The names those modules define are also found here, where callers first met them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools.model.verdict import Tone
from diagtools.render.escape import _safe, one_line, terminal_safe
from diagtools.render.lines import (
    OUTCOME_WORDS,
    _cuda_lines,
    _culprit_lines,
    _driver_text,
    _error_lines,
    culprit_details,
    cut_lines,
    headline_words,
    hook_note,
    site_lines,
    text_table,
    wrapped,
)
from diagtools.render.paths import display_path, shareable
from diagtools.render.style import paint, toned, use_color, verdict_toned
from diagtools.render.sweep_text import render_baseline, render_bisect, render_guard_failure, render_sweep

if TYPE_CHECKING:
    from collections.abc import Sequence

    from diagtools.model.diff import ScanDiff
    from diagtools.model.replay import ChildOutcome, ParentState, ReplayComparison, ReplayResult
    from diagtools.model.scan import ScanResult, Site
    from diagtools.render.ordering import GroupLine, ModuleGroups

__all__ = [  # the renderers, and the pieces callers first found here
    "OUTCOME_WORDS",
    "culprit_details",
    "cut_lines",
    "one_line",
    "paint",
    "render_baseline",
    "render_bisect",
    "render_comparison",
    "render_diff",
    "render_guard_failure",
    "render_replay",
    "render_scan",
    "render_sweep",
    "render_verdict",
    "scan_title",
    "terminal_safe",
    "text_table",
    "use_color",
]

_one_line = one_line


@_safe
def scan_title(targets: Sequence[str]) -> str:
    """A scan report's first line: what was scanned (printed at once by a command, before the scan ends)."""
    return f"diagtools scan {' '.join(map(_one_line, targets))}"


@_safe
def render_scan(result: ScanResult, *, stack: bool = False, title: bool = True) -> str:
    """A short report a person can act on; ``stack`` adds the whole Python stack; every path by the one rule;
    ``title=False`` leaves out the first line (:func:`scan_title`) for a command that printed it already."""
    result = shareable(result, library=True)
    lines = [
        *([scan_title(result.targets)] if title else []),
        *wrapped(f"  driver: {_one_line(_driver_text(result))}"),
        f"  status: {result.status}  ({len(result.modules)} modules imported in {result.duration_s:.2f} s)",
    ]
    lines += _error_lines(result)
    lines += _cuda_lines(result)
    for index, culprit in enumerate(result.culprits):
        lines += _culprit_lines(culprit, stack=stack, headline=result.headline if index == 0 else None)
    note = hook_note(result)
    if note:
        lines.append(f"  note: {note}")
    if result.cuts is not None and result.cuda_initialized:
        lines += cut_lines(result)
    if result.skipped_events:
        lines.append(f"  note: {result.skipped_events} malformed event line(s) from the subkernel were skipped")
    return "\n".join(lines)


@_safe
def render_replay(result: ReplayResult) -> str:
    """The replay as a transcript: setup, parent state, child outcome, driver answers."""
    lines = [
        f"diagtools replay {result.target} --start-method {result.start_method} --child {result.child_action}",
        *wrapped(f"  driver: {_one_line(_driver_text(result))}"),
        f"  {toned(*result.headline())}",
        f"  status: {result.status}; the import {_import_verdict(result)}",
    ]
    if result.error is not None:
        lines.append(f"  error: {result.error.message}")
    if result.parent is not None:
        lines += _parent_lines(result.parent)
    if result.child is not None:
        lines += _child_lines(result.child, result.driver.kind)
    return "\n".join(lines)


def _import_verdict(result: ReplayResult) -> str:
    """What the replay says about the import itself (not about this child)."""
    if result.parent is None:
        return toned("was not judged", Tone.UNKNOWN)
    if result.parent.cuda_initialized:
        return toned("initializes CUDA", Tone.BAD)
    return toned("does not initialize CUDA", Tone.GOOD)


def _parent_lines(parent: ParentState) -> list[str]:
    state = _parent_state(parent)
    lines = [f"  parent: {state} (driver answered {parent.driver_state}); {len(parent.threads)} thread(s)"]
    if parent.torch_cuda_initialized is not None:
        lines.append(f"    torch.cuda initialized: {parent.torch_cuda_initialized}")
    return lines


def _parent_state(parent: ParentState | None) -> str:
    if parent is None:
        return "?"
    if parent.cuda_initialized:
        return toned("CUDA initialized", Tone.BAD)
    return toned("CUDA not initialized", Tone.GOOD)


def _child_cell(child: ChildOutcome | None) -> str:
    """A child's outcome in a few words: red when it failed as a poisoned driver makes it fail, green when it worked."""
    if child is None:
        return "no child"
    tone = Tone.GOOD if child.status == "ok" else Tone.BAD if child.status == "failed" else Tone.UNKNOWN
    return toned(_one_line(child.short()), tone)


def _child_lines(child: ChildOutcome, driver_kind: str) -> list[str]:
    lines = [f"  child: {_child_cell(child)}  (exit code {child.exitcode})"]
    for call in child.driver_calls:
        lines.append(f"    {call.call} -> {call.name} ({call.code}) [{driver_kind} driver]")
    shown = child.shown_traceback.strip()
    if shown and child.status != "ok" and not child.driver_calls:
        lines.append("    " + _one_line(shown.splitlines()[-1]))
    return lines


@_safe
def render_comparison(comparison: ReplayComparison) -> str:
    """A variant x start-method grid, the parent's CUDA state per variant, then the verdict as bullets."""
    methods = comparison.start_methods
    rows = []
    for variant in comparison.variants:
        state = _parent_state(comparison.runs_of(variant)[0].parent)
        cells = [comparison.run(variant, method).child for method in methods]
        rows.append([variant, state, *(_child_cell(cell) for cell in cells)])
    lines = [f"diagtools replay {comparison.target} --compare"]
    lines += ["  " + line for line in text_table(["variant", "parent", *methods], rows)]
    lines += render_verdict(comparison).splitlines()
    return "\n".join(lines)


def render_verdict(comparison: ReplayComparison) -> str:
    """The comparison's verdict as a short headline and one bullet per finding."""
    _, *findings = comparison.explanation()
    headline = "; ".join(toned(text, tone) for text, tone in comparison.headline_parts())
    return "\n".join([f"  {headline}", *(f"    - {finding}" for finding in findings)])


@_safe
def render_diff(diff: ScanDiff, *, limit: int = 20) -> str:
    """The verdict, the edge the fix cut, and what left or joined the import tree, most relevant first.

    The culprit chain and the target's own package are listed one per line
    (up to ``limit``); other packages get one line each with their count, the
    standard library one line in all.
    """
    lines = wrapped(f"diagtools diff: {diff.summary()}")
    lines.append(f"  verdict: {verdict_toned(diff.verdict)}")
    head = diff.headline
    if head.line is not None:
        lines += site_lines(f"line to change ({headline_words(head)}):", _shown_site(head.line), "  ")
    for label, scan in (("before:", diff.before), ("after: ", diff.after)):
        culprit = scan.culprit
        if culprit is None:
            continue
        via = " -> ".join(map(_one_line, culprit.chain))
        lines += wrapped(f"  {label} culprit {_one_line(culprit.module)} via {via}")
        if culprit.initialized_at is not None:
            lines += site_lines("CUDA initialized at:", _shown_site(culprit.initialized_at), "    ")
    from diagtools.render.ordering import group_modules  # a diff's grouping: a scan's report does not need it

    chain = diff.before.culprit.chain if diff.before.culprit else ()
    for label, names, sign in (
        ("no longer imported", diff.removed_modules, "-"),
        ("newly imported", diff.added_modules, "+"),
    ):
        groups = group_modules(names, targets=diff.before.targets, chain=chain)
        lines.append(f"  modules {label}: {groups.total}")
        lines += _group_lines(groups, sign, limit)
    return "\n".join(lines)


def _shown_site(site: Site) -> Site:
    """``site`` with its path as a reader sees it (repository-relative, ``~`` for home)."""
    return replace(site, file=display_path(site.file))


def _group_lines(groups: ModuleGroups, sign: str, limit: int) -> list[str]:
    def text(line: GroupLine) -> str:
        if line.name is None:
            return line.words
        gap = "  " if line.words.startswith("(") else ""
        return f"{_one_line(line.name)}{gap}{line.words}"

    return [f"    {sign} {text(line)}" for line in groups.shown(limit)]
