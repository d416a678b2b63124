"""compress_state_store in Triton: one program per token, a ``[chunk, 512]`` tile, online softmax.

Every token gets a program; one that is not a boundary token, or has a negative slot, loads
nothing else and stores nothing.  A working program walks its window ``chunk`` rows at a time
(C4: the whole window of 8 in one step; C128: 16 steps of 8), loading for each row the 512 kv
and 512 score columns it uses, and keeps a running maximum, denominator and weighted sum per
feature (the softmax over the window axis, one per feature).  Then RMSNorm, RoPE on the last
64 channels (the ``[512]`` row seen as 256 pairs, the first 224 rotated by the identity), and
the ``fp8_ds_mla`` store: the row seen as ``[8, 64]`` and rounded to bf16, tiles 0-6 scaled by
their power of two and stored as e4m3 bytes, tile 7 stored as bf16 through a 16-bit view of the
same cache, and the 8-byte scale record (7 UE8M0 bytes, then a 0 pad byte).

Runs on GPUs and, with ``TRITON_INTERPRET=1``, on the CPU: all math is fp32 (the bf16 and e4m3
roundings and the scale exponent are integer arithmetic on the bits, the same on both), and the
only loads through loaded values are index loads (block-table entries, positions), never loaded
pointers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.state import DATA_BYTES, HEAD_DIM, SCALE_BYTES, StateLayout
from diagtools.kernels.state_reference import check_state_inputs

__all__ = ["LaunchConfig", "compile_ptx", "compress_state_store_triton"]


@dataclass(frozen=True)
class LaunchConfig:
    """Launch shape: ``chunk`` window rows per step (a ``[chunk, 512]`` kv and score tile)."""

    chunk: int
    num_warps: int

    TILE_ELEMENTS = 4096  # kv elements per step: with the scores, 32 KB of fp32 in flight

    @classmethod
    def for_layout(cls, layout: StateLayout) -> LaunchConfig:
        return cls(chunk=min(layout.window, cls.TILE_ELEMENTS // HEAD_DIM), num_warps=4)


@triton.jit
def _compress_state_store_kernel(
    state_ptr,
    block_table_ptr,
    requests_ptr,
    positions_ptr,
    slots_ptr,
    weight_ptr,
    cos_sin_ptr,
    out_ptr,
    out_half_ptr,
    block_table_stride,
    cos_sin_stride,
    state_block,
    block_size,
    eps,
    D: tl.constexpr,
    WIDTH: tl.constexpr,
    RATIO: tl.constexpr,
    WINDOW: tl.constexpr,
    CHUNK: tl.constexpr,
    ROPE: tl.constexpr,
    DATA: tl.constexpr,
    SCALES: tl.constexpr,
):
    tl.static_assert(D // 64 == SCALES)  # the store writes one scale byte per 64-wide tile, the last the pad
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    boundary = (position + 1) % RATIO == 0
    slot = tl.load(slots_ptr + token, mask=boundary, other=-1).to(tl.int64)
    if boundary & (slot >= 0):  # every other token stops here, having read its position (and slot)
        request = tl.load(requests_ptr + token).to(tl.int64)
        table_row = block_table_ptr + request * block_table_stride
        compressed = _pool_window(state_ptr, table_row, position, state_block, D, WIDTH, RATIO, WINDOW, CHUNK)
        y = _norm_rope(compressed, weight_ptr, cos_sin_ptr + (position // RATIO * RATIO) * cos_sin_stride, eps, D, ROPE)
        block_start = (slot // block_size) * (block_size * (DATA + SCALES))
        data_at = block_start + (slot % block_size) * DATA
        scales_at = block_start + block_size * DATA + (slot % block_size) * SCALES
        _store_fp8_ds_mla(y, out_ptr, out_half_ptr, data_at, scales_at, D)


@triton.jit
def _pool_window(state_ptr, table_row, position, state_block, D, WIDTH, RATIO, WINDOW, CHUNK):
    """Softmax over the window rows, one per feature, and the weighted kv sum: ``[D]`` fp32.

    ``CHUNK`` rows at a time, keeping a running maximum, denominator and weighted sum per feature.
    """
    feature = tl.arange(0, D)
    top = tl.full([D], -3.0e38, tl.float32)  # finite: an all-missing chunk leaves the sums unchanged
    denominator = tl.zeros([D], tl.float32)
    total = tl.zeros([D], tl.float32)
    for start in range(0, WINDOW, CHUNK):
        step = start + tl.arange(0, CHUNK)  # window row, oldest first
        q = position - WINDOW + 1 + step
        exists = q >= 0  # C4's first group has no previous group
        q = tl.where(exists, q, 0)
        block = tl.load(table_row + q // state_block, mask=exists, other=0).to(tl.int64)
        # C4: the previous group's rows read [0, D), the current group's [WIDTH - D, WIDTH); a product, not a
        # select, so the compiler sees every row start a multiple of D and issues 128-bit loads
        first = (step >= WINDOW - RATIO).to(tl.int64) * (WIDTH - D)
        column = ((block * state_block + q % state_block) * (2 * WIDTH) + first)[:, None] + feature[None, :]
        kv = tl.load(state_ptr + column, mask=exists[:, None], other=0.0).to(tl.float32)
        score = tl.load(state_ptr + column + WIDTH, mask=exists[:, None], other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, tl.max(score, axis=0))
        decay = tl.exp(top - new_top)
        gates = tl.exp(score - new_top[None, :])
        denominator = denominator * decay + tl.sum(gates, axis=0)
        total = total * decay + tl.sum(gates * kv, axis=0)
        top = new_top
    return total / denominator


@triton.jit
def _norm_rope(compressed, weight_ptr, cos_sin_row, eps, D, ROPE):
    """RMSNorm with the weight, then interleaved RoPE on the last ``ROPE`` channels: ``[D]`` fp32.

    The row is seen as ``D / 2`` pairs; the pairs before the last ``ROPE / 2`` turn by zero.
    """
    feature = tl.arange(0, D)
    inv_rms = tl.rsqrt(tl.sum(compressed * compressed, axis=0) / D + eps)
    y = compressed * inv_rms * tl.load(weight_ptr + feature)
    even, odd = tl.split(tl.reshape(y, [D // 2, 2]))
    pair = tl.arange(0, D // 2) - (D - ROPE) // 2
    rotates = pair >= 0
    table = cos_sin_row + tl.where(rotates, pair, 0)
    cos = tl.load(table, mask=rotates, other=1.0)
    sin = tl.load(table + ROPE // 2, mask=rotates, other=0.0)
    return tl.reshape(tl.join(even * cos - odd * sin, even * sin + odd * cos), [D])


@triton.jit
def _store_fp8_ds_mla(y, out_ptr, out_half_ptr, data_at, scales_at, D):
    """The row as ``[D / 64, 64]`` tiles: all but the last as e4m3 bytes with a UE8M0 scale each,
    the last as bf16 (through the cache's 16-bit view, in 2-byte units); the scale record's last
    byte (padding) is written as 0.

    As vLLM's kernel does, the quantized tiles start from the values rounded to bf16: their amax
    (floored at ``1e-4``) picks the scale, and they are what is scaled, clamped to +-448 and cast.
    """
    tiles = tl.reshape(y, [D // 64, 64])
    tile = tl.arange(0, D // 64)
    lane = tl.arange(0, 64)
    quantized = tile < D // 64 - 1
    bf16 = _bf16_bits(tiles)
    rounded = (bf16.to(tl.int32) << 16).to(tl.float32, bitcast=True)  # the bf16 values, exactly, as fp32
    amax = tl.maximum(tl.max(tl.abs(rounded), axis=1), 1e-4)
    exponent = _ue8m0_exponent(amax)  # in [-22, 120] for a finite amax: 1 / scale is a normal fp32
    inverse_scale = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    scaled = tl.minimum(tl.maximum(rounded * inverse_scale[:, None], -448.0), 448.0)
    tl.store(out_ptr + data_at + tile[:, None] * 64 + lane[None, :], _e4m3_bits(scaled), mask=quantized[:, None])
    scale_bytes = tl.where(quantized, tl.minimum(tl.maximum(exponent + 127, 0), 255), 0)
    tl.store(out_ptr + scales_at + tile, scale_bytes.to(tl.uint8))  # D / 64 == SCALES: 7 scales, then the pad
    tail = (data_at + (D - 64)) // 2 + tl.where(quantized, 0, tile - (D // 64 - 1))[:, None] * 64 + lane[None, :]
    tl.store(out_half_ptr + tail, bf16, mask=~quantized[:, None])


@triton.jit
def _ue8m0_exponent(amax):
    """``ceil(log2(amax / 448))`` for a positive normal fp32 ``amax``, exactly, from its bits: with
    ``amax = (1 + f) * 2**e``, ``amax / 448 = (1 + f) / 1.75 * 2**(e - 8)``, whose factor lies in
    ``[4/7, 8/7)`` and exceeds 1 exactly when ``f > 0.75`` (mantissa field above ``0x600000``)."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127 - 8
    return tl.where((bits & 0x7FFFFF) > 0x600000, exponent + 1, exponent)


@triton.jit
def _e4m3_bits(x):
    """fp32 values with ``|x| <= 448`` to FP8 e4m3 (fn) bytes, rounded to nearest even, by integer
    arithmetic: the same bytes on a GPU and under the interpreter (whose own fp8 cast drops the
    carry when rounding overflows the mantissa)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = ((bits >> 24) & 0x80).to(tl.uint8)
    magnitude = bits & 0x7FFFFFFF
    # normal e4m3 (|x| >= 2**-6): drop 20 mantissa bits, carrying into the exponent; rebias 127 -> 7
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - ((127 - 7) << 3)
    # subnormal e4m3: the 24-bit significand in units of 2**-9 (rounding up to 8 gives 2**-6, a normal)
    significand = (magnitude & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(14 - ((magnitude >> 23) - 127), 1), 25)
    subnormal = (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift
    code = tl.minimum(tl.where((magnitude >> 23) >= 127 - 6, normal, subnormal), 0x7E)
    return code.to(tl.uint8) | sign


@triton.jit
def _bf16_bits(x):
    """fp32 values (finite) to bf16 bit patterns as int16, rounded to nearest even, by integer arithmetic."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16)


def _launch(
    state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache, ratio, eps
) -> None:
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    tokens, layout, block_size = check_state_inputs(*arguments, ratio)
    if block_table.stride(1) != 1 or not cos_sin_cache.is_contiguous():
        raise ValueError("block_table rows and cos_sin_cache must be contiguous")
    if tokens == 0:
        return
    config = LaunchConfig.for_layout(layout)
    _compress_state_store_kernel[(tokens,)](
        state_cache,
        block_table,
        request_indices,
        positions,
        slot_mapping,
        weight.float().contiguous(),
        cos_sin_cache,
        kv_cache,
        kv_cache.view(torch.int16),
        block_table.stride(0),
        cos_sin_cache.stride(0),
        state_cache.shape[1],
        block_size,
        eps,
        D=HEAD_DIM,
        WIDTH=layout.width,
        RATIO=layout.ratio,
        WINDOW=layout.window,
        CHUNK=config.chunk,
        ROPE=ROPE_DIM,
        DATA=DATA_BYTES,
        SCALES=SCALE_BYTES,
        num_warps=config.num_warps,
    )


# The kernel's parameter types for an ahead-of-time compile (int64 indices, an int32 block table).
_SIGNATURE = {
    "state_ptr": "*fp32",
    "block_table_ptr": "*i32",
    "requests_ptr": "*i64",
    "positions_ptr": "*i64",
    "slots_ptr": "*i64",
    "weight_ptr": "*fp32",
    "cos_sin_ptr": "*fp32",
    "out_ptr": "*u8",
    "out_half_ptr": "*i16",
    "block_table_stride": "i64",
    "cos_sin_stride": "i64",
    "state_block": "i64",
    "block_size": "i64",
    "eps": "fp32",
}


# What a real launch tells the compiler about the arguments (Triton specializes on them): every tensor
# starts on a 16-byte boundary, and these sizes are multiples of 16 in vLLM's caches.
ALIGNED_ARGUMENTS = ("state_block", "block_size")


def compile_ptx(ratio: int, capability: int = 90, *, aligned: bool = True) -> str:
    """The kernel's PTX for ``sm_<capability>``, compiled here without a GPU (not under the interpreter).

    ``aligned``: with the divisibility a real launch on vLLM's tensors gets (16 for every pointer and for
    :data:`ALIGNED_ARGUMENTS`), so the PTX has the vector widths the GPU will run."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from diagtools.kernels.state import layout_for

    kernel = _compress_state_store_kernel
    if not hasattr(kernel, "arg_names") or not hasattr(kernel, "src"):
        raise ValueError("compile_ptx needs the compiled kernel: unset TRITON_INTERPRET")
    layout = layout_for(ratio)
    config = LaunchConfig.for_layout(layout)
    constants = {
        "D": HEAD_DIM,
        "WIDTH": layout.width,
        "RATIO": layout.ratio,
        "WINDOW": layout.window,
        "CHUNK": config.chunk,
        "ROPE": ROPE_DIM,
        "DATA": DATA_BYTES,
        "SCALES": SCALE_BYTES,
    }
    signature = {**_SIGNATURE, **dict.fromkeys(constants, "constexpr")}
    hinted = [n for n, kind in signature.items() if kind.startswith("*") or n in ALIGNED_ARGUMENTS] if aligned else []
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
        attrs={(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in hinted},
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": config.num_warps})
    return compiled.asm["ptx"]


def compress_state_store_triton(
    state_cache,
    block_table,
    request_indices,
    positions,
    slot_mapping,
    weight,
    cos_sin_cache,
    kv_cache,
    *,
    ratio: int,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The Triton backend; writes and returns ``kv_cache``."""
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    _launch(*arguments, ratio, eps)
    return kv_cache
