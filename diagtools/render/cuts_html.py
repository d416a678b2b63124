"""HTML of the fix, for notebooks and reports: every user-controlled string is escaped."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from diagtools.render.html import _STYLE, change_html, cuts_html, path_html
from diagtools.render.lines import OUTCOME_WORDS
from diagtools.render.paths import display_path, shareable

if TYPE_CHECKING:
    from diagtools.model.fix import FixResult

__all__ = ["fix_html", "patch_html"]

_PATCH_STYLE = (
    "<style>.dt pre.dt-patch{background:#fbfbfb;border:1px solid #ddd;line-height:1.45}"
    ".dt-patch .add{color:#1b5e20;background:#e8f5e9}.dt-patch .del{color:#8e0000;background:#fdecea}"
    ".dt-patch .hunk{color:#555}</style>"
)


def patch_html(patch: str) -> str:
    """A unified diff, its added and removed lines marked (and coloured beyond the marks)."""
    rows = []
    for line in patch.splitlines():
        kind = "add" if line.startswith("+") and not line.startswith("+++") else ""
        kind = kind or ("del" if line.startswith("-") and not line.startswith("---") else "")
        kind = kind or ("hunk" if line.startswith("@@") else "")
        text = escape(line)
        rows.append(f'<span class="{kind}">{text}</span>' if kind else text)
    return _PATCH_STYLE + '<pre class="dt-patch">' + "\n".join(rows) + "</pre>"


def fix_html(fix: FixResult) -> str:
    """The fix as a notebook shows it: the line to change, the cut, the patch, its check, callers, the guard."""
    scan = shareable(fix.scan)
    verdict = "verified" if fix.verified else "not verified"
    css = "good" if fix.verified else "unknown"
    parts = [
        _STYLE,
        '<div class="dt">',
        f'<p class="dt-verdict"><b>diagtools fix</b> <code>{escape(" ".join(scan.targets))}</code> &mdash; '
        f'<span class="{css}">{verdict}</span></p>',
    ]
    if scan.culprit is not None:
        parts.append(f"<p>Culprit: <code>{escape(scan.culprit.module or '?')}</code></p>")
        parts.append(change_html(scan.culprit, scan.headline))
    parts.append(cuts_html(scan))
    if fix.reason:
        parts.append(f'<p class="unknown">No patch: {escape(fix.reason)}</p></div>')
        return "".join(parts)
    check = fix.check
    if check is not None:
        names = "".join(
            f"<li><code>from {escape(n.module)} import {escape(n.name)}</code>: "
            + (
                '<span class="good">resolves</span>'
                if n.ok
                else f'<span class="bad">does not resolve</span> ({escape(n.error)})'
            )
            + "</li>"
            for n in check.names
        )
        rescan = escape(OUTCOME_WORDS[check.rescan]) + (f" ({escape(check.reason)})" if check.reason else "")
        parts.append(f"<p>Checked on a temporary copy: rescan with the patch <b>{rescan}</b>.</p><ul>{names}</ul>")
    parts.append(f"<p>The patch (apply in the checkout root with <code>git apply</code>):</p>{patch_html(fix.patch)}")
    if fix.callers:
        items = "".join(
            f"<li>{path_html(display_path(c.site.file), c.site.line)} <code>{escape(c.site.source)}</code></li>"
            for c in fix.callers
        )
        parts.append(
            "<p>Callers that import the deferred names (they keep working; deleting the re-export would break "
            f"them):</p><ul>{items}</ul>"
        )
    parts.append(f"<p>The guard (<code>{escape(fix.guard_file)}</code>):</p><pre>{escape(fix.guard)}</pre>")
    parts.append("</div>")
    return "".join(parts)
