"""Tolerances per output dtype, and the check every backend must pass against float64."""

from __future__ import annotations

import torch

# The output is stored in bf16 (8 significand bits): each element is off by at most half an ulp,
# 2**-9 relative, plus the fp32 arithmetic before it.  A norm-wise bound of 8e-3 leaves room for
# round-toward-zero conversions (the Triton interpreter) while any indexing mistake lands near 1.
RELATIVE_ERROR = {torch.bfloat16: 8e-3}
ELEMENTWISE = {torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def assert_matches_reference(inputs) -> None:
    """Written rows equal the float64 reference within tolerance; skipped slots stay poisoned."""
    head_dim = inputs.kv.shape[1]
    flat = inputs.kv_cache.view(-1, head_dim).cpu()
    slots = inputs.slot_mapping.cpu()
    keep = slots >= 0
    expected = inputs.expected().cpu()[keep]
    got = flat[slots[keep].long()].double()
    assert not torch.isnan(got).any(), "a kept row was not written"
    if keep.any():  # a draw may pad every group; then only the untouched check below applies
        error = float((got - expected).norm() / expected.norm())
        assert error < RELATIVE_ERROR[torch.bfloat16], error
        torch.testing.assert_close(got, expected, **ELEMENTWISE[torch.bfloat16])
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slots[keep].long()] = False
    assert torch.isnan(flat[untouched].float()).all(), "a row outside the kept slots was written"
