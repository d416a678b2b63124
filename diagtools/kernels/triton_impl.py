"""compress_norm_rope_store in Triton: one program per group, a [ratio, D] tile in registers.

Runs on GPUs and, with ``TRITON_INTERPRET=1``, on the CPU (where bf16 values
are cast to fp32 inside the kernel, as the interpreter has no bf16 math).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.reference import check_inputs

__all__ = ["LaunchConfig", "compress_norm_rope_store_triton"]


@dataclass(frozen=True)
class LaunchConfig:
    """Launch shape: one program per group; warps scale with the head dim."""

    num_warps: int

    @classmethod
    def for_head_dim(cls, head_dim: int) -> LaunchConfig:
        return cls(num_warps=4 if head_dim >= 512 else 2)


@triton.jit
def _compress_norm_rope_store_kernel(
    kv_ptr,
    score_ptr,
    weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    slots_ptr,
    out_ptr,
    cos_sin_stride,
    eps,
    HEAD_DIM: tl.constexpr,
    RATIO: tl.constexpr,
    ROPE: tl.constexpr,
):
    group = tl.program_id(0)
    slot = tl.load(slots_ptr + group).to(tl.int64)
    if slot >= 0:
        rows = tl.arange(0, RATIO)
        cols = tl.arange(0, HEAD_DIM)
        logits = tl.load(score_ptr + group * RATIO + rows).to(tl.float32)
        gates = tl.exp(logits - tl.max(logits, axis=0))
        gates = gates / tl.sum(gates, axis=0)
        tile_offsets = (group * RATIO + rows)[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
        tile = tl.load(kv_ptr + tile_offsets).to(tl.float32)
        compressed = tl.sum(tile * gates[:, None], axis=0)
        inv_rms = 1.0 / tl.sqrt(tl.sum(compressed * compressed, axis=0) / HEAD_DIM + eps)
        normed = compressed * inv_rms * tl.load(weight_ptr + cols).to(tl.float32)
        even, odd = tl.split(tl.reshape(normed, [HEAD_DIM // 2, 2]))
        pair = tl.arange(0, HEAD_DIM // 2) - (HEAD_DIM - ROPE) // 2
        in_rope = pair >= 0
        table = cos_sin_ptr + tl.load(positions_ptr + group).to(tl.int64) * cos_sin_stride
        cos = tl.load(table + pair, mask=in_rope, other=1.0)
        sin = tl.load(table + ROPE // 2 + pair, mask=in_rope, other=0.0)
        rotated = tl.reshape(tl.join(even * cos - odd * sin, even * sin + odd * cos), [HEAD_DIM])
        tl.store(out_ptr + slot * HEAD_DIM + cols, rotated.to(tl.bfloat16))


def _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio: int, eps: float) -> None:
    groups, head_dim = check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    if ratio & (ratio - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two ratio, got {ratio}")
    for name, tensor in (("kv", kv), ("score", score), ("weight", weight), ("cos_sin_cache", cos_sin_cache)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if groups == 0:
        return
    config = LaunchConfig.for_head_dim(head_dim)
    _compress_norm_rope_store_kernel[(groups,)](
        kv,
        score,
        weight.float().contiguous(),
        cos_sin_cache,
        positions,
        slot_mapping,
        kv_cache,
        cos_sin_cache.stride(0),
        eps,
        HEAD_DIM=head_dim,
        RATIO=ratio,
        ROPE=ROPE_DIM,
        num_warps=config.num_warps,
    )


def compress_norm_rope_store_triton(
    kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, *, ratio: int = 4, eps: float = 1e-6
) -> torch.Tensor:
    """The Triton backend; writes and returns ``kv_cache``."""
    _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio, eps)
    return kv_cache
