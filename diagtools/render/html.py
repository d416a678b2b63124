"""HTML rendering for notebooks and reports: every user-controlled string is escaped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from html import escape
from typing import Any

from diagtools.errors import MissingExtraError
from diagtools.model.diff import ScanDiff
from diagtools.model.replay import ChildOutcome, ReplayComparison, ReplayResult
from diagtools.model.scan import Culprit, ScanResult, Site
from diagtools.model.verdict import Verdict

__all__ = [
    "bench_table_html",
    "comparison_html",
    "diff_html",
    "graph_block",
    "module_html",
    "replay_html",
    "scan_html",
    "svg_of",
]

_STYLE = (
    "<style>.dt{font-family:system-ui,sans-serif;font-size:13px}.dt code{background:#f4f4f4;padding:1px 3px}"
    ".dt .bad{color:#b00020;font-weight:600}.dt .good{color:#1b7f3b;font-weight:600}"
    ".dt .unknown{color:#a15c00;font-weight:600}"
    ".dt table{border-collapse:collapse}.dt td,.dt th{border:1px solid #ddd;padding:3px 8px;text-align:left!important;"
    "vertical-align:top}.dt td.num{text-align:right!important;font-variant-numeric:tabular-nums}"
    ".dt pre{background:#f8f8f8;padding:6px;overflow-x:auto}"
    ".dt-graph{max-width:100%}</style>"
)


_VERDICT_CLASS = {
    Verdict.POISONED_FORK: "bad",
    Verdict.INITIALIZES_CUDA: "bad",
    Verdict.CLEAN: "good",
    Verdict.UNKNOWN: "unknown",
}


def _verdict_badge(verdict: Verdict) -> str:
    """Red for initializes-cuda, green for clean, amber for unknown."""
    return f'<span class="{_VERDICT_CLASS[verdict]}">{escape(verdict.value)}</span>'


def _site_html(label: str, site: Site) -> str:
    return (
        f"<p>{label}: <code>{escape(site.file)}:{site.line}</code> in <code>{escape(site.function)}</code></p>"
        f"<pre>{site.line:>5} | {escape(site.source)}</pre>"
    )


def _culprit_html(culprit: Culprit) -> str:
    parts = [
        f"<p>Culprit: <code>{escape(culprit.module or '(no module)')}</code> ({escape(culprit.phase)}, "
        f"evidence: {escape(culprit.evidence)})</p>"
    ]
    if culprit.chain:
        parts.append("<p>Chain: " + " &rarr; ".join(f"<code>{escape(m)}</code>" for m in culprit.chain) + "</p>")
    if culprit.phase == "thread":
        parts.append(f"<p>Thread: <code>{escape(culprit.thread)}</code></p>")
        if culprit.thread_started_at is not None:
            parts.append(_site_html("Started at", culprit.thread_started_at))
    if culprit.module_site is not None:
        parts.append(_site_html("<b>Line to change</b>", culprit.module_site))
    if culprit.site is not None and culprit.site != culprit.module_site:
        parts.append(_site_html("Via" if culprit.module_site else "Site", culprit.site))
    return "".join(parts)


def svg_of(graph: Any) -> str:
    """Inline SVG of a graphviz graph, or a note when graphviz's ``dot`` is missing."""
    try:
        svg = graph.pipe(format="svg").decode("utf-8")
    except Exception as exc:  # graphviz raises ExecutableNotFound, CalledProcessError
        return f"<p><i>graph not rendered: {escape(str(exc).splitlines()[0])}</i></p>"
    return svg[svg.find("<svg") :]


def graph_block(
    draw: Callable[[], Any], details: dict[str, dict[str, Any]] | None = None, *, selected: str | None = None
) -> str:
    """The graph ``draw()`` builds as the interactive view (inline SVG and script); a note without graphviz."""
    from diagtools.render.graphview import graph_view_html

    try:
        svg = svg_of(draw())
    except MissingExtraError as exc:
        return f"<p><i>{escape(str(exc))}</i></p>"
    if "<svg" not in svg:
        return svg
    return f'<div class="dt-graph">{graph_view_html(svg, details, selected=selected)}</div>'


def scan_html(result: ScanResult, *, graph: bool = False, selected: str | None = None) -> str:
    """Summary, culprit with its source line, the error if the target failed, and the graph."""
    verdict = _verdict_badge(result.verdict)
    parts = [
        _STYLE,
        '<div class="dt">',
        f"<p><b>diagtools scan</b> <code>{escape(' '.join(result.targets))}</code> &mdash; {verdict}</p>",
        f"<p>Driver: {escape(_driver_label(result))}. Status: <code>{escape(result.status)}</code>; "
        f"{len(result.modules)} modules in {result.duration_s:.2f} s.</p>",
    ]
    if result.error is not None:
        parts.append(f'<p class="bad">{escape(result.error.message)}</p>')
    if not result.cuda_initialized and result.doubts():
        reasons = "".join(f"<li>{escape(reason)}</li>" for reason in result.doubts())
        parts.append(f'<p class="unknown">Not called clean: the run could not see everything.</p><ul>{reasons}</ul>')
    parts += [_culprit_html(culprit) for culprit in result.culprits]
    if graph:
        parts.append(graph_block(result.graph, _graph_details(result), selected=selected))
    parts.append("</div>")
    return "".join(parts)


def _driver_label(result: ScanResult | ReplayResult) -> str:
    """The driver without its library path: pages get shared, and that path is a cache folder."""
    return replace(result.driver, library=None).describe()


def _graph_details(result: ScanResult) -> dict[str, dict[str, Any]]:
    from diagtools.render.graphview import node_details

    return node_details(result)


def _child_cell(child: ChildOutcome | None) -> str:
    if child is None:
        return "<td>no child</td>"
    calls = "<br>".join(f"<code>{escape(c.call)}</code> &rarr; {escape(c.name)} ({c.code})" for c in child.driver_calls)
    css = "good" if child.ok else "unknown" if child.status == "unavailable" else "bad"
    return f'<td><span class="{css}">{escape(child.summary())}</span><br>{calls}</td>'


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
        f"&mdash; {_verdict_badge(result.verdict)}, status <code>{escape(result.status)}</code></p>",
        f"<p>Driver: {escape(_driver_label(result))}; {escape(parent_text)}.</p>",
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
        f"<table>{header}{''.join(rows)}</table>"
        f"<p>{_verdict_badge(comparison.verdict)} (after the fix)</p>{_findings_html(comparison)}</div>"
    )


def _findings_html(comparison: ReplayComparison) -> str:
    headline, *findings = comparison.explanation()
    items = "".join(f"<li>{escape(finding)}</li>" for finding in findings)
    return f"<p><b>Verdict:</b> {escape(headline)}</p>" + (f"<ul>{items}</ul>" if items else "")


def diff_html(diff: ScanDiff, *, limit: int = 50, graph: bool = False) -> str:
    """The verdict, the cut edge, and the removed and added modules."""
    cut = ""
    if diff.broken_edge:
        importer, imported = (escape(name) for name in diff.broken_edge)
        cut = f"<p>Chain broken at <code>{importer}</code> &rarr; <code>{imported}</code></p>"
    removed = "".join(f"<li><del>{escape(name)}</del></li>" for name in diff.removed_modules[:limit])
    added = "".join(f"<li><ins>{escape(name)}</ins></li>" for name in diff.added_modules[:limit])
    verdict = f"{_verdict_badge(diff.verdict)} {escape(diff.summary())}"
    return (
        f'{_STYLE}<div class="dt"><p><b>diagtools diff</b> &mdash; {verdict}</p>'
        f"{cut}<p>No longer imported ({len(diff.removed_modules)}):</p><ul>{removed}</ul>"
        f"<p>Newly imported ({len(diff.added_modules)}):</p><ul>{added}</ul>"
        f"{graph_block(diff.graph, _graph_details(diff.before)) if graph else ''}</div>"
    )


def module_html(result: ScanResult, name: str) -> str:
    """One module's details: file, importer, times, threads, and the stack when it is the culprit."""
    node = result.module(name)
    rows = [
        ("module", name),
        ("file", node.file or "(no file: builtin, frozen or namespace)"),
        ("imported by", node.parent or "(the scan request or start-up)"),
        ("phase", node.phase),
        ("self", f"{node.self_s * 1000:.2f} ms"),
        ("cumulative", f"{node.cumulative_s * 1000:.2f} ms"),
        ("threads started", str(node.threads_started)),
        ("initializes CUDA", "yes" if node.initializes_cuda else "no"),
    ]
    table = "".join(f"<tr><th>{escape(key)}</th><td>{escape(value)}</td></tr>" for key, value in rows)
    stacks = [
        "<p>Python stack when CUDA was initialized (outermost first):</p><pre>"
        + escape("\n".join(f"{f.file}:{f.line} in {f.function}    {f.source}" for f in culprit.stack))
        + "</pre>"
        for culprit in result.culprits
        if culprit.module == name
    ]
    return f'{_STYLE}<div class="dt"><table>{table}</table>{"".join(stacks)}</div>'


def bench_table_html(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain results table: one row per measurement, the given columns in order."""
    head = "".join(f"<th>{escape(column)}</th>" for column in columns)
    body = "".join("<tr>" + "".join(_td(row.get(column)) for column in columns) + "</tr>" for row in rows)
    return f'{_STYLE}<div class="dt"><table><tr>{head}</tr>{body}</table></div>'


def _td(value: Any) -> str:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f'<td class="num">{escape(_cell(value))}</td>' if numeric else f"<td>{escape(_cell(value))}</td>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
