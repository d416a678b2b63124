"""The cut search's order and minimisation, against a scripted verifier (no subprocess).

The world here: importing the target initializes CUDA unless every statement of
``needed`` is deferred; until then each run reports a chain through the first
needed statement still running.  The real verifier runs subkernels
(tests/functional/test_cuts.py); this one only says what such runs would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagtools.model.cuts import CutTry, Edge, Outcome, chain_edges
from diagtools.model.scan import Culprit, DriverInfo, ImportNode, ScanResult, Site
from diagtools.usecases.cuts import search_cuts

ROOT = "/src"


def module_file(name: str) -> str:
    return f"{ROOT}/{name.replace('.', '/')}/__init__.py"


def scan(chain: tuple[str, ...], lines: dict[str, int]) -> ScanResult:
    """A scan whose culprit chain is ``chain``; ``lines[importer]`` is the statement importing the next module."""
    stack = tuple(Site(module_file(m), lines.get(m, 1), "<module>", f"import {m}") for m in chain)
    nodes = tuple(ImportNode(m, chain[i - 1] if i else None, module_file(m), 0.1, 0.1) for i, m in enumerate(chain))
    culprit = Culprit(chain[-1], chain, stack[-1], stack, "import", module_site=stack[-1])
    return ScanResult(("app.models.ops",), "ok", DriverInfo("simulated"), True, nodes, (culprit,))


@dataclass
class World:
    """Deferring every statement of ``needed`` leaves the target clean; ``chains`` says which chain a run
    reports while ``needed[i]`` still runs."""

    needed: list[tuple[str, int]]
    chains: dict[tuple[str, int], tuple[tuple[str, ...], dict[str, int]]]
    runs: list[frozenset[tuple[str, int]]] = field(default_factory=list)
    tries: list[CutTry] = field(default_factory=list)
    budget: int = 24

    def exhausted(self) -> bool:
        return self.budget <= 0

    def check(self, edges):
        deferred = frozenset((e.importer, e.site.line) for e in edges)
        self.runs.append(deferred)
        self.budget -= 1
        running = [statement for statement in self.needed if statement not in deferred]
        if not running:
            attempt = CutTry(tuple(edges), Outcome.CLEAN)
            self.tries.append(attempt)
            return attempt, None
        chain, lines = self.chains[running[0]]
        attempt = CutTry(tuple(edges), Outcome.STILL_INITIALIZES, chain=chain)
        self.tries.append(attempt)
        return attempt, scan(chain, lines)


PARENT, TARGET, LEAF_A, LEAF_B = "app.models", "app.models.ops", "app.models.ops.a", "app.models.ops.b"


def world() -> World:
    """The DeepSeek-V4 shape: a parent package imports the target, whose __init__ re-exports two leaves."""
    via_a = ((PARENT, TARGET, LEAF_A), {PARENT: 7, TARGET: 3})
    via_b = ((PARENT, TARGET, LEAF_B), {PARENT: 7, TARGET: 4})
    return World(needed=[(TARGET, 3), (TARGET, 4)], chains={(TARGET, 3): via_a, (TARGET, 4): via_b})


def test_the_nearest_cut_takes_the_targets_own_statements_and_never_the_parents():
    found = world()
    first = scan(*found.chains[(TARGET, 3)])
    search = search_cuts(first, found)
    assert [(e.importer, e.site.line) for e in search.nearest.edges] == [(TARGET, 3), (TARGET, 4)]
    assert all(PARENT not in {i for i, _ in run} for run in found.runs[:2])  # the target's own edges came first
    assert search.nearest.verified == Outcome.CLEAN
    assert search.deepest.edges == search.nearest.edges
    assert search.same


def test_an_edge_whose_restoration_keeps_the_target_clean_is_dropped():
    found = world()
    found.needed = [(TARGET, 4)]  # only the second re-export initializes CUDA...
    first = scan(*found.chains[(TARGET, 3)])  # ...but the first scan's chain runs through the first one
    search = search_cuts(first, found)
    assert [(e.importer, e.site.line) for e in search.nearest.edges] == [(TARGET, 4)]
    assert frozenset({(TARGET, 4)}) in found.runs  # the smaller cut was verified by its own run


def test_edges_are_the_importers_module_body_lines():
    result = scan((PARENT, TARGET, LEAF_A), {PARENT: 7, TARGET: 3})
    edges = chain_edges(result)
    assert [(e.importer, e.imported, e.site.line) for e in edges] == [(PARENT, TARGET, 7), (TARGET, LEAF_A, 3)]
    assert all(isinstance(e, Edge) and e.first_party for e in edges)
