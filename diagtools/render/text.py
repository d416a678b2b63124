"""Terminal rendering of scan results: the culprit, its chain and its line."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from diagtools.model.bisect import BisectResult
from diagtools.model.diff import ScanDiff
from diagtools.model.replay import ChildOutcome, ParentState, ReplayComparison, ReplayResult
from diagtools.model.scan import Culprit, ScanResult
from diagtools.model.sweep import SweepResult
from diagtools.render.ordering import ModuleGroups, group_modules
from diagtools.render.paths import display_path

__all__ = [
    "paint",
    "render_bisect",
    "render_comparison",
    "render_diff",
    "render_guard_failure",
    "render_replay",
    "render_scan",
    "render_sweep",
    "render_verdict",
    "text_table",
    "use_color",
]


def render_scan(result: ScanResult, *, stack: bool = False) -> str:
    """A short report a person can act on; ``stack`` adds the whole Python stack."""
    lines = [
        f"diagtools scan {' '.join(result.targets)}",
        f"  driver: {_driver_text(result)}",
        f"  status: {result.status}  ({len(result.modules)} modules imported in {result.duration_s:.2f} s)",
    ]
    lines += _error_lines(result)
    lines += _cuda_lines(result)
    for culprit in result.culprits:
        lines += _culprit_lines(culprit, stack=stack)
    return "\n".join(lines)


def _driver_text(result: ScanResult) -> str:
    """The driver, its library shown home-relative (``~/.cache/...``) like every path a report prints."""
    library = result.driver.library
    return replace(result.driver, library=display_path(library) if library else None).describe()


def _error_lines(result: ScanResult) -> list[str]:
    if result.error is None:
        return []
    lines = [f"  error: {result.error.message}"]
    if result.error.file:
        lines.append(f"    at {result.error.file}:{result.error.line}")
    return lines


def _cuda_lines(result: ScanResult) -> list[str]:
    if not result.cuda_initialized:
        return ["  CUDA initialized: no"]
    phase = result.culprit.phase if result.culprit else "unknown"
    return [f"  CUDA initialized: YES (during {phase})"]


def _culprit_lines(culprit: Culprit, *, stack: bool) -> list[str]:
    lines = [f"  culprit: {culprit.module or '(no module was executing)'}"]
    if culprit.chain:
        lines.append(f"    chain: {' -> '.join(culprit.chain)}")
    if culprit.phase == "thread":
        lines.append(f"    thread: {culprit.thread}")
    if culprit.site is not None:
        lines.append(f"    site:  {culprit.site.file}:{culprit.site.line} in {culprit.site.function}")
        if culprit.site.source:
            lines.append(f"    {culprit.site.line:>5} | {culprit.site.source}")
    lines.append(f"    evidence: {culprit.evidence}")
    if stack and culprit.stack:
        lines.append("    stack (outermost first):")
        lines += [f"      {frame.file}:{frame.line} in {frame.function}" for frame in culprit.stack]
    return lines


def render_replay(result: ReplayResult) -> str:
    """The replay as a transcript: setup, parent state, child outcome, driver answers."""
    lines = [
        f"diagtools replay {result.target} --start-method {result.start_method} --child {result.child_action}",
        f"  driver: {result.driver.describe()}",
        f"  status: {result.status}",
    ]
    if result.error is not None:
        lines.append(f"  error: {result.error.message}")
    if result.parent is not None:
        lines += _parent_lines(result.parent)
    if result.child is not None:
        lines += _child_lines(result.child, result.driver.kind)
    return "\n".join(lines)


def _parent_lines(parent: ParentState) -> list[str]:
    state = "initialized" if parent.cuda_initialized else "not initialized"
    lines = [f"  parent: CUDA {state} (driver answered {parent.driver_state}); {len(parent.threads)} thread(s)"]
    if parent.torch_cuda_initialized is not None:
        lines.append(f"    torch.cuda initialized: {parent.torch_cuda_initialized}")
    return lines


def _child_lines(child: ChildOutcome, driver_kind: str) -> list[str]:
    lines = [f"  child: {child.summary()}  (exit code {child.exitcode})"]
    for call in child.driver_calls:
        lines.append(f"    {call.call} -> {call.name} ({call.code}) [{driver_kind} driver]")
    if child.traceback and child.status != "ok":
        lines.append("    " + child.traceback.strip().splitlines()[-1])
    return lines


def render_comparison(comparison: ReplayComparison) -> str:
    """A variant x start-method grid, the parent's CUDA state per variant, then the verdict as bullets."""
    methods = comparison.start_methods
    rows = []
    for variant in comparison.variants:
        parent = comparison.runs_of(variant)[0].parent
        state = "?" if parent is None else ("CUDA initialized" if parent.cuda_initialized else "CUDA not initialized")
        cells = [comparison.run(variant, method).child for method in methods]
        rows.append([variant, state, *((cell.summary() if cell else "no child") for cell in cells)])
    lines = [f"diagtools replay {comparison.target} --compare"]
    lines += ["  " + line for line in text_table(["variant", "parent", *methods], rows)]
    lines += render_verdict(comparison).splitlines()
    return "\n".join(lines)


def render_verdict(comparison: ReplayComparison) -> str:
    """The comparison's verdict as a short headline and one bullet per finding."""
    headline, findings = comparison.findings()
    return "\n".join([f"  verdict: {headline}", *(f"    - {finding}" for finding in findings)])


def text_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] | None = None
) -> list[str]:
    """Aligned columns: numbers right, text left, every column as wide as its widest cell.

    A column is numeric when every value in it is a number or ``None``; ``right`` names the
    right-aligned columns instead, for numbers already formatted as text.
    """
    cells = [[_table_cell(value) for value in row] for row in rows]
    numeric = [
        (i in right)
        if right is not None
        else bool(rows) and all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(header))
    ]
    widths = [max([len(header[i])] + [len(row[i]) for row in cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if right else v.ljust(w) for v, w, right in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(list(header)), *(line(row) for row in cells)]


def _table_cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_diff(diff: ScanDiff, *, limit: int = 20) -> str:
    """The verdict, the edge the fix cut, and what left or joined the import tree, most relevant first.

    The culprit chain and the target's own package are listed one per line
    (up to ``limit``); other packages get one line each with their count, the
    standard library one line in all.
    """
    lines = [f"diagtools diff: {diff.verdict()}"]
    if diff.before.culprit is not None:
        lines.append(f"  before: culprit {diff.before.culprit.module} via {' -> '.join(diff.before.culprit.chain)}")
    if diff.after.culprit is not None:
        lines.append(f"  after:  culprit {diff.after.culprit.module} via {' -> '.join(diff.after.culprit.chain)}")
    chain = diff.before.culprit.chain if diff.before.culprit else ()
    for label, names, sign in (
        ("no longer imported", diff.removed_modules, "-"),
        ("newly imported", diff.added_modules, "+"),
    ):
        groups = group_modules(names, targets=diff.before.targets, chain=chain)
        lines.append(f"  modules {label}: {groups.total}")
        lines += _group_lines(groups, sign, limit)
    return "\n".join(lines)


def _group_lines(groups: ModuleGroups, sign: str, limit: int) -> list[str]:
    lines = [f"    {sign} {name}  (culprit chain)" for name in groups.chain]
    lines += [f"    {sign} {name}" for name in groups.own[:limit]]
    if len(groups.own) > limit:
        lines.append(f"    {sign} ... {len(groups.own) - limit} more of the target's package")
    for package, modules in groups.others[:limit]:
        lines.append(f"    {sign} {package}.*: {len(modules)} module{'s' if len(modules) != 1 else ''}")
    hidden = groups.others[limit:]
    if hidden:
        lines.append(f"    {sign} ... {len(hidden)} more packages, {sum(len(m) for _, m in hidden)} modules")
    if groups.stdlib:
        preview = ", ".join(groups.stdlib[:4]) + (", ..." if len(groups.stdlib) > 4 else "")
        lines.append(f"    {sign} standard library: {len(groups.stdlib)} modules ({preview})")
    return lines


def render_guard_failure(result: ScanResult) -> str:
    """Why a module that must stay CUDA-free failed the check, in a few lines."""
    target = " ".join(result.targets)
    if not result.ok:
        detail = result.error.message if result.error else result.status
        return f"{target} could not be imported in a fresh subkernel ({result.status}): {detail}"
    lines = [f"importing {target} initialized CUDA [{result.driver.describe()}]"]
    for culprit in result.culprits:
        lines += _culprit_lines(culprit, stack=False)
    return "\n".join(lines)


def render_sweep(result: SweepResult) -> str:
    """A module -> verdict table, culprits first, then the counts."""
    rows = sorted(result.rows, key=lambda row: (not row.cuda_initialized, row.status == "ok", row.module))
    table: list[list[object]] = []
    for row in rows:
        where = ""
        if row.culprit is not None:
            site = f" at {row.culprit.site.file}:{row.culprit.site.line}" if row.culprit.site else ""
            where = f"{row.culprit.module}{site}"
        elif row.error:
            where = row.error
        table.append([row.module, "YES" if row.cuda_initialized else "no", f"{row.import_s:.3f}", row.status, where])
    lines = text_table(["module", "CUDA?", "import s", "status", "culprit / site"], table, right=(2,))
    resumed = f", {result.resumed} from the journal" if result.resumed else ""
    lines.append(
        f"{len(result.rows)} modules{resumed}: {len(result.culprits)} initialize CUDA, "
        f"{len(result.failures)} failed to import ({result.seconds:.1f} s)"
    )
    return "\n".join(lines)


def render_bisect(result: BisectResult) -> str:
    """The first bad commit, what it touched, and the culprit at that commit."""
    lines = [f"diagtools bisect {result.target}: {result.good[:12]} (good) .. {result.bad[:12]} (bad)"]
    if result.first_bad is None:
        lines.append("  no single first bad commit: skipped commits hide it; candidates:")
        lines += [f"    {commit}" for commit in result.candidates]
    else:
        lines.append(f"  first bad commit: {result.first_bad}  {result.subject}")
        lines += [f"    touched: {file}" for file in result.files]
        if result.culprit is not None:
            lines += _culprit_lines(result.culprit, stack=False)
    skipped = sum(1 for step in result.steps if step.verdict == "skip")
    lines.append(f"  {len(result.steps)} commits tested by git bisect, {skipped} skipped (target did not import)")
    return "\n".join(lines)


_RED, _GREEN, _AMBER, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"
_PAINT = (
    (
        _RED,
        r"CUDA initialized: YES|(?<!not )(?<!no longer )initializes CUDA|initializes-cuda|CUDA initialized(?!:)"
        r"|\bUNEXPECTED\b|\bYES\b",
    ),
    (
        _GREEN,
        r"CUDA initialized: no|does not initialize CUDA|no longer initializes CUDA|CUDA not initialized|\bclean\b"
        r"|status: ok\b|\[ok \]|\bok \(\d+ device\(s\)\)",
    ),
    (_AMBER, r"\bunknown\b|\bfailed\b|\bimport-error\b|\bcrashed\b|\btimeout\b|\bexited\b|\bFAILED\b"),
)
_PAINTER = re.compile("|".join(f"(?P<c{i}>{pattern})" for i, (_, pattern) in enumerate(_PAINT)))


def paint(text: str) -> str:
    """``text`` with ANSI colours: red where CUDA got initialized, green where clean, amber for failed/unknown."""

    def colour(match: re.Match[str]) -> str:
        group = next(name for name, value in match.groupdict().items() if value is not None)
        return f"{_PAINT[int(group[1:])][0]}{match.group(0)}{_RESET}"

    return _PAINTER.sub(colour, text)


def use_color(isatty: bool, environ: Mapping[str, str]) -> bool:
    """Colour a terminal unless ``NO_COLOR`` is set; ``FORCE_COLOR`` colours even a pipe."""
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    return isatty and environ.get("TERM") != "dumb"
