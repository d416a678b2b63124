"""The postmortem: one self-contained HTML page and a paste-ready Markdown twin with its graphs beside it.

Sections: a summary (what broke, the line to change, the fix, the guard),
how to fix it (the actual change between the compared trees, or the
verified patch), the root cause (culprit, chain, source line, graph), the
replay transcript, what the fix changed in the import tree, kernel timing,
the regression guard, and the timeline of the analysis itself.  The line to
change follows the one rule of :func:`diagtools.model.cuts.headline`: the
regression edge when a fixed tree is compared, else the nearest verified cut;
it is always a line the change shown beside it changes.  Everything is built from
result objects, so the same analysis a notebook ran is what the report says;
every path is shown relative to its repository or import root.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import Any, NamedTuple

from diagtools.errors import MissingExtraError
from diagtools.model.bisect import BisectResult
from diagtools.model.fix import FixResult
from diagtools.model.replay import ReplayComparison
from diagtools.model.scan import Culprit, ScanResult, Site
from diagtools.render.html import _STYLE, bench_table_html, comparison_html, graph_block, scan_html
from diagtools.render.paths import display_path
from diagtools.render.postmortem_report import (
    Postmortem,
    _code,
    _md_text,
    _verdict,  # noqa: F401 - the timeline's words, also read from here
)
from diagtools.render.text import render_comparison, render_diff, render_scan, terminal_safe

__all__ = ["HOW_TO_FIX", "Postmortem", "PostmortemFiles", "bench_rows_of", "postmortem", "write_postmortem"]

BENCH_COLUMNS = ["size", "backend", "median_ms", "GB/s", "copy_fraction", "max_rel_error"]
GRAPH_FILE, FIX_GRAPH_FILE = "postmortem-graph.svg", "postmortem-fix.svg"
TIMELINE_NOTE = "When each step of this analysis ran (UTC): the analysis, not the incident (its timeline is above)."

HOW_TO_FIX = (
    (
        "Import the leaf lazily, behind the platform gate",
        "Move the import of the module that touches the driver (a CuTe DSL or Triton kernel, a platform probe) "
        "into the function that uses it, after the check that CUDA is wanted, so that importing the package "
        "costs nothing and initializes nothing (the DeepSeek-V4 ops and Triton is_active() fixes).",
    ),
    (
        "Keep package __init__ free of heavy re-exports",
        "A package __init__ that re-exports a kernel module imports it for everyone who imports the package; "
        "keep the __init__ to its docstring (or resolve names lazily with a module __getattr__) and let callers "
        "import the leaf module where they use it (the common/ops fix).",
    ),
)


class PostmortemFiles(NamedTuple):
    """Where the postmortem went; in a notebook it shows the report itself."""

    html: Path
    markdown: Path

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view: where the files went, repository-relative."""
        printer.text(f"postmortem: {display_path(str(self.html))}, {display_path(str(self.markdown))}")

    def _repr_html_(self) -> str:
        page = self.html.read_text(encoding="utf-8")
        start, end = page.find(_BODY_OPEN), page.rfind("</body>")
        if start < 0 or end <= start:
            return page
        return f'{_STYLE}<div class="dt">{page[start + len(_BODY_OPEN) : end]}</div>'


_BODY_OPEN = '<body class="dt">'


def _inline_md(text: str) -> str:
    """Markdown's `code` spans as HTML, everything else escaped."""
    parts = escape(text).split("`")
    return "".join(f"<code>{_breakable_name(part)}</code>" if i % 2 else part for i, part in enumerate(parts))


def _breakable_name(code: str) -> str:
    """Escaped code that may break after a ``.`` or a ``/`` (between names), never inside a name."""
    return code.replace(".", ".<wbr>").replace("/", "/<wbr>")


def _html_sections(report: Postmortem) -> list[str]:
    before = report.shown_before
    summary = "".join(f"<dt>{escape(h)}</dt><dd>{_inline_md(t)}</dd>" for h, t in report.summary())
    fixes = "".join(f"<li><b>{escape(h)}.</b> {escape(t)}</li>" for h, t in HOW_TO_FIX)
    sections = [
        f"<h1>{escape(report.title)}</h1>",
        f"<p>Target <code>{escape(report.target)}</code>; driver: {escape(before.driver.describe())}.</p>",
        f'<h2>Summary</h2><dl class="summary">{summary}</dl>',
        *_impact_html(report),
        "<h2>How to fix</h2>",
        f"<p>The pattern behind it (the change itself is under The fix):</p><ol>{fixes}</ol>",
        "<h2>The fix</h2>",
        *_change_html(report),
    ]
    diff = report.diff
    if diff is not None:
        sections += [
            "<p>What it changed in the import tree:</p>",
            f"<pre>{escape(render_diff(diff))}</pre>",
            graph_block(diff.graph),
        ]
    sections += ["<h2>Root cause</h2>", scan_html(before, graph=True)]
    context, marked = report.source_context(), report.marked_line()
    if context and marked is not None:
        lines = "\n".join(f"{'&gt;' if n == marked.line else ' '} {n:>5} | {escape(text)}" for n, text in context)
        sections.append(f"<p>Source around the line to change:</p><pre>{lines}</pre>")
    if report.replay is not None:
        sections += [
            "<h2>Replay</h2>",
            comparison_html(report.replay),
        ]
    sections += [f"<h2>{escape(_bench_title(report))}</h2>", _bench_html(report)]
    sections += ["<h2>Regression guard</h2>", f"<pre>{escape(report.guard_snippet())}</pre>"]
    sections += [
        "<h2>Timeline of the analysis</h2>",
        f"<p>{escape(TIMELINE_NOTE)}</p><div class='dt-box'><table><tr><th>time (UTC)</th><th>analysis step</th></tr>"
        + "".join(f"<tr><td>{escape(t)}</td><td>{escape(what)}</td></tr>" for t, what in report.timeline())
        + "</table></div>",
    ]
    return sections


def _impact_html(report: Postmortem) -> list[str]:
    """The Impact section, and the incident's timeline when a bisect or a fix is at hand."""
    said = "".join(f"<li>{_inline_md(sentence)}</li>" for sentence in report.impact())
    sections = [f"<h2>Impact</h2><ul>{said}</ul>"] if said else []
    incident = report.incident()
    if incident:
        rows = "".join(f"<tr><td>{escape(when)}</td><td>{_inline_md(what)}</td></tr>" for when, what in incident)
        table = f"<div class='dt-box'><table><tr><th>when</th><th>what</th></tr>{rows}</table></div>"
        sections.append(f"<h2>Timeline of the incident</h2>{table}")
    return sections


def _change_html(report: Postmortem) -> list[str]:
    """The change itself: the compared trees' diff, or the verified patch, with what it is."""
    from diagtools.render.cuts_html import patch_html

    change = report.change
    if not change:
        return [
            "<p>No change to show yet: compare the fixed tree (<code>after</code>) or pass a "
            "<code>diagtools.fix</code> result.</p>"
        ]
    return [f"<p>{escape(_change_caption(report))}</p>", patch_html(change)]


def _change_caption(report: Postmortem) -> str:
    if report.after is not None:
        return "The change between the analysed tree and the fixed one (the files on the import path that differ):"
    state = "verified" if report.fix is not None and report.fix.verified else "not verified"
    return f"The patch diagtools fix wrote for the nearest cut ({state}; apply it with git apply):"


def _bench_title(report: Postmortem) -> str:
    """The timing section's title says where the times come from: a postmortem shows CPU times never."""
    if report.bench_rows and report.bench_device:
        return f"Kernel timing after the fix (measured on {report.bench_device})"
    if report.bench_rows:
        return "Kernel timing after the fix (device not recorded)"
    return "Kernel timing after the fix"


def _bench_html(report: Postmortem) -> str:
    note = f"<p>{escape(report.bench_note)}</p>" if report.bench_note else ""
    if not report.bench_rows:
        return note or "<p>Not measured.</p>"
    return note + bench_table_html(list(report.bench_rows), BENCH_COLUMNS)


def _impact_markdown(report: Postmortem) -> list[str]:
    lines = []
    said = report.impact()
    if said:
        lines += ["## Impact", "", *(f"- {_md_text(sentence)}" for sentence in said), ""]
    incident = report.incident()
    if incident:
        lines += ["## Timeline of the incident", "", "| when | what |", "| --- | --- |"]
        lines += [f"| {_md_cell(when)} | {_md_text(what)} |" for when, what in incident] + [""]
    return lines


def _markdown(report: Postmortem, graphs: dict[str, str]) -> str:
    before = report.shown_before
    driver = _md_text(before.driver.describe())
    lines = [f"# {_md_text(report.title)}", "", f"Target {_code(report.target)}; driver: {driver}.", ""]
    lines += ["## Summary", ""] + [f"- **{heading}:** {_md_text(text)}" for heading, text in report.summary()] + [""]
    lines += _impact_markdown(report)
    lines += ["## How to fix", "", "The pattern behind it (the change itself is under The fix):", ""]
    lines += [f"{i}. **{_md_text(h)}.** {_md_text(t)}" for i, (h, t) in enumerate(HOW_TO_FIX, 1)] + [""]
    lines += ["## The fix", ""]
    change = report.change
    if change:
        lines += [_md_text(_change_caption(report)), "", *_fenced(change.rstrip("\n"), "diff"), ""]
    else:
        lines += ["No change to show yet: compare the fixed tree (`after`) or pass a `diagtools.fix` result.", ""]
    if report.diff is not None:
        lines += ["What it changed in the import tree:", "", *_fenced(render_diff(report.diff), "text"), ""]
        lines += _graph_markdown(FIX_GRAPH_FILE, "What the fix removed (dashed grey)", graphs, None)
    lines += ["## Root cause", "", *_fenced(render_scan(before, stack=True), "text"), ""]
    context, marked = report.source_context(), report.marked_line()
    if context and marked is not None:
        excerpt = "\n".join(f"{'>' if n == marked.line else ' '} {n:>5} | {t}" for n, t in context)
        lines += [*_fenced(excerpt, "python"), ""]
    lines += _graph_markdown(GRAPH_FILE, "Import graph: the culprit in red, its chain in orange", graphs, before)
    if report.replay is not None:
        lines += ["## Replay", "", *_fenced(render_comparison(report.replay), "text"), ""]
    lines += [f"## {_bench_title(report)}", ""]
    if report.bench_note:
        lines += [_md_text(report.bench_note), ""]
    if report.bench_rows:
        lines += ["| " + " | ".join(BENCH_COLUMNS) + " |", "|" + "".join(_md_align(c) for c in BENCH_COLUMNS)]
        lines += ["| " + " | ".join(_md_cell(row.get(c)) for c in BENCH_COLUMNS) + " |" for row in report.bench_rows]
    elif not report.bench_note:
        lines.append("Not measured.")
    test, _, ci = report.guard_snippet().partition("# CI step\n")
    lines += ["", "## Regression guard", "", *_fenced(test.rstrip(), "python"), "", "CI step:", ""]
    lines += [*_fenced(ci.rstrip(), "sh"), ""]
    lines += ["## Timeline of the analysis", "", TIMELINE_NOTE, "", "| time (UTC) | analysis step |", "| --- | --- |"]
    lines += [f"| {_md_cell(t)} | {_md_cell(what)} |" for t, what in report.timeline()] + [""]
    return "\n".join(lines)


def _graph_markdown(name: str, caption: str, graphs: dict[str, str], chain_of: ScanResult | None) -> list[str]:
    """The culprit chain as a Mermaid block (GitHub and GitLab draw it, and it survives pasting), then where the
    whole graph is drawn: named, never embedded, since a relative image breaks once the text is pasted."""
    lines: list[str] = []
    if chain_of is not None and chain_of.culprit is not None:
        lines += ["The import chain to the culprit:", "", "```mermaid", _mermaid_chain(chain_of.culprit), "```", ""]
    if name in graphs:
        lines += [f"{caption}: `{name}` beside this file, and in `postmortem.html`.", ""]
    return lines


def _mermaid_chain(culprit: Culprit) -> str:
    chain = list(culprit.chain) or [culprit.module or "?"]
    nodes = [f'    n{i}["{mermaid_text(name)}"]' for i, name in enumerate(chain)]
    lines = culprit.chain_imports + (None,) * len(chain)
    edges = [f"    n{i} -->{_mermaid_label(lines[i + 1])} n{i + 1}" for i in range(len(chain) - 1)]
    return "\n".join(["graph LR", *nodes, *edges, f"    style n{len(chain) - 1} fill:#d62728,color:#fff"])


def _mermaid_label(site: Site | None) -> str:
    """``|file:line|`` of an import line for a Mermaid edge, or nothing."""
    if site is None:
        return ""
    return "|" + mermaid_text(f"{site.file.rsplit('/', 1)[-1]}:{site.line}") + "|"


_MERMAID_PLAIN = re.compile(r"[A-Za-z0-9_.:/ -]")


def mermaid_text(text: str) -> str:
    """Text for a Mermaid label: every character outside a plain set becomes an entity code (``#35;``).

    Names come from the target (module names, import filenames), so a newline, ``%%``, ``]``, ``|`` or a quote
    would otherwise end the label or start a new Mermaid statement.
    """
    return "".join(ch if _MERMAID_PLAIN.fullmatch(ch) else f"#{ord(ch)};" for ch in text)


def _md_align(column: str) -> str:
    return " --- |" if column in ("size", "backend") else " ---: |"


def _fenced(text: str, language: str) -> list[str]:
    """A fenced code block whose fence is longer than any backtick run inside, so no line can close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, text, fence]


def _md_cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))
    return terminal_safe(text).replace("\n", " ").replace("|", "\\|")


def _write_graphs(folder: Path, report: Postmortem) -> dict[str, str]:
    """The graphs as SVG files beside the Markdown; none when graphviz or ``dot`` is missing."""
    written: dict[str, str] = {}
    draws: list[tuple[str, Callable[[], Any]]] = [(GRAPH_FILE, report.shown_before.graph)]
    diff = report.diff
    if diff is not None:
        draws.append((FIX_GRAPH_FILE, diff.graph))
    for name, draw in draws:
        try:
            (folder / name).write_bytes(draw().pipe(format="svg"))
        except MissingExtraError:
            return written
        except Exception:  # graphviz raises ExecutableNotFound or CalledProcessError; Mermaid stands in
            continue
        written[name] = str(folder / name)
    return written


def write_postmortem(out: str | Path, report: Postmortem) -> PostmortemFiles:
    """Write ``postmortem.html`` (self-contained: inline CSS, SVG and script), ``postmortem.md`` and its SVGs."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(_html_sections(report))
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(report.title)}</title>{_STYLE}'
        f"</head>{_BODY_OPEN}{body}</body></html>"
    )
    html_path, md_path = folder / "postmortem.html", folder / "postmortem.md"
    html_path.write_text(page, encoding="utf-8")
    markdown = _markdown(report, _write_graphs(folder, report))
    md_path.write_text("\n".join(line.rstrip() for line in markdown.split("\n")), encoding="utf-8")
    return PostmortemFiles(html_path, md_path)


def postmortem(
    before: ScanResult,
    after: ScanResult | None = None,
    *,
    replay: ReplayComparison | None = None,
    out: str | Path = "postmortem",
    title: str | None = None,
    bench_rows: Sequence[dict[str, Any]] = (),
    bench_note: str = "",
    bench_device: str = "",
    fix: FixResult | None = None,
    bisect: BisectResult | None = None,
) -> PostmortemFiles:
    """Write the postmortem of ``before`` (and its fix ``after``) under ``out``; returns the HTML and Markdown paths.

    ``fix`` (a :func:`diagtools.fix` result) supplies the verified patch and its guard test; without ``after``
    the patch is the change shown.  ``bisect`` (a :func:`diagtools.bisect` result) puts the first bad commit in
    the incident's timeline.  ``bench_device`` names where ``bench_rows`` were measured; rows measured
    on ``cpu`` are left out.
    """
    report = Postmortem(
        title=title or f"Postmortem: importing {' '.join(before.targets)} initialized CUDA",
        before=before,
        after=after,
        replay=replay,
        fix=fix,
        bisect=bisect,
        bench_rows=bench_rows_of(bench_rows),
        bench_note=bench_note,
        bench_device=bench_device,
    )
    return write_postmortem(out, report)


def bench_rows_of(results: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Rows in the postmortem's column order, whatever else a bench result carries."""
    return tuple({column: row.get(column) for column in BENCH_COLUMNS} for row in results)
