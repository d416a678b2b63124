"""The postmortem: one self-contained HTML page and its Markdown twin.

Sections: summary, timeline, root cause (culprit, chain, source line, graph),
replay transcript, the fix's diff, kernel timing, and the regression guard to
add.  Everything is built from result objects, so the same analysis a notebook
ran is what the report says.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from diagtools.errors import MissingExtraError
from diagtools.model.diff import ScanDiff, diff_scans
from diagtools.model.replay import ReplayComparison
from diagtools.model.scan import ScanResult
from diagtools.render.html import _STYLE, bench_table_html, comparison_html, graph_block, scan_html
from diagtools.render.text import render_comparison, render_diff, render_scan, terminal_safe

__all__ = ["Postmortem", "write_postmortem"]

BENCH_COLUMNS = ["size", "backend", "median_ms", "GB/s", "copy_fraction", "max_rel_error"]


@dataclass(frozen=True)
class Postmortem:
    """What the postmortem is made of; ``after`` and ``replay`` are optional."""

    title: str
    before: ScanResult
    after: ScanResult | None = None
    replay: ReplayComparison | None = None
    bench_rows: tuple[dict[str, Any], ...] = ()
    bench_note: str = ""

    @property
    def target(self) -> str:
        return " ".join(self.before.targets)

    @property
    def diff(self) -> ScanDiff | None:
        return diff_scans(self.before, self.after) if self.after is not None else None

    def timeline(self) -> list[tuple[str, str]]:
        """(time, what happened) for each analysis step, in the order they ran."""
        events = [(self.before.started_at, f"scan before the fix: {_verdict(self.before)}")]
        if self.replay is not None:
            for label, run in self.replay.runs:
                events.append((run.started_at, f"replay {label}/{run.start_method}: {run.status}"))
        if self.after is not None:
            events.append((self.after.started_at, f"scan after the fix: {_verdict(self.after)}"))
        return sorted(events, key=lambda event: event[0])  # stable: same instant keeps the order the steps ran

    def guard_snippet(self) -> str:
        return (
            "# tests/test_cuda_free.py\n"
            "from diagtools.pytest_plugin import assert_import_cuda_free\n\n\n"
            "def test_import_stays_cuda_free():\n"
            f"    assert_import_cuda_free({self.target!r})\n\n"
            "# CI step\n"
            f"diagtools scan {self.target} --fail-on-cuda\n"
        )


def _verdict(result: ScanResult) -> str:
    if not result.cuda_initialized:
        return "CUDA not initialized"
    culprit = result.culprit
    return f"CUDA initialized by {culprit.module}" if culprit else "CUDA initialized"


def _source_context(file: str, line: int, around: int = 3) -> list[tuple[int, str]]:
    first = max(1, line - around)
    return [
        (n, linecache.getline(file, n).rstrip("\n"))
        for n in range(first, line + around + 1)
        if linecache.getline(file, n)
    ]


def _html_sections(report: Postmortem) -> list[str]:
    culprit = report.before.culprit
    sections = [
        f"<h1>{escape(report.title)}</h1>",
        f"<p>Target <code>{escape(report.target)}</code>; driver: {escape(report.before.driver.describe())}.</p>",
        "<h2>Timeline</h2><table><tr><th>time (UTC)</th><th>step</th></tr>"
        + "".join(f"<tr><td>{escape(t)}</td><td>{escape(what)}</td></tr>" for t, what in report.timeline())
        + "</table>",
        "<h2>Root cause</h2>",
        scan_html(report.before),
    ]
    if culprit is not None and culprit.site is not None:
        context = _source_context(culprit.site.file, culprit.site.line)
        lines = "\n".join(f"{'&gt;' if n == culprit.site.line else ' '} {n:>5} | {escape(text)}" for n, text in context)
        sections.append(f"<p>Source around the culprit line:</p><pre>{lines}</pre>")
    sections.append(graph_block(report.before.graph))
    if report.replay is not None:
        sections += [
            "<h2>Replay</h2>",
            comparison_html(report.replay),
            f"<pre>{escape(render_comparison(report.replay))}</pre>",
        ]
    diff = report.diff
    if diff is not None:
        sections += [
            "<h2>The fix</h2>",
            f"<pre>{escape(render_diff(diff))}</pre>",
            graph_block(diff.graph),
        ]
    sections += ["<h2>Kernel timing after the fix</h2>", _bench_html(report)]
    sections += ["<h2>Regression guard</h2>", f"<pre>{escape(report.guard_snippet())}</pre>"]
    return sections


def _bench_html(report: Postmortem) -> str:
    note = f"<p>{escape(report.bench_note)}</p>" if report.bench_note else ""
    if not report.bench_rows:
        return note or "<p>Not measured.</p>"
    return note + bench_table_html(list(report.bench_rows), BENCH_COLUMNS)


def _markdown(report: Postmortem) -> str:
    lines = [
        f"# {report.title}",
        "",
        f"Target `{report.target}`; driver: {report.before.driver.describe()}.",
        "",
        "## Timeline",
        "",
        "| time (UTC) | step |",
        "| --- | --- |",
    ]
    lines += [f"| {_md_cell(t)} | {_md_cell(what)} |" for t, what in report.timeline()]
    lines += ["", "## Root cause", "", *_fenced(render_scan(report.before, stack=True), "text"), ""]
    lines += [*_fenced(_dot(report.before), "dot"), ""]
    if report.replay is not None:
        lines += ["## Replay", "", *_fenced(render_comparison(report.replay), "text"), ""]
    if report.diff is not None:
        lines += ["## The fix", "", *_fenced(render_diff(report.diff), "text"), ""]
    lines += ["## Kernel timing after the fix", ""]
    if report.bench_note:
        lines += [report.bench_note, ""]
    if report.bench_rows:
        lines += ["| " + " | ".join(BENCH_COLUMNS) + " |", "|" + " --- |" * len(BENCH_COLUMNS)]
        lines += ["| " + " | ".join(_md_cell(row.get(c)) for c in BENCH_COLUMNS) + " |" for row in report.bench_rows]
    elif not report.bench_note:
        lines.append("Not measured.")
    lines += ["", "## Regression guard", "", *_fenced(report.guard_snippet(), "python"), ""]
    return "\n".join(lines)


def _fenced(text: str, language: str) -> list[str]:
    """A fenced code block whose fence is longer than any backtick run inside, so no line can close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, text, fence]


def _md_cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))
    return terminal_safe(text).replace("\n", " ").replace("|", "\\|")


def _dot(result: ScanResult) -> str:
    try:
        return result.to_dot()
    except MissingExtraError as exc:
        return f"// {exc}"


def write_postmortem(out: str | Path, report: Postmortem) -> tuple[Path, Path]:
    """Write ``postmortem.html`` (self-contained: inline CSS and SVG) and ``postmortem.md``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(_html_sections(report))
    page = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{escape(report.title)}</title>{_STYLE}'
        f'</head><body class="dt">{body}</body></html>'
    )
    html_path, md_path = folder / "postmortem.html", folder / "postmortem.md"
    html_path.write_text(page, encoding="utf-8")
    md_path.write_text(_markdown(report), encoding="utf-8")
    return html_path, md_path


def bench_rows_of(results: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Rows in the postmortem's column order, whatever else a bench result carries."""
    return tuple({column: row.get(column) for column in BENCH_COLUMNS} for row in results)
