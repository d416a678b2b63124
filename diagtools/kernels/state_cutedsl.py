"""compress_state_store in the CuTe DSL (nvidia-cutlass-dsl), launched through the CUDA driver API.

Which tokens are launched.  Only working tokens (on a boundary, with a slot): their indices are
compacted (:func:`plan_launch`), so no CTA is launched for the tokens in between; a real C128
prefill has one working token in 128.  By default the host compacts them once per batch (one
``nonzero`` on the device, whose count sets the grid, so the host waits for it once).  A
graph-safe plan (``max_working``, say :func:`working_bound` from the batch's shapes) sets the grid
from that bound and compacts on the device before each launch, into buffers of fixed address, so
a CUDA graph that captures :func:`launch_planned` replays it across decode steps as vLLM does; the
CTAs past the working tokens find an inert token and stop.  Either plan can be launched many
times (every layer of a step): :func:`launch_planned`.

Layout of the work.  Each lane owns 16 of the 512 features as four 4-feature quarters,
``128 k + 4 lane + j`` (``k, j`` in 0..3), so each warp-wide 128-bit load of a state-row part (kv
or score), of the weight, and each shared-memory access of the C128 merge reads or writes 512
contiguous bytes: coalesced loads, no shared-memory bank conflicts.  A token's window is split
over ``splits`` warps:

- C4 (window 8): one warp per token, four tokens per CTA of 128 threads;
- C128 (window 128): eight warps per token (16 rows each), one token per CTA of 256 threads;
  the warps' partial softmax states (running maximum, denominator and weighted sum per feature)
  are merged through 48 KB of shared memory, then the first warp finishes the token.
- C128 split (:func:`split_windows`: fewer working tokens than the GPU has multiprocessors, as in a
  decode step, where one CTA a token would leave most of them idle): each window across
  :data:`PIECES` CTAs of four warps (two rows each); a piece's warps merge through 24 KB of shared
  memory and its first warp stores the piece's partial state to a global buffer; a second launch on
  the same stream (``finish``, one warp a token) merges the pieces' states as the unsplit kernel
  merges its warps', and finishes the token.  The two launches are ordered by the stream, so no
  CTA waits on another.

A warp reads its window two rows at a time and keeps an online softmax per feature (one
rescale per two rows).  The C4 window's rows at negative positions (the first group of a
request) read row 0 and take a score of -3e38, so they weigh nothing.

The finish, on one warp: RMSNorm (the sum of squares by a butterfly shuffle), the ``fp8_ds_mla``
store as vLLM does it and RoPE.  Quarter ``k`` of lanes 0-15 is FP8 tile ``2 k`` and of lanes 16-31
tile ``2 k + 1``, except lanes 16-31's last quarter, the 64 RoPE features.  Per tile: the values
rounded to bf16, the tile maximum by a butterfly over its 16 lanes, floored at 1e-4, the
power-of-two scale exact from the exponent bits, 4 FP8 bytes a lane (128 contiguous bytes a
warp store); lanes 0 and 16 write the UE8M0 bytes and the zero padding byte.  Lanes 16-31 rotate
their two RoPE pairs at ``(p // R) * R`` and store 4 bf16 values each.

The launch.  The kernel takes raw global pointers and explicit 64-bit sizes, so nothing about
the tensors is baked into the compiled code; the grid comes from the number of working tokens
(:meth:`StateLaunchConfig.grid`) and the kernel is launched with ``cuLaunchKernel`` on torch's
current stream.  The PTX for sm_90a of both compressors ships in ``ptx/``, so a GPU machine
without nvidia-cutlass-dsl runs this exact kernel.  Compiling needs no GPU: set
``CUTE_DSL_ARCH=sm_90a``.  The 8-byte bf16 stores need the cache's blocks to start on 16-byte
boundaries: an even ``block_size`` (vLLM's is 64).
"""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.cuda_launch import (
    ARCH,
    PTX_DIR,
    KernelLaunch,
    LoadedKernel,
    aligned,
    compile_to_ptx,
    compiled_or_shipped,
    cuda_device_of,
    gmem_pointer,
    launch_kernel,
    load_kernel,
    require_aligned,
)
from diagtools.kernels.state import DATA_BYTES, HEAD_DIM, SCALE_BYTES, StateLayout, layout_for
from diagtools.kernels.state_reference import boundary_tokens, check_state_inputs

__all__ = [
    "PARAM_TYPES",
    "PIECES",
    "PREBUILT",
    "StateLaunchConfig",
    "compile_ptx",
    "compress_state_store_cutedsl",
    "kernel_ptx",
    "launch_planned",
    "overflowed",
    "plan_launch",
    "prebuilt_path",
    "split_windows",
    "working_bound",
]

ELEMENTS = 16  # features per lane: 512 / 32
QUARTER = 4  # features per 128-bit vector: a lane's quarters are 128 features apart
QUARTERS = ELEMENTS // QUARTER
LANES = HEAD_DIM // ELEMENTS
SPAN = LANES * QUARTER  # features one warp-wide vector covers: 128
CHUNK = 2  # window rows per online-softmax step
HALF_LANES = LANES // 2  # lanes per FP8 tile within a quarter
MISSING_SCORE = -3.0e38  # finite: a row that does not exist weighs exp(-3e38 - m) = 0
TOKEN_BYTES = DATA_BYTES + SCALE_BYTES
AMAX_FLOOR = 1e-4  # a tile's maximum is floored here before its scale is taken, as in vLLM
E4M3_MAX = 448.0
PREBUILT = ((4, "whole"), (128, "whole"), (128, "partial"), (128, "finish"))  # the (ratio, stage) PTX in ptx/


STAGES = ("whole", "partial", "finish")
PIECES = 16  # CTAs a C128 window is split across when it is split: 8 rows each, 2 a warp
MERGE_GROUP = 8  # partial states whose denominators and sums a merge loads at once


@dataclass(frozen=True)
class StateLaunchConfig:
    """Per compressor and stage: how a token's window is shared among warps and CTAs, and the CTA shape.

    ``whole``: a token's window in one CTA (C4: four tokens a CTA; C128: eight warps on one token).
    ``partial`` and ``finish`` split a C128 window across :data:`PIECES` CTAs: each ``partial`` CTA merges
    its 8 rows into a partial softmax state in global memory, then a ``finish`` warp per token merges the
    pieces and stores the token, as the whole kernel's first warp does."""

    ratio: int
    stage: str = "whole"

    def __post_init__(self) -> None:
        layout_for(self.ratio)  # ValueError for a ratio that is no compressor's
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.stage != "whole" and self.layout.window <= 8:
            raise ValueError(f"only a C128 window is split across CTAs, not ratio {self.ratio}'s")

    @property
    def layout(self) -> StateLayout:
        return layout_for(self.ratio)

    @property
    def pieces(self) -> int:
        """CTAs that share one token's window: :data:`PIECES` for ``partial``, else one."""
        return PIECES if self.stage == "partial" else 1

    @property
    def splits(self) -> int:
        """Warps that share a token's rows within a CTA: one for C4's 8 rows (and for ``finish``, which reads
        no rows), eight (16 rows each) for a whole C128 window, four (2 rows each) for a ``partial`` piece."""
        if self.stage == "finish" or self.layout.window <= 8:
            return 1
        return 4 if self.stage == "partial" else 8

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
        return 0 if self.stage == "finish" else self.layout.window // (self.pieces * self.splits)

    @property
    def shared_floats(self) -> int:
        """Shared memory for merging the splits: maximum, denominator and sum per feature and warp."""
        return 0 if self.splits == 1 else 3 * self.warps * HEAD_DIM

    @property
    def partial_floats(self) -> int:
        """Global memory per working token for the pieces' partial states (maximum, denominator, sum)."""
        return 0 if self.stage == "whole" else 3 * PIECES * HEAD_DIM

    def grid(self, working: int) -> int:
        """CTAs to launch for ``working`` compacted tokens: every CTA but the last is full."""
        if self.pieces > 1:
            return max(1, working * self.pieces)
        return max(1, math.ceil(working / self.tokens_per_cta))

    def token_of(self, cta: int, warp: int) -> tuple[int, int]:
        """The ``(working-token index, row slice)`` a warp of a CTA works on (slice ``s`` holds the window's
        rows ``s * rows_per_warp ..``): the kernel's own arithmetic."""
        if self.pieces > 1:
            return cta // self.pieces, (cta % self.pieces) * self.splits + warp % self.splits
        return cta * self.tokens_per_cta + warp // self.splits, warp % self.splits


def split_windows(ratio: int, working: int, multiprocessors: int | None) -> bool:
    """Whether a batch's windows are split across CTAs: C128 only, when its working tokens (one CTA each
    unsplit) are fewer than the GPU's multiprocessors, so that most of them would idle."""
    return multiprocessors is not None and layout_for(ratio).window > 8 and working < multiprocessors


# ----------------------------------------------------------------------------- the kernel

# The kernel's parameters, in order: 10 pointers, 9 sizes, eps.
POINTERS = ("state", "table", "requests", "positions", "slots", "weight", "cos_sin", "out", "work", "partials")
SIZES = (
    "tokens",
    "working",
    "state_rows",
    "table_entries",
    "table_stride",
    "state_block",
    "max_pos",
    "cache_bytes",
    "block_size",
)


@functools.cache
def _define_kernel():  # noqa: PLR0915 - the device code is defined inside, where cutlass is imported
    """The device code and its host function (needs nvidia-cutlass-dsl, imported only here)."""
    import cutlass
    from cutlass import cute

    f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64

    def quarter(tensor, k):
        """A lane's quarter ``k`` (4 features) of a 16-feature register tensor."""
        return cute.local_tile(tensor, (QUARTER,), (k,))

    def stored_state(shared, partials, index, kind, source, at, finish):
        """Quarter ``at`` of one partial softmax state (``kind`` 0: maximum, 1: denominator, 2: sum): of warp
        ``source`` in shared memory, or, in the finish stage, of piece ``source`` of token ``index`` in global."""
        if cutlass.const_expr(finish):
            row = (index * PIECES + source) * 3 + kind
            return cute.local_tile(partials, (QUARTER,), (row * (HEAD_DIM // QUARTER) + at,))
        return cute.local_tile(shared[kind, source, None], (QUARTER,), (at,))

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
        work_ptr: cute.Pointer,
        partials_ptr: cute.Pointer,
        tokens: cutlass.Int64,
        working: cutlass.Int64,
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
        pieces: cutlass.Constexpr,
        finish: cutlass.Constexpr,
    ):
        row_vectors = 2 * width // QUARTER  # 4-float vectors in one state row
        rows_per_warp = 0 if cutlass.const_expr(finish) else window // (pieces * splits)
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        cta = cute.arch.block_idx()[0]
        piece = cta % pieces  # 0 unless the window is split across CTAs
        if cutlass.const_expr(pieces > 1):
            index = i64(cta // pieces)
        else:
            index = i64(cta) * (warps // splits) + i64(warp // splits)
        split = warp % splits
        sources = PIECES if cutlass.const_expr(finish) else splits  # the partial states merged

        state = cute.make_tensor(state_ptr, cute.make_layout(state_rows * 2 * width))
        table = cute.make_tensor(table_ptr, cute.make_layout(table_entries))
        requests = cute.make_tensor(requests_ptr, cute.make_layout(tokens))
        positions = cute.make_tensor(positions_ptr, cute.make_layout(tokens))
        slots = cute.make_tensor(slots_ptr, cute.make_layout(tokens))
        work = cute.make_tensor(work_ptr, cute.make_layout(working))
        weight = cute.make_tensor(weight_ptr, cute.make_layout(HEAD_DIM))
        cos_sin = cute.make_tensor(cos_sin_ptr, cute.make_layout(max_pos * ROPE_DIM))
        out = cute.make_tensor(out_ptr, cute.make_layout(cache_bytes))
        partials = None
        if cutlass.const_expr(pieces > 1 or finish):
            partials = cute.make_tensor(partials_ptr, cute.make_layout(working * (3 * PIECES * HEAD_DIM)))
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
        maxima = cute.make_rmem_tensor((PIECES * QUARTER,), f32)  # the merge: a quarter of every state's maximum
        sums = cute.make_rmem_tensor((2 * MERGE_GROUP * QUARTER,), f32)  # and of a group's denominators and sums
        angles = cute.make_rmem_tensor((QUARTER,), f32)  # two cosines, then two sines
        tail = cute.make_rmem_tensor((QUARTER,), cutlass.BFloat16)
        fp8 = cute.make_rmem_tensor((QUARTER,), cutlass.Float8E4M3FN)
        rounded = cute.make_rmem_tensor((ELEMENTS,), f32)
        scaled = cute.make_rmem_tensor((QUARTER,), f32)

        # the working token (compacted on the host), then its position, slot and request side by side
        position = i64(0)
        slot = i64(-1)
        request = i64(0)
        if index < working:
            token = i64(work[index])
            position = i64(positions[token])
            slot = i64(slots[token])
            request = i64(requests[token])
        # the same for every warp of a token, so for the whole CTA when splits > 1 (barriers are safe)
        if slot >= 0:
            table_row = request * table_stride
            rows_per_block = i32(state_block)  # positions fit in 32 bits: cheap divisions
            last = i32(position)
            for e in cutlass.range_constexpr(ELEMENTS):
                top[e] = f32(MISSING_SCORE)
                denominator[e] = f32(0.0)
                total[e] = f32(0.0)
            for step in cutlass.range_constexpr(rows_per_warp // CHUNK):
                valid = []
                for j in cutlass.range_constexpr(CHUNK):
                    local = step * CHUNK + j
                    q = last - (window - 1) + (piece * splits + split) * rows_per_warp + local
                    exists = q >= 0
                    q = cutlass.max(q, i32(0))
                    block = i64(table[table_row + i64(q // rows_per_block)])
                    row = block * state_block + i64(q % rows_per_block)
                    # C4: the previous group's rows read the first D columns of each half, the
                    # current group's the last D (splits is 1 there, so `local` is the window row)
                    part = (width - HEAD_DIM) // QUARTER if local >= window - ratio else 0
                    first = row * row_vectors + part + lane
                    for k in cutlass.range_constexpr(QUARTERS):  # each: 512 contiguous bytes a warp
                        row_at = first + k * (SPAN // QUARTER)
                        cute.autovec_copy(cute.local_tile(state, (QUARTER,), (row_at,)), quarter(kv[j, None], k))
                        source = cute.local_tile(state, (QUARTER,), (row_at + width // QUARTER,))
                        cute.autovec_copy(source, quarter(score[j, None], k))
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
                for k in cutlass.range_constexpr(QUARTERS):  # 512 contiguous bytes a warp: no bank conflicts
                    at = k * LANES + lane
                    for kind, source in enumerate((top, denominator, total)):
                        target = cute.local_tile(shared[kind, warp, None], (QUARTER,), (at,))
                        cute.autovec_copy(quarter(source, k), target)
                cute.arch.sync_threads()

            at = lane  # a lane's first quarter in a warp-wide state access (reassigned per quarter)
            if split == 0:  # the first warp of the token (of the piece, when split) finishes it
                if cutlass.const_expr(sources > 1):  # only the finishing warp merges the states, a quarter at a time
                    for k in cutlass.range_constexpr(QUARTERS):
                        at = k * LANES + lane
                        for s in cutlass.range_constexpr(sources):  # every state's maximum, the loads all in flight
                            maximum = cute.local_tile(maxima, (QUARTER,), (s,))
                            cute.autovec_copy(stored_state(shared, partials, index, 0, s, at, finish), maximum)
                        best = quarter(top, k)
                        merged_d = quarter(denominator, k)
                        merged_t = quarter(total, k)
                        for j in cutlass.range_constexpr(QUARTER):
                            best[j] = maxima[j]
                            for s in cutlass.range_constexpr(1, sources):
                                best[j] = cute.arch.fmax(best[j], maxima[s * QUARTER + j])
                            merged_d[j] = f32(0.0)
                            merged_t[j] = f32(0.0)
                        for group in cutlass.range_constexpr(0, sources, MERGE_GROUP):  # denominators and sums
                            for s in cutlass.range_constexpr(group, min(group + MERGE_GROUP, sources)):
                                for kind in cutlass.range_constexpr(1, 3):
                                    into = cute.local_tile(sums, (QUARTER,), (2 * (s - group) + kind - 1,))
                                    cute.autovec_copy(stored_state(shared, partials, index, kind, s, at, finish), into)
                            for s in cutlass.range_constexpr(group, min(group + MERGE_GROUP, sources)):
                                for j in cutlass.range_constexpr(QUARTER):
                                    factor = cute.math.exp(maxima[s * QUARTER + j] - best[j], fastmath=True)
                                    held = 2 * (s - group) * QUARTER + j
                                    merged_d[j] = merged_d[j] + sums[held] * factor
                                    merged_t[j] = merged_t[j] + sums[held + QUARTER] * factor
                if cutlass.const_expr(pieces > 1):  # a piece: its merged state, for the finish stage
                    for k in cutlass.range_constexpr(QUARTERS):  # 512 contiguous bytes a warp
                        at = k * LANES + lane
                        for kind, source in enumerate((top, denominator, total)):
                            row = (index * PIECES + piece) * 3 + kind
                            piece_state = cute.local_tile(partials, (QUARTER,), (row * (HEAD_DIM // QUARTER) + at,))
                            cute.autovec_copy(quarter(source, k), piece_state)
                else:
                    squares = f32(0.0)
                    for e in cutlass.range_constexpr(ELEMENTS):
                        y[e] = total[e] * cute.arch.rcp_approx(denominator[e])
                        squares = squares + y[e] * y[e]
                    for offset in (16, 8, 4, 2, 1):
                        squares = squares + cute.arch.shuffle_sync_bfly(squares, offset=offset)
                    inverse_rms = cute.math.rsqrt(squares * (1.0 / HEAD_DIM) + eps, fastmath=True)
                    for k in cutlass.range_constexpr(QUARTERS):
                        cute.autovec_copy(cute.local_tile(weight, (QUARTER,), (k * LANES + lane,)), quarter(w, k))
                    for e in cutlass.range_constexpr(ELEMENTS):
                        y[e] = y[e] * inverse_rms * w[e]

                    slot_in_cache = i32(slot)  # fewer than 2**31 slots fit in any GPU's memory
                    tokens_per_block = i32(block_size)
                    block_start = i64(slot_in_cache // tokens_per_block) * (block_size * TOKEN_BYTES)
                    cache_row = i64(slot_in_cache % tokens_per_block)
                    data_at = block_start + cache_row * DATA_BYTES
                    scales_at = block_start + block_size * DATA_BYTES + cache_row * SCALE_BYTES
                    high = lane // HALF_LANES  # 0 for lanes 0-15 (even tiles), 1 for lanes 16-31 (odd tiles, RoPE)

                    # each tile's scale, from the values rounded to bf16 (the RoPE quarter joins the shuffles only)
                    rounded.store(y.load().to(cutlass.BFloat16).to(f32))
                    for k in cutlass.range_constexpr(QUARTERS):
                        amax = f32(0.0)
                        for j in cutlass.range_constexpr(QUARTER):
                            amax = cute.arch.fmax(amax, cute.math.absf(rounded[k * QUARTER + j]))
                        for offset in (8, 4, 2, 1):  # within the 16 lanes of the tile
                            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
                        amax = cute.arch.fmax(amax, f32(AMAX_FLOOR))
                        # ceil(log2(amax / 448)) from the bits of a normal positive float, and 2**-exponent
                        exponent = ((amax * (1.0 / E4M3_MAX)).bitcast(i32) + 0x7FFFFF) >> 23
                        exponent = exponent - 127
                        inverse_scale = ((127 - exponent) << 23).bitcast(f32)
                        fp8_lane = True if cutlass.const_expr(k < QUARTERS - 1) else high == 0
                        if fp8_lane:
                            for j in cutlass.range_constexpr(QUARTER):
                                value = rounded[k * QUARTER + j] * inverse_scale
                                scaled[j] = cute.arch.fmin(cute.arch.fmax(value, f32(-E4M3_MAX)), f32(E4M3_MAX))
                            fp8.store(scaled.load().to(cutlass.Float8E4M3FN))
                            fp8_at = (data_at + k * SPAN) // QUARTER + lane  # 128 contiguous bytes a warp
                            cute.autovec_copy(fp8, cute.local_tile(out_fp8, (QUARTER,), (fp8_at,)))
                            if lane % HALF_LANES == 0:
                                out[scales_at + 2 * k + high] = cutlass.Uint8(exponent + 127)
                    if lane == HALF_LANES:
                        out[scales_at + SCALE_BYTES - 1] = cutlass.Uint8(0)  # the padding byte
                    if high == 1:
                        # RoPE at (p // R) * R: this lane's pairs i and i + 1 take cosines i, i + 1 and their sines
                        pair = 2 * (lane - HALF_LANES)
                        angle_row = (position // ratio * ratio) * ROPE_DIM
                        cosines = (angle_row + pair) // 2
                        cosine_pair = cute.local_tile(cos_sin, (2,), (cosines,))
                        cute.autovec_copy(cosine_pair, cute.local_tile(angles, (2,), (0,)))
                        sines = (angle_row + ROPE_DIM // 2 + pair) // 2
                        sine_pair = cute.local_tile(cos_sin, (2,), (sines,))
                        cute.autovec_copy(sine_pair, cute.local_tile(angles, (2,), (1,)))
                        last_quarter = (QUARTERS - 1) * QUARTER
                        for i in cutlass.range_constexpr(2):
                            even, odd = y[last_quarter + 2 * i], y[last_quarter + 2 * i + 1]
                            y[last_quarter + 2 * i] = even * angles[i] - odd * angles[2 + i]
                            y[last_quarter + 2 * i + 1] = even * angles[2 + i] + odd * angles[i]
                        tail.store(quarter(y, QUARTERS - 1).load().to(cutlass.BFloat16))
                        # in 4-value bf16 tiles
                        tail_at = (data_at + (HEAD_DIM - ROPE_DIM)) // (2 * QUARTER) + lane - HALF_LANES
                        cute.autovec_copy(tail, cute.local_tile(out_bf16, (QUARTER,), (tail_at,)))

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
        work_ptr: cute.Pointer,
        partials_ptr: cute.Pointer,
        tokens: cutlass.Int64,
        working: cutlass.Int64,
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
        pieces: cutlass.Constexpr,
        finish: cutlass.Constexpr,
    ):
        kernel(
            state_ptr, table_ptr, requests_ptr, positions_ptr, slots_ptr, weight_ptr, cos_sin_ptr, out_ptr, work_ptr,
            partials_ptr, tokens, working, state_rows, table_entries, table_stride, state_block, max_pos, cache_bytes,
            block_size, eps, ratio, window, width, splits, warps, pieces, finish,
        ).launch(grid=[ctas, 1, 1], block=[warps * 32, 1, 1])  # fmt: skip

    return host


# ----------------------------------------------------------------------------- compile

PARAM_TYPES = ("u64",) * len(POINTERS) + ("u64",) * len(SIZES) + ("f32",)


def compile_ptx(ratio: int, dump_dir: str | Path, *, stage: str = "whole", arch: str = ARCH) -> str:
    """Compile one stage with nvidia-cutlass-dsl for ``arch`` (no GPU needed) and return the PTX text."""
    import cutlass

    config = StateLaunchConfig(ratio, stage)
    layout = config.layout
    f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
    # state, table, requests, positions, slots, weight, cos/sin, the fp8_ds_mla cache, working tokens, partials
    pointers = (f32, i32, i64, i64, i64, f32, f32, cutlass.Uint8, i32, f32)
    arguments = (
        *(gmem_pointer(dtype) for dtype in pointers),
        *(i64(1) for _ in SIZES),
        f32(1e-6),
        i32(1),
        layout.ratio,
        layout.window,
        layout.width,
        config.splits,
        config.warps,
        config.pieces,
        int(stage == "finish"),
    )
    return compile_to_ptx(_define_kernel(), arguments, dump_dir, arch)


def prebuilt_path(ratio: int, stage: str = "whole") -> Path:
    suffix = "" if stage == "whole" else f"_{stage}"
    return PTX_DIR / f"compress_state_store_c{ratio}{suffix}.{ARCH}.ptx"


@functools.cache
def kernel_ptx(ratio: int, stage: str = "whole") -> str:
    """The PTX to load: compiled here when nvidia-cutlass-dsl is importable, else the shipped copy."""
    StateLaunchConfig(ratio, stage)
    return compiled_or_shipped(
        prebuilt_path(ratio, stage),
        lambda folder, arch: compile_ptx(ratio, folder, stage=stage, arch=arch),
        f"no compiled kernel for ratio {ratio} ({stage})",
    )


# ----------------------------------------------------------------------------- launch


def working_tokens(positions, slot_mapping, ratio: int):
    """The indices (int32, in token order) of the tokens that do work: on a boundary, with a slot.
    One ``nonzero`` on the tensors' device; reading its length waits for the device once."""
    return torch.nonzero(boundary_tokens(positions, ratio) & (slot_mapping >= 0)).flatten().int()


def working_bound(tokens: int, ratio: int, requests: int) -> int:
    """The most tokens of a batch that can work, from its shapes alone, when each request's tokens sit at
    consecutive positions (as vLLM schedules them): one boundary in ``ratio`` positions, plus one a request."""
    return max(1, min(tokens, tokens // ratio + requests))


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
    *,
    max_working: int | None = None,
    multiprocessors: int | None = None,
) -> KernelLaunch | None:
    """Validate and convert the inputs, and compute the grid and arguments (``None``: nothing to launch).

    By default the working tokens are compacted once (one ``nonzero``, whose count the host waits for), and
    the plan holds for as long as the index tensors and the slots stay as they are.  With ``max_working``
    (say :func:`working_bound`) the plan is graph-safe: its grid comes from that bound, and the compaction
    runs on the device before each launch (``prepare``: the caller's token tables copied into static
    buffers, then a fixed-size ``nonzero_static`` whose unused entries name an inert token with no slot),
    so a CUDA graph that captures :func:`launch_planned` replays it with whatever the tensors hold then.
    A batch with more working tokens than the bound is flagged on the device (``overflow`` in
    :func:`plan_launch`'s ``keep_alive``; :func:`overflowed` reads it), never silently cut.

    ``multiprocessors`` (the GPU's, as :func:`compress_state_store_cutedsl` passes) lets a C128 batch with
    fewer working tokens (or a smaller bound) than that split each window across :data:`PIECES` CTAs
    (:func:`split_windows`): the plan is then two launches on one stream, ``partial`` and, in its ``then``,
    ``finish``, with the pieces' states in a buffer of the plan's own; without it, one CTA takes a window."""
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    tokens, _layout, block_size = check_state_inputs(*arguments, ratio)
    if block_size % 2:
        raise ValueError(
            f"the CuTe DSL backend stores 128-bit vectors, so the cache's block_size must be even, got {block_size}"
        )
    require_aligned(state_cache=state_cache, kv_cache=kv_cache)
    if tokens == 0:
        return None
    if max_working is None:
        work = working_tokens(positions, slot_mapping, ratio)
        if work.numel() == 0:
            return None
        split = split_windows(ratio, work.numel(), multiprocessors)
        tensors = {**_converted(*arguments, work=work), "partials": _partials(work.numel(), split, work.device)}
        return _launch(tensors, tokens, work.numel(), ratio, eps, block_size, split=split)
    bound = max(1, max_working)
    split = split_windows(ratio, bound, multiprocessors)
    return _graph_safe_launch(arguments, tokens, bound, ratio, eps, block_size, split=split)


def _partials(working: int, split: bool, device) -> torch.Tensor:
    """The pieces' partial softmax states of a split plan (unused, and empty, otherwise)."""
    floats = working * 3 * PIECES * HEAD_DIM if split else 0
    return torch.empty(floats, dtype=torch.float32, device=device)


def _converted(state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache, *,
               work) -> dict[str, torch.Tensor]:  # fmt: skip
    tensors = {
        "state_cache": state_cache,
        "block_table": block_table.int().contiguous(),
        "request_indices": request_indices.long().contiguous(),
        "positions": positions.long().contiguous(),
        "slot_mapping": slot_mapping.long().contiguous(),
        "weight": weight.float().contiguous(),
        "cos_sin_cache": cos_sin_cache.float().contiguous(),
        "kv_cache": kv_cache,
        "work": work,
    }
    return aligned(tensors, in_place=("state_cache", "kv_cache"))


def _graph_safe_launch(arguments, tokens: int, bound: int, ratio: int, eps: float, block_size: int, *,
                       split: bool) -> KernelLaunch:  # fmt: skip
    """The plan whose every buffer has a fixed address and whose every value is computed on the device."""
    state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache = arguments
    device = positions.device
    refreshes: list[tuple[torch.Tensor, torch.Tensor]] = []

    def static(source: torch.Tensor, dtype: torch.dtype, inert: int | None = None) -> torch.Tensor:
        """A buffer the kernel reads, refreshed from ``source`` before each launch (a token table gets one
        inert token appended, ``inert`` in it)."""
        extra = 0 if inert is None else 1
        buffer = torch.full((source.shape[0] + extra, *source.shape[1:]), inert or 0, dtype=dtype, device=device)
        refreshes.append((buffer[: source.shape[0]], source))
        return buffer

    tensors = {
        "state_cache": state_cache,
        "block_table": static(block_table, torch.int32),
        "request_indices": static(request_indices, torch.int64, inert=0),
        "positions": static(positions, torch.int64, inert=0),
        "slot_mapping": static(slot_mapping, torch.int64, inert=-1),
        "weight": static(weight, torch.float32),
        "cos_sin_cache": static(cos_sin_cache, torch.float32),
        "kv_cache": kv_cache,
        "work": torch.full((bound,), tokens, dtype=torch.int32, device=device),
        "partials": _partials(bound, split, device),
    }
    require_aligned(**tensors)  # fresh allocations: aligned; in place: checked above
    overflow = torch.zeros((), dtype=torch.bool, device=device)
    work = tensors["work"]

    def prepare() -> None:
        for buffer, source in refreshes:
            buffer.copy_(source)
        working = boundary_tokens(positions, ratio) & (slot_mapping >= 0)
        work.copy_(torch.nonzero_static(working, size=bound, fill_value=tokens).flatten())
        overflow.copy_(working.sum() > bound)

    prepare()
    launch = _launch(tensors, tokens + 1, bound, ratio, eps, block_size, prepare=prepare, split=split)
    return replace(launch, keep_alive=(*launch.keep_alive, overflow))


def overflowed(launch: KernelLaunch) -> bool:
    """Whether the last prepared batch of a graph-safe plan had more working tokens than its bound (their
    rows were not written): reading it waits for the device."""
    return launch.prepare is not None and bool(launch.keep_alive[-1])


def _launch(tensors: dict[str, torch.Tensor], tokens: int, working: int, ratio: int, eps: float, block_size: int,
            prepare: Callable[[], object] | None = None, split: bool = False) -> KernelLaunch:  # fmt: skip
    """The launch of the whole kernel, or of the partial stage with the finish stage as its ``then``."""
    pointers = tuple(t.data_ptr() for t in tensors.values())
    state_cache, table, kv_cache = tensors["state_cache"], tensors["block_table"], tensors["kv_cache"]
    sizes = (
        tokens,
        working,
        state_cache.shape[0] * state_cache.shape[1],
        table.numel(),
        table.stride(0),
        state_cache.shape[1],
        tensors["cos_sin_cache"].shape[0],
        kv_cache.numel(),
        block_size,
    )
    then = None
    for stage in ("finish", "partial") if split else ("whole",):
        config = StateLaunchConfig(ratio, stage)
        then = KernelLaunch(
            config=config,
            param_types=PARAM_TYPES,
            grid=(config.grid(working), 1, 1),
            block=(config.threads, 1, 1),
            arguments=(*pointers, *sizes, float(eps)),
            keep_alive=tuple(tensors.values()),
            prepare=prepare if stage != "finish" else None,
            then=then,
        )
    assert then is not None
    return then


@functools.cache
def _load(device: int, config: StateLaunchConfig) -> LoadedKernel:
    """Load the module into the device's context (torch's primary one) and look up the kernel."""
    return load_kernel(device, kernel_ptx(config.ratio, config.stage), PARAM_TYPES, config.threads)


def launch_planned(launch: KernelLaunch, device: int, stream: int) -> None:
    """Launch a plan from :func:`plan_launch` on ``stream`` (a raw ``cudaStream_t``), each of its stages in
    turn: no host work but packing the arguments, so it can be replayed (or captured in a CUDA graph)."""
    for stage in launch.stages():
        launch_kernel(_load(device, stage.config), stage, stream)


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
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    device = cuda_device_of(state_cache)
    with torch.cuda.device(device):
        multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
        launch = plan_launch(*arguments, ratio, eps, multiprocessors=multiprocessors)
        if launch is not None:
            launch_planned(launch, device, torch.cuda.current_stream(device).cuda_stream)
    return kv_cache
