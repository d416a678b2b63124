"""Terminal text of a sweep, its baseline, a bisect and the guard's failure: module tables and root causes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools.render.escape import WIDTH, _safe, one_line
from diagtools.render.lines import _culprit_lines, headline_words, text_table, wrapped
from diagtools.render.paths import display_path, short_path
from diagtools.render.style import verdict_toned, visible_len

if TYPE_CHECKING:
    from diagtools.model.bisect import BisectResult
    from diagtools.model.scan import ScanResult, Site
    from diagtools.model.sweep import RootCause, SweepResult, SweepRow

__all__ = ["render_baseline", "render_bisect", "render_guard_failure", "render_sweep"]

_one_line = one_line


@_safe
def render_guard_failure(result: ScanResult) -> str:
    """Why a module that must stay CUDA-free failed the check, in a few lines."""
    target = " ".join(map(_one_line, result.targets))
    if not result.cuda_initialized and not result.ok:
        detail = result.error.message if result.error else result.status
        return f"{target} could not be imported in a fresh subkernel ({result.status}): {detail} (verdict unknown)"
    if not result.cuda_initialized:
        reasons = "; ".join(result.doubts())
        return f"{target}: verdict {verdict_toned(result.verdict)}, not clean: {reasons} [{result.driver.describe()}]"
    verdict, driver = verdict_toned(result.verdict), result.driver.describe()
    lines = [f"importing {target} initialized CUDA (verdict {verdict}) [{driver}]"]
    for index, culprit in enumerate(result.culprits):
        lines += _culprit_lines(culprit, stack=False, headline=result.headline if index == 0 else None)
    return "\n".join(lines)


def _sweep_where(row: SweepRow, room: int) -> tuple[str, str]:
    """The row's last column in ``room`` characters, and a line to put below the row when it cannot fit there.

    The culprit and where the user's code reaches it (the path shortened in its middle, never the module's
    name), the parent it inherits from, or the error.  Names and phrases are never cut: what does not fit goes
    on its own line.  The line to change is a root cause's verified cut, listed below the table.
    """
    if row.culprit is not None and row.inherited_from:
        text = _one_line(f"(inherited from {row.inherited_from})")  # the README's words
    elif row.culprit is not None:
        module, line = _one_line(row.culprit.module), row.culprit.own_line
        where = _one_line(f"{display_path(line.file)}:{line.line}") if line else ""
        if not where:
            text = module
        elif len(module) + 4 + 12 <= room:  # room for the name and a path cut in its middle
            return f"{module} at {short_path(where, room - len(module) - 4)}", ""
        else:
            text = f"{module} at {where}"
    elif row.preloaded:
        text = "(preloaded by the zygote)"
    else:
        text = _one_line(row.error)
    if len(text) <= room:
        return text, ""
    return "", "    " + _shortened(text, WIDTH - 4)


def _shortened(text: str, limit: int) -> str:
    """A path cut in its middle at folder boundaries; other text (a message) cut at a word, with ``…``."""
    if len(text) <= limit:
        return text
    if " " not in text:
        return short_path(text, limit)
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:") + "\u2026"


def _cause_lines(result: SweepResult) -> list[str]:
    """Each root cause once: its line to change (a verified cut, when searched), the initializer, how many modules
    reach it."""
    causes = result.causes
    if not causes:
        return []
    lines = [f"root causes: {len(causes)} (for {len(result.culprits)} modules that initialize CUDA)"]
    for number, cause in enumerate(causes, 1):
        lines += _cause_title(number, cause.key)
        lines += _cause_sites(cause)
        parent = len(cause.through_parent)
        only = f", {parent} only through a parent package" if parent else ""
        lines.append(_one_line(_reached(f"     reached by {len(cause.modules)} module(s){only}: ", cause.modules)))
    return lines


def _cause_sites(cause: RootCause) -> list[str]:
    """The cause's line to change by the one rule, then where the user's code reaches it and CUDA's line."""

    def where(label: str, site: Site | None) -> list[str]:
        return [_one_line(f"     {label} {short_path(f'{display_path(site.file)}:{site.line}', 78)}")] if site else []

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


def _cause_title(number: int, key: str) -> list[str]:
    """``N. module: `statement``` (``<- initializer`` only when it is another module), the statement on a line of
    its own when the whole does not fit: the key is never cut."""
    reached, arrow, initializer = key.rpartition(" <- ")
    module = reached.partition(": ")[0]
    shown = reached if arrow and initializer == module else key
    title = _one_line(f"  {number}. {shown}")
    head, colon, rest = shown.partition(": ")
    if len(title) <= WIDTH or not colon:  # a cause with no line of the user's (``module (phase)``) stays whole
        return [title]
    return [_one_line(f"  {number}. {head}:"), _one_line(f"       {rest}")]


def _reached(lead: str, modules: Sequence[str]) -> str:
    """``lead`` and as many whole module names as fit in :data:`WIDTH`, then how many more: a name is never cut."""
    shown: list[str] = []
    for index, name in enumerate(modules[:6]):
        rest = len(modules) - index - 1
        more = f", ... {rest} more" if rest else ""
        if len(lead) + len(", ".join([*shown, name])) + len(more) > WIDTH:
            break
        shown.append(name)
    hidden = len(modules) - len(shown)
    if not shown:
        return lead.rstrip(": ") + " (in the table above)"
    return lead + ", ".join(shown) + (f", ... {hidden} more" if hidden else "")


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
    lines = wrapped(f"driver: {shown.describe()}") if shown is not None else []
    return "\n".join([*lines, _sweep_run(result)])


def _sweep_run(result: SweepResult) -> str:
    """How the sweep ran, in lines that fit :data:`WIDTH`, wrapped between words and names, never inside one."""
    if result.mode == "zygote":
        lines = ["mode: zygote (each module scanned in a child forked from a process that preloaded its imports)"]
        lines += wrapped(f"preloaded: {', '.join(map(_one_line, result.preload)) or 'nothing'}")
    else:
        lines = ["mode: fresh subkernels"]
    for note in result.preload_notes:
        lines += wrapped(f"preload: {_one_line(note)}")
    if result.fallback:
        lines += wrapped(f"fallback: {result.fallback}")
    if result.rescanned or result.resumed:
        lines += wrapped(f"journal: {_rescan_words(result)}")
    return "\n".join(lines)


def _rescan_words(result: SweepResult) -> str:
    """How many rows the journal gave, and why the others were scanned again, the commonest reason first."""
    reasons: dict[str, int] = {}
    for why in result.rescanned.values():
        reasons[why] = reasons.get(why, 0) + 1
    ranked = sorted(reasons.items(), key=lambda item: -item[1])
    shown = "; ".join(f"{count} because {_one_line(why)}" for count, why in ((c, w) for w, c in ranked[:4]))
    more = f"; {sum(c for _, c in ranked[4:])} for other reasons" if len(ranked) > 4 else ""
    rescanned = f", rescanned {len(result.rescanned)}: {shown}{more}" if result.rescanned else ""
    return f"reused {result.resumed} row(s){rescanned}"


@_safe
def render_sweep(result: SweepResult) -> str:
    """A module -> verdict table, culprits first, then how it ran and the counts."""
    rows = sorted(result.rows, key=lambda row: (not row.cuda_initialized, row.status == "ok", row.module))
    table: list[list[str]] = []
    for row in rows:
        cuda = verdict_toned(row.judged, {"initializes-cuda": "YES", "clean": "no"}.get(row.judged.value, "?"))
        table.append([row.module, cuda, f"{row.import_s:.3f}", str(row.status), ""])
    header = ["module", "CUDA?", "import s", "status", "culprit at / why"]
    used = sum(max(len(header[i]), *(visible_len(r[i]) for r in table)) + 2 for i in range(4)) if table else 0
    below = []
    for cells, row in zip(table, rows, strict=True):
        cells[4], line = _sweep_where(row, max(WIDTH - used, 12))
        below.append(line)
    if WIDTH - used < len(header[4]):
        header[4] = ""  # every detail is on its own line below its row
    head, *body = text_table(header, table, right=(2,))
    lines = [head]
    for line, extra in zip(body, below, strict=True):
        lines += [line, extra] if extra else [line]
    lines += _cause_lines(result)
    lines.append(_sweep_mode(result))
    if result.interrupted:
        lines.append(
            f"interrupted: {result.interrupted} modules were not scanned; rerun with the same --json to resume"
        )
    resumed = f", {result.resumed} from the journal" if result.resumed else ""
    inherited = sum(1 for row in result.culprits if row.cuda_source == "parent")
    lines.append(f"verdict: {verdict_toned(result.verdict)}")
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
