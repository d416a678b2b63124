"""The fp8_ds_mla row format: sizes, power-of-two scales, vLLM's quantization (bf16 rounding first,
the 1e-4 amax floor) and a round trip within FP8 precision."""

from __future__ import annotations

import math

from tests.conftest import require

torch = require("torch", "kernels")

from diagtools.kernels.reference import (  # noqa: E402
    FP8_ROW_BYTES,
    MIN_AMAX,
    dequantize_fp8_ds_mla,
    quantize_fp8_ds_mla,
)

# 127 + ceil(log2(1e-4 / 448)): the scale byte of a tile whose amax is below the floor
FLOOR_SCALE_BYTE = 127 + math.ceil(math.log2(MIN_AMAX / 448))
# A value whose own e4m3 rounding (at scale 1) differs from the e4m3 rounding of its bf16 rounding:
# 1.0625 is the midpoint of e4m3's 1 and 1.125; just above it rounds up to 1.125, but its bf16
# rounding is 1.0625 itself, a tie, which rounds to the even 1.
ABOVE_MIDPOINT = 1.0625 + 2**-12


def fp8_ds_mla_cases() -> torch.Tensor:
    """fp32 rows ``[5, 512]`` exercising each step of the quantization, tiles 0-6 (the last 64 are
    the bf16 tail): row 0 all zero; row 1 tiles below the amax floor, an amax of exactly 448 * 2**k,
    one that bf16 rounds onto 448 from above, the value above an e4m3 midpoint; rows 2-4 random
    tiles over magnitudes 2**-40 .. 2**40."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.zeros(5, 512)
    special = rows[1, :448].view(7, 64)
    special[0] = torch.linspace(-5e-5, 9e-5, 64)  # amax below 1e-4
    special[1] = torch.linspace(-3.5, 1.0, 64)  # amax 3.5 = 448 * 2**-7 exactly: scaled onto 448
    special[2, :2] = torch.tensor([448.4375, -3.0])  # bf16 rounds it to 448: scale 1, not 2
    special[3, :2] = torch.tensor([448.0, ABOVE_MIDPOINT])  # scale 1; the value ties in bf16
    special[4] = torch.randn(64, generator=generator) * 1e-30  # amax far below the floor
    special[5] = torch.randn(64, generator=generator) * 1e30
    rows[1, 448:] = torch.randn(64, generator=generator)
    binades = torch.randint(-40, 41, (3, 8, 1), generator=generator).float()
    rows[2:] = (torch.randn(3, 8, 64, generator=generator) * torch.exp2(binades)).reshape(3, 512)
    return rows


def test_row_layout_and_scales():
    values = torch.randn(5, 512) * torch.logspace(-3, 3, 5)[:, None]
    data, scales = quantize_fp8_ds_mla(values)
    assert data.dtype == torch.uint8
    assert data.shape == (5, FP8_ROW_BYTES) == (5, 576)
    assert scales.dtype == torch.uint8
    assert scales.shape == (5, 7)
    tiles = values[:, :448].to(torch.bfloat16).float().reshape(5, 7, 64).abs().amax(-1)  # as quantized: bf16
    scale = torch.exp2(scales.float() - 127)
    assert (tiles / scale <= 448).all()  # nothing saturates
    assert (tiles / scale > 224).all()  # and the scale is the smallest power of two that fits


def test_tiny_and_zero_tiles_take_the_floor_scale():
    assert FLOOR_SCALE_BYTE == 105
    rows = fp8_ds_mla_cases()
    data, scales = quantize_fp8_ds_mla(rows)
    assert (data[0, :448] == 0).all()  # an all-zero tile stores zeros
    assert (scales[0] == FLOOR_SCALE_BYTE).all()
    assert scales[1, 0] == scales[1, 4] == FLOOR_SCALE_BYTE  # amax 9e-5 and 1e-30: floored at 1e-4
    # at the floor scale 2**-22, 9e-5 scales to 377.5 and is stored as e4m3's 384
    assert data[1, 63].view(torch.float8_e4m3fn).float() == 384
    assert (data[1, 256:320].view(torch.float8_e4m3fn).float() == 0).all()  # 1e-30 * 2**22 underflows


def test_values_are_rounded_to_bf16_before_fp8():
    rows = fp8_ds_mla_cases()
    data, scales = quantize_fp8_ds_mla(rows)
    e4m3 = torch.tensor([ABOVE_MIDPOINT]).to(torch.float8_e4m3fn)
    assert e4m3.float() == 1.125  # direct rounding
    assert torch.tensor([ABOVE_MIDPOINT]).to(torch.bfloat16).float().to(torch.float8_e4m3fn).float() == 1.0
    assert scales[1, 3] == 127
    assert data[1, 3 * 64 + 1] == 0x38  # e4m3 1.0, not 0x39 (1.125)
    assert scales[1, 2] == 127  # 448.4375 needs scale 2, its bf16 value 448 scale 1
    assert data[1, 2 * 64] == 0x7E  # 448
    assert scales[1, 1] == 120  # amax 448 * 2**-7: the scale is exactly 2**-7
    assert data[1, 64] == 0xFE  # -3.5 / 2**-7 = -448


def test_matches_a_literal_float64_reading():
    """Bytes equal a per-tile float64 computation of the steps as written: bf16, amax floor, ceil(log2), clamp."""
    rows = fp8_ds_mla_cases()
    data, scales = quantize_fp8_ds_mla(rows)
    for r in range(rows.shape[0]):
        for t in range(7):
            tile = rows[r, 64 * t : 64 * (t + 1)].to(torch.bfloat16).double()
            amax = max(float(tile.abs().max()), float(torch.tensor(MIN_AMAX, dtype=torch.float32)))
            exponent = math.ceil(math.log2(amax / 448))
            assert int(scales[r, t]) == min(max(exponent + 127, 0), 255)
            want = (tile / 2.0**exponent).clamp(-448, 448).float().to(torch.float8_e4m3fn).view(torch.uint8)
            assert torch.equal(data[r, 64 * t : 64 * (t + 1)], want), (r, t)
    assert torch.equal(data[:, 448:].view(torch.bfloat16), rows[:, 448:].to(torch.bfloat16))


def test_round_trip_is_within_fp8_and_bf16_precision():
    values = torch.randn(64, 512, dtype=torch.float64) * 3
    back = dequantize_fp8_ds_mla(*quantize_fp8_ds_mla(values)).double()
    head, tail = values[:, :448], values[:, 448:]
    # e4m3 keeps 3 significand bits: half an ulp is 2**-4 relative, and values far below the
    # tile's largest lose more (subnormals), so check norm-wise and against the tile's scale; the
    # bf16 rounding first adds at most 2**-9 relative, which the 2**-4 bound still covers
    assert float((back[:, :448] - head).norm() / head.norm()) < 0.04
    amax = head.reshape(64, 7, 64).abs().amax(-1, keepdim=True)
    assert ((back[:, :448] - head).reshape(64, 7, 64).abs() <= amax * 2**-4 + 1e-12).all()
    torch.testing.assert_close(back[:, 448:], tail.to(torch.bfloat16).double())
