"""The fp8_ds_mla row format: sizes, power-of-two scales, and a round trip within FP8 precision."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from diagtools.kernels.reference import FP8_ROW_BYTES, dequantize_fp8_ds_mla, quantize_fp8_ds_mla  # noqa: E402


def test_row_layout_and_scales():
    values = torch.randn(5, 512) * torch.logspace(-3, 3, 5)[:, None]
    data, scales = quantize_fp8_ds_mla(values)
    assert data.dtype == torch.uint8
    assert data.shape == (5, FP8_ROW_BYTES) == (5, 576)
    assert scales.dtype == torch.uint8
    assert scales.shape == (5, 7)
    tiles = values[:, :448].reshape(5, 7, 64).abs().amax(-1)
    scale = torch.exp2(scales.float() - 127)
    assert (tiles / scale <= 448).all()  # nothing saturates
    assert (tiles / scale > 224).all()  # and the scale is the smallest power of two that fits


def test_round_trip_is_within_fp8_and_bf16_precision():
    values = torch.randn(64, 512, dtype=torch.float64) * 3
    back = dequantize_fp8_ds_mla(*quantize_fp8_ds_mla(values)).double()
    head, tail = values[:, :448], values[:, 448:]
    # e4m3 keeps 3 significand bits: half an ulp is 2**-4 relative, and values far below the
    # tile's largest lose more (subnormals), so check norm-wise and against the tile's scale
    assert float((back[:, :448] - head).norm() / head.norm()) < 0.04
    amax = head.reshape(64, 7, 64).abs().amax(-1, keepdim=True)
    assert ((back[:, :448] - head).reshape(64, 7, 64).abs() <= amax * 2**-4 + 1e-12).all()
    torch.testing.assert_close(back[:, 448:], tail.to(torch.bfloat16).double())
