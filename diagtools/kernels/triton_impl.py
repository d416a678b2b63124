"""compress_norm_rope_store in Triton: several groups per program, a [groups, ratio, D] tile in registers.

Each program takes ``block_groups`` consecutive groups (about 8192 kv elements
in flight); padded groups (slot < 0) load nothing.  The RoPE work (cos/sin
loads, the pair rotation) is done on the last 64 channels only.  Runs on GPUs
and, with ``TRITON_INTERPRET=1``, on the CPU (where bf16 values are cast to
fp32 inside the kernel, as the interpreter has no bf16 math).
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
    """Launch shape: ``block_groups`` groups per program (a ``[block_groups, ratio, D]`` tile)."""

    block_groups: int
    num_warps: int

    TILE_ELEMENTS = 8192  # kv elements per program: 16 KB of bf16 in flight

    @classmethod
    def for_shape(cls, head_dim: int, ratio: int) -> LaunchConfig:
        block_groups = max(1, cls.TILE_ELEMENTS // (ratio * head_dim))
        return cls(block_groups=block_groups, num_warps=8 if head_dim >= 512 else 4)

    def grid(self, groups: int) -> tuple[int]:
        return (triton.cdiv(groups, self.block_groups),)


@triton.jit
def _compress_norm_rope_store_kernel(
    kv_ptr,
    score_ptr,
    weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    slots_ptr,
    out_ptr,
    groups,
    cos_sin_stride,
    eps,
    HEAD_DIM: tl.constexpr,
    HEAD_BLOCK: tl.constexpr,
    RATIO: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # the channels split in two: the first HEAD_DIM - ROPE are only normalized (a power-of-two
    # block, masked at D=512 where 448 is not one), the last ROPE are normalized and rotated
    group = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    slot = tl.load(slots_ptr + group, mask=group < groups, other=-1).to(tl.int64)
    keep = slot >= 0
    rows = group[:, None] * RATIO + tl.arange(0, RATIO)[None, :]  # [G, R] row index, 64-bit
    logits = tl.load(score_ptr + rows, mask=keep[:, None], other=0.0).to(tl.float32)
    gates = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    gates = gates * (1.0 / tl.sum(gates, axis=1))[:, None]  # one reciprocal per group

    head = tl.arange(0, HEAD_BLOCK)
    in_head = head < HEAD_DIM - ROPE
    tail = HEAD_DIM - ROPE + tl.arange(0, ROPE)
    row_base = kv_ptr + rows[:, :, None] * HEAD_DIM  # [G, R, 1]
    kv_head = tl.load(row_base + head[None, None, :], mask=keep[:, None, None] & in_head[None, None, :], other=0.0)
    kv_tail = tl.load(row_base + tail[None, None, :], mask=keep[:, None, None], other=0.0)
    head_sum = tl.sum(kv_head.to(tl.float32) * gates[:, :, None], axis=1)  # [G, HEAD_BLOCK]
    tail_sum = tl.sum(kv_tail.to(tl.float32) * gates[:, :, None], axis=1)  # [G, ROPE]

    squares = tl.sum(head_sum * head_sum, axis=1) + tl.sum(tail_sum * tail_sum, axis=1)
    inv_rms = tl.rsqrt(squares / HEAD_DIM + eps)[:, None]
    head_out = head_sum * inv_rms * tl.load(weight_ptr + head, mask=in_head, other=0.0)[None, :]
    tail_out = tail_sum * inv_rms * tl.load(weight_ptr + tail)[None, :]

    even, odd = tl.split(tl.reshape(tail_out, [BLOCK_G, ROPE // 2, 2]))
    pair = tl.arange(0, ROPE // 2)
    position = tl.load(positions_ptr + group, mask=keep, other=0).to(tl.int64)
    table = cos_sin_ptr + position[:, None] * cos_sin_stride + pair[None, :]
    cos = tl.load(table, mask=keep[:, None], other=1.0)
    sin = tl.load(table + ROPE // 2, mask=keep[:, None], other=0.0)
    rotated = tl.reshape(tl.join(even * cos - odd * sin, even * sin + odd * cos), [BLOCK_G, ROPE])

    out_row = out_ptr + slot[:, None] * HEAD_DIM
    tl.store(out_row + head[None, :], head_out.to(tl.bfloat16), mask=keep[:, None] & in_head[None, :])
    tl.store(out_row + tail[None, :], rotated.to(tl.bfloat16), mask=keep[:, None])


def _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio: int, eps: float) -> None:
    groups, head_dim = check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    if ratio & (ratio - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two ratio, got {ratio}")
    for name, tensor in (("kv", kv), ("score", score), ("weight", weight), ("cos_sin_cache", cos_sin_cache)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if groups == 0:
        return
    config = LaunchConfig.for_shape(head_dim, ratio)
    _compress_norm_rope_store_kernel[config.grid(groups)](
        kv,
        score,
        weight.float().contiguous(),
        cos_sin_cache,
        positions,
        slot_mapping,
        kv_cache,
        groups,
        cos_sin_cache.stride(0),
        eps,
        HEAD_DIM=head_dim,
        HEAD_BLOCK=triton.next_power_of_2(head_dim - ROPE_DIM),
        RATIO=ratio,
        ROPE=ROPE_DIM,
        BLOCK_G=config.block_groups,
        num_warps=config.num_warps,
    )


def compress_norm_rope_store_triton(
    kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, *, ratio: int = 4, eps: float = 1e-6
) -> torch.Tensor:
    """The Triton backend; writes and returns ``kv_cache``."""
    _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio, eps)
    return kv_cache
