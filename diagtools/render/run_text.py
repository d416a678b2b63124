"""``diagtools run`` results as plain text: the verdict, then each finding with both stacks side by side.

The culprit is told in the scan's own words (:func:`diagtools.render.text.culprit_details`);
identical findings (one cuInit, one fork line, many workers) are one block
with the count and the children's pids; every field the program controls
(paths, source lines, argv, messages) is made terminal-safe.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from diagtools import protocol
from diagtools.model.common import describe_exit
from diagtools.model.cuts import unsearched
from diagtools.model.run import Finding, RunResult
from diagtools.model.scan import Culprit, Site
from diagtools.render.escape import one_line, terminal_safe
from diagtools.render.lines import culprit_details, site_lines, wrapped
from diagtools.render.paths import display_path, shorten_paths, shown_site
from diagtools.render.style import verdict_toned

__all__ = [
    "VERDICT_WORDS",
    "FindingGroup",
    "compact_pids",
    "describe_exit",
    "group_findings",
    "render_run",
    "render_watch",
    "side_by_side",
    "user_site",
]

_COLUMN = 58
_FRAMES = 8
_PIDS_SHOWN = 12
#: a run's verdict in the words every run report says it once: the text, the HTML, the pytest summary
VERDICT_WORDS = {
    "poisoned-fork": "POISONED FORK: a process forked after initializing CUDA (poisoned-fork)",
    "initializes-cuda": "CUDA initialized, no fork after it was seen (initializes-cuda)",
    "clean": "no process initialized CUDA (clean)",
    "unknown": "the run could not see everything, see the notes (unknown)",
}


@dataclass(frozen=True)
class FindingGroup:
    """Findings that differ only in the child: one cuInit, one fork line, one outcome, many children."""

    first: Finding
    children: tuple[int | None, ...]


def user_site(stack: Sequence[Site]) -> Site | None:
    """The innermost frame of the user's own code (the line the user wrote), else of an installed package,
    else the innermost: by :func:`diagtools.protocol.file_kind`, the rule the attribution uses."""
    for wanted in ("user", "installed"):
        frame = next((frame for frame in reversed(stack) if protocol.file_kind(frame.file) == wanted), None)
        if frame is not None:
            return frame
    return stack[-1] if stack else None


def compact_pids(pids: Iterable[int | None], limit: int = _PIDS_SHOWN) -> str:
    """``101-150, 152, 160`` for a list of pids: runs joined, at most ``limit`` pieces, then how many more."""
    runs: list[list[int]] = []
    for pid in sorted({pid for pid in pids if pid is not None}):
        if runs and pid == runs[-1][-1] + 1:
            runs[-1].append(pid)
        else:
            runs.append([pid])
    pieces = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    shown = ", ".join(pieces[:limit])
    return shown + (f", … ({len(pieces) - limit} more)" if len(pieces) > limit else "") if shown else "?"


def _group_key(finding: Finding) -> tuple[object, ...]:
    saw = finding.child_saw.describe() if finding.child_saw is not None else None
    return (finding.kind, finding.pid, finding.start_kind, finding.fork_stack, finding.cuinit, saw, finding.context)


def group_findings(findings: Sequence[Finding]) -> list[FindingGroup]:
    """Identical findings merged, in the order of their first one."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for finding in findings:
        groups.setdefault(_group_key(finding), []).append(finding)
    return [FindingGroup(items[0], tuple(item.child for item in items)) for items in groups.values()]


def _short(site: Site) -> str:
    return f"{os.path.basename(site.file)}:{site.line} {site.function}"


def side_by_side(left_title: str, left: Sequence[Site], right_title: str, right: Sequence[Site]) -> list[str]:
    """Two stacks (innermost frames, outermost first) in two columns."""
    left_rows = [one_line(_short(frame)) for frame in left[-_FRAMES:]]
    right_rows = [one_line(_short(frame)) for frame in right[-_FRAMES:]]
    lines = [f"    {left_title:<{_COLUMN}} | {right_title}"]
    for index in range(max(len(left_rows), len(right_rows))):
        a = left_rows[index] if index < len(left_rows) else ""
        b = right_rows[index] if index < len(right_rows) else ""
        lines.append(f"    {a[:_COLUMN]:<{_COLUMN}} | {b}")
    return lines


def _culprit_lines(cuinit: Culprit | None) -> list[str]:
    if cuinit is None:
        return ["    culprit: seen only through the driver's state (no stack)"]
    return [
        f"    culprit: {one_line(cuinit.module or '(no module was executing)')}",
        *culprit_details(cuinit, indent="      ", headline=unsearched(cuinit.chain), imports=True),
    ]


def _finding_lines(number: int, group: FindingGroup) -> list[str]:
    finding, count = group.first, len(group.children)
    if finding.kind != "poisoned-fork":
        return [f"  finding {number}: CUDA initialized in pid {finding.pid}", *_culprit_lines(finding.cuinit)]
    how = f"({finding.start_kind or 'fork'})"
    if count > 1:
        head = f"poisoned fork x{count}: pid {finding.pid} started children {compact_pids(group.children)} {how}"
    else:
        head = f"poisoned fork: pid {finding.pid} started child {finding.child or '?'} {how}"
    lines = [f"  finding {number}: {head} after initializing CUDA", *_culprit_lines(finding.cuinit)]
    fork_site = user_site(finding.fork_stack)
    if fork_site is not None:
        lines += site_lines("forked at:", shown_site(fork_site))
    if finding.context:
        lines.append(f"    while: {one_line(finding.context)}")
    if finding.child_saw is not None:
        lines += wrapped(f"    the child{'ren' if count > 1 else ''}: {one_line(finding.child_saw.describe())}")
    cuinit_stack = finding.cuinit.stack if finding.cuinit else ()
    lines += side_by_side("cuInit stack", cuinit_stack, "fork stack", finding.fork_stack)
    return lines


def _shown(finding: Finding) -> Finding:
    """``finding`` with the paths its lines show written by the one rule, so a line is wrapped by the width it is
    shown at; the fork stack stays as recorded (:func:`user_site` reads whose code each frame is)."""
    saw = finding.child_saw
    if saw is not None:
        refused = tuple(
            replace(r, site=shown_site(r.site) if r.site else None, stack=tuple(map(shown_site, r.stack)))
            for r in saw.refused
        )
        saw = replace(saw, refused=refused)
    return replace(
        finding,
        cuinit=finding.cuinit.with_sites(shown_site) if finding.cuinit else None,
        child_saw=saw,
    )


def _body(result: RunResult) -> list[str]:
    lines = []
    for number, group in enumerate(group_findings([_shown(f) for f in result.findings]), start=1):
        lines += _finding_lines(number, group)
    return lines


def _home_relative(text: str) -> str:
    return shorten_paths(text, ())


def render_run(result: RunResult) -> str:
    """The report ``diagtools run`` prints on stderr; terminal-safe, paths under home shown with ``~``."""
    forked = sum(1 for record in result.processes if record.via == "fork")
    driver = replace(result.driver, library=display_path(result.driver.library) if result.driver.library else None)
    lines = [
        f"diagtools run: {one_line(result.title)}",
        *wrapped(f"  driver: {one_line(driver.describe())}"),
        f"  command: {describe_exit(result.exitcode)}; {len(result.processes)} Python process(es) watched"
        f" ({forked} forked)",
        f"  verdict: {verdict_toned(result.verdict, VERDICT_WORDS[result.verdict])}",
        *_body(result),
        *(f"  note: {one_line(note)}" for note in result.notes),
    ]
    return terminal_safe(_home_relative("\n".join(lines)))


def render_watch(result: RunResult) -> str:
    """The ``pytest --cuda-watch`` summary: who initialized CUDA during which node, and forks after it."""
    lines = [
        f"verdict: {verdict_toned(result.verdict, VERDICT_WORDS[result.verdict])}",
        *_body(result),
        *(f"note: {one_line(note)}" for note in result.notes),
    ]
    return terminal_safe(_home_relative("\n".join(lines)))
