"""Find where to cut: the import statements whose deferral leaves the target clean, each verified by a run.

A try runs the target's real code in a fresh subkernel, on the same driver,
with the chosen statements deferred.  The probe loads each changed module
from its rewritten text (:func:`diagtools.usecases.defer.defer`, the same
rewrite the patch makes) under the module's own file name, through the
module's own loader, and says so in a ``rewritten`` event; every other file
is imported from where it lies.  Lines the rewrite moved are mapped back to
the file as it is, so each chain and error a try reports names the user's
real lines.

The search: cut the chain's first deferrable first-party edge (nearest: the
target's own statements before its parent packages') or its last (deepest),
run, and when CUDA is still initialized follow the new chain the same way,
until the target runs clean; then drop every edge whose restoration keeps it
clean.  An edge whose deferral breaks the import, or
whose statement cannot wait, is passed over for the next one along the chain.
"""

from __future__ import annotations

import os
import tempfile
import time
import tokenize
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from diagtools import protocol
from diagtools.errors import CannotDeferError
from diagtools.model.cuts import Cut, CutKind, CutSearch, CutTry, Edge, Outcome, chain_edges, edge_keys
from diagtools.model.scan import ScanResult, Site, TargetFailure
from diagtools.model.verdict import ScanStatus, Verdict
from diagtools.runner.subkernel import RawRun, SubkernelRequest

if TYPE_CHECKING:
    from diagtools.model.driver import DriverInfo
    from diagtools.model.sweep import SweepRow
    from diagtools.usecases.defer import Deferred

__all__ = ["MAX_TRIES", "Rewrite", "search_cuts", "sweep_reach"]

MAX_TRIES = 24  # verification runs one search may make, nearest and deepest together

Runner = Callable[[SubkernelRequest], RawRun]


@dataclass(frozen=True)
class Rewrite:
    """Deferring ``edges`` as files: each changed file's rewrite, or the reason it cannot be made."""

    deferred: tuple[Deferred, ...]
    refused: CannotDeferError | None = None


def rewrite(edges: Sequence[Edge]) -> Rewrite:
    """Each file's rewrite with the statements of its edges deferred (the patch makes the same one)."""
    from diagtools.usecases.defer import defer

    by_file: dict[str, list[Edge]] = {}
    for edge in edges:
        by_file.setdefault(edge.site.file, []).append(edge)
    done = []
    for file, mine in by_file.items():
        try:
            source = read_source(file)
            done.append(
                defer(file, source, [e.site.line for e in mine], package=_is_package(file), module=mine[0].importer)
            )
        except CannotDeferError as refused:
            return Rewrite(tuple(done), refused)
    return Rewrite(tuple(done))


def read_source(file: str) -> str:
    """A Python file's text, decoded as the interpreter would (its coding cookie); refused with the reason."""
    try:
        with tokenize.open(file) as handle:
            return handle.read()
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise CannotDeferError(file, 0, f"the file cannot be read ({exc})") from None


def encoding_of(file: str) -> str:
    with open(file, "rb") as handle:
        return tokenize.detect_encoding(handle.readline)[0]


def _is_package(file: str) -> bool:
    return os.path.basename(file) == "__init__.py"


class Verifier:
    """Runs the target with chosen edges deferred, once per set of edges, and keeps every try in order."""

    def __init__(
        self,
        request: SubkernelRequest,
        *,
        targets: tuple[str, ...],
        driver: DriverInfo,
        own: tuple[str, ...],
        runner: Runner,
        budget: int = MAX_TRIES,
    ) -> None:
        self.request, self.targets, self.driver, self.own, self.runner = request, targets, driver, own, runner
        self.budget = budget
        self.tries: list[CutTry] = []
        self._memo: dict[frozenset[tuple[str, int]], tuple[CutTry, ScanResult | None]] = {}

    def exhausted(self) -> bool:
        return self.budget <= 0

    def check(self, edges: Sequence[Edge]) -> tuple[CutTry, ScanResult | None]:
        """The try of exactly ``edges`` (remembered): its outcome, and the run's result when one was made."""
        key = frozenset((e.site.file, e.site.line) for e in edges)
        if key not in self._memo:
            self._memo[key] = self._run(tuple(edges))
            self.tries.append(self._memo[key][0])
        return self._memo[key]

    def _run(self, edges: tuple[Edge, ...]) -> tuple[CutTry, ScanResult | None]:
        start = time.monotonic()
        made = rewrite(edges)
        if made.refused is not None:
            refused = made.refused
            at = (
                Site(refused.file, refused.line, "<module>", _line_text(refused.file, refused.line))
                if refused.line
                else None
            )
            return CutTry(edges, Outcome.CANNOT_DEFER, refused.reason, at=at), None
        self.budget -= 1
        with tempfile.TemporaryDirectory(prefix="diagtools-cut-") as scratch:
            raw = self.runner(self.request.with_settings({protocol.SCAN_SOURCES: _sources(made.deferred, scratch)}))
        from diagtools.usecases.assemble import assemble

        result = remap(assemble(raw, self.targets, self.driver, self.own), made.deferred)
        outcome, reason = _outcome(result, raw, made.deferred)
        culprit = result.culprit
        at = culprit.initialized_at if culprit is not None and outcome == Outcome.STILL_INITIALIZES else None
        if outcome == Outcome.BREAKS and result.error is not None and result.error.file:
            line = result.error.line or 0
            at = Site(result.error.file, line, "<module>", _line_text(result.error.file, line))
        chain = culprit.chain if culprit is not None and outcome == Outcome.STILL_INITIALIZES else ()
        seconds = round(time.monotonic() - start, 3)
        return CutTry(edges, outcome, reason, chain, at, seconds), result


def _sources(deferred: Iterable[Deferred], scratch: str) -> str:
    """Write each rewritten text in the file's own encoding; the request's lines of original, rewritten."""
    lines = []
    for index, change in enumerate(deferred):
        path = os.path.join(scratch, f"{index}.py")
        with open(path, "wb") as handle:
            handle.write(change.after.encode(encoding_of(change.file), "surrogateescape"))
        lines += [change.file, path]
    return "\n".join(lines)


def _outcome(result: ScanResult, raw: RawRun, deferred: Sequence[Deferred]) -> tuple[Outcome, str]:
    """What the try showed, and in words why when it is not clean."""
    applied = {event.get("f") for event in raw.events if event.get("e") == "rewritten"}
    loaded = {node.file for node in result.modules}
    missed = [change.file for change in deferred if change.file in loaded and change.file not in applied]
    if missed:
        return Outcome.UNKNOWN, f"{missed[0]} was imported without its rewritten text, so the try proves nothing"
    if result.status == ScanStatus.IMPORT_ERROR:
        return Outcome.BREAKS, result.error.message if result.error else "the import failed"
    if result.cuda_initialized and result.culprit is not None:
        return Outcome.STILL_INITIALIZES, f"CUDA is still initialized, by {result.culprit.module}"
    if result.verdict != Verdict.CLEAN:
        return Outcome.UNKNOWN, "; ".join(result.doubts()) or "the run could not see"
    return Outcome.CLEAN, ""


def _line_text(file: str, line: int) -> str:
    from diagtools.usecases.attribution import source_line

    return source_line(file, line)


# ---- lines of a rewritten file, mapped back to the file as it is -----------------------------


def remap(result: ScanResult, deferred: Sequence[Deferred]) -> ScanResult:
    """``result`` with every site in a rewritten file moved to that file's real line (its text when the line is
    one the rewrite added)."""
    if not deferred:
        return result
    from diagtools.usecases.defer import line_map

    maps = {change.file: (line_map(change.before, change.after), change.after.splitlines()) for change in deferred}

    def site(value: Site) -> Site:
        if value.file not in maps:
            return value
        mapping, lines = maps[value.file]
        if value.line in mapping:
            return replace(value, line=mapping[value.line], source=_line_text(value.file, mapping[value.line]))
        text = lines[value.line - 1].strip() if 0 < value.line <= len(lines) else value.source
        return replace(value, source=f"{text}  [a line the rewrite added]")

    culprits = tuple(culprit.with_sites(site) for culprit in result.culprits)
    error = result.error
    if error is not None and error.file in maps and error.line:
        error = replace(error, line=site(Site(error.file, error.line, "")).line)
    return replace(result, culprits=culprits, error=error)


# ---- the search -------------------------------------------------------------------------------


def search_cuts(result: ScanResult, verifier: Verifier, sweep: Iterable[SweepRow] = ()) -> CutSearch:
    """The nearest and the deepest verified cut of ``result``'s culprit, every try, and why when there is none."""
    start = time.monotonic()
    reason = _unsearchable(result)
    if reason:
        return CutSearch(reason=reason)
    nearest = _search(result, verifier, CutKind.NEAREST)
    deepest = _search(result, verifier, CutKind.DEEPEST) if nearest is not None else None
    rows = tuple(sweep)
    if rows:
        nearest = _with_reach(nearest, rows)
        deepest = _with_reach(deepest, rows)
    why = "" if nearest is not None else _why_none(result, verifier)
    return CutSearch(nearest, deepest, tuple(verifier.tries), why, round(time.monotonic() - start, 3))


def _unsearchable(result: ScanResult) -> str:
    culprit = result.culprit
    if result.verdict != Verdict.INITIALIZES_CUDA or culprit is None:
        return "nothing to cut: the target does not initialize CUDA"
    if culprit.phase != "import":
        return f"CUDA is initialized during {culprit.phase}, not by an import: no import statement to defer"
    edges = chain_edges(result)
    if not any(edge.first_party for edge in edges):
        return _no_first_party_edge(result, edges)
    return ""


def _no_first_party_edge(result: ScanResult, edges: Sequence[Edge]) -> str:
    """Why no import can be cut; the lines themselves are the culprit's ("CUDA initialized at", "your code
    reaches it at"), which every report shows beside this."""
    culprit = result.culprit
    assert culprit is not None
    if not edges:
        return (
            f"{culprit.module}'s own top-level code initializes CUDA and no import leads there that could wait: "
            "make that call lazy (inside a function) instead"
        )
    reach = " (where your code reaches it: see below)" if culprit.first_party else ""
    return f"every import on the chain to {culprit.module} is in third-party code{reach}"


def _search(result: ScanResult, verifier: Verifier, kind: CutKind) -> Cut | None:
    """Cut, rerun, follow the next chain, until clean; then the smallest subset that stays clean."""
    cut: list[Edge] = []
    current = result
    while not verifier.exhausted():
        candidates = [e for e in chain_edges(current) if e.first_party and _key(e) not in {_key(c) for c in cut}]
        if kind == CutKind.DEEPEST:
            candidates.reverse()
        else:  # the target's own statements first: a parent package's import of it is rarely the change
            candidates.sort(key=lambda edge: not _inside(edge.importer, result.targets))
        step = _step(cut, candidates, verifier)
        if step is None:
            return None
        edge, attempt, after = step
        cut.append(edge)
        if attempt.outcome == Outcome.CLEAN:
            return Cut(kind, _minimal(cut, verifier))
        assert after is not None
        current = after
    return None


def _step(cut: list[Edge], candidates: list[Edge], verifier: Verifier) -> tuple[Edge, CutTry, ScanResult | None] | None:
    """The first candidate that, added to ``cut``, runs clean or moves the initialization elsewhere."""
    for edge in candidates:
        if verifier.exhausted():
            return None
        attempt, after = verifier.check([*cut, edge])
        if attempt.outcome in (Outcome.CLEAN, Outcome.STILL_INITIALIZES) and not _same_chain(attempt, edge):
            return edge, attempt, after
    return None


def _same_chain(attempt: CutTry, edge: Edge) -> bool:
    """The try still initialized CUDA through the very edge it deferred: the deferral changed nothing."""
    chain = attempt.chain
    return any(chain[i : i + 2] == (edge.importer, edge.imported) for i in range(len(chain) - 1))


def _minimal(cut: list[Edge], verifier: Verifier) -> tuple[Edge, ...]:
    """``cut`` less every edge whose restoration keeps the target clean (each check a run)."""
    kept = list(cut)
    for edge in list(cut):
        if len(kept) == 1 or verifier.exhausted():
            break
        rest = [e for e in kept if _key(e) != _key(edge)]
        attempt, _ = verifier.check(rest)
        if attempt.outcome == Outcome.CLEAN:
            kept = rest
    return tuple(sorted(kept, key=cut.index))


def _inside(module: str, targets: Sequence[str]) -> bool:
    """``module`` is one of the targets or a module below one."""
    return any(module == target or module.startswith(target + ".") for target in targets)


def _key(edge: Edge) -> tuple[str, int]:
    return edge.site.file, edge.site.line


def _why_none(result: ScanResult, verifier: Verifier) -> str:
    if verifier.exhausted():
        return f"no cut verified within {MAX_TRIES} runs"
    kinds = {attempt.outcome for attempt in verifier.tries}
    if kinds <= {Outcome.CANNOT_DEFER}:
        return "no import on the chain can wait: each is needed while its module is imported (see the tries)"
    return "no verified cut: every try broke the import, could not wait, or left CUDA initialized (see the tries)"


def _with_reach(cut: Cut | None, rows: Sequence[SweepRow]) -> Cut | None:
    return None if cut is None else replace(cut, reach=sweep_reach(cut.edges, rows))


def sweep_reach(edges: Sequence[Edge], rows: Iterable[SweepRow]) -> int:
    """How many swept modules that initialize CUDA have one of ``edges`` on their culprit chain."""
    keys = edge_keys(edges)
    count = 0
    for row in rows:
        culprit = row.culprit
        if row.cuda_initialized and culprit is not None:
            pairs = set(zip(culprit.chain, culprit.chain[1:], strict=False))
            count += bool(pairs & keys)
    return count


def target_error(message: str) -> TargetFailure:
    return TargetFailure("import-error", message)
