"""``diagtools run`` results as self-contained HTML (notebooks and ``--html``); every label escaped."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence

from diagtools.model.cuts import unsearched
from diagtools.model.run import RunResult
from diagtools.model.scan import Culprit, Site
from diagtools.model.verdict import VERDICT_TONES, Tone, Verdict
from diagtools.render.html import culprit_html
from diagtools.render.paths import shorten_paths
from diagtools.render.run_text import FindingGroup, compact_pids, describe_exit, group_findings, user_site
from diagtools.render.style import HTML_COLOURS

__all__ = ["run_html", "run_page"]


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _stack_cell(stack: Sequence[Site]) -> str:
    rows = "".join(
        f"<div><code>{_esc(frame.file)}:{frame.line}</code> in <b>{_esc(frame.function)}</b>"
        + (f"<br><code style='color:#444'>{_esc(frame.source)}</code>" if frame.source else "")
        + "</div>"
        for frame in stack
    )
    return f"<td style='vertical-align:top;font-size:90%'>{rows or '<i>no stack</i>'}</td>"


def _cuinit_html(cuinit: Culprit | None) -> str:
    """The culprit in the scan's own words and layout (:func:`~diagtools.render.html.culprit_html`)."""
    if cuinit is None:
        return "<p>culprit: seen only through the driver's state.</p>"
    context = f"<p>While: <code>{_esc(cuinit.context)}</code></p>" if cuinit.context else ""
    return culprit_html(cuinit, unsearched(cuinit.chain)) + context


def _finding_html(group: FindingGroup) -> str:
    finding, count = group.first, len(group.children)
    if finding.kind != "poisoned-fork":
        return f"<h4>CUDA initialized in pid {finding.pid}</h4>{_cuinit_html(finding.cuinit)}"
    fork_site = user_site(finding.fork_stack)
    forked = f" at <code>{_esc(fork_site)}</code>: <code>{_esc(fork_site.source)}</code>" if fork_site else ""
    saw = f"<p>The child: {_esc(finding.child_saw.describe())}</p>" if finding.child_saw else ""
    cuinit_stack = finding.cuinit.stack if finding.cuinit else ()
    return (
        f"<h4 style='color:{HTML_COLOURS[Tone.BAD]}'>Poisoned fork{f' x{count}' if count > 1 else ''}: "
        f"pid {finding.pid} started "
        f"{_children(group)}"
        f" ({_esc(finding.start_kind or 'fork')}) after initializing CUDA</h4>"
        f"{_cuinit_html(finding.cuinit)}<p>Forked{forked}</p>{saw}"
        "<table style='border-collapse:collapse'><tr><th>cuInit stack</th><th>fork stack</th></tr>"
        f"<tr>{_stack_cell(cuinit_stack)}{_stack_cell(finding.fork_stack)}</tr></table>"
    )


def _children(group: FindingGroup) -> str:
    if len(group.children) > 1:
        return f"children {_esc(compact_pids(group.children))}"
    return f"child {_esc(group.first.child or '?')}"


def _script_folders(result: RunResult) -> list[str]:
    """Folders of the scripts the command names (even removed since): paths under them are shown relative."""
    named = [arg for arg in result.command if os.path.isfile(arg) or (os.path.isabs(arg) and arg.endswith(".py"))]
    return [os.path.dirname(os.path.abspath(arg)) for arg in named]


def run_html(result: RunResult) -> str:
    """An HTML fragment: the verdict, each finding with both stacks side by side, the notes.

    Paths are shown relative to the command's script folders and with ``~``
    for home, so the fragment can be pasted into a report.
    """
    color = HTML_COLOURS[VERDICT_TONES[Verdict(result.verdict)]]
    findings = "".join(_finding_html(group) for group in group_findings(result.findings))
    notes = "".join(f"<li>{_esc(note)}</li>" for note in result.notes)
    return shorten_paths(_run_fragment(result, color, findings, notes), _script_folders(result))


def _run_fragment(result: RunResult, color: str, findings: str, notes: str) -> str:
    return (
        "<div class='diagtools-run'>"
        f"<p><code>{_esc(result.title)}</code>: {_esc(describe_exit(result.exitcode))}; "
        f"{len(result.processes)} Python process(es) watched; driver: {_esc(result.driver.describe())}</p>"
        f"<p style='color:{color};font-weight:bold'>verdict: {_esc(result.verdict)}</p>"
        f"{findings}{f'<ul>{notes}</ul>' if notes else ''}</div>"
    )


def run_page(result: RunResult) -> str:
    """A whole HTML page for ``--html``."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>diagtools run</title></head>"
        f"<body style='font-family:sans-serif'>{run_html(result)}</body></html>\n"
    )
