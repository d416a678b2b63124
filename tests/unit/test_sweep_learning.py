"""The adaptive preload's learner decides from its sample's children only, once every one has ended."""

from __future__ import annotations

import pytest

from diagtools.model.driver import DriverInfo
from diagtools.model.scan import ImportNode, ScanResult
from diagtools.usecases.sweep_learning import Learned, Learner

SAMPLE = [f"pk.s{n}" for n in range(4)]


def child(module: str, *imported: str) -> ScanResult:
    """A child's scan: it imported ``module`` and, below it, ``imported``."""
    nodes = [ImportNode(module, None, None, 0.01, 0.5)]
    nodes += [ImportNode(name, module, None, 0.1, 0.1) for name in imported]
    return ScanResult((module,), "ok", DriverInfo("simulated"), False, tuple(nodes))


def test_it_waits_for_every_sample_child_and_counts_none_other():
    learner = Learner("pk", SAMPLE, 0.5)
    for n in range(6):  # quick children of modules outside the sample end first: never counted
        learner.observe(f"pk.other{n}", child(f"pk.other{n}"))
        learner.decide()
    for module in SAMPLE[:3]:
        learner.observe(module, child(module, "pk.heavy"))
        learner.decide()  # one sample child still runs: no decision yet
    assert not learner.decided
    assert learner.children == 3
    learner.observe(SAMPLE[3], child(SAMPLE[3]))
    with pytest.raises(Learned):
        learner.decide()
    assert learner.candidates(0.5, ()) == [("pk.heavy", 3)]


def test_a_preloaded_sample_module_counts_as_seen_not_as_a_child():
    learner = Learner("pk", SAMPLE, 0.5)
    learner.observe(SAMPLE[0], None)
    for module in SAMPLE[1:]:
        learner.observe(module, child(module))
    learner.decide()
    assert learner.decided
    assert learner.children == 3
    assert learner.candidates(0.5, ()) == []
