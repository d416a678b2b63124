"""compress_norm_rope_store in the CuTe DSL (nvidia-cutlass-dsl): one CTA of 64 threads per group.

Each of the 64 lanes owns ``D / 64`` contiguous channels (8 at D=512, 2 at
D=128), so an interleaved RoPE pair never straddles two lanes.  The gate
softmax over the ``ratio`` logits is computed by every lane (it is a handful
of values), the sum of squares is reduced with a butterfly shuffle inside each
warp and shared memory across the two warps.  The compile is cached per
(head dim, ratio) and built from fake tensors with symbolic sizes, so it needs
no GPU: with ``CUTE_DSL_ARCH=sm_90a`` it produces PTX on any machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import cutlass
import torch
from cutlass import cute
from cutlass.cute.runtime import from_dlpack, make_fake_compact_tensor
from cutlass.memory import SmemAllocator

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.reference import check_inputs

__all__ = ["LaunchConfig", "compile_for", "compress_norm_rope_store_cutedsl", "ptx_for"]

THREADS = 64
WARPS = THREADS // 32


@dataclass(frozen=True)
class LaunchConfig:
    """One CTA of 64 threads per group; each lane owns ``elements`` contiguous channels."""

    head_dim: int
    ratio: int

    @property
    def elements(self) -> int:
        return self.head_dim // THREADS

    @property
    def rope_first_lane(self) -> int:
        return (self.head_dim - ROPE_DIM) // self.elements


@cute.kernel
def _kernel(
    kv: cute.Tensor,
    score: cute.Tensor,
    weight: cute.Tensor,
    cos_sin: cute.Tensor,
    positions: cute.Tensor,
    slots: cute.Tensor,
    out: cute.Tensor,
    eps: cutlass.Float32,
    head_dim: cutlass.Constexpr,
    ratio: cutlass.Constexpr,
    elements: cutlass.Constexpr,
    rope_first_lane: cutlass.Constexpr,
):
    lane, _, _ = cute.arch.thread_idx()
    group, _, _ = cute.arch.block_idx()
    smem = SmemAllocator()
    partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(WARPS), byte_alignment=16)
    slot = slots[group]
    if slot >= 0:
        first_row = group * ratio
        top = score[first_row]
        for j in cutlass.range_constexpr(1, ratio):
            top = cute.math.max(top, score[first_row + j])
        acc = [cutlass.Float32(0.0)] * elements
        denom = cutlass.Float32(0.0)
        for j in cutlass.range_constexpr(ratio):
            gate = cute.math.exp(score[first_row + j] - top)
            denom = denom + gate
            for e in cutlass.range_constexpr(elements):
                acc[e] = acc[e] + gate * kv[first_row + j, lane * elements + e].to(cutlass.Float32)
        squares = cutlass.Float32(0.0)
        for e in cutlass.range_constexpr(elements):
            acc[e] = acc[e] / denom
            squares = squares + acc[e] * acc[e]
        for offset in (16, 8, 4, 2, 1):
            squares = squares + cute.arch.shuffle_sync_bfly(squares, offset=offset)
        if lane % 32 == 0:
            partial[lane // 32] = squares
        cute.arch.sync_threads()
        total = partial[0]
        for w in cutlass.range_constexpr(1, WARPS):
            total = total + partial[w]
        inv_rms = cute.math.rsqrt(total / head_dim + eps)
        position = positions[group]
        for e in cutlass.range_constexpr(0, elements, 2):
            column = lane * elements + e
            x0 = acc[e] * inv_rms * weight[column]
            x1 = acc[e + 1] * inv_rms * weight[column + 1]
            if lane >= rope_first_lane:
                pair = (column - (head_dim - ROPE_DIM)) // 2
                cos = cos_sin[position, pair]
                sin = cos_sin[position, ROPE_DIM // 2 + pair]
                out[slot, column] = (x0 * cos - x1 * sin).to(cutlass.BFloat16)
                out[slot, column + 1] = (x0 * sin + x1 * cos).to(cutlass.BFloat16)
            else:
                out[slot, column] = x0.to(cutlass.BFloat16)
                out[slot, column + 1] = x1.to(cutlass.BFloat16)


@cute.jit
def _host(
    kv: cute.Tensor,
    score: cute.Tensor,
    weight: cute.Tensor,
    cos_sin: cute.Tensor,
    positions: cute.Tensor,
    slots: cute.Tensor,
    out: cute.Tensor,
    eps: cutlass.Float32,
    head_dim: cutlass.Constexpr,
    ratio: cutlass.Constexpr,
    elements: cutlass.Constexpr,
    rope_first_lane: cutlass.Constexpr,
):
    groups = cute.size(positions)
    _kernel(kv, score, weight, cos_sin, positions, slots, out, eps, head_dim, ratio, elements, rope_first_lane).launch(
        grid=[groups, 1, 1], block=[THREADS, 1, 1]
    )


def _fake_arguments(config: LaunchConfig) -> tuple:
    rows, groups, slots, positions = (cute.sym_int32() for _ in range(4))
    return (
        make_fake_compact_tensor(cutlass.BFloat16, (rows, config.head_dim), stride_order=(1, 0), assumed_align=16),
        make_fake_compact_tensor(cutlass.Float32, (rows,)),
        make_fake_compact_tensor(cutlass.Float32, (config.head_dim,)),
        make_fake_compact_tensor(cutlass.Float32, (positions, ROPE_DIM), stride_order=(1, 0)),
        make_fake_compact_tensor(cutlass.Int64, (groups,)),
        make_fake_compact_tensor(cutlass.Int64, (groups,)),
        make_fake_compact_tensor(cutlass.BFloat16, (slots, config.head_dim), stride_order=(1, 0), assumed_align=16),
        cutlass.Float32(1e-6),
    )


def _compile(head_dim: int, ratio: int, **options: str):
    config = LaunchConfig(head_dim, ratio)
    arguments = (*_fake_arguments(config), head_dim, ratio, config.elements, config.rope_first_lane)
    return cute.compile(_host, *arguments, **options)


@functools.cache
def compile_for(head_dim: int, ratio: int):
    """The compiled kernel for one (head dim, ratio), from fake tensors: no GPU needed to build it."""
    return _compile(head_dim, ratio)


def ptx_for(head_dim: int, ratio: int, dump_dir: str | Path, *, arch: str = "") -> str:
    """Compile keeping the PTX under ``dump_dir`` and return it (``arch`` defaults to ``CUTE_DSL_ARCH``)."""
    Path(dump_dir).mkdir(parents=True, exist_ok=True)
    options = f"--keep-ptx --dump-dir={dump_dir}" + (f" --gpu-arch {arch}" if arch else "")
    ptx = _compile(head_dim, ratio, options=options).artifacts.PTX
    return Path(ptx).read_text() if "\n" not in ptx and Path(ptx).is_file() else ptx  # a path or the text


def _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio: int, eps: float) -> None:
    groups, head_dim = check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    if not kv.is_cuda:
        raise ValueError("the CuTe DSL backend runs on CUDA tensors only; use backend='torch' or 'triton' here")
    if groups == 0:
        return
    compiled = compile_for(head_dim, ratio)
    tensors = (
        kv.contiguous(),
        score.contiguous(),
        weight.float().contiguous(),
        cos_sin_cache.float().contiguous(),
        positions.long().contiguous(),
        slot_mapping.long().contiguous(),
        kv_cache.view(-1, head_dim),
    )
    compiled(
        *(from_dlpack(t, assumed_align=16 if t.dtype == torch.bfloat16 else None) for t in tensors),
        cutlass.Float32(eps),
    )


def compress_norm_rope_store_cutedsl(
    kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, *, ratio: int = 4, eps: float = 1e-6
) -> torch.Tensor:
    """The CuTe DSL backend (CUDA only); writes and returns ``kv_cache``."""
    _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio, eps)
    return kv_cache
