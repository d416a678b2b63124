"""The Triton kernel under TRITON_INTERPRET=1 against the float64 reference, on fresh random inputs."""

from __future__ import annotations

import os

import pytest

from tests.conftest import require

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel is decorated, so before the import
torch = require("torch", "kernels")
require("triton", "kernels")

from diagtools.kernels import compress_norm_rope_store  # noqa: E402
from diagtools.kernels.reference import make_inputs  # noqa: E402

from .edges import SIMPLIFIED_EDGES, simplified_edge  # noqa: E402
from .tolerances import assert_bytes_match_reference, assert_matches_reference  # noqa: E402

# The grid: both supported head dims; one group, an odd count and a 64-group batch; ratios 1, 4 and 8
# (the kernel tiles [ratio, D], so ratio 1 and the largest ratio bound the tile shapes).
CASES = [(1, 128, 4), (37, 128, 4), (64, 512, 4), (16, 512, 8), (8, 128, 1), (5, 512, 2)]


@pytest.mark.parametrize(("groups", "head_dim", "ratio"), CASES)
def test_triton_matches_float64_reference(groups, head_dim, ratio):
    inputs = make_inputs(groups, head_dim, ratio=ratio, padding=0.25, seed=groups * head_dim + ratio)
    compress_norm_rope_store(*inputs.args(), ratio=ratio, backend="triton")
    assert_matches_reference(inputs)


def test_all_slots_skipped_writes_nothing():
    inputs = make_inputs(6, 128, seed=6)
    inputs.slot_mapping.fill_(-1)
    compress_norm_rope_store(*inputs.args(), backend="triton")
    assert torch.isnan(inputs.kv_cache.float()).all()


def test_non_power_of_two_ratio_is_refused():
    inputs = make_inputs(4, 128, ratio=3, seed=7)
    with pytest.raises(ValueError, match="power-of-two ratio"):
        compress_norm_rope_store(*inputs.args(), ratio=3, backend="triton")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("edge", SIMPLIFIED_EDGES)
def test_every_stored_value_is_the_reference_rounded_once(backend, edge):
    """On seeded random inputs and on each edge (rows near eps with eps 1e-3, scores of +200, the cache's
    first and last slot): every stored bf16 value is the float64 reference rounded once (to nearest even
    in torch; toward zero under the Triton interpreter, whose cast truncates), for the reference moved by
    the kernels' fp32 error; almost every value has one allowed byte."""
    inputs = simplified_edge(edge, seed=300)
    compress_norm_rope_store(*inputs.args(), ratio=inputs.ratio, eps=inputs.eps, backend=backend)
    assert_matches_reference(inputs)
    ambiguous = assert_bytes_match_reference(inputs, toward_zero=backend == "triton")
    assert ambiguous < 0.02, ambiguous  # the bracket is narrow: one byte allowed for nearly every value
