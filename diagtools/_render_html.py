"""HTML rendering for notebooks and reports: every user-controlled string is escaped."""

from __future__ import annotations

from html import escape

from diagtools._diff import ScanDiff
from diagtools._model import Culprit, ScanResult
from diagtools._replay_model import ChildOutcome, ReplayComparison, ReplayResult

__all__ = ["comparison_html", "diff_html", "replay_html", "scan_html"]

_STYLE = (
    "<style>.dt{font-family:system-ui,sans-serif;font-size:13px}.dt code{background:#f4f4f4;padding:1px 3px}"
    ".dt .bad{color:#b00020;font-weight:600}.dt .good{color:#1b7f3b;font-weight:600}"
    ".dt table{border-collapse:collapse}.dt td,.dt th{border:1px solid #ddd;padding:3px 8px;text-align:left;"
    "vertical-align:top}.dt pre{background:#f8f8f8;padding:6px;overflow-x:auto}</style>"
)


def _badge(good: bool, text: str) -> str:
    return f'<span class="{"good" if good else "bad"}">{escape(text)}</span>'


def _culprit_html(culprit: Culprit) -> str:
    parts = [
        f"<p>Culprit: <code>{escape(culprit.module or '(no module)')}</code> ({escape(culprit.phase)}, "
        f"evidence: {escape(culprit.evidence)})</p>"
    ]
    if culprit.chain:
        parts.append("<p>Chain: " + " &rarr; ".join(f"<code>{escape(m)}</code>" for m in culprit.chain) + "</p>")
    if culprit.site is not None:
        site = culprit.site
        parts.append(
            f"<p>Site: <code>{escape(site.file)}:{site.line}</code> in <code>{escape(site.function)}</code></p>"
            f"<pre>{site.line:>5} | {escape(site.source)}</pre>"
        )
    return "".join(parts)


def scan_html(result: ScanResult) -> str:
    """Summary, culprit with its source line, and the error if the target failed."""
    verdict = _badge(
        not result.cuda_initialized, "CUDA initialized" if result.cuda_initialized else "CUDA not initialized"
    )
    parts = [
        _STYLE,
        '<div class="dt">',
        f"<p><b>diagtools scan</b> <code>{escape(' '.join(result.targets))}</code> &mdash; {verdict}</p>",
        f"<p>Driver: {escape(result.driver.describe())}. Status: <code>{escape(result.status)}</code>; "
        f"{len(result.modules)} modules in {result.duration_s:.2f} s.</p>",
    ]
    if result.error is not None:
        parts.append(f'<p class="bad">{escape(result.error.message)}</p>')
    parts += [_culprit_html(culprit) for culprit in result.culprits]
    parts.append("</div>")
    return "".join(parts)


def _child_cell(child: ChildOutcome | None) -> str:
    if child is None:
        return "<td>no child</td>"
    calls = "<br>".join(f"<code>{escape(c.call)}</code> &rarr; {escape(c.name)} ({c.code})" for c in child.driver_calls)
    return f"<td>{_badge(child.ok or child.status == 'unavailable', child.summary())}<br>{calls}</td>"


def replay_html(result: ReplayResult) -> str:
    """One replay: parent state and the child's outcome, with its traceback."""
    parent = result.parent
    parent_text = (
        "no parent state"
        if parent is None
        else (
            f"parent CUDA {'initialized' if parent.cuda_initialized else 'not initialized'}, "
            f"{len(parent.threads)} thread(s)"
        )
    )
    parts = [
        _STYLE,
        '<div class="dt">',
        f"<p><b>diagtools replay</b> <code>{escape(result.target)}</code> with "
        f"<code>{escape(result.start_method)}</code>, child <code>{escape(result.child_action)}</code> "
        f"&mdash; status <code>{escape(result.status)}</code></p>",
        f"<p>Driver: {escape(result.driver.describe())}; {escape(parent_text)}.</p>",
        f"<table><tr><th>child</th></tr><tr>{_child_cell(result.child)}</tr></table>",
    ]
    if result.child is not None and result.child.traceback:
        parts.append(f"<pre>{escape(result.child.traceback)}</pre>")
    if result.error is not None:
        parts.append(f'<p class="bad">{escape(result.error.message)}</p>')
    parts.append("</div>")
    return "".join(parts)


def comparison_html(comparison: ReplayComparison) -> str:
    """Before/after rows, start-method columns, and the verdict."""
    methods = comparison.start_methods
    header = "<tr><th>variant</th><th>parent</th>" + "".join(f"<th>{escape(m)}</th>" for m in methods) + "</tr>"
    rows = []
    for variant in comparison.variants:
        parent = comparison.runs_of(variant)[0].parent
        state = "?" if parent is None else ("CUDA initialized" if parent.cuda_initialized else "CUDA not initialized")
        cells = "".join(_child_cell(comparison.run(variant, m).child) for m in methods)
        rows.append(f"<tr><td>{escape(variant)}</td><td>{escape(state)}</td>{cells}</tr>")
    return (
        f'{_STYLE}<div class="dt"><p><b>Fork replay</b> <code>{escape(comparison.target)}</code></p>'
        f"<table>{header}{''.join(rows)}</table><p>{escape(comparison.verdict())}</p></div>"
    )


def diff_html(diff: ScanDiff, *, limit: int = 50) -> str:
    """The verdict, the cut edge, and the removed and added modules."""
    cut = ""
    if diff.broken_edge:
        importer, imported = (escape(name) for name in diff.broken_edge)
        cut = f"<p>Chain broken at <code>{importer}</code> &rarr; <code>{imported}</code></p>"
    removed = "".join(f"<li><del>{escape(name)}</del></li>" for name in diff.removed_modules[:limit])
    added = "".join(f"<li><ins>{escape(name)}</ins></li>" for name in diff.added_modules[:limit])
    verdict = _badge(not diff.after.cuda_initialized, diff.verdict())
    return (
        f'{_STYLE}<div class="dt"><p><b>diagtools diff</b> &mdash; {verdict}</p>'
        f"{cut}<p>No longer imported ({len(diff.removed_modules)}):</p><ul>{removed}</ul>"
        f"<p>Newly imported ({len(diff.added_modules)}):</p><ul>{added}</ul></div>"
    )
