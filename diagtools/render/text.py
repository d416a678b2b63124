"""Terminal rendering of scan results: the culprit, its chain and its line.

Everything here may carry text the target controls (module names, file
paths, source lines, messages, captured output), so every public function
returns text with control characters shown as ``\\xNN`` escapes: no ANSI or
OSC sequence, carriage return or bidi override reaches the terminal.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ParamSpec

from diagtools.model.verdict import Evidence
from diagtools.render.paths import display_path, short_path

if TYPE_CHECKING:  # the result types are only read here; a scan's report loads no replay, sweep or diff model
    from diagtools.model.bisect import BisectResult
    from diagtools.model.cuts import Cut, CutTry, Edge, Headline
    from diagtools.model.diff import ScanDiff
    from diagtools.model.replay import ChildOutcome, ParentState, ReplayComparison, ReplayResult
    from diagtools.model.scan import Culprit, ScanResult, Site
    from diagtools.model.sweep import RootCause, SweepResult, SweepRow
    from diagtools.render.ordering import ModuleGroups

__all__ = [
    "OUTCOME_WORDS",
    "culprit_details",
    "cut_lines",
    "one_line",
    "paint",
    "render_bisect",
    "render_comparison",
    "render_diff",
    "render_guard_failure",
    "render_replay",
    "render_scan",
    "render_sweep",
    "render_verdict",
    "terminal_safe",
    "text_table",
    "use_color",
]

_P = ParamSpec("_P")
WIDTH = 100  # the columns a table row may take
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[{_CONTROL}]")  # newline and tab are kept
_CONTROLS_AND_BREAKS = re.compile(f"[{_CONTROL}\n\t]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab shown as an escape."""
    return _CONTROLS.sub(_escape, text)


def one_line(text: object) -> str:
    """A single-line field (a name, a path, a source line): line breaks are escaped too."""
    return _CONTROLS_AND_BREAKS.sub(_escape, str(text))


def _safe(render: Callable[_P, str]) -> Callable[_P, str]:
    @functools.wraps(render)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> str:
        return terminal_safe(render(*args, **kwargs))

    return wrapper


_one_line = one_line


@_safe
def render_scan(result: ScanResult, *, stack: bool = False) -> str:
    """A short report a person can act on; ``stack`` adds the whole Python stack."""
    lines = [
        f"diagtools scan {' '.join(map(_one_line, result.targets))}",
        f"  driver: {_one_line(_driver_text(result))}",
        f"  status: {result.status}  ({len(result.modules)} modules imported in {result.duration_s:.2f} s)",
    ]
    lines += _error_lines(result)
    lines += _cuda_lines(result)
    for index, culprit in enumerate(result.culprits):
        lines += _culprit_lines(culprit, stack=stack, headline=result.headline if index == 0 else None)
    note = hook_note(result)
    if note:
        lines.append(f"  note: {note}")
    if result.cuts is not None and result.cuda_initialized:
        lines += cut_lines(result)
    if result.skipped_events:
        lines.append(f"  note: {result.skipped_events} malformed event line(s) from the subkernel were skipped")
    return "\n".join(lines)


EVIDENCE_WORDS = {
    Evidence.DRIVER_HOOK: "driver-hook",
    Evidence.INFERRED: "driver-hook, inferred from the CUDA runtime's export-table request (no cuInit call was seen)",
    Evidence.TRACE: "trace (a line-traced rerun)",
    Evidence.STATE_PROBE: "state-probe (the driver's state changed between two observations)",
}


def evidence_words(culprit: Culprit) -> str:
    """How the moment was caught, in words."""
    return EVIDENCE_WORDS[culprit.evidence]


def hook_note(result: ScanResult) -> str:
    """On the real driver, when its injection hook stayed silent: how the moment was found instead."""
    culprit = result.culprit
    if result.driver.kind != "real" or culprit is None or culprit.evidence is Evidence.DRIVER_HOOK:
        return ""
    return (
        "the driver never called the injection library (CUDA_INJECTION64_PATH: an old driver, or the library did "
        "not load), so the moment was found from the driver's state"
        + (" and a line-traced rerun" if culprit.evidence is Evidence.TRACE else "")
    )


def _driver_text(result: ScanResult | ReplayResult) -> str:
    """The driver, its library shown home-relative (``~/.cache/...``) like every path a report prints."""
    library = result.driver.library
    return replace(result.driver, library=display_path(library) if library else None).describe()


def _error_lines(result: ScanResult) -> list[str]:
    if result.error is None:
        return []
    lines = [f"  error: {result.error.message}"]
    if result.error.file:
        lines.append(f"    at {_one_line(result.error.file)}:{result.error.line}")
    return lines


def _cuda_lines(result: ScanResult) -> list[str]:
    lines = [f"  verdict: {result.verdict}"]
    if result.cuda_initialized:
        phase = result.culprit.phase if result.culprit else "unknown"
        lines.append(f"  CUDA initialized: YES (during {phase})")
        if result.simulation_gaps:  # the verdict stands, but later code may have failed at the simulation's edge
            lines.append("  simulation gaps (where the simulated GPU could not play along):")
            lines += [f"    - {_one_line(gap)}" for gap in result.simulation_gaps]
    elif result.doubts():
        lines.append("  CUDA initialized: unknown (not seen, but the run could not see everything):")
        lines += [f"    - {_one_line(reason)}" for reason in result.doubts()]
    else:
        lines.append("  CUDA initialized: no")
    lines += [
        _one_line(
            f"  still running when the scan stopped watching: thread {thread.name!r} started by {thread.starter}"
            + (f" at {thread.started_at}" if thread.started_at else "")
        )
        for thread in result.threads_alive
    ]
    return lines


def _site_lines(label: str, site: Site, indent: str = "    ") -> list[str]:
    lines = [f"{indent}{label} {_one_line(site)}"]
    if site.source:
        lines.append(f"{indent}{site.line:>5} | {_one_line(site.source)}")
    return lines


def _culprit_lines(culprit: Culprit, *, stack: bool, headline: Headline | None = None) -> list[str]:
    return [
        f"  culprit: {_one_line(culprit.module or '(no module was executing)')}",
        *culprit_details(culprit, stack=stack, headline=headline),
    ]


def culprit_details(
    culprit: Culprit,
    *,
    stack: bool = False,
    indent: str = "    ",
    headline: Headline | None = None,
    imports: bool = False,
) -> list[str]:
    """A culprit's chain, thread, line to change, where CUDA got initialized, context and evidence: the words every
    report uses.

    ``headline`` is the line to change by the one rule (:func:`diagtools.model.cuts.headline`); without one
    (a run, whose culprits no cut was searched for) the report names no line to change.  ``imports``: show the
    chain's import lines whenever one is known (a run's: the script or cell line that started the chain).
    """
    lines = []
    if culprit.chain:
        lines.append(f"{indent}chain: {' -> '.join(map(_one_line, culprit.chain))}")
    if culprit.phase == "thread":
        lines.append(f"{indent}thread: {_one_line(culprit.thread_described)}")
        if culprit.thread_started_at is not None:
            lines += _site_lines("started at:", culprit.thread_started_at, indent)
    lines += change_lines(culprit, headline, indent)
    if culprit.context:
        lines.append(f"{indent}while: {_one_line(culprit.context)}")
    lines.append(f"{indent}evidence: {evidence_words(culprit)} (phase {culprit.phase})")
    if (stack and culprit.chain_imports) or (imports and any(culprit.chain_imports)):
        lines.append(f"{indent}imports (importer -> imported at the import line):")
        lines += [_edge_line(edge, indent) for edge in culprit.import_edges()]
    if stack and culprit.stack:
        lines.append(f"{indent}stack (outermost first):")
        if culprit.stack_dropped:
            lines.append(f"{indent}  [... {culprit.stack_dropped} outer frames dropped]")
        lines += [f"{indent}  {_one_line(frame)}" for frame in culprit.stack]
    return lines


def headline_words(headline: Headline) -> str:
    """Which rule chose the line to change, in words."""
    if headline.rule.value == "regression-edge":
        if headline.edge is None:
            return "the line the known-good state no longer runs at import"
        return "the import the known-good state does not run"
    return "the nearest verified cut" if headline.rule.value == "nearest-cut" else ""


def change_lines(culprit: Culprit, headline: Headline | None, indent: str = "    ") -> list[str]:
    """The line to change (with the rule that chose it and the deepest cut beside it), then where CUDA got
    initialized, the library line that called the driver, and where the user's code reaches it."""
    lines = []
    shown: list[Site | None] = []
    if headline is not None and headline.line is not None:
        lines += _site_lines(f"line to change ({headline_words(headline)}):", headline.line, indent)
        shown.append(headline.line)
        if headline.deepest is not None:
            lines += _site_lines("deepest first-party cut:", headline.deepest.site, indent)
            shown.append(headline.deepest.site)
    elif headline is not None:
        lines.append(f"{indent}line to change: none verified ({_one_line(headline.reason)})")
    at, inside = culprit.initialized_at, culprit.initialized_in
    if at is not None:
        lines += _site_lines("CUDA initialized at:", at, indent)
    if inside is not None:
        lines += _site_lines("initialized in:", inside, indent)
    reach = culprit.first_party
    if reach is not None and reach not in (*shown, at, inside):
        lines += _site_lines("your code reaches it at:", reach, indent)
    return lines


# ---- where to cut ---------------------------------------------------------------------------

OUTCOME_WORDS = {  # a try's outcome (diagtools.model.cuts.Outcome) in words
    "clean": "clean",
    "still-initializes": "still initializes CUDA",
    "breaks": "breaks the import",
    "cannot-defer": "cannot wait",
    "unknown": "unknown",
}
_PASSED_OVER = ("cannot-defer", "breaks", "unknown")


def edge_text(edge: Edge) -> str:
    """``file:line  statement`` of an edge, the path shown as a reader would see it."""
    site = edge.site
    return _one_line(f"{display_path(site.file)}:{site.line}  {site.source}".rstrip())


def try_text(attempt: CutTry) -> str:
    """One try in a line: the statements deferred, what happened, and where."""
    edges = ", ".join(f"{display_path(e.site.file)}:{e.site.line}" for e in attempt.edges)
    words = OUTCOME_WORDS[attempt.outcome]
    detail = ""
    if attempt.outcome == "still-initializes" and attempt.chain:
        detail = f" (through {' -> '.join(attempt.chain)})"
    elif attempt.reason and attempt.outcome != "clean":
        where = f"{attempt.at.file.rsplit('/', 1)[-1]}: " if attempt.at is not None and len(attempt.edges) > 1 else ""
        detail = f": {where}{attempt.reason}"
    return _one_line(f"defer {edges}: {words}{detail}")


def _cut_block(cut: Cut, label: str, indent: str) -> list[str]:
    count = f"{len(cut.edges)} import{'s' if len(cut.edges) != 1 else ''}"
    reach = f"; on the chain of {cut.reach} swept module(s)" if cut.reach is not None else ""
    lines = [f"{indent}{label}: {count}, verified {cut.verified}{reach}"]
    lines += [f"{indent}  - {edge_text(edge)}" for edge in cut.edges]
    return lines


def cut_lines(result: ScanResult, indent: str = "  ") -> list[str]:
    """Where to cut: the nearest and deepest verified cuts, the statements passed over, and what to run next."""
    search = result.cuts
    if search is None:
        return []
    runs = sum(1 for attempt in search.tries if attempt.outcome != "cannot-defer")
    lines = [f"{indent}where to cut: {runs} verification run(s), {search.seconds:.2f} s"]
    inner = indent + "  "
    if search.nearest is None:
        lines.append(_one_line(f"{inner}no verified cut: {search.reason}"))
    else:
        lines += _cut_block(search.nearest, "nearest cut", inner)
        if search.same:
            lines.append(f"{inner}deepest first-party cut: the same")
        elif search.deepest is not None:
            lines += _cut_block(search.deepest, "deepest first-party cut", inner)
    passed = [a for a in search.tries if a.outcome in _PASSED_OVER]
    if passed:
        lines.append(f"{inner}passed over:")
        lines += [f"{inner}  - {try_text(attempt)}" for attempt in passed]
    if search.nearest is not None:
        lines.append(_one_line(f"{inner}the patch and its guard: diagtools fix {' '.join(result.targets)}"))
    return lines


def _edge_line(edge: tuple[str, str, Site | None], indent: str) -> str:
    importer, imported, site = edge
    where = f"{site.file}:{site.line}" + (f"  {site.source}" if site.source else "") if site else "(line unknown)"
    return _one_line(f"{indent}  {importer} -> {imported}: {where}")


@_safe
def render_replay(result: ReplayResult) -> str:
    """The replay as a transcript: setup, parent state, child outcome, driver answers."""
    lines = [
        f"diagtools replay {result.target} --start-method {result.start_method} --child {result.child_action}",
        f"  driver: {_one_line(_driver_text(result))}",
        f"  {result.headline()[0]}",
        f"  status: {result.status}; the import {_import_verdict(result)}",
    ]
    if result.error is not None:
        lines.append(f"  error: {result.error.message}")
    if result.parent is not None:
        lines += _parent_lines(result.parent)
    if result.child is not None:
        lines += _child_lines(result.child, result.driver.kind)
    return "\n".join(lines)


def _import_verdict(result: ReplayResult) -> str:
    """What the replay says about the import itself (not about this child)."""
    if result.parent is None:
        return "was not judged"
    return "initializes CUDA" if result.parent.cuda_initialized else "does not initialize CUDA"


def _parent_lines(parent: ParentState) -> list[str]:
    state = "initialized" if parent.cuda_initialized else "not initialized"
    lines = [f"  parent: CUDA {state} (driver answered {parent.driver_state}); {len(parent.threads)} thread(s)"]
    if parent.torch_cuda_initialized is not None:
        lines.append(f"    torch.cuda initialized: {parent.torch_cuda_initialized}")
    return lines


def _child_lines(child: ChildOutcome, driver_kind: str) -> list[str]:
    lines = [f"  child: {child.short()}  (exit code {child.exitcode})"]
    for call in child.driver_calls:
        lines.append(f"    {call.call} -> {call.name} ({call.code}) [{driver_kind} driver]")
    shown = child.shown_traceback.strip()
    if shown and child.status != "ok" and not child.driver_calls:
        lines.append("    " + _one_line(shown.splitlines()[-1]))
    return lines


@_safe
def render_comparison(comparison: ReplayComparison) -> str:
    """A variant x start-method grid, the parent's CUDA state per variant, then the verdict as bullets."""
    methods = comparison.start_methods
    rows = []
    for variant in comparison.variants:
        parent = comparison.runs_of(variant)[0].parent
        state = "?" if parent is None else ("CUDA initialized" if parent.cuda_initialized else "CUDA not initialized")
        cells = [comparison.run(variant, method).child for method in methods]
        rows.append([variant, state, *(_one_line(cell.short() if cell else "no child") for cell in cells)])
    lines = [f"diagtools replay {comparison.target} --compare"]
    lines += ["  " + line for line in text_table(["variant", "parent", *methods], rows)]
    lines += render_verdict(comparison).splitlines()
    return "\n".join(lines)


def render_verdict(comparison: ReplayComparison) -> str:
    """The comparison's verdict as a short headline and one bullet per finding."""
    headline, *findings = comparison.explanation()
    return "\n".join([f"  {headline}", *(f"    - {finding}" for finding in findings)])


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


@_safe
def render_diff(diff: ScanDiff, *, limit: int = 20) -> str:
    """The verdict, the edge the fix cut, and what left or joined the import tree, most relevant first.

    The culprit chain and the target's own package are listed one per line
    (up to ``limit``); other packages get one line each with their count, the
    standard library one line in all.
    """
    lines = [f"diagtools diff: {diff.summary()}"]
    lines.append(f"  verdict: {diff.verdict}")
    head = diff.headline
    if head.line is not None:
        lines += _site_lines(f"line to change ({headline_words(head)}):", _shown_site(head.line), "  ")
    for label, scan in (("before:", diff.before), ("after: ", diff.after)):
        culprit = scan.culprit
        if culprit is None:
            continue
        lines.append(f"  {label} culprit {_one_line(culprit.module)} via {' -> '.join(map(_one_line, culprit.chain))}")
        if culprit.initialized_at is not None:
            lines += _site_lines("CUDA initialized at:", _shown_site(culprit.initialized_at), "    ")
    from diagtools.render.ordering import group_modules  # a diff's grouping: a scan's report does not need it

    chain = diff.before.culprit.chain if diff.before.culprit else ()
    for label, names, sign in (
        ("no longer imported", diff.removed_modules, "-"),
        ("newly imported", diff.added_modules, "+"),
    ):
        groups = group_modules(names, targets=diff.before.targets, chain=chain)
        lines.append(f"  modules {label}: {groups.total}")
        lines += _group_lines(groups, sign, limit)
    return "\n".join(lines)


def _shown_site(site: Site) -> Site:
    """``site`` with its path as a reader sees it (repository-relative, ``~`` for home)."""
    return replace(site, file=display_path(site.file))


def _group_lines(groups: ModuleGroups, sign: str, limit: int) -> list[str]:
    lines = [f"    {sign} {_one_line(name)}  (culprit chain)" for name in groups.chain]
    lines += [f"    {sign} {_one_line(name)}" for name in groups.own[:limit]]
    if len(groups.own) > limit:
        lines.append(f"    {sign} ... {len(groups.own) - limit} more of the target's package")
    for package, modules in groups.others[:limit]:
        lines.append(f"    {sign} {_one_line(package)}.*: {len(modules)} module{'s' if len(modules) != 1 else ''}")
    hidden = groups.others[limit:]
    if hidden:
        lines.append(f"    {sign} ... {len(hidden)} more packages, {sum(len(m) for _, m in hidden)} modules")
    if groups.stdlib:
        preview = ", ".join(groups.stdlib[:4]) + (", ..." if len(groups.stdlib) > 4 else "")
        lines.append(f"    {sign} standard library: {len(groups.stdlib)} modules ({preview})")
    return lines


@_safe
def render_guard_failure(result: ScanResult) -> str:
    """Why a module that must stay CUDA-free failed the check, in a few lines."""
    target = " ".join(map(_one_line, result.targets))
    if not result.cuda_initialized and not result.ok:
        detail = result.error.message if result.error else result.status
        return f"{target} could not be imported in a fresh subkernel ({result.status}): {detail} (verdict unknown)"
    if not result.cuda_initialized:
        reasons = "; ".join(result.doubts())
        return f"{target}: verdict {result.verdict}, not clean: {reasons} [{result.driver.describe()}]"
    lines = [f"importing {target} initialized CUDA (verdict {result.verdict}) [{result.driver.describe()}]"]
    for index, culprit in enumerate(result.culprits):
        lines += _culprit_lines(culprit, stack=False, headline=result.headline if index == 0 else None)
    return "\n".join(lines)


def _sweep_where(row: SweepRow) -> str:
    """The row's last column: the culprit and where the user's code reaches it (repository-relative), the parent
    it inherits from, or the error.  The line to change is a root cause's verified cut, listed below."""
    if row.culprit is not None and row.inherited_from:
        return _one_line(f"(inherited from {row.inherited_from})")  # the README's words
    if row.culprit is not None:
        line = row.culprit.own_line
        site = f" at {display_path(line.file)}:{line.line}" if line else ""
        return _one_line(f"{row.culprit.module}{site}")
    if row.preloaded:
        return "(preloaded by the zygote)"
    return _one_line(row.error)


def _fit(cell: str, width: int) -> str:
    """``cell`` cut in the middle to ``width`` characters (a path keeps its file name and line)."""
    return cell if len(cell) <= width else short_path(cell, max(width, 12))


def _cause_lines(result: SweepResult) -> list[str]:
    """Each root cause once: its line to change (a verified cut, when searched), the initializer, how many modules
    reach it."""
    causes = result.causes
    if not causes:
        return []
    lines = [f"root causes: {len(causes)} (for {len(result.culprits)} modules that initialize CUDA)"]
    for number, cause in enumerate(causes, 1):
        lines.append(_one_line(f"  {number}. {cause.key}"))
        lines += _cause_sites(cause)
        parent = len(cause.through_parent)
        only = f", {parent} only through a parent package" if parent else ""
        reached = f"     reached by {len(cause.modules)} module(s){only}: {_names(cause.modules)}"
        lines.append(_one_line(reached if len(reached) <= WIDTH else reached[: WIDTH - 4] + " ..."))
    return lines


def _cause_sites(cause: RootCause) -> list[str]:
    """The cause's line to change by the one rule, then where the user's code reaches it and CUDA's line."""

    def where(label: str, site: Site | None) -> list[str]:
        return [_one_line(f"     {label} {_fit(f'{display_path(site.file)}:{site.line}', 78)}")] if site else []

    headline = cause.headline
    lines = where(f"line to change ({headline_words(headline)}, on {cause.representative}):", headline.line)
    if headline.deepest is not None:
        lines += where("deepest first-party cut:", headline.deepest.site)
    if headline.line is None:
        why = headline.reason if cause.cuts is not None else "not searched: sweep --cuts, or diagtools fix MODULE"
        lines.append(_one_line(f"     line to change: none verified ({why})"))
    shown = {headline.line, headline.deepest.site if headline.deepest else None}
    if cause.own_line not in shown and cause.own_line != cause.initialized_at:
        lines += where("your code reaches it at:", cause.own_line)
    lines += where("CUDA initialized at:", cause.initialized_at)
    reach = cause.cuts.nearest.reach if cause.cuts is not None and cause.cuts.nearest is not None else None
    if reach is not None:
        lines.append(f"     the nearest cut is on the chain of {reach} swept module(s)")
    return lines


def _names(modules: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(modules[:limit])
    return shown + (f", ... {len(modules) - limit} more" if len(modules) > limit else "")


@_safe
def render_baseline(result: SweepResult, known: frozenset[str], source: str) -> str:
    """What a baseline comparison found: the new root causes (the ones that fail), and the known ones."""
    new = result.new_causes(known)
    known_here = len(result.causes) - len(new)
    lines = [f"baseline {_one_line(source)}: {len(new)} new root cause(s), {known_here} known"]
    lines += [_one_line(f"  NEW: {cause.key} ({len(cause.modules)} module(s))") for cause in new]
    return "\n".join(lines)


def _sweep_mode(result: SweepResult) -> str:
    driver = result.driver
    shown = replace(driver, library=display_path(driver.library) if driver.library else None) if driver else None
    lines = [f"driver: {shown.describe()}"] if shown is not None else []
    return "\n".join([*lines, _sweep_run(result)])


def _sweep_run(result: SweepResult) -> str:
    if result.mode == "zygote":
        preload = ", ".join(result.preload) or "nothing"
        line = f"mode: zygote (preloaded {preload}; each module in a forked child)"
    else:
        line = "mode: fresh subkernels"
    line += "".join(f"\npreload: {_one_line(note)}" for note in result.preload_notes)
    return line + (f"\nfallback: {result.fallback}" if result.fallback else "")


@_safe
def render_sweep(result: SweepResult) -> str:
    """A module -> verdict table, culprits first, then how it ran and the counts."""
    rows = sorted(result.rows, key=lambda row: (not row.cuda_initialized, row.status == "ok", row.module))
    table: list[list[str]] = []
    for row in rows:
        cuda = {"initializes-cuda": "YES", "clean": "no"}.get(row.verdict.value, "?")
        table.append([row.module, cuda, f"{row.import_s:.3f}", str(row.status), _sweep_where(row)])
    header = ["module", "CUDA?", "import s", "status", "culprit at / why"]
    used = sum(max(len(header[i]), *(len(r[i]) for r in table)) + 2 for i in range(4)) if table else 0
    for cells in table:
        cells[4] = _fit(cells[4], WIDTH - used)
    lines = text_table(header, table, right=(2,))
    lines += _cause_lines(result)
    lines.append(_sweep_mode(result))
    if result.interrupted:
        lines.append(
            f"interrupted: {result.interrupted} modules were not scanned; rerun with the same --json to resume"
        )
    resumed = f", {result.resumed} from the journal" if result.resumed else ""
    inherited = sum(1 for row in result.culprits if row.cuda_source == "parent")
    lines.append(f"verdict: {result.verdict}")
    lines.append(
        f"{len(result.rows)} modules{resumed}: {len(result.culprits)} initialize CUDA ({inherited} through a parent "
        f"package), {len(result.failures)} failed to import ({result.seconds:.1f} s)"
    )
    return "\n".join(lines)


@_safe
def render_bisect(result: BisectResult) -> str:
    """The first bad commit, what it touched, and the culprit at that commit."""
    lines = [f"diagtools bisect {result.target}: {result.good[:12]} (good) .. {result.bad[:12]} (bad)"]
    if result.first_bad is None:
        lines.append("  no single first bad commit: skipped commits hide it; candidates:")
        lines += [f"    {commit}" for commit in result.candidates]
    else:
        lines.append(f"  first bad commit: {result.first_bad}  {_one_line(result.subject)}")
        lines += [f"    touched: {_one_line(file)}" for file in result.files]
        if result.culprit is not None:
            lines += _culprit_lines(result.culprit, stack=False, headline=result.headline)
            if result.parent is not None:
                lines.append(f"    compared with its parent {result.parent[:12]} (clean): the known-good state")
    skipped = sum(1 for step in result.steps if step.verdict == "skip")
    lines.append(f"  {len(result.steps)} commits tested by git bisect, {skipped} skipped (target did not import)")
    return "\n".join(lines)


_RED, _GREEN, _AMBER, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"
_PAINT = (
    (
        _RED,
        r"Reproduced: [^;\n]*|not fixed: [^;\n]*"
        r"|CUDA initialized: YES|(?<!not )(?<!no longer )initializes CUDA|initializes-cuda|CUDA initialized(?!:)"
        r"|\bUNEXPECTED\b|\bYES\b|poisoned-fork|poisoned fork",
    ),
    (
        _GREEN,
        r"(?<!not )fixed: [^;\n]*|Passes: [^;\n]*"
        r"|CUDA initialized: no|does not initialize CUDA|no longer initializes CUDA|CUDA not initialized|\bclean\b"
        r"|status: ok\b|\[ok \]|\bok \(\d+ device\(s\)\)",
    ),
    (
        _AMBER,
        r"[Nn]ot (?:judged|reproduced)\b[^;\n]*|\bunknown\b|(?<!\b0 )\bfailed\b|\bimport-error\b|\bcrashed\b"
        r"|\btimeout\b|\bexited\b|\bFAILED\b",
    ),
)


@functools.cache
def _painter() -> re.Pattern[str]:
    """The colouring pattern, compiled on first use: a report to a pipe or a file is never painted."""
    return re.compile("|".join(f"(?P<c{i}>{pattern})" for i, (_, pattern) in enumerate(_PAINT)))


def paint(text: str) -> str:
    """``text`` with ANSI colours: red where CUDA got initialized, green where clean, amber for failed/unknown."""

    def colour(match: re.Match[str]) -> str:
        group = next(name for name, value in match.groupdict().items() if value is not None)
        return f"{_PAINT[int(group[1:])][0]}{match.group(0)}{_RESET}"

    return _painter().sub(colour, text)


def use_color(isatty: bool, environ: Mapping[str, str]) -> bool:
    """Colour a terminal unless ``NO_COLOR`` is set; ``FORCE_COLOR`` colours even a pipe."""
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    return isatty and environ.get("TERM") != "dumb"
