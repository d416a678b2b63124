"""Terminal text of the fix: the verified cut, the patch, its check on a copy, the callers, the guard.

Like :mod:`diagtools.render.text`, every function returns text with control
characters escaped: module names, paths and source lines are the target's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools.model.verdict import Tone
from diagtools.render.escape import _safe, one_line
from diagtools.render.lines import OUTCOME_WORDS, change_lines, cut_lines, wrapped
from diagtools.render.paths import display_path
from diagtools.render.style import toned, verdict_toned

if TYPE_CHECKING:
    from diagtools.model.fix import FixResult

__all__ = ["render_fix", "shareable_fix_text"]


@_safe
def render_fix(fix: FixResult, *, patch: bool = True) -> str:
    """The fix as a person reads it: the cut, the patch, its check, the callers, the guard; ``patch``: the diff
    itself last (a file given to ``--write`` holds it instead)."""
    scan = fix.scan
    lines = [f"diagtools fix {' '.join(map(one_line, scan.targets))}"]
    lines += wrapped(
        f"  driver: {one_line(replace(scan.driver, library=display_path(scan.driver.library)).describe())}"
    )
    lines.append(f"  verdict: {verdict_toned(scan.verdict)}")
    if scan.culprit is not None:
        lines.append(f"  culprit: {one_line(scan.culprit.module)}")
        lines.append(f"    chain: {' -> '.join(map(one_line, scan.culprit.chain))}")
        lines += change_lines(scan.culprit, scan.headline, "    ")
    lines += cut_lines(scan)
    if fix.reason:
        lines.append(one_line(f"  no patch: {fix.reason}"))
        return "\n".join(lines)
    lines += _patch_lines(fix)
    if patch:
        lines += ["", *fix.patch.splitlines()]
    return "\n".join(lines)


def root_text(root: str) -> str:
    """Where a patch applies, without a machine's own path: a git checkout by name, else the shown path."""
    from pathlib import Path

    if (Path(root) / ".git").exists():
        return f"the top level of the git checkout {Path(root).name}/"
    return display_path(root) or root


def _patch_lines(fix: FixResult) -> list[str]:
    lines = [one_line(f"  patch (apply in {root_text(fix.root)}: git apply FILE, or patch -p1 < FILE):")]
    for change in fix.changes:
        lazy = f"; lazy: {', '.join(change.lazy)}" if change.lazy else ""
        moved = f"; moved into functions: {', '.join(f'{n} -> {f}()' for n, f in change.moved)}" if change.moved else ""
        lines.append(one_line(f"    {change.path}{lazy}{moved}"))
    check = fix.check
    if check is not None:
        state = toned("passed", Tone.GOOD) if check.passed else toned("FAILED", Tone.BAD)
        lines.append(f"  check on a temporary copy: {state}")
        lines.append(
            f"    rescan with the patch: {OUTCOME_WORDS[check.rescan]}" + (f" ({check.reason})" if check.reason else "")
        )
        for name in check.names:
            verdict = "resolves" if name.ok else f"does NOT resolve: {name.error}"
            lines.append(one_line(f"    from {name.module} import {name.name}: {verdict}"))
    if fix.callers:
        lines.append(
            "  callers that import the deferred names (they keep working; deleting the re-export would break them):"
        )
        lines += [one_line(f"    {display_path(c.site.file)}:{c.site.line}  {c.site.source}") for c in fix.callers]
    lines.append(f"  guard ({fix.guard_file}, or `cuda_free_modules = {' '.join(fix.scan.targets)}` in pytest.ini):")
    lines += [f"    {line}" if line else "" for line in fix.guard.splitlines()]
    return lines


def shareable_fix_text(fix: FixResult) -> str:
    """The fix's report with every path relative, as a notebook saves it (its plain-text view)."""
    from diagtools.render.paths import shareable

    return render_fix(replace(fix, scan=shareable(fix.scan)))
