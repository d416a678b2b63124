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


def _seen_heavy(jobs: int | None) -> Learner:
    """A learner whose four sample children each spent 0.1 s importing ``pk.heavy`` (and ``pk.heavy.sub``)."""
    learner = Learner("pk", SAMPLE, 0.5, ("pk",), jobs=jobs)
    for module in SAMPLE:
        learner.observe(module, child(module, "pk.heavy"))
        learner.importers["pk.heavy.sub"] = "pk.heavy"  # below it: not counted again in what it saves
        learner.seconds["pk.heavy.sub"] = 0.4
        learner.counts["pk.heavy.sub"] = 4
    return learner


def test_a_later_learner_stops_its_zygote_only_when_the_rows_left_pay_for_another():
    assert _seen_heavy(None).pays(["pk.heavy", "pk.heavy.sub"], restart_s=1000.0, rows_left=1)  # a first learner
    # 0.1 s saved on each of 100 rows, 2 at a time: 5 s, against a zygote that starts in 4 s or in 6 s
    assert _seen_heavy(2).pays(["pk.heavy", "pk.heavy.sub"], restart_s=4.0, rows_left=100)
    assert not _seen_heavy(2).pays(["pk.heavy", "pk.heavy.sub"], restart_s=6.0, rows_left=100)
    learner = _seen_heavy(2)
    learner.decide(restart_s=6.0, rows_left=100)  # not worth it: the same zygote goes on
    assert learner.decided
    assert learner.declined == (
        "learned pk.heavy, pk.heavy.sub from 4 more sampled children, not preloaded: they would save the 100 rows "
        "left about 5 s, and another zygote takes 6 s to start"
    )
    with pytest.raises(Learned):
        _seen_heavy(2).decide(restart_s=4.0, rows_left=100)


def test_what_the_zygote_passed_over_is_never_learned_again():
    learner = _seen_heavy(None)
    learner.decide(passed_over=["pk.heavy", "pk.heavy.sub"])  # nothing else to learn: no Learned
    assert learner.decided
    assert learner.candidates(0.5, learner.exclude) == []
