"""``diagtools run`` results as plain text: the verdict, then each finding with both stacks side by side."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from diagtools.model.run import CudaInit, Finding, RunResult
from diagtools.model.scan import Site

__all__ = ["describe_exit", "render_run", "render_watch", "side_by_side", "user_site"]

_STDLIB = os.path.dirname(os.path.abspath(os.__file__))
_COLUMN = 58
_FRAMES = 8
_VERDICTS = {
    "poisoned-fork": "POISONED FORK: a process forked after initializing CUDA",
    "initializes-cuda": "CUDA initialized (no fork after it was seen)",
    "clean": "clean: no process initialized CUDA",
    "unknown": "unknown: the run could not see everything (see notes)",
}


def user_site(stack: Sequence[Site]) -> Site | None:
    """The innermost frame outside the standard library (the line the user wrote), else the innermost."""
    for frame in reversed(stack):
        if not frame.file.startswith(_STDLIB) and not frame.file.startswith("<frozen"):
            return frame
    return stack[-1] if stack else None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _short(site: Site) -> str:
    return f"{os.path.basename(site.file)}:{site.line} {site.function}"


def side_by_side(left_title: str, left: Sequence[Site], right_title: str, right: Sequence[Site]) -> list[str]:
    """Two stacks (innermost frames, outermost first) in two columns."""
    left_rows = [_short(frame) for frame in left[-_FRAMES:]]
    right_rows = [_short(frame) for frame in right[-_FRAMES:]]
    lines = [f"    {left_title:<{_COLUMN}} | {right_title}"]
    for index in range(max(len(left_rows), len(right_rows))):
        a = left_rows[index] if index < len(left_rows) else ""
        b = right_rows[index] if index < len(right_rows) else ""
        lines.append(f"    {a[:_COLUMN]:<{_COLUMN}} | {b}")
    return lines


def _cuinit_lines(cuinit: CudaInit | None) -> list[str]:
    if cuinit is None:
        return ["    CUDA initialized: seen only through the driver's state (no stack)"]
    chain = " -> ".join(cuinit.chain) or "-"
    lines = [f"    CUDA initialized by: {cuinit.module or '?'}  (phase {cuinit.phase}, {cuinit.thread})"]
    lines.append(f"      chain: {chain}")
    if cuinit.context:
        lines.append(f"      while: {cuinit.context}")
    change, initialized = cuinit.line_to_change, cuinit.initialized_in
    via = cuinit.site if cuinit.site not in (change, initialized) else None
    for label, site in (("line to change", change), ("initialized in", initialized), ("via", via)):
        if site is not None:
            lines.append(f"      {label}: {site}")
            if site.source:
                lines.append(f"        {site.line} | {site.source}")
    return lines


def _finding_lines(number: int, finding: Finding) -> list[str]:
    if finding.kind != "poisoned-fork":
        return [f"  finding {number}: CUDA initialized in pid {finding.pid}", *_cuinit_lines(finding.cuinit)]
    lines = [
        f"  finding {number}: poisoned fork: pid {finding.pid} started child {finding.child or '?'} "
        f"({finding.start_kind or 'fork'}) after initializing CUDA"
    ]
    lines += _cuinit_lines(finding.cuinit)
    fork_site = user_site(finding.fork_stack)
    if fork_site is not None:
        lines.append(f"    forked at: {fork_site}")
        if fork_site.source:
            lines.append(f"        {fork_site.line} | {fork_site.source}")
    if finding.context:
        lines.append(f"      while: {finding.context}")
    if finding.child_saw is not None:
        lines.append(f"    the child: {finding.child_saw.describe()}")
    cuinit_stack = finding.cuinit.stack if finding.cuinit else ()
    lines += side_by_side("cuInit stack", cuinit_stack, "fork stack", finding.fork_stack)
    return lines


def render_run(result: RunResult) -> str:
    """The report ``diagtools run`` prints on stderr."""
    forked = sum(1 for record in result.processes if record.via == "fork")
    lines = [
        f"diagtools run: {shlex.join(result.command)}",
        f"  driver: {result.driver.describe()}",
        f"  command: {describe_exit(result.exitcode)}; {len(result.processes)} Python process(es) watched"
        f" ({forked} forked)",
        f"  verdict: {_VERDICTS.get(result.verdict, result.verdict)}",
    ]
    for number, finding in enumerate(result.findings, start=1):
        lines += _finding_lines(number, finding)
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines)


def render_watch(result: RunResult) -> str:
    """The ``pytest --cuda-watch`` summary: who initialized CUDA during which node, and forks after it."""
    lines = [f"verdict: {_VERDICTS.get(result.verdict, result.verdict)}"]
    for number, finding in enumerate(result.findings, start=1):
        lines += _finding_lines(number, finding)
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)
