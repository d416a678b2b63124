"""compress_state_store in the CuTe DSL (nvidia-cutlass-dsl), launched through the CUDA driver API.

Layout of the work.  Each lane of a warp owns 16 contiguous features of the 512, so every
state-row part it reads (16 fp32 kv values, 16 fp32 scores), the weight, the cos/sin values and
every store move as 128-bit vectors.  A token's window is split over ``splits`` warps:

- C4 (window 8): one warp per token, four tokens per CTA of 128 threads;
- C128 (window 128): eight warps per token (16 rows each), one token per CTA of 256 threads;
  the warps' partial softmax states (running maximum, denominator and weighted sum per feature)
  are merged through 48 KB of shared memory, then the first warp finishes the token.

A warp reads its window two rows at a time and keeps an online softmax per feature (one
rescale per two rows).  The C4 window's rows at negative positions (the first group of a
request) read row 0 and take a score of -3e38, so they weigh nothing.  Tokens that are not on a
boundary, or have a negative slot, read their position (and slot) and stop.

The finish, on one warp: RMSNorm (the sum of squares by a butterfly shuffle), the ``fp8_ds_mla``
store as vLLM does it (lanes 0-27, four lanes a 64-feature tile: the values rounded to bf16, the
tile maximum by a two-step butterfly, floored at 1e-4, the power-of-two scale exact from the
exponent bits, 16 FP8 bytes a lane in one 128-bit store, the UE8M0 byte and the zero padding byte)
and, on lanes 28-31, RoPE at ``(p // R) * R`` and the bf16 tail (two 128-bit stores a lane).

The launch.  The kernel takes raw global pointers and explicit 64-bit sizes, so nothing about
the tensors is baked into the compiled code; the grid is computed here from the real number of
tokens (:meth:`StateLaunchConfig.grid`) and the kernel is launched with ``cuLaunchKernel`` on
torch's current stream.  The PTX for sm_90a of both compressors ships in ``ptx/``, so a GPU
machine without nvidia-cutlass-dsl runs this exact kernel.  Compiling needs no GPU: set
``CUTE_DSL_ARCH=sm_90a``.  The 128-bit output stores need the cache's blocks to start on
16-byte boundaries: an even ``block_size`` (vLLM's is 64).
"""

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.cuda_launch import VECTOR_BYTES, KernelLaunch, aligned, launch_kernel, load_kernel
from diagtools.kernels.state import DATA_BYTES, HEAD_DIM, SCALE_BYTES, StateLayout, layout_for
from diagtools.kernels.state_reference import check_state_inputs

__all__ = [
    "PARAM_TYPES",
    "PREBUILT",
    "StateLaunchConfig",
    "compile_ptx",
    "compress_state_store_cutedsl",
    "kernel_ptx",
    "plan_launch",
    "prebuilt_path",
]

ELEMENTS = 16  # features per lane: 512 / 32
LANES = HEAD_DIM // ELEMENTS
CHUNK = 2  # window rows per online-softmax step
FP8_LANES = (HEAD_DIM - ROPE_DIM) // ELEMENTS  # lanes 0-27 quantize, 28-31 rotate
TILE_LANES = 64 // ELEMENTS  # lanes per 64-feature scale tile
MISSING_SCORE = -3.0e38  # finite: a row that does not exist weighs exp(-3e38 - m) = 0
HALF_PAIRS = ELEMENTS // 2  # RoPE pairs per lane
TOKEN_BYTES = DATA_BYTES + SCALE_BYTES
AMAX_FLOOR = 1e-4  # a tile's maximum is floored here before its scale is taken, as in vLLM
E4M3_MAX = 448.0
PTX_DIR = Path(__file__).resolve().parent / "ptx"
PREBUILT = (4, 128)  # the ratios whose PTX ships in ptx/
ARCH = "sm_90a"


@dataclass(frozen=True)
class StateLaunchConfig:
    """Per compressor: how many warps share a token's window, and the CTA shape that follows."""

    ratio: int

    @property
    def layout(self) -> StateLayout:
        return layout_for(self.ratio)

    @property
    def splits(self) -> int:
        """Warps per token: one for C4's 8 rows, eight (16 rows each) for C128's 128."""
        return 1 if self.layout.window <= 8 else 8

    @property
    def warps(self) -> int:
        return 4 if self.splits == 1 else self.splits

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def tokens_per_cta(self) -> int:
        return self.warps // self.splits

    @property
    def rows_per_warp(self) -> int:
        return self.layout.window // self.splits

    @property
    def shared_floats(self) -> int:
        """Shared memory for merging the splits: maximum, denominator and sum per feature and warp."""
        return 0 if self.splits == 1 else 3 * self.warps * HEAD_DIM

    def grid(self, tokens: int) -> int:
        """CTAs to launch: every token gets its warps (idle tokens return at once)."""
        return max(1, math.ceil(tokens / self.tokens_per_cta))

    def token_of(self, cta: int, warp: int) -> tuple[int, int]:
        """The ``(token, split)`` a warp of a CTA works on: the kernel's own index arithmetic."""
        return cta * self.tokens_per_cta + warp // self.splits, warp % self.splits


# ----------------------------------------------------------------------------- the kernel


@functools.cache
def _define_kernel():  # noqa: PLR0915 - the device code is defined inside, where cutlass is imported
    """The device code and its host function (needs nvidia-cutlass-dsl, imported only here)."""
    import cutlass
    from cutlass import cute

    f32, i64 = cutlass.Float32, cutlass.Int64

    @cute.kernel
    def kernel(  # noqa: PLR0912, PLR0915 - the whole device function, unrolled at compile time
        state_ptr: cute.Pointer,
        table_ptr: cute.Pointer,
        requests_ptr: cute.Pointer,
        positions_ptr: cute.Pointer,
        slots_ptr: cute.Pointer,
        weight_ptr: cute.Pointer,
        cos_sin_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        tokens: cutlass.Int64,
        state_rows: cutlass.Int64,
        table_entries: cutlass.Int64,
        table_stride: cutlass.Int64,
        state_block: cutlass.Int64,
        max_pos: cutlass.Int64,
        cache_bytes: cutlass.Int64,
        block_size: cutlass.Int64,
        eps: cutlass.Float32,
        ratio: cutlass.Constexpr,
        window: cutlass.Constexpr,
        width: cutlass.Constexpr,
        splits: cutlass.Constexpr,
        warps: cutlass.Constexpr,
    ):
        row_tiles = 2 * width // ELEMENTS  # 16-float tiles in one state row
        rows_per_warp = window // splits
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        token = i64(cute.arch.block_idx()[0]) * (warps // splits) + i64(warp // splits)
        split = warp % splits

        state = cute.make_tensor(state_ptr, cute.make_layout(state_rows * 2 * width))
        table = cute.make_tensor(table_ptr, cute.make_layout(table_entries))
        requests = cute.make_tensor(requests_ptr, cute.make_layout(tokens))
        positions = cute.make_tensor(positions_ptr, cute.make_layout(tokens))
        slots = cute.make_tensor(slots_ptr, cute.make_layout(tokens))
        weight = cute.make_tensor(weight_ptr, cute.make_layout(HEAD_DIM))
        cos_sin = cute.make_tensor(cos_sin_ptr, cute.make_layout(max_pos * ROPE_DIM))
        out = cute.make_tensor(out_ptr, cute.make_layout(cache_bytes))
        out_fp8 = cute.make_tensor(cute.recast_ptr(out_ptr, dtype=cutlass.Float8E4M3FN), cute.make_layout(cache_bytes))
        out_bf16 = cute.make_tensor(
            cute.recast_ptr(out_ptr, dtype=cutlass.BFloat16), cute.make_layout(cache_bytes // 2)
        )

        shared = None
        if cutlass.const_expr(splits > 1):
            merge = cute.make_layout((3, warps, HEAD_DIM), stride=(warps * HEAD_DIM, HEAD_DIM, 1))
            shared = cute.make_tensor(cute.arch.alloc_smem(f32, 3 * warps * HEAD_DIM, alignment=16), merge)

        kv = cute.make_rmem_tensor(cute.make_layout((CHUNK, ELEMENTS), stride=(ELEMENTS, 1)), f32)
        score = cute.make_rmem_tensor(cute.make_layout((CHUNK, ELEMENTS), stride=(ELEMENTS, 1)), f32)
        top = cute.make_rmem_tensor((ELEMENTS,), f32)
        denominator = cute.make_rmem_tensor((ELEMENTS,), f32)
        total = cute.make_rmem_tensor((ELEMENTS,), f32)
        y = cute.make_rmem_tensor((ELEMENTS,), f32)
        w = cute.make_rmem_tensor((ELEMENTS,), f32)
        angles = cute.make_rmem_tensor(cute.make_layout((2, ELEMENTS // 2), stride=(ELEMENTS // 2, 1)), f32)
        tail = cute.make_rmem_tensor((ELEMENTS,), cutlass.BFloat16)
        fp8 = cute.make_rmem_tensor((ELEMENTS,), cutlass.Float8E4M3FN)
        rounded = cute.make_rmem_tensor((ELEMENTS,), f32)

        # position, slot and request are read side by side (not one after the other): an idle
        # token reads 16 bytes more, a working one waits one memory latency instead of three
        position = i64(0)
        slot = i64(-1)
        request = i64(0)
        if token < tokens:
            position = i64(positions[token])
            slot = i64(slots[token])
            request = i64(requests[token])
        if (position + 1) % ratio != 0:
            slot = i64(-1)
        # the same for every warp of a token, so for the whole CTA when splits > 1 (barriers are safe)
        if slot >= 0:
            table_row = request * table_stride
            rows_per_block = cutlass.Int32(state_block)  # positions fit in 32 bits: cheap divisions
            last = cutlass.Int32(position)
            for e in cutlass.range_constexpr(ELEMENTS):
                top[e] = f32(MISSING_SCORE)
                denominator[e] = f32(0.0)
                total[e] = f32(0.0)
            for step in cutlass.range_constexpr(rows_per_warp // CHUNK):
                valid = []
                for j in cutlass.range_constexpr(CHUNK):
                    local = step * CHUNK + j
                    q = last - (window - 1) + split * rows_per_warp + local
                    exists = q >= 0
                    q = cutlass.max(q, cutlass.Int32(0))
                    block = i64(table[table_row + i64(q // rows_per_block)])
                    row = block * state_block + i64(q % rows_per_block)
                    # C4: the previous group's rows read the first D columns of each half, the
                    # current group's the last D (splits is 1 there, so `local` is the window row)
                    part = (width - HEAD_DIM) // ELEMENTS if local >= window - ratio else 0
                    tile = row * row_tiles + part + lane
                    cute.autovec_copy(cute.local_tile(state, (ELEMENTS,), (tile,)), kv[j, None])
                    cute.autovec_copy(cute.local_tile(state, (ELEMENTS,), (tile + width // ELEMENTS,)), score[j, None])
                    valid.append(f32(1.0) if cutlass.const_expr(window == ratio) else exists.to(f32))
                for e in cutlass.range_constexpr(ELEMENTS):
                    scores = [score[j, e] * valid[j] + (valid[j] - 1.0) * -MISSING_SCORE for j in range(CHUNK)]
                    new_top = top[e]
                    for j in cutlass.range_constexpr(CHUNK):
                        new_top = cute.arch.fmax(new_top, scores[j])
                    decay = cute.math.exp(top[e] - new_top, fastmath=True)
                    d = denominator[e] * decay
                    t = total[e] * decay
                    for j in cutlass.range_constexpr(CHUNK):
                        gate = cute.math.exp(scores[j] - new_top, fastmath=True)
                        d = d + gate
                        t = t + gate * kv[j, e]
                    top[e] = new_top
                    denominator[e] = d
                    total[e] = t

            if cutlass.const_expr(splits > 1):
                base = lane * ELEMENTS
                cute.autovec_copy(top, cute.local_tile(shared[0, warp, None], (ELEMENTS,), (lane,)))
                cute.autovec_copy(denominator, cute.local_tile(shared[1, warp, None], (ELEMENTS,), (lane,)))
                cute.autovec_copy(total, cute.local_tile(shared[2, warp, None], (ELEMENTS,), (lane,)))
                cute.arch.sync_threads()

            if split == 0:  # the first warp of the token finishes it
                if cutlass.const_expr(splits > 1):  # only the finishing warp merges the splits
                    for e in cutlass.range_constexpr(ELEMENTS):
                        best = shared[0, 0, base + e]
                        for s in cutlass.range_constexpr(1, splits):
                            best = cute.arch.fmax(best, shared[0, s, base + e])
                        d = f32(0.0)
                        t = f32(0.0)
                        for s in cutlass.range_constexpr(splits):
                            factor = cute.math.exp(shared[0, s, base + e] - best, fastmath=True)
                            d = d + shared[1, s, base + e] * factor
                            t = t + shared[2, s, base + e] * factor
                        denominator[e] = d
                        total[e] = t
                squares = f32(0.0)
                for e in cutlass.range_constexpr(ELEMENTS):
                    y[e] = total[e] * cute.arch.rcp_approx(denominator[e])
                    squares = squares + y[e] * y[e]
                for offset in (16, 8, 4, 2, 1):
                    squares = squares + cute.arch.shuffle_sync_bfly(squares, offset=offset)
                inverse_rms = cute.math.rsqrt(squares * (1.0 / HEAD_DIM) + eps, fastmath=True)
                cute.autovec_copy(cute.local_tile(weight, (ELEMENTS,), (lane,)), w)
                for e in cutlass.range_constexpr(ELEMENTS):
                    y[e] = y[e] * inverse_rms * w[e]

                # the tile's scale, from the values rounded to bf16 (lanes 28-31 join the shuffles only)
                rounded.store(y.load().to(cutlass.BFloat16).to(f32))
                amax = f32(0.0)
                for e in cutlass.range_constexpr(ELEMENTS):
                    amax = cute.arch.fmax(amax, cute.math.absf(rounded[e]))
                for offset in (1, 2):
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
                amax = cute.arch.fmax(amax, f32(AMAX_FLOOR))
                # ceil(log2(amax / 448)) from the bits of a normal positive float, and 2**-exponent
                exponent = ((amax * (1.0 / E4M3_MAX)).bitcast(cutlass.Int32) + 0x7FFFFF) >> 23
                exponent = exponent - 127
                inverse_scale = ((127 - exponent) << 23).bitcast(f32)

                slot_in_cache = cutlass.Int32(slot)  # fewer than 2**31 slots fit in any GPU's memory
                tokens_per_block = cutlass.Int32(block_size)
                block_start = i64(slot_in_cache // tokens_per_block) * (block_size * TOKEN_BYTES)
                cache_row = i64(slot_in_cache % tokens_per_block)
                data_at = block_start + cache_row * DATA_BYTES
                scales_at = block_start + block_size * DATA_BYTES + cache_row * SCALE_BYTES
                if lane < FP8_LANES:
                    for e in cutlass.range_constexpr(ELEMENTS):
                        scaled = rounded[e] * inverse_scale
                        rounded[e] = cute.arch.fmin(cute.arch.fmax(scaled, f32(-E4M3_MAX)), f32(E4M3_MAX))
                    fp8.store(rounded.load().to(cutlass.Float8E4M3FN))
                    cute.autovec_copy(fp8, cute.local_tile(out_fp8, (ELEMENTS,), (data_at // ELEMENTS + lane,)))
                    if lane % TILE_LANES == 0:
                        out[scales_at + lane // TILE_LANES] = cutlass.Uint8(exponent + 127)
                else:
                    if lane == FP8_LANES:
                        out[scales_at + SCALE_BYTES - 1] = cutlass.Uint8(0)  # the padding byte
                    # RoPE at (p // R) * R: this lane's 8 pairs take cosines 8k..8k+7 and the sines after
                    k = lane - FP8_LANES
                    angle_row = (position // ratio * ratio) * (ROPE_DIM // HALF_PAIRS)
                    cute.autovec_copy(cute.local_tile(cos_sin, (HALF_PAIRS,), (angle_row + k,)), angles[0, None])
                    sines = angle_row + ROPE_DIM // 2 // HALF_PAIRS + k
                    cute.autovec_copy(cute.local_tile(cos_sin, (HALF_PAIRS,), (sines,)), angles[1, None])
                    for i in cutlass.range_constexpr(HALF_PAIRS):
                        even, odd = y[2 * i], y[2 * i + 1]
                        y[2 * i] = even * angles[0, i] - odd * angles[1, i]
                        y[2 * i + 1] = even * angles[1, i] + odd * angles[0, i]
                    tail.store(y.load().to(cutlass.BFloat16))
                    tail_tile = (data_at + (HEAD_DIM - ROPE_DIM)) // VECTOR_BYTES + 2 * k  # in 8-value bf16 tiles
                    cute.autovec_copy(cute.local_tile(tail, (8,), (0,)), cute.local_tile(out_bf16, (8,), (tail_tile,)))
                    cute.autovec_copy(
                        cute.local_tile(tail, (8,), (1,)), cute.local_tile(out_bf16, (8,), (tail_tile + 1,))
                    )

    @cute.jit
    def host(
        state_ptr: cute.Pointer,
        table_ptr: cute.Pointer,
        requests_ptr: cute.Pointer,
        positions_ptr: cute.Pointer,
        slots_ptr: cute.Pointer,
        weight_ptr: cute.Pointer,
        cos_sin_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        tokens: cutlass.Int64,
        state_rows: cutlass.Int64,
        table_entries: cutlass.Int64,
        table_stride: cutlass.Int64,
        state_block: cutlass.Int64,
        max_pos: cutlass.Int64,
        cache_bytes: cutlass.Int64,
        block_size: cutlass.Int64,
        eps: cutlass.Float32,
        ctas: cutlass.Int32,
        ratio: cutlass.Constexpr,
        window: cutlass.Constexpr,
        width: cutlass.Constexpr,
        splits: cutlass.Constexpr,
        warps: cutlass.Constexpr,
    ):
        kernel(
            state_ptr, table_ptr, requests_ptr, positions_ptr, slots_ptr, weight_ptr, cos_sin_ptr, out_ptr,
            tokens, state_rows, table_entries, table_stride, state_block, max_pos, cache_bytes, block_size, eps,
            ratio, window, width, splits, warps,
        ).launch(grid=[ctas, 1, 1], block=[warps * 32, 1, 1])  # fmt: skip

    return host


# ----------------------------------------------------------------------------- compile

# The kernel's parameters, in order, as PTX types: 8 pointers, 8 sizes, eps.
PARAM_TYPES = ("u64",) * 8 + ("u64",) * 8 + ("f32",)


def compile_ptx(ratio: int, dump_dir: str | Path, *, arch: str = ARCH) -> str:
    """Compile with nvidia-cutlass-dsl for ``arch`` (no GPU needed) and return the PTX text."""
    import cutlass
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    config = StateLaunchConfig(ratio)
    layout = config.layout
    Path(dump_dir).mkdir(parents=True, exist_ok=True)

    def pointer(dtype):
        return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=VECTOR_BYTES)

    arguments = (
        pointer(cutlass.Float32),  # state cache
        pointer(cutlass.Int32),  # block table
        pointer(cutlass.Int64),  # request of each token
        pointer(cutlass.Int64),  # positions
        pointer(cutlass.Int64),  # slots
        pointer(cutlass.Float32),  # weight
        pointer(cutlass.Float32),  # cos/sin
        pointer(cutlass.Uint8),  # the fp8_ds_mla cache
        *(cutlass.Int64(1) for _ in range(8)),
        cutlass.Float32(1e-6),
        cutlass.Int32(1),
        layout.ratio,
        layout.window,
        layout.width,
        config.splits,
        config.warps,
    )
    options = f"--keep-ptx --dump-dir={dump_dir} --gpu-arch {arch}"
    ptx = cute.compile(_define_kernel(), *arguments, options=options).artifacts.PTX
    return Path(ptx).read_text() if "\n" not in ptx and Path(ptx).is_file() else ptx


def prebuilt_path(ratio: int) -> Path:
    return PTX_DIR / f"compress_state_store_c{ratio}.{ARCH}.ptx"


@functools.cache
def kernel_ptx(ratio: int) -> str:
    """The PTX to load: compiled here when nvidia-cutlass-dsl is importable, else the shipped copy."""
    layout_for(ratio)
    try:
        import cutlass  # noqa: F401
    except ImportError:
        return prebuilt_path(ratio).read_text()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return compile_ptx(ratio, folder, arch=os.environ.get("CUTE_DSL_ARCH", ARCH))


# ----------------------------------------------------------------------------- launch


def plan_launch(
    state_cache,
    block_table,
    request_indices,
    positions,
    slot_mapping,
    weight,
    cos_sin_cache,
    kv_cache,
    ratio: int,
    eps: float,
) -> KernelLaunch | None:
    """Validate and convert the inputs, and compute the grid and arguments (``None``: no tokens)."""
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    tokens, _layout, block_size = check_state_inputs(*arguments, ratio)
    if block_size % 2:
        raise ValueError(
            f"the CuTe DSL backend stores 128-bit vectors, so the cache's block_size must be even, got {block_size}"
        )
    if tokens == 0:
        return None
    config = StateLaunchConfig(ratio)
    tensors = {
        "state_cache": state_cache,
        "block_table": block_table.int().contiguous(),
        "request_indices": request_indices.long().contiguous(),
        "positions": positions.long().contiguous(),
        "slot_mapping": slot_mapping.long().contiguous(),
        "weight": weight.float().contiguous(),
        "cos_sin_cache": cos_sin_cache.float().contiguous(),
        "kv_cache": kv_cache,
    }
    tensors = aligned(tensors, in_place=("state_cache", "kv_cache"))
    pointers = tuple(t.data_ptr() for t in tensors.values())
    table = tensors["block_table"]
    sizes = (
        tokens,
        state_cache.shape[0] * state_cache.shape[1],
        table.numel(),
        table.stride(0),
        state_cache.shape[1],
        cos_sin_cache.shape[0],
        kv_cache.numel(),
        block_size,
    )
    return KernelLaunch(
        config=config,
        param_types=PARAM_TYPES,
        grid=(config.grid(tokens), 1, 1),
        block=(config.threads, 1, 1),
        arguments=(*pointers, *sizes, float(eps)),
        keep_alive=tuple(tensors.values()),
    )


@functools.cache
def _load(device: int, ratio: int):
    """Load the module into the device's context (torch's primary one) and look up the kernel."""
    return load_kernel(device, kernel_ptx(ratio), PARAM_TYPES, StateLaunchConfig(ratio).threads)


def compress_state_store_cutedsl(
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
    """The CuTe DSL backend (CUDA only); writes and returns ``kv_cache``."""
    if not state_cache.is_cuda:
        raise ValueError("the CuTe DSL backend runs on CUDA tensors only; use backend='torch' or 'triton' here")
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    device = state_cache.device.index if state_cache.device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(device):
        launch = plan_launch(*arguments, ratio, eps)
        if launch is not None:
            launch_kernel(_load(device, ratio), launch, torch.cuda.current_stream(device).cuda_stream)
    return kv_cache
