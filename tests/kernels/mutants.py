"""Wrong kernels the tests must catch, made from the real sources by their structure.

A Python or Triton source is changed through its syntax tree (the call to ``rsqrt`` whose argument
holds ``eps``, the ``exp`` of a difference, the comparison of ``slot`` with 0), so a reformatted or
reworded line still gets its mutant; PTX is changed by instruction patterns.  A mutation whose
target is gone raises :class:`MutantMissedError` instead of running the unchanged kernel, so a mutant
can never pass by not being applied.  :data:`MUTANTS` is the list of wrong kernels that must die;
``test_mutants.py`` runs each on the input that exposes it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass


class MutantMissedError(AssertionError):
    """The structure a mutation changes is not in the source (any more): the mutant list needs a look."""


def _name(node: ast.AST) -> str | None:
    """The name a node stands for: ``x``, ``tl.x`` and ``x[i]`` are all ``x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return None


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n.func) == name]


def _rewrite(source: str, change: Callable[[ast.Module], int], what: str) -> str:
    tree = ast.parse(source)
    if change(tree) == 0:
        raise MutantMissedError(f"no {what} in the source")
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace_in(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
        elif isinstance(value, list):
            value[:] = [new if item is old else item for item in value]


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def scale_eps(factor: float | None) -> Callable[[str], str]:
    """``eps`` inside every ``rsqrt(...)`` times ``factor``, or a constant 1e-6 in its place (``None``)."""

    def change(tree: ast.Module) -> int:
        parents, count = _parents(tree), 0
        for call in _calls(tree, "rsqrt"):
            for node in [n for n in ast.walk(call) if isinstance(n, ast.Name) and n.id == "eps"]:
                new = ast.Constant(1e-6) if factor is None else ast.BinOp(node, ast.Mult(), ast.Constant(factor))
                _replace_in(parents[id(node)], node, new)
                count += 1
        return count

    return lambda source: _rewrite(source, change, "eps inside an rsqrt")


def softmax_without_max(scores: str) -> Callable[[str], str]:
    """``exp(scores - maximum)`` becomes ``exp(scores)``: the softmax no longer subtracts its maximum."""

    def change(tree: ast.Module) -> int:
        count = 0
        for call in _calls(tree, "exp"):
            argument = call.args[0] if call.args else None
            if isinstance(argument, ast.BinOp) and isinstance(argument.op, ast.Sub) and _name(argument.left) == scores:
                call.args[0] = argument.left
                count += 1
        return count

    return lambda source: _rewrite(source, change, f"exp({scores} - ...)")


def slot_zero_skipped(source: str) -> str:
    """``slot >= 0`` becomes ``slot > 0``: the cache's first slot is never written."""

    def change(tree: ast.Module) -> int:
        count = 0
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Compare)
                and _name(node.left) == "slot"
                and isinstance(node.ops[0], ast.GtE)
                and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value == 0
            ):
                node.ops[0] = ast.Gt()
                count += 1
        return count

    return _rewrite(source, change, "slot >= 0")


def exponent_plus_one(source: str) -> str:
    """Every ``_ue8m0_exponent(...)`` one too large (so in the scale byte and the inverse scale alike)."""

    def change(tree: ast.Module) -> int:
        parents, calls = _parents(tree), _calls(tree, "_ue8m0_exponent")
        for call in calls:
            _replace_in(parents[id(call)], call, ast.BinOp(call, ast.Add(), ast.Constant(1)))
        return len(calls)

    return _rewrite(source, change, "call of _ue8m0_exponent")


def no_amax_floor(source: str) -> str:
    """``maximum(x, 1e-4)`` becomes ``x``: a tile below the floor gets a scale from its own tiny amax."""

    def change(tree: ast.Module) -> int:
        parents, count = _parents(tree), 0
        for call in _calls(tree, "maximum"):
            if len(call.args) == 2 and isinstance(call.args[1], ast.Constant) and call.args[1].value == 1e-4:
                _replace_in(parents[id(call)], call, call.args[0])
                count += 1
        return count

    return _rewrite(source, change, "maximum(..., 1e-4)")


def piece_offset_dropped(source: str) -> str:
    """``(piece * splits + split) * rows`` becomes ``split * rows``: every piece of a split C128 window reads the
    window's first rows, not its own."""

    def change(tree: ast.Module) -> int:
        parents, count = _parents(tree), 0
        for node in list(ast.walk(tree)):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Add)
                and isinstance(node.left, ast.BinOp)
                and isinstance(node.left.op, ast.Mult)
                and {_name(node.left.left), _name(node.left.right)} == {"piece", "splits"}
                and _name(node.right) == "split"
            ):
                _replace_in(parents[id(node)], node, node.right)
                count += 1
        return count

    return _rewrite(source, change, "piece * splits + split")


def ptx_substitution(pattern: str, replacement: str, *, occurrence: int | None = 0) -> Callable[[str], str]:
    """PTX with ``pattern``'s ``occurrence``-th match (counted from 0; ``None``: every match) replaced."""
    compiled = re.compile(pattern)

    def mutate(ptx: str) -> str:
        matches = list(compiled.finditer(ptx))
        if occurrence is None and matches:
            return compiled.sub(replacement, ptx)
        if occurrence is None or occurrence >= len(matches):
            raise MutantMissedError(f"{pattern!r}: {len(matches)} match(es), wanted #{occurrence}")
        match = matches[occurrence]
        return ptx[: match.start()] + match.expand(replacement) + ptx[match.end() :]

    return mutate


# PTX: the amax floor (1e-4 as fp32 is 0f38D1B717), once per quarter of the seven FP8 tiles (two tiles each,
# in whatever order the compiler put them: every quarter's mutant meets the edge tiles at 0, 2, 4 and 6);
# the eps parameter, the kernel's only 32-bit one, loaded as a constant 1e-6 (0f358637BD) instead.
PTX_AMAX_FLOOR = r"(max\.f32\s+%r\d+, %r\d+, )0f38D1B717;"
PTX_EPS_LOAD = r"ld\.param\.b32\s+(%r\d+), \[\w+_param_\d+\];"
PTX_EXPONENT_BIAS = r"(add\.s32\s+%r\d+, %r\d+, )8388607;"
# the packed FP8 conversion's two operands (which value goes in the high byte), and the C4 score load: the
# score half starts 4096 bytes into a state row
PTX_FP8_PAIR = r"(cvt\.rn\.satfinite\.e4m3x2\.f32\s+%rs\d+), (%r\d+), (%r\d+);"
PTX_SCORE_LOAD = r"(ld\.global\.v4\.b32\s+\{[^}]*\}, \[%rd\d+\+)4096\]"


@dataclass(frozen=True)
class Mutant:
    """One wrong kernel: which kernel, how it is made from the real one, and the input that exposes it."""

    # "triton" (the simplified Triton kernel), "state-triton", "ptx" (simplified), "state-ptx", "generator",
    # "state-generator", "state-split-generator" (a C128 window split across CTAs: its partial stage generated)
    kernel: str
    name: str
    mutate: Callable[[str], str]
    exposed_by: tuple[str, ...]  # edges of tests/kernels/edges.py: the mutant must fail on one of them
    ratio: int = 4  # the faithful variant's C4 or C128

    @property
    def id(self) -> str:
        return f"{self.kernel}{'-c128' if self.ratio == 128 else ''}:{self.name}"


MUTANTS = (
    # the simplified Triton kernel (diagtools/kernels/triton_impl.py)
    Mutant("triton", "eps-ignored", scale_eps(None), ("eps",)),
    Mutant("triton", "eps-x10", scale_eps(10), ("eps",)),
    Mutant("triton", "eps-x0.1", scale_eps(0.1), ("eps",)),
    Mutant("triton", "eps-x100", scale_eps(100), ("eps",)),
    Mutant("triton", "softmax-without-max", softmax_without_max("logits"), ("logits",)),
    Mutant("triton", "slot-0-skipped", slot_zero_skipped, ("slots",)),
    # the faithful Triton kernel (diagtools/kernels/state_triton.py)
    Mutant("state-triton", "eps-ignored", scale_eps(None), ("eps",)),
    Mutant("state-triton", "eps-x10", scale_eps(10), ("eps",)),
    Mutant("state-triton", "eps-x0.1", scale_eps(0.1), ("eps",)),
    Mutant("state-triton", "softmax-without-max", softmax_without_max("score"), ("logits",)),
    Mutant("state-triton", "slot-0-skipped", slot_zero_skipped, ("slots",)),
    Mutant("state-triton", "exponent+1", exponent_plus_one, ("tiles-0",)),
    Mutant("state-triton", "no-amax-floor", no_amax_floor, ("tiles-0",)),
    # the shipped PTX of the simplified CuTe DSL kernel
    Mutant("ptx", "eps-constant", ptx_substitution(PTX_EPS_LOAD, r"mov.b32 \1, 0f358637BD;"), ("eps",)),
    # the shipped PTX of the faithful CuTe DSL kernel
    Mutant("state-ptx", "eps-constant", ptx_substitution(PTX_EPS_LOAD, r"mov.b32 \1, 0f358637BD;"), ("eps",)),
    Mutant("state-ptx", "exponent+1", ptx_substitution(PTX_EXPONENT_BIAS, r"\g<1>16777215;"), ("tiles-0",)),
    Mutant("state-ptx", "exponent+1", ptx_substitution(PTX_EXPONENT_BIAS, r"\g<1>16777215;"), ("tiles-0",), ratio=128),
    Mutant("state-ptx", "fp8-bytes-swapped", ptx_substitution(PTX_FP8_PAIR, r"\1, \3, \2;"), ("random",)),
    Mutant("state-ptx", "score-column+4", ptx_substitution(PTX_SCORE_LOAD, r"\g<1>4112]"), ("random",)),
    Mutant(
        "state-ptx",
        "no-amax-floor-quarter-0",
        ptx_substitution(PTX_AMAX_FLOOR, r"\g<1>0f00000000;"),
        ("tiles-0",),
        ratio=128,
    ),
    *(
        Mutant(
            "state-ptx",
            f"no-amax-floor-quarter-{quarter}",
            ptx_substitution(PTX_AMAX_FLOOR, r"\g<1>0f00000000;", occurrence=quarter),
            ("tiles-0", "tiles-2", "tiles-4", "tiles-6"),
        )
        for quarter in range(4)
    ),
)
# Made by compiling a mutated generator (test_mutants.py's GENERATED, where nvidia-cutlass-dsl is installed).
SPLIT_MUTANTS = (Mutant("state-split-generator", "piece-offset-dropped", piece_offset_dropped, ("random",), ratio=128),)
