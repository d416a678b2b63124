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


# The fp8_ds_mla store (compress_state_store).  FP8 e4m3 keeps 3 significand bits: a value in a tile
# whose largest magnitude is ``amax`` is off by at most half an ulp, ``|v| * 2**-4 <= amax * 2**-4``
# (subnormals lose less in absolute terms), plus the fp32 arithmetic before it; norm-wise the
# rounding averages near 2**-4 / sqrt(3) relative.  The bf16 tail is rounded to nearest even once:
# half an ulp, 2**-9 relative.  Any indexing mistake (a wrong window row, the wrong half of a C4
# row, a wrong RoPE position) lands near 1.
FP8_TILE_ERROR = 2**-4 * 1.01
FP8_RELATIVE_ERROR = 0.04
BF16_TAIL = {"rtol": 2**-8, "atol": 1e-5}


def assert_state_store_matches_reference(inputs) -> None:
    """Working tokens' stored rows, dequantized, equal the float64 reference within FP8 and bf16
    precision, and their scale records end in a zero padding byte; every other byte of the cache
    (other slots, non-boundary tokens' slots, negative slots) is still poison."""
    from diagtools.kernels.state_reference import POISON, TOKEN_BYTES, cache_block_bytes, dequantized_cache_rows

    cache = cache_block_bytes(inputs.kv_cache.cpu())  # either accepted shape, as [blocks, block bytes]
    work = inputs.working().cpu()
    slots = inputs.slot_mapping.cpu()[work]
    expected = inputs.expected().cpu()
    got = dequantized_cache_rows(cache, slots).double()
    assert torch.isfinite(got).all(), "a working token's row was not written"
    if slots.numel():
        head, want = got[:, :448], expected[:, :448]
        error = float((head - want).norm() / want.norm())
        assert error < FP8_RELATIVE_ERROR, error
        amax = want.reshape(-1, 7, 64).abs().amax(-1, keepdim=True)
        excess = (head - want).reshape(-1, 7, 64).abs() - amax * FP8_TILE_ERROR
        assert (excess <= 1e-6).all(), float(excess.max())
        torch.testing.assert_close(got[:, 448:], expected[:, 448:], **BF16_TAIL)
    written = torch.zeros_like(cache, dtype=torch.bool)
    block_size = cache.shape[1] // TOKEN_BYTES
    blocks, rows = (slots.long() // block_size)[:, None], (slots.long() % block_size)[:, None]
    written[blocks, rows * 576 + torch.arange(576)] = True  # the token's data
    scale_record = block_size * 576 + rows * 8  # its 8-byte scale record, after the block's data
    written[blocks, scale_record + torch.arange(8)] = True
    assert (cache[blocks, scale_record + 7] == 0).all(), "a working token's scale padding byte is not 0"
    assert (cache[~written] == POISON).all(), "a byte outside the working tokens' rows was written"
