"""The pieces every terminal report is made of: the culprit's lines, the cuts, aligned tables, words.

The scan, the fix, ``diagtools run`` and the sweep tell a culprit, a line to
change and a cut in the same words; they are written once, here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools.model.verdict import Evidence, Tone
from diagtools.render.escape import WIDTH, one_line
from diagtools.render.paths import display_path
from diagtools.render.style import toned, verdict_toned, visible_len

if TYPE_CHECKING:
    from diagtools.model.cuts import Cut, CutTry, Headline
    from diagtools.model.replay import ReplayResult
    from diagtools.model.scan import Culprit, ScanResult, Site

__all__ = [
    "EVIDENCE_WORDS",
    "OUTCOME_WORDS",
    "change_lines",
    "culprit_details",
    "cut_lines",
    "evidence_words",
    "headline_words",
    "hook_note",
    "site_lines",
    "text_table",
    "try_text",
    "wrapped",
]

_one_line = one_line

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
    lines = [f"  verdict: {verdict_toned(result.verdict)}"]
    if result.cuda_initialized:
        phase = result.culprit.phase if result.culprit else "unknown"
        lines.append(f"  {toned('CUDA initialized: YES', Tone.BAD)} (during {phase})")
        if result.simulation_gaps:  # the verdict stands, but later code may have failed at the simulation's edge
            lines.append("  simulation gaps (where the simulated GPU could not play along):")
            lines += [f"    - {_one_line(gap)}" for gap in result.simulation_gaps]
    elif result.doubts():
        unknown = toned("unknown", Tone.UNKNOWN)
        lines.append(f"  CUDA initialized: {unknown} (not seen, but the run could not see everything):")
        lines += [f"    - {_one_line(reason)}" for reason in result.doubts()]
    else:
        lines.append(f"  {toned('CUDA initialized: no', Tone.GOOD)}")
    lines += [
        _one_line(
            f"  still running when the scan stopped watching: thread {thread.name!r} started by {thread.starter}"
            + (f" at {thread.started_at}" if thread.started_at else "")
        )
        for thread in result.threads_alive
    ]
    return lines


def site_lines(label: str, site: Site, indent: str = "    ") -> list[str]:
    """A labelled site and its source line; a site too long for the label's line goes whole on the next."""
    where = _one_line(site)
    lines = [f"{indent}{label} {where}"]
    if len(lines[0]) > WIDTH:
        lines = [f"{indent}{label}", f"{indent}  {where}"]
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
        lines += wrapped(f"{indent}chain: {' -> '.join(map(_one_line, culprit.chain))}")
    if culprit.phase == "thread":
        lines.append(f"{indent}thread: {_one_line(culprit.thread_described)}")
        if culprit.thread_started_at is not None:
            lines += site_lines("started at:", culprit.thread_started_at, indent)
    lines += change_lines(culprit, headline, indent)
    if culprit.context:
        lines.append(f"{indent}while: {_one_line(culprit.context)}")
    lines.append(f"{indent}evidence: {evidence_words(culprit)} (phase {culprit.phase})")
    if (stack and culprit.chain_imports) or (imports and any(culprit.chain_imports)):
        lines.append(f"{indent}imports (importer -> imported at the import line):")
        for edge in culprit.import_edges():
            lines += _edge_lines(edge, indent)
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
        lines += site_lines(f"line to change ({headline_words(headline)}):", headline.line, indent)
        shown.append(headline.line)
        if headline.deepest is not None:
            lines += site_lines("deepest first-party cut:", headline.deepest.site, indent)
            shown.append(headline.deepest.site)
    elif headline is not None:
        lines.append(f"{indent}line to change: none verified ({_one_line(headline.reason)})")
    at, inside = culprit.initialized_at, culprit.initialized_in
    if at is not None:
        lines += site_lines("CUDA initialized at:", at, indent)
    if inside is not None:
        lines += site_lines("initialized in:", inside, indent)
    reach = culprit.first_party
    if reach is not None and reach not in (*shown, at, inside):
        lines += site_lines("your code reaches it at:", reach, indent)
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
_OUTCOME_TONES = {"clean": Tone.GOOD, "still-initializes": Tone.BAD}


def located_lines(lead: str, where: str, source: str, indent: str) -> list[str]:
    """``lead where  source`` in one line when it fits :data:`WIDTH`, else the source whole on the next line."""
    line = f"{lead}{where}  {source}".rstrip() if source else f"{lead}{where}"
    if len(line) <= WIDTH or not source:
        return [line]
    return [f"{lead}{where}", f"{indent}{source}"]


def try_text(attempt: CutTry) -> str:
    """One try in a line: the statements deferred, what happened, and where."""
    edges = ", ".join(f"{display_path(e.site.file)}:{e.site.line}" for e in attempt.edges)
    words = toned(OUTCOME_WORDS[attempt.outcome], _OUTCOME_TONES.get(attempt.outcome, Tone.UNKNOWN))
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
    for edge in cut.edges:
        where = _one_line(f"{display_path(edge.site.file)}:{edge.site.line}")
        lines += located_lines(f"{indent}  - ", where, _one_line(edge.site.source), f"{indent}      ")
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
        for attempt in passed:
            lines += wrapped(f"{inner}  - {try_text(attempt)}", "    ")
    if search.nearest is not None:
        lines.append(_one_line(f"{inner}the patch and its guard: diagtools fix {' '.join(result.targets)}"))
    return lines


def _edge_lines(edge: tuple[str, str, Site | None], indent: str) -> list[str]:
    """``importer -> imported: file:line  statement``; what does not fit goes whole on the lines below."""
    importer, imported, site = edge
    lead = _one_line(f"{indent}  {importer} -> {imported}: ")
    if site is None:
        return [f"{lead}(line unknown)"]
    where = _one_line(f"{site.file}:{site.line}")
    if len(lead) + len(where) > WIDTH:
        return [lead.rstrip(), *located_lines(f"{indent}    ", where, _one_line(site.source), f"{indent}      ")]
    return located_lines(lead, where, _one_line(site.source), f"{indent}      ")


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
    widths = [max([len(header[i])] + [visible_len(row[i]) for row in cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        pads = [" " * (w - visible_len(v)) for v, w in zip(values, widths, strict=True)]
        parts = [pad + v if right else v + pad for v, pad, right in zip(values, pads, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(list(header)), *(line(row) for row in cells)]


def _table_cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def wrapped(text: str, indent: str = "    ") -> list[str]:
    """``text`` in lines of at most :data:`~diagtools.render.escape.WIDTH` columns, broken between words and
    never inside one (a path longer than a line keeps a line of its own); the lines after the first indented."""
    if len(text) <= WIDTH:
        return [text]
    import textwrap  # only a long line needs it

    lead = len(text) - len(text.lstrip(" "))
    return textwrap.wrap(
        text.lstrip(" "),
        WIDTH,
        initial_indent=" " * lead,
        subsequent_indent=" " * lead + indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [text]
