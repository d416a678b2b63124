"""Every wrong kernel in the mutant list fails the check the right kernel passes, on the input that exposes it.

The Triton kernels run under the interpreter, the shipped PTX (and PTX compiled from a mutated CuTe DSL
generator, where nvidia-cutlass-dsl is installed) in the PTX interpreter; each mutant is made from the
real source by its structure (``mutants.py``), and the right kernel is run on the same input first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import require

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated, so before any import of one
torch = require("torch", "kernels")
require("triton", "kernels")

from triton.runtime.errors import InterpreterError  # noqa: E402

from diagtools.kernels import cutedsl_impl, state_cutedsl, state_triton, triton_impl  # noqa: E402

from .edges import simplified_edge, state_edge  # noqa: E402
from .mutants import (  # noqa: E402
    MUTANTS,
    SPLIT_MUTANTS,
    Mutant,
    MutantMissedError,
    piece_offset_dropped,
    scale_eps,
    slot_zero_skipped,
    softmax_without_max,
)
from .ptxvm import run_launch  # noqa: E402
from .tolerances import (  # noqa: E402
    assert_bytes_match_reference,
    assert_matches_reference,
    assert_state_bytes_match_reference,
    assert_state_store_matches_reference,
)

SOURCES = {
    "triton": triton_impl,
    "state-triton": state_triton,
    "generator": cutedsl_impl,
    "state-generator": state_cutedsl,
    "state-split-generator": state_cutedsl,
}
SIMPLIFIED = ("triton", "ptx", "generator")
# The wrong kernels a review found passing the tests; each must be on the list (and so must die).
REVIEWED = {
    "triton:eps-x100",
    "triton:softmax-without-max",
    "triton:slot-0-skipped",
    "state-triton:eps-x10",
    "state-triton:eps-x0.1",
    "state-triton:softmax-without-max",
    "state-triton:slot-0-skipped",
    "ptx:eps-constant",
    "state-ptx:eps-constant",
    "generator:softmax-without-max",
    "state-generator:softmax-without-max",
    *(f"state-ptx:no-amax-floor-quarter-{quarter}" for quarter in range(4)),
}
GENERATED = (
    Mutant("generator", "softmax-without-max", softmax_without_max("logits_now"), ("logits",)),
    Mutant("state-generator", "softmax-without-max", softmax_without_max("scores"), ("logits",)),
    *SPLIT_MUTANTS,
)


def _load(kernel: str, source: str, tmp_path: Path, monkeypatch) -> object:
    """The kernel's module with ``source`` in place of its own, loaded under a name of its own."""
    name = f"mutated_{SOURCES[kernel].__name__.rsplit('.', 1)[1]}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _shipped_stage(config) -> str:
    return state_cutedsl.prebuilt_path(config.ratio, config.stage).read_text()


def _ptx(kernel: str, ratio: int, mutate, tmp_path: Path, monkeypatch):
    """The PTX to run: the shipped one, mutated; or compiled from the mutated generator (for a split window,
    per stage: the mutated partial stage, the shipped finish)."""
    if kernel == "ptx":
        return mutate(cutedsl_impl.prebuilt_path(128, 4).read_text())
    if kernel == "state-ptx":
        return mutate(state_cutedsl.prebuilt_path(ratio).read_text())
    require("cutlass", "kernels")
    module = _load(kernel, mutate(Path(SOURCES[kernel].__file__).read_text()), tmp_path, monkeypatch)
    folder = tmp_path / "ptx"
    folder.mkdir(exist_ok=True)
    if kernel == "state-split-generator":
        partial = module.compile_ptx(128, folder, stage="partial")
        return lambda config: partial if config.stage == "partial" else _shipped_stage(config)
    return module.compile_ptx(128, 4, folder) if kernel == "generator" else module.compile_ptx(4, folder)


def _run(kernel: str, inputs, mutate=None, tmp_path: Path | None = None, monkeypatch=None) -> None:
    """Run ``kernel`` (mutated by ``mutate`` when given) on ``inputs``, storing into their cache."""
    if kernel in ("triton", "state-triton"):
        module = SOURCES[kernel]
        if mutate is not None:
            module = _load(kernel, mutate(Path(module.__file__).read_text()), tmp_path, monkeypatch)
        call = module.compress_norm_rope_store_triton if kernel == "triton" else module.compress_state_store_triton
        call(*inputs.args(), ratio=inputs.ratio, eps=inputs.eps)
        return
    simplified, split = kernel in SIMPLIFIED, kernel.startswith("state-split")
    if mutate is not None:
        ptx = _ptx(kernel, inputs.ratio, mutate, tmp_path, monkeypatch)
    elif split:
        ptx = _shipped_stage
    else:
        path = cutedsl_impl.prebuilt_path(128, 4) if simplified else state_cutedsl.prebuilt_path(inputs.ratio)
        ptx = path.read_text()
    if simplified:
        launch = cutedsl_impl.plan_launch(*inputs.args(), 4, inputs.eps, multiprocessors=1, ctas_per_sm=2)
    else:  # a split window's plan as on a GPU of 132 multiprocessors
        multiprocessors = 132 if split else None
        launch = state_cutedsl.plan_launch(*inputs.args(), inputs.ratio, inputs.eps, multiprocessors=multiprocessors)
    run_launch(ptx, launch)


def _check(kernel: str, inputs) -> None:
    """The checks the right kernel passes: values within tolerance, and every stored byte."""
    if kernel in SIMPLIFIED:
        assert_matches_reference(inputs)
        assert_bytes_match_reference(inputs, toward_zero=kernel == "triton")  # the interpreter truncates
    else:
        assert_state_store_matches_reference(inputs)
        assert_state_bytes_match_reference(inputs)


def _inputs(mutant: Mutant, edge: str, seed: int):
    if mutant.kernel in SIMPLIFIED:
        return simplified_edge(edge, seed=seed)
    return state_edge(edge, ratio=mutant.ratio, seed=seed)


@pytest.mark.parametrize("mutant", [*MUTANTS, *GENERATED], ids=lambda m: m.id)
def test_each_wrong_kernel_fails_the_check_the_right_one_passes(mutant, tmp_path, monkeypatch):
    for number, edge in enumerate(mutant.exposed_by):
        right = _inputs(mutant, edge, seed=200 + number)
        _run(mutant.kernel, right)
        _check(mutant.kernel, right)

    def run_wrong_kernel() -> None:
        for number, edge in enumerate(mutant.exposed_by):
            wrong = _inputs(mutant, edge, seed=200 + number)
            _run(mutant.kernel, wrong, mutant.mutate, tmp_path, monkeypatch)
            _check(mutant.kernel, wrong)

    # wrong values or bytes; for scores that overflow exp, the interpreter may refuse the exp itself
    expected = (AssertionError, InterpreterError) if "logits" in mutant.exposed_by else AssertionError
    with pytest.raises(expected) as caught:
        run_wrong_kernel()
    assert not isinstance(caught.value, MutantMissedError), caught.value  # made, run, and caught


def test_the_list_holds_every_wrong_kernel_a_review_found_passing():
    listed = {mutant.id for mutant in (*MUTANTS, *GENERATED)}
    assert listed >= REVIEWED, sorted(REVIEWED - listed)


def test_a_mutation_whose_target_is_gone_says_so_instead_of_running_the_right_kernel():
    with pytest.raises(MutantMissedError, match="eps inside an rsqrt"):
        scale_eps(10)("def f(x):\n    return x + 1\n")
    with pytest.raises(MutantMissedError, match="piece \\* splits \\+ split"):
        piece_offset_dropped("q = last + split * rows\n")
    with pytest.raises(MutantMissedError, match="slot >= 0"):
        slot_zero_skipped("keep = slot > -1\n")
    reformatted = "keep = (\n    slot\n    >= 0\n)  # the same comparison, another layout\n"
    assert slot_zero_skipped(reformatted).strip() == "keep = slot > 0"
