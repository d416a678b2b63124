"""``diagtools run`` results as self-contained HTML (notebooks and ``--html``); every label escaped."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence

from diagtools.model.cuts import unsearched
from diagtools.model.run import RunResult
from diagtools.model.scan import Culprit, Site
from diagtools.model.verdict import VERDICT_TONES, Verdict
from diagtools.render.html import culprit_html
from diagtools.render.paths import shorten_paths
from diagtools.render.run_text import (
    VERDICT_WORDS,
    FindingGroup,
    compact_pids,
    describe_exit,
    group_findings,
    user_site,
)
from diagtools.render.style import HTML_COLOURS

__all__ = ["run_html", "run_page"]


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _breakable(path: str) -> str:
    """``path`` escaped, breakable after each ``/`` and ``.`` only, so a narrow page never cuts a name."""
    return _esc(path).replace("/", "/<wbr>").replace(".", ".<wbr>")


def _stack_block(title: str, stack: Sequence[Site]) -> str:
    """A stack as a list under its title, frames left-aligned, each statement on its own unwrapped line (it
    scrolls in its own box): a stack is read top to bottom, never in a narrow column beside another."""
    frames = "".join(
        f"<li><code>{_breakable(frame.file)}:{frame.line}</code> in <b>{_esc(frame.function)}</b>"
        + (
            f"<div style='overflow-x:auto'><code style='white-space:pre;color:#444'>{_esc(frame.source)}</code></div>"
            if frame.source
            else ""
        )
        + "</li>"
        for frame in stack
    )
    body = f"<ol style='margin:.2em 0;padding-left:1.6em'>{frames}</ol>" if frames else "<p><i>no stack</i></p>"
    return f"<div style='text-align:left;overflow-wrap:normal;word-break:normal'><b>{_esc(title)}</b>{body}</div>"


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
        f"<h4>{'Forks' if count > 1 else 'Fork'}: pid {finding.pid} started {_children(group)}"
        f" ({_esc(finding.start_kind or 'fork')}) after initializing CUDA</h4>"
        f"{_cuinit_html(finding.cuinit)}<p>Forked{forked}</p>{saw}"
        f"{_stack_block('cuInit stack (outermost first)', cuinit_stack)}"
        f"{_stack_block('fork stack (outermost first)', finding.fork_stack)}"
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
        f"{len(result.processes)} Python process(es) watched; driver: {_esc(_shared_driver(result))}</p>"
        f"<p style='color:{color};font-weight:bold'>verdict: {_esc(VERDICT_WORDS[result.verdict])}</p>"
        f"{findings}{f'<ul>{notes}</ul>' if notes else ''}</div>"
    )


def _shared_driver(result: RunResult) -> str:
    """The driver in words, without the cache path a machine built it at: the fragment is pasted elsewhere."""
    from dataclasses import replace

    return replace(result.driver, library=None).describe()


def run_page(result: RunResult) -> str:
    """A whole HTML page for ``--html``."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>diagtools run</title></head>"
        f"<body style='font-family:sans-serif'>{run_html(result)}</body></html>\n"
    )
