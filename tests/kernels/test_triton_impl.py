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

from .tolerances import assert_matches_reference  # noqa: E402

# The grid: both supported head dims; one group, an odd count and a 64-group batch; ratios 1, 4 and 8
# (the kernel tiles [ratio, D], so ratio 1 and the largest ratio bound the tile shapes).
CASES = [(1, 128, 4), (37, 128, 4), (64, 512, 4), (16, 512, 8), (8, 128, 1), (5, 512, 2)]


@pytest.mark.parametrize(("groups", "head_dim", "ratio"), CASES)
def test_triton_matches_float64_reference(groups, head_dim, ratio):
    inputs = make_inputs(groups, head_dim, ratio=ratio, padding=0.25)
    compress_norm_rope_store(*inputs.args(), ratio=ratio, backend="triton")
    assert_matches_reference(inputs)


def test_all_slots_skipped_writes_nothing():
    inputs = make_inputs(6, 128)
    inputs.slot_mapping.fill_(-1)
    compress_norm_rope_store(*inputs.args(), backend="triton")
    assert torch.isnan(inputs.kv_cache.float()).all()


def test_non_power_of_two_ratio_is_refused():
    inputs = make_inputs(4, 128, ratio=3)
    with pytest.raises(ValueError, match="power-of-two ratio"):
        compress_norm_rope_store(*inputs.args(), ratio=3, backend="triton")
