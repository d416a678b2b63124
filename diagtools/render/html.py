"""HTML rendering for notebooks and reports: every user-controlled string is escaped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from html import escape
from typing import Any

from diagtools.errors import MissingExtraError
from diagtools.model.cuts import Cut, Headline
from diagtools.model.diff import ScanDiff, diff_scans
from diagtools.model.replay import ChildOutcome, ReplayComparison, ReplayResult, Tone
from diagtools.model.scan import Culprit, ScanResult, Site
from diagtools.model.sweep import RootCause, SweepResult
from diagtools.model.verdict import VERDICT_TONES, Verdict
from diagtools.render.lines import evidence_words, headline_words, hook_note, try_text
from diagtools.render.ordering import GroupLine, ModuleGroups, group_modules
from diagtools.render.paths import shareable, short_path
from diagtools.render.style import HTML_COLOURS

__all__ = [
    "bench_table_html",
    "comparison_html",
    "culprit_html",
    "cuts_html",
    "diff_html",
    "graph_block",
    "module_html",
    "path_html",
    "replay_html",
    "scan_html",
    "short_path",
    "svg_of",
    "sweep_html",
    "table_html",
]

_STYLE = (
    "<style>.dt{font-family:system-ui,sans-serif;font-size:13px;line-height:1.5;max-width:100%;overflow-wrap:break-word}"
    # a wrapped code span draws a background box per line: no vertical padding, so no box covers the underscores
    # of the line above; each line keeps its own padding at the edges
    ".dt code{background:#f4f4f4;padding:0 3px;-webkit-box-decoration-break:clone;box-decoration-break:clone}"
    + "".join(f".dt .{tone.value}{{color:{colour};font-weight:600}}" for tone, colour in HTML_COLOURS.items())
    + ".dt .dt-box{max-width:100%;overflow-x:auto}"
    + ".dt table{border-collapse:collapse;max-width:100%}.dt td,.dt th{border:1px solid #ddd;padding:3px 8px;"
    "text-align:left!important;vertical-align:top;overflow-wrap:break-word}"
    ".dt td.num{text-align:right!important;font-variant-numeric:tabular-nums;white-space:nowrap}"
    ".dt pre{background:#f8f8f8;padding:6px;overflow-x:auto;white-space:pre;overflow-wrap:normal}"
    # a path breaks only where it says (<wbr> after / and .), never inside a name; a source line never breaks
    ".dt .dt-path{white-space:nowrap}.dt td .dt-path{white-space:normal;overflow-wrap:normal;word-break:normal}"
    ".dt tr.dt-under td{border-top:none;color:#333}.dt .dt-label{color:#666}"
    ".dt code.dt-line{white-space:pre;display:inline-block;max-width:100%;overflow-x:auto;vertical-align:top}"
    ".dt .dt-verdict{font-size:14px}"
    ".dt-graph{max-width:100%}</style>"
)


def _verdict_badge(verdict: Verdict) -> str:
    """Red for initializes-cuda, green for clean, amber for unknown."""
    return f'<span class="{VERDICT_TONES[verdict].value}">{escape(verdict.value)}</span>'


def path_html(path: str, line: int | None = None) -> str:
    """A path as ``<code>``: shortened in the middle, the whole path on hover; the line number never cut.

    It may break after a ``/`` (never inside a name), so a narrow column wraps it instead of widening.
    """
    shown = escape(short_path(path)).replace("/", "/<wbr>")
    shown += f":{line}" if line is not None else ""
    full = escape(path) + (f":{line}" if line is not None else "")
    return f'<code class="dt-path" title="{full}">{shown}</code>'


def _site_html(label: str, site: Site) -> str:
    return (
        f"<p>{label}: {path_html(site.file, site.line)} in <code>{escape(site.function)}</code></p>"
        f"<pre>{site.line:>5} | {escape(site.source)}</pre>"
    )


def culprit_html(culprit: Culprit, headline: Headline | None = None) -> str:
    """Who initialized CUDA, through which chain, the line to change and where it happened: the scan's words."""
    parts = [
        f"<p>Culprit: <code>{escape(culprit.module or '(no module)')}</code> ({escape(culprit.phase)}, "
        f"evidence: {escape(evidence_words(culprit))})</p>"
    ]
    if culprit.chain:
        parts.append("<p>Chain: " + " &rarr; ".join(f"<code>{escape(m)}</code>" for m in culprit.chain) + "</p>")
    if culprit.phase == "thread":
        parts.append(f"<p>Thread: <code>{escape(culprit.thread_described)}</code></p>")
        if culprit.thread_started_at is not None:
            parts.append(_site_html("Started at", culprit.thread_started_at))
    parts.append(change_html(culprit, headline))
    edges = culprit.import_edges()
    if any(site is not None for _, _, site in edges):
        parts.append("<p>Imports:</p><ul>" + "".join(_edge_html(edge) for edge in edges) + "</ul>")
    return "".join(parts)


def change_html(culprit: Culprit, headline: Headline | None) -> str:
    """The line to change by the one rule (and the deepest cut beside it), then where CUDA got initialized, the
    library line that called the driver, and where the user's code reaches it: the text report's words."""
    parts = []
    shown: list[Site | None] = []
    if headline is not None and headline.line is not None:
        words = headline_words(headline)
        parts.append(_site_html(f"<b>Line to change</b> ({escape(words)})", headline.line))
        shown.append(headline.line)
        if headline.deepest is not None:
            parts.append(_site_html("Deepest first-party cut", headline.deepest.site))
            shown.append(headline.deepest.site)
    elif headline is not None:
        parts.append(f'<p class="unknown">Line to change: none verified ({escape(headline.reason)})</p>')
    at, inside = culprit.initialized_at, culprit.initialized_in
    if at is not None:
        parts.append(_site_html("CUDA initialized at", at))
    if inside is not None:
        parts.append(_site_html("Initialized in", inside))
    reach = culprit.first_party
    if reach is not None and reach not in (*shown, at, inside):
        parts.append(_site_html("Your code reaches it at", reach))
    return "".join(parts)


def _edge_html(edge: tuple[str, str, Site | None]) -> str:
    importer, imported, site = edge
    where = f"{path_html(site.file, site.line)}{_source_line(site.source)}" if site else "?"
    return f"<li><code>{escape(importer)}</code> &rarr; <code>{escape(imported)}</code>: {where}</li>"


def _source_line(source: str) -> str:
    """A statement on its own line, whole: it scrolls in its box rather than break mid-statement."""
    return f'<br><code class="dt-line">{escape(source.strip())}</code>' if source.strip() else ""


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
    shown = shareable(result)
    verdict = _verdict_badge(result.verdict)
    parts = [
        _STYLE,
        '<div class="dt">',
        f'<p class="dt-verdict"><b>diagtools scan</b> <code>{escape(" ".join(result.targets))}</code> &mdash; '
        f"{verdict}</p>",
        f"<p>Driver: {escape(_driver_label(result))}. Status: <code>{escape(result.status)}</code>; "
        f"{len(result.modules)} modules in {result.duration_s:.2f} s.</p>",
    ]
    if result.error is not None:
        parts.append(f'<p class="bad">{escape(result.error.message)}</p>')
    if not result.cuda_initialized and result.doubts():
        reasons = "".join(f"<li>{escape(reason)}</li>" for reason in result.doubts())
        parts.append(f'<p class="unknown">Not called clean: the run could not see everything.</p><ul>{reasons}</ul>')
    parts += [culprit_html(c, shown.headline if i == 0 else None) for i, c in enumerate(shown.culprits)]
    if hook_note(result):
        parts.append(f'<p class="unknown">Note: {escape(hook_note(result))}.</p>')
    if shown.cuts is not None and result.cuda_initialized:
        parts.append(cuts_html(shown))
    if graph:
        parts.append(graph_block(shown.graph, _graph_details(result), selected=selected))
    parts.append("</div>")
    return "".join(parts)


def _cut_html(cut: Cut, label: str) -> str:
    reach = f"; on the chain of {cut.reach} swept module(s)" if cut.reach is not None else ""
    items = "".join(f"<li>{path_html(e.site.file, e.site.line)}{_source_line(e.site.source)}</li>" for e in cut.edges)
    count = f"{len(cut.edges)} import{'s' if len(cut.edges) != 1 else ''}"
    verified = f'<span class="good">{escape(cut.verified.value)}</span>'
    return f"<p>{label}: {count}, verified {verified}{reach}</p><ul>{items}</ul>"


def cuts_html(result: ScanResult) -> str:
    """The verified cuts of a scan, and the statements passed over with the reason."""
    search = result.cuts
    if search is None:
        return ""
    runs = sum(1 for attempt in search.tries if attempt.outcome != "cannot-defer")
    parts = [f"<p><b>Where to cut</b>: {runs} verification run(s), {search.seconds:.2f} s.</p>"]
    if search.nearest is None:
        parts.append(f'<p class="unknown">No verified cut: {escape(search.reason)}</p>')
    else:
        parts.append(_cut_html(search.nearest, "Nearest cut"))
        if search.same:
            parts.append("<p>Deepest first-party cut: the same.</p>")
        elif search.deepest is not None:
            parts.append(_cut_html(search.deepest, "Deepest first-party cut"))
    passed = [a for a in search.tries if a.outcome in ("cannot-defer", "breaks", "unknown")]
    if passed:
        said = "".join(f"<li>{escape(try_text(a)).replace('/', '/<wbr>')}</li>" for a in passed)  # paths break at /
        parts.append(f"<p>Passed over:</p><ul>{said}</ul>")
    return "".join(parts)


def sweep_html(result: SweepResult) -> str:
    """The sweep's answer: each root cause once, then the modules that initialize CUDA."""
    verdict = _verdict_badge(result.verdict)
    causes = result.causes
    parts = [
        _STYLE,
        '<div class="dt">',
        f"<p><b>diagtools sweep</b> <code>{escape(result.package)}</code> &mdash; {verdict}</p>",
        f"<p>{len(result.rows)} modules, {len(result.culprits)} initialize CUDA through {len(causes)} root "
        f"cause(s); {len(result.failures)} failed to import ({result.seconds:.1f} s, {escape(result.mode)}).</p>",
    ]
    if result.interrupted:
        parts.append(f'<p class="unknown">Interrupted: {result.interrupted} modules were not scanned.</p>')
    if causes:
        parts.append("<h3>Root causes</h3><ol>" + "".join(_cause_html(cause) for cause in causes) + "</ol>")
    parts.append("</div>")
    return "".join(parts)


def _cause_html(cause: RootCause) -> str:
    parts = [f"<li><code>{escape(cause.key)}</code>"]
    headline = cause.headline
    if headline.line is not None:
        parts.append(
            _site_html(
                f"<b>Line to change</b> (the nearest verified cut, on {escape(cause.representative or '?')})",
                headline.line,
            )
        )
        if headline.deepest is not None:
            parts.append(_site_html("Deepest first-party cut", headline.deepest.site))
    else:
        why = headline.reason if cause.cuts is not None else "not searched: sweep --cuts, or diagtools fix MODULE"
        parts.append(f'<p class="unknown">Line to change: none verified ({escape(why)})</p>')
    if cause.own_line is not None and cause.own_line not in (headline.line, cause.initialized_at):
        parts.append(_site_html("Your code reaches it at", cause.own_line))
    if cause.initialized_at is not None:
        parts.append(_site_html("CUDA initialized at", cause.initialized_at))
    parent = f", {len(cause.through_parent)} only through a parent package" if cause.through_parent else ""
    names = ", ".join(f"<code>{escape(m)}</code>" for m in cause.modules)
    parts.append(f"<p>Reached by {len(cause.modules)} module(s){parent}: {names}</p></li>")
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
    label = "fails: the driver answered" if child.short().startswith("fails:") else child.short()
    return f'<td><span class="{css}">{escape(label)}</span><br>{calls}</td>'


def _table(head: str, rows: str) -> str:
    """A table in its own box: it wraps, and scrolls inside the box rather than widening the page."""
    return f'<div class="dt-box"><table>{head}{rows}</table></div>'


def _headline_html(parts: tuple[tuple[str, Tone], ...]) -> str:
    """The one verdict, each part in its colour (a failure red, the fix green)."""
    spans = "; ".join(f'<span class="{tone.value}">{escape(text)}</span>' for text, tone in parts)
    return f'<p class="dt-verdict">{spans}</p>'


def _driver_answer_html(child: ChildOutcome) -> str:
    """The child's failure as the driver's answer and the user's frames; diagtools' own frames stay in the JSON."""
    shown = child.shown_traceback.strip()
    if child.ok or not shown or (child.driver_calls and '  File "' not in shown):  # the table said it already
        return ""
    return f"<p>The child's error (the driver's answer, your frames only):</p><pre>{escape(shown)}</pre>"


def replay_html(result: ReplayResult) -> str:
    """One replay: its headline, the parent's state and the child's outcome with the driver's answer."""
    parent = result.parent
    parent_text = (
        "no parent state"
        if parent is None
        else (
            f"the parent {'initialized CUDA' if parent.cuda_initialized else 'did not initialize CUDA'} "
            f"before starting the child, {len(parent.threads)} thread(s)"
        )
    )
    parts = [
        _STYLE,
        '<div class="dt">',
        f"<p><b>diagtools replay</b> <code>{escape(result.target)}</code> with "
        f"<code>{escape(result.start_method)}</code>, child <code>{escape(result.child_action)}</code></p>",
        _headline_html((result.headline(),)),
        f"<p>Driver: {escape(_driver_label(result))}; {escape(parent_text)}.</p>",
        _table("<tr><th>child</th></tr>", f"<tr>{_child_cell(result.child)}</tr>"),
    ]
    if result.child is not None:
        parts.append(_driver_answer_html(result.child))
    if result.error is not None:
        parts.append(f'<p class="bad">{escape(result.error.message)}</p>')
    parts.append("</div>")
    return "".join(parts)


def comparison_html(comparison: ReplayComparison) -> str:
    """The one verdict, then before/after rows by start-method columns, then the findings."""
    methods = comparison.start_methods
    header = "<tr><th>variant</th><th>parent</th>" + "".join(f"<th>{escape(m)}</th>" for m in methods) + "</tr>"
    rows = []
    for variant in comparison.variants:
        parent = comparison.runs_of(variant)[0].parent
        state = "?" if parent is None else ("CUDA initialized" if parent.cuda_initialized else "CUDA not initialized")
        cells = "".join(_child_cell(comparison.run(variant, m).child) for m in methods)
        rows.append(f"<tr><td>{escape(variant)}</td><td>{escape(state)}</td>{cells}</tr>")
    _, *findings = comparison.explanation()
    items = "".join(f"<li>{escape(finding)}</li>" for finding in findings)
    return (
        f'{_STYLE}<div class="dt"><p><b>Fork replay</b> <code>{escape(comparison.target)}</code></p>'
        f"{_headline_html(comparison.headline_parts())}{_table(header, ''.join(rows))}"
        + (f"<ul>{items}</ul>" if items else "")
        + "</div>"
    )


def diff_html(diff: ScanDiff, *, limit: int = 20, graph: bool = False) -> str:
    """The verdict, the cut edge, and the removed and added modules grouped as the terminal groups them."""
    cut = ""
    if diff.broken_edge:
        importer, imported = (escape(name) for name in diff.broken_edge)
        cut = f"<p>Chain broken at <code>{importer}</code> &rarr; <code>{imported}</code></p>"
    chain = diff.before.culprit.chain if diff.before.culprit else ()
    lists = "".join(
        f"<p>{label} ({groups.total}):</p><ul>{_group_items(groups, tag, limit)}</ul>"
        for label, names, tag in (
            ("No longer imported", diff.removed_modules, "del"),
            ("Newly imported", diff.added_modules, "ins"),
        )
        if (groups := group_modules(names, targets=diff.before.targets, chain=chain)).total
    )
    verdict = f"{_verdict_badge(diff.verdict)} {escape(diff.summary())}"
    return (
        f'{_STYLE}<div class="dt"><p class="dt-verdict"><b>diagtools diff</b> &mdash; {verdict}</p>'
        f"{cut}{lists}"
        f"{_diff_graph(diff) if graph else ''}</div>"
    )


def _diff_graph(diff: ScanDiff) -> str:
    """The diff's graph drawn from shareable copies: its tooltips carry no machine-local path."""
    shown = diff_scans(shareable(diff.before), shareable(diff.after))
    return graph_block(shown.graph, _graph_details(diff.before))


def _group_items(groups: ModuleGroups, tag: str, limit: int) -> str:
    """The culprit chain first (one per line), the target's package, then one line per other package."""

    def item(line: GroupLine) -> str:
        words = escape(line.words).replace("...", "&hellip;")
        if line.name is None:
            return f"<li>{words}</li>"
        title = f' title="{escape(line.title)}"' if line.title else ""
        gap = " " if line.words.startswith("(") else ""
        return f"<li><{tag}{title}>{escape(line.name)}</{tag}>{gap}{words}</li>"

    return "".join(item(line) for line in groups.shown(limit))


def module_html(result: ScanResult, name: str) -> str:
    """One module's details: file, importer, times, threads, and the stack when it is the culprit."""
    result = shareable(result)
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
    table = _table("", "".join(f"<tr><th>{escape(key)}</th><td>{escape(value)}</td></tr>" for key, value in rows))
    stacks = [
        "<p>Python stack when CUDA was initialized (outermost first):</p><pre>"
        + escape("\n".join(f"{f.file}:{f.line} in {f.function}    {f.source}" for f in culprit.stack))
        + "</pre>"
        for culprit in result.culprits
        if culprit.module == name
    ]
    return f'{_STYLE}<div class="dt">{table}{"".join(stacks)}</div>'


def table_html(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    caption: str = "",
    paths: Sequence[int] = (),
    code: Sequence[int] = (),
    below: Sequence[int] = (),
) -> str:
    """Any small table for a notebook: every cell escaped, in its own box that scrolls rather than widens.

    The columns numbered in ``paths`` hold paths (``file`` or ``file:line``): shown shortened, whole on hover,
    breakable only after a ``/``.  Those in ``code`` (source lines) and ``below`` (long prose) are
    not narrow columns: each goes under its row, across the table's width, labelled with its header; a source
    line is kept whole on one line that scrolls.
    """
    title = f"<p>{escape(caption)}</p>" if caption else ""
    return f'{_STYLE}<div class="dt">{title}{_rows_table(header, rows, paths, code, below)}</div>'


def bench_table_html(rows: list[dict[str, Any]], columns: list[str], *, caption: str = "") -> str:
    """A results table, one row per measurement, its ``note`` under the row; ``caption`` (say, that CPU times mean
    nothing) heads it."""
    below = [columns.index("note")] if "note" in columns else []
    table = _rows_table(columns, [[row.get(column) for column in columns] for row in rows], (), (), below)
    title = f'<p class="unknown">{escape(caption)}</p>' if caption else ""
    return f'{_STYLE}<div class="dt">{title}{table}</div>'


def _rows_table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    paths: Sequence[int],
    code: Sequence[int],
    below: Sequence[int],
) -> str:
    under = [i for i in range(len(header)) if i in code or i in below]
    beside = [i for i in range(len(header)) if i not in under]
    head = "<tr>" + "".join(f"<th>{escape(str(header[i]))}</th>" for i in beside) + "</tr>"

    def cell(i: int, value: object) -> str:
        if i in paths and value and value != "-":
            return f"<td>{path_html(str(value))}</td>"
        return _td(value)

    def under_row(i: int, value: object) -> str:
        if not value:
            return ""
        shown = f'<code class="dt-line">{escape(_cell(value))}</code>' if i in code else escape(_cell(value))
        label = f'<span class="dt-label">{escape(str(header[i]))}:</span>'
        return f'<tr class="dt-under"><td colspan="{len(beside)}">{label} {shown}</td></tr>'

    body = "".join(
        "<tr>" + "".join(cell(i, row[i]) for i in beside) + "</tr>" + "".join(under_row(i, row[i]) for i in under)
        for row in rows
    )
    return _table(head, body)


def _td(value: Any) -> str:
    if isinstance(value, Verdict):  # a verdict reads in its tone wherever a table shows one
        return f'<td class="{VERDICT_TONES[value].value}">{escape(value.value)}</td>'
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f'<td class="num">{escape(_cell(value))}</td>' if numeric else f"<td>{escape(_cell(value))}</td>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
