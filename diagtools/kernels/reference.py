"""The torch reference for compress_norm_rope_store, in any float precision.

Used as the ``torch`` backend (fp32 math) and, in float64, as the yardstick the
Triton and CuTe DSL kernels are checked against.  Also builds fresh random
inputs of the right shapes and a poisoned output cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from diagtools.kernels import ROPE_DIM, SUPPORTED_HEAD_DIMS

__all__ = [
    "FP8_ROW_BYTES",
    "Inputs",
    "check_inputs",
    "compress_norm_rope_store_reference",
    "compressed_rows",
    "dequantize_fp8_ds_mla",
    "make_inputs",
    "normalize_and_rotate",
    "quantize_fp8_ds_mla",
]


def check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio: int) -> tuple[int, int]:
    """Validate shapes and dtypes (``ValueError`` with what is wrong); return ``(G, D)``."""
    if kv.dim() != 2 or kv.dtype != torch.bfloat16:
        raise ValueError(f"kv must be a bf16 [G*ratio, D] tensor, got {kv.dtype} {tuple(kv.shape)}")
    rows, head_dim = kv.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported: use one of {SUPPORTED_HEAD_DIMS}")
    if ratio < 1 or rows % ratio:
        raise ValueError(f"kv has {rows} rows, not a multiple of ratio={ratio}")
    groups = rows // ratio
    if score.shape != (rows,) or score.dtype != torch.float32:
        raise ValueError(f"score must be fp32 [{rows}], got {score.dtype} {tuple(score.shape)}")
    if weight.shape != (head_dim,):
        raise ValueError(f"weight must be [{head_dim}], got {tuple(weight.shape)}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != ROPE_DIM:
        raise ValueError(f"cos_sin_cache must be [max_pos, {ROPE_DIM}], got {tuple(cos_sin_cache.shape)}")
    for name, index in (("positions", positions), ("slot_mapping", slot_mapping)):
        if index.shape != (groups,) or index.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int32/int64 [{groups}] tensor, got {index.dtype} {tuple(index.shape)}")
    if kv_cache.dtype != torch.bfloat16 or kv_cache.shape[-1] != head_dim or not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be a contiguous bf16 [..., {head_dim}] tensor, got {kv_cache.dtype}")
    devices = {t.device for t in (kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return groups, head_dim


def compressed_rows(
    kv,
    score,
    weight,
    cos_sin_cache,
    positions,
    *,
    ratio: int = 4,
    eps: float = 1e-6,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``[G, D]`` values the operation stores, computed in ``dtype`` (no rounding to bf16)."""
    groups, head_dim = kv.shape[0] // ratio, kv.shape[1]
    rows = kv.to(dtype).view(groups, ratio, head_dim)
    gates = torch.softmax(score.to(dtype).view(groups, ratio), dim=1)
    compressed = (gates.unsqueeze(-1) * rows).sum(dim=1)
    return normalize_and_rotate(compressed, weight, cos_sin_cache, positions, eps=eps)


def normalize_and_rotate(compressed, weight, cos_sin_cache, positions, *, eps: float) -> torch.Tensor:
    """RMSNorm of ``[N, D]`` rows with ``weight``, then interleaved RoPE on their last 64 channels at
    ``positions`` (cosines then sines in ``cos_sin_cache``), in ``compressed``'s dtype."""
    rows, head_dim = compressed.shape
    dtype = compressed.dtype
    normed = compressed * torch.rsqrt(compressed.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(dtype)
    half = ROPE_DIM // 2
    table = cos_sin_cache.to(dtype)[positions.long()]
    cos, sin = table[:, :half], table[:, half:]
    pairs = normed[:, head_dim - ROPE_DIM :].reshape(rows, half, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).reshape(rows, ROPE_DIM)
    return torch.cat((normed[:, : head_dim - ROPE_DIM], rotated), dim=1)


def compress_norm_rope_store_reference(
    kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, *, ratio: int = 4, eps: float = 1e-6
) -> torch.Tensor:
    """The operation in torch eager (fp32 math); writes and returns ``kv_cache``."""
    check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    values = compressed_rows(kv, score, weight, cos_sin_cache, positions, ratio=ratio, eps=eps)
    keep = slot_mapping >= 0
    kv_cache.view(-1, kv.shape[1])[slot_mapping[keep].long()] = values[keep].to(torch.bfloat16)
    return kv_cache


@dataclass(frozen=True)
class Inputs:
    """One random input set, with the output cache poisoned (NaN) so unwritten rows show."""

    kv: torch.Tensor
    score: torch.Tensor
    weight: torch.Tensor
    cos_sin_cache: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    kv_cache: torch.Tensor
    ratio: int
    eps: float = 1e-6  # the RMSNorm epsilon the kernel is given

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.kv, self.score, self.weight, self.cos_sin_cache, self.positions, self.slot_mapping, self.kv_cache)

    def expected(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        kv, score, weight, cos_sin_cache, positions = self.args()[:5]
        return compressed_rows(kv, score, weight, cos_sin_cache, positions, ratio=self.ratio, eps=self.eps, dtype=dtype)

    def min_bytes(self) -> int:
        """Fewest bytes the operation must move: what a kernel that skips padded groups reads and writes.

        Every group's slot is read; a kept group (slot >= 0) also reads its ``ratio`` kv rows and
        logits and its position, and writes one row; each distinct position of a kept group reads one
        cos/sin row; the weight is read once.  Padded groups read nothing else.
        """
        head_dim = self.kv.shape[1]
        keep = self.slot_mapping >= 0
        kept = int(keep.sum())
        distinct_positions = int(torch.unique(self.positions[keep]).numel())
        reads = self.slot_mapping.numel() * self.slot_mapping.element_size()
        reads += kept * (self.ratio * (head_dim * self.kv.element_size() + 4) + self.positions.element_size())
        reads += distinct_positions * ROPE_DIM * self.cos_sin_cache.element_size()
        reads += self.weight.numel() * self.weight.element_size()
        return reads + kept * head_dim * self.kv_cache.element_size()


def rope_cache(max_pos: int, *, base: float = 10000.0, device: str | torch.device = "cpu") -> torch.Tensor:
    """A real RoPE table ``[max_pos, 64]``: 32 cosines, then 32 sines."""
    half = ROPE_DIM // 2
    inv_freq = 1.0 / (base ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=1).to(torch.float32).to(device)


def make_inputs(
    groups: int,
    head_dim: int,
    *,
    ratio: int = 4,
    padding: float = 0.125,
    max_pos: int = 4096,
    block_size: int = 64,
    seed: int | None = None,
    device: str | torch.device = "cpu",
) -> Inputs:
    """Fresh random inputs, drawn on ``device``; about ``padding`` of the groups get slot -1; slots are a
    random permutation of the cache's rows; the output cache is poisoned with NaN."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed if seed is not None else torch.seed() % (2**31))
    rows = groups * ratio
    kv = torch.randn(rows, head_dim, generator=generator, device=device).to(torch.bfloat16)
    score = torch.randn(rows, generator=generator, device=device) * 2
    weight = 1 + 0.1 * torch.randn(head_dim, generator=generator, device=device)
    positions = torch.randint(0, max_pos, (groups,), generator=generator, device=device)
    blocks = math.ceil(groups * 1.25 / block_size) + 1
    slots = torch.randperm(blocks * block_size, generator=generator, device=device)[:groups]
    slots[torch.rand(groups, generator=generator, device=device) < padding] = -1
    cache = torch.full((blocks, block_size, head_dim), float("nan"), dtype=torch.bfloat16, device=device)
    return Inputs(kv, score, weight, rope_cache(max_pos, device=device), positions, slots, cache, ratio=ratio)


# ----------------------------------------------------------------------------- fp8_ds_mla rows
# The ``fp8_ds_mla`` row format of the faithful variant, in torch: a reference for later kernels.
#
# One stored row of D = 512 values:
#
# - the first 448 values as FP8 e4m3, in 7 tiles of 64, each tile with one power-of-two scale
#   stored as UE8M0 (a biased exponent byte: ``scale = 2 ** (byte - 127)``);
# - the last 64 values (the rotated RoPE part) as bf16, each rounded once to nearest even.
#
# That is 448 + 128 = 576 data bytes per row, plus 7 scale bytes.  In the paged cache a block's
# scale bytes follow all its rows' data; this module works on rows and leaves the block layout to
# the kernels.  The quantization follows vLLM's DeepSeek-V4 compressor kernel: the 448 values are
# first rounded to bf16 (from fp32, to nearest even), and the tile's largest magnitude ``amax`` and
# the scaled values both come from those bf16 values; ``amax`` is floored at ``1e-4``; the scale is
# the smallest power of two with ``amax / scale <= 448`` (e4m3's largest finite value), so the
# exponent is ``ceil(log2(amax / 448))``; the scaled values are clamped to +-448 before the
# (round-to-nearest-even) e4m3 cast, and the scale byte ``exponent + 127`` to [0, 255].

FP8_DIMS = 448
TILE = 64
TILES = FP8_DIMS // TILE
BF16_DIMS = 64
FP8_ROW_BYTES = FP8_DIMS + 2 * BF16_DIMS  # 576
E4M3_MAX = 448.0
MIN_AMAX = 1e-4  # a tile's amax is floored here (as an fp32): an all-zero tile gets scale byte 105


def quantize_fp8_ds_mla(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, 512]`` float values to ``(data uint8 [T, 576], scales uint8 [T, 7])``.

    Values wider than fp32 are taken to fp32 first, so every rounding is the kernels' own.
    """
    if values.dim() != 2 or values.shape[1] != FP8_DIMS + BF16_DIMS:
        raise ValueError(f"expected [T, {FP8_DIMS + BF16_DIMS}] values, got {tuple(values.shape)}")
    rows = values.shape[0]
    values = values.float()
    tiles = values[:, :FP8_DIMS].to(torch.bfloat16).float().reshape(rows, TILES, TILE)
    amax = tiles.abs().amax(dim=-1).clamp_min(MIN_AMAX)
    # ceil(log2(x)) exactly: x = m * 2**e with m in [0.5, 1), so it is e, or e - 1 when m == 0.5
    mantissa, power = torch.frexp(amax / E4M3_MAX)
    exponent = (power - (mantissa == 0.5).int()).float()
    scaled = (tiles * torch.exp2(-exponent)[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
    fp8 = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(rows, FP8_DIMS)
    tail = values[:, FP8_DIMS:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(rows, 2 * BF16_DIMS)
    scales = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return torch.cat((fp8, tail), dim=1), scales


def dequantize_fp8_ds_mla(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``(data uint8 [T, 576], scales uint8 [T, 7])`` back to ``[T, 512]`` float32 values."""
    rows = data.shape[0]
    fp8 = data[:, :FP8_DIMS].contiguous().view(torch.float8_e4m3fn).float().reshape(rows, TILES, TILE)
    head = (fp8 * torch.exp2(scales.float() - 127)[..., None]).reshape(rows, FP8_DIMS)
    tail = data[:, FP8_DIMS:].contiguous().view(torch.bfloat16).float()
    return torch.cat((head, tail), dim=1)
