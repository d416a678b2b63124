"""The torch reference: fp32 against float64, input validation, skipped slots untouched."""

from __future__ import annotations

import pytest

from tests.conftest import require

torch = require("torch", "kernels")

from diagtools.kernels.reference import compress_norm_rope_store_reference, make_inputs  # noqa: E402

from .tolerances import assert_matches_reference  # noqa: E402


@pytest.mark.parametrize(("groups", "head_dim", "ratio"), [(1, 128, 4), (40, 512, 4), (17, 128, 8), (9, 512, 1)])
def test_reference_matches_float64(groups, head_dim, ratio):
    inputs = make_inputs(groups, head_dim, ratio=ratio, seed=groups * head_dim + ratio)
    compress_norm_rope_store_reference(*inputs.args(), ratio=ratio)
    assert_matches_reference(inputs)


def test_rope_rotates_only_the_last_64_channels():
    inputs = make_inputs(8, 128, seed=3)
    zero_angle = inputs.cos_sin_cache.clone()
    zero_angle[:, :32], zero_angle[:, 32:] = 1.0, 0.0
    rotated = inputs.expected()
    plain = type(inputs)(*(zero_angle if t is inputs.cos_sin_cache else t for t in inputs.args()), ratio=inputs.ratio)
    unrotated = plain.expected()
    assert torch.equal(rotated[:, :64], unrotated[:, :64])
    assert not torch.allclose(rotated[:, 64:], unrotated[:, 64:])
    # rotation preserves each pair's length
    pair_norm = lambda x: x[:, 64:].reshape(-1, 32, 2).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_norm(rotated), pair_norm(unrotated))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(kv=a["kv"].float()), "kv must be a bf16"),
        (lambda a: a.update(kv=a["kv"][:, :64].contiguous()), "head dim 64 is not supported"),
        (lambda a: a.update(score=a["score"][:-1]), "score must be fp32"),
        (lambda a: a.update(positions=a["positions"].float()), "positions must be an int32/int64"),
        (lambda a: a.update(kv_cache=a["kv_cache"].float()), "kv_cache must be a contiguous bf16"),
    ],
)
def test_bad_inputs_raise_value_error(change, message):
    inputs = make_inputs(4, 128, seed=5)
    names = ["kv", "score", "weight", "cos_sin_cache", "positions", "slot_mapping", "kv_cache"]
    args = dict(zip(names, inputs.args(), strict=True))
    change(args)
    with pytest.raises(ValueError, match=message):
        compress_norm_rope_store_reference(*args.values(), ratio=4)


def test_min_bytes_counts_only_what_a_kernel_must_move():
    inputs = make_inputs(8, 128, ratio=4, seed=5, padding=0.0)
    inputs.positions[:] = 7  # one distinct position: one cos/sin row
    kept_group = 4 * (128 * 2 + 4) + 8 + 128 * 2  # kv rows and logits, position, output row
    assert inputs.min_bytes() == 8 * 8 + 8 * kept_group + 64 * 4 + 128 * 4
    inputs.slot_mapping.fill_(-1)  # padded groups read their slot and nothing else
    assert inputs.min_bytes() == 8 * 8 + 128 * 4
