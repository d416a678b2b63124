"""Tolerances per output dtype, and the check every backend must pass against float64."""

from __future__ import annotations

from dataclasses import dataclass

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


# Every stored byte, against the reference quantizer.  The kernels compute the values they store in
# fp32 with approximate exp2/rcp/rsqrt, so their values differ from the float64 reference by a few
# fp32 ulps: the reference quantizer is run on the float64 values moved by that much either way
# (``STORED_VALUE_ERROR``: relative to the value, plus a small part of the RMSNorm weight for the
# values that cancel).  A stored byte must be one the quantizer gives for a value in that bracket; where the
# whole bracket rounds alike (all but a few bytes in ten thousand) that is one exact byte.
STORED_VALUE_ERROR = {"relative": 2e-6, "of_weight": 2e-6}
# On a GPU, ex2/rcp/rsqrt .approx are off by an ulp or two and sums run in other orders (and cancel):
# wider, still far inside the factor of two a wrong scale exponent makes.
GPU_STORED_VALUE_ERROR = {"relative": 3e-5, "of_weight": 1e-4}


@dataclass(frozen=True)
class ByteCheck:
    """How many stored bytes were checked, and how many of those had a single allowed value."""

    scale_bytes: int
    data_bytes: int
    exact: int  # bytes whose bracket allowed one value only

    @property
    def ambiguous_fraction(self) -> float:
        return 1 - self.exact / max(1, self.scale_bytes + self.data_bytes)


def _exponents(values: torch.Tensor) -> torch.Tensor:
    """The reference's scale exponent of each 64-value tile of ``[N, 448]`` values (via the quantizer)."""
    from diagtools.kernels.reference import quantize_fp8_ds_mla

    padded = torch.cat((values.float(), values.new_zeros(values.shape[0], 64).float()), dim=1)
    return quantize_fp8_ds_mla(padded)[1].long() - 127


def _fp8_at(values: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """The reference quantizer's stored value (as a float) of ``[N, 7, 64]`` values at given exponents:
    rounded to bf16, scaled, clamped to 448, rounded to e4m3."""
    scale = torch.exp2(exponent.double())[..., None]
    scaled = (values.float().to(torch.bfloat16).double() / scale).clamp(-448, 448).float()
    return scaled.to(torch.float8_e4m3fn).double() * scale


def assert_state_bytes_match_reference(inputs, error_bound: dict[str, float] = STORED_VALUE_ERROR) -> ByteCheck:
    """Every stored scale byte, FP8 byte and bf16 tail byte of the working tokens is one the
    reference quantizer gives for the float64 value moved by at most ``error_bound``."""
    from diagtools.kernels.state_reference import read_fp8_ds_mla_cache

    work = inputs.working().cpu()
    data, scales = read_fp8_ds_mla_cache(inputs.kv_cache.cpu(), inputs.slot_mapping.cpu()[work])
    y = inputs.expected().cpu()  # float64 [N, 512]
    rows = y.shape[0]
    low, high, error = _bracket(y, inputs.weight, error_bound)
    # the scale: from the tile maxima at the smallest and the largest magnitudes in the bracket
    small = y.sign() * (y.abs() - error).clamp_min(0)
    big = y.sign() * (y.abs() + error)
    lowest, highest = _exponents(small[:, :448]), _exponents(big[:, :448])
    stored = scales[:, :7].long() - 127
    bad = (stored < lowest) | (stored > highest)
    assert not bad.any(), f"{int(bad.sum())} scale bytes outside the reference's, e.g. {_first(bad, stored, lowest)}"
    # the FP8 bytes, at the stored scale: the reference quantizer is monotone in the value
    got = data[:, :448].contiguous().view(torch.float8_e4m3fn).double().reshape(rows, 7, 64)
    got = got * torch.exp2(stored.double())[..., None]
    lo = _fp8_at(low[:, :448].reshape(rows, 7, 64), stored)
    hi = _fp8_at(high[:, :448].reshape(rows, 7, 64), stored)
    bad = (got < lo) | (got > hi) | got.isnan()
    assert not bad.any(), f"{int(bad.sum())} FP8 bytes outside the reference's, e.g. {_first(bad, got, lo, hi)}"
    # the bf16 tail, rounded once to nearest even
    tail = data[:, 448:].contiguous().view(torch.bfloat16).double()
    lo_tail, hi_tail = (v[:, 448:].to(torch.bfloat16).double() for v in (low, high))
    bad = (tail < lo_tail) | (tail > hi_tail) | tail.isnan()
    assert not bad.any(), f"{int(bad.sum())} bf16 values outside the reference's, e.g. {_first(bad, tail, lo_tail)}"
    exact = int((lowest == highest).sum()) + int((lo == hi).sum()) + 2 * int((lo_tail == hi_tail).sum())
    return ByteCheck(scale_bytes=rows * 7, data_bytes=rows * 576, exact=exact)


def _bracket(
    y: torch.Tensor, weight: torch.Tensor, error_bound: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y`` (float64 rows, RoPE on the last 64 in pairs) moved down and up by the kernels' own fp32 error.

    y = c / rms(c) * weight (then RoPE on pairs): an error in c of a small part of rms(c) moves y by
    that part of |weight|; a RoPE pair mixes its two weights.
    """
    weight = weight.cpu().double().abs()
    head = weight.numel() - 64
    pairs = weight[head:].view(32, 2).amax(dim=1).repeat_interleave(2)
    reach = torch.cat((weight[:head], pairs))
    error = y.abs() * error_bound["relative"] + reach * error_bound["of_weight"]
    return y - error, y + error, error


def _bf16_toward_zero(values: torch.Tensor) -> torch.Tensor:
    bits = values.float().view(torch.int32) & -65536  # keep sign, exponent and the top 7 significand bits
    return bits.view(torch.float32).double()


def assert_bytes_match_reference(
    inputs, error_bound: dict[str, float] = STORED_VALUE_ERROR, *, toward_zero: bool = False
) -> float:
    """The simplified kernel's stored bf16 values, kept rows only: each one the float64 reference rounded
    once, for the reference moved by at most ``error_bound`` (the kernels' fp32 arithmetic); returns the
    fraction of values whose bracket allowed two neighbours.  Rounded to nearest even, as torch and a GPU
    round; ``toward_zero`` for the Triton interpreter, whose fp32-to-bf16 cast truncates."""
    head_dim = inputs.kv.shape[1]
    slots = inputs.slot_mapping.cpu()
    keep = slots >= 0
    got = inputs.kv_cache.view(-1, head_dim).cpu()[slots[keep].long()].double()
    low, high, _ = _bracket(inputs.expected().cpu()[keep], inputs.weight, error_bound)
    rounded = _bf16_toward_zero if toward_zero else (lambda v: v.to(torch.bfloat16).double())
    lo, hi = rounded(low), rounded(high)
    bad = (got < lo) | (got > hi) | got.isnan()
    assert not bad.any(), f"{int(bad.sum())} bf16 values outside the reference's, e.g. {_first(bad, got, lo, hi)}"
    return 1 - float((lo == hi).double().mean()) if got.numel() else 0.0


def _first(bad: torch.Tensor, *tensors: torch.Tensor) -> tuple[float, ...]:
    index = tuple(int(i) for i in bad.nonzero()[0])
    return tuple(float(t[index]) for t in tensors)


def with_edge_tiles(inputs, first: int = 0):
    """The inputs with the RMSNorm weight changed so that the store's rare paths are reached: FP8
    tile ``first`` stores zeros (weight 0: the zero tile), the next values near 1e-7, far below the
    1e-4 amax floor (the tiny tile), the next values near 3e3 (a large scale exponent), the next the
    values negated (counting modulo the 7 FP8 tiles: ``first=4`` sends tiles 4, 5, 6 and 0 down
    those paths, so with ``first=0`` every tile meets every edge).  (The clamp to +-448 is reached
    only by a tile whose largest value scales to exactly 448, the boundary: with the smallest
    power-of-two scale that fits, nothing exceeds it.)  Returns ``inputs``, changed in place."""
    weight = inputs.weight.view(7 + 1, 64)
    zero, tiny, large, negative = ((first + k) % 7 for k in range(4))
    weight[zero] = 0.0
    weight[tiny] *= 1e-7
    weight[large] *= 3e3
    weight[negative] *= -1.0
    return inputs
