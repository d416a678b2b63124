"""compress_norm_rope_store in the CuTe DSL (nvidia-cutlass-dsl), launched through the CUDA driver API.

Layout of the work.  A *team* of ``D / E`` lanes handles one group: each lane
owns ``E`` contiguous channels (16 at D=512, 8 at D=128), so every kv row,
the weight, the cos/sin pairs and the output row move as 128-bit vectors.  At
D=512 a team is a whole warp; at D=128 a warp holds two teams.  The sum of
squares is a butterfly shuffle inside the team: no shared memory, no barrier.
Only the last ``64 / E`` lanes of a team (the last 64 channels) load cos/sin
and rotate.

Several groups per CTA.  The grid is persistent (at most ``CTAS_PER_SM`` CTAs
of ``THREADS`` threads per multiprocessor); each warp walks the groups with a
grid stride and keeps two loads ahead: while it computes group ``g`` it has
already issued the kv rows, logits and cos/sin of the next group and the slot
and position of the one after.  Padded groups (slot < 0) read nothing but
their slot.  The weight is loaded once per warp.  All offsets are 64-bit.

The launch.  The kernel takes raw global pointers plus explicit 64-bit sizes,
so nothing about the tensors is baked into the compiled code: the grid is
computed here from the real sizes (:meth:`LaunchConfig.grid`) and the kernel
is launched with ``cuLaunchKernel`` (the driver API through ctypes) on torch's
current stream.
The compiled PTX for sm_90a at the benchmark's sizes ships beside this file
(``ptx/``), so a GPU machine without nvidia-cutlass-dsl still runs this exact
kernel; with nvidia-cutlass-dsl installed other (head dim, ratio) pairs are
compiled on first use.  Compiling needs no GPU: set ``CUTE_DSL_ARCH=sm_90a``.
"""

import functools
import math
from dataclasses import dataclass
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
)
from diagtools.kernels.reference import check_inputs

__all__ = [
    "PARAM_TYPES",
    "PREBUILT",
    "LaunchConfig",
    "compile_ptx",
    "compress_norm_rope_store_cutedsl",
    "kernel_ptx",
    "plan_launch",
    "prebuilt_path",
]

THREADS = 128
WARPS = THREADS // 32
CTAS_PER_SM = 8
PREBUILT = ((512, 4), (128, 4))  # the (head dim, ratio) pairs whose PTX ships in ptx/


# ----------------------------------------------------------------------------- launch config


@dataclass(frozen=True)
class LaunchConfig:
    """Per (head dim, ratio): channels per lane, lanes per group, groups per warp."""

    head_dim: int
    ratio: int

    @property
    def elements(self) -> int:
        """Channels per lane: two 128-bit vectors of bf16 at D=512, one at D=128."""
        return 16 if self.head_dim >= 512 else 8

    @property
    def lanes(self) -> int:
        return self.head_dim // self.elements

    @property
    def groups_per_warp(self) -> int:
        return 32 // self.lanes

    @property
    def groups_per_cta(self) -> int:
        """Groups one CTA handles per step of its loop."""
        return WARPS * self.groups_per_warp

    @property
    def rope_first_lane(self) -> int:
        return (self.head_dim - ROPE_DIM) // self.elements

    def grid(self, groups: int, multiprocessors: int, ctas_per_sm: int = CTAS_PER_SM) -> int:
        """CTAs to launch: one per ``groups_per_cta`` groups, capped at the CTAs resident at once."""
        return max(1, min(math.ceil(groups / self.groups_per_cta), multiprocessors * ctas_per_sm))

    def validate(self) -> None:
        if self.head_dim % self.elements or 32 % self.lanes or self.head_dim < ROPE_DIM:
            raise ValueError(f"head dim {self.head_dim} does not tile into 128-bit lanes")
        if ROPE_DIM % self.elements:
            raise ValueError(f"RoPE dims {ROPE_DIM} do not split over lanes of {self.elements}")


# ----------------------------------------------------------------------------- the kernel


@functools.cache
def _define_kernel():  # noqa: PLR0915 - the device code is defined inside, where cutlass is imported
    """The device code and its host function (needs nvidia-cutlass-dsl, imported only here)."""
    import cutlass
    from cutlass import cute

    @cute.kernel
    def kernel(  # noqa: PLR0912, PLR0915 - the whole device function, unrolled at compile time
        kv_ptr: cute.Pointer,
        score_ptr: cute.Pointer,
        weight_ptr: cute.Pointer,
        cos_sin_ptr: cute.Pointer,
        positions_ptr: cute.Pointer,
        slots_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        groups: cutlass.Int64,
        cache_rows: cutlass.Int64,
        max_pos: cutlass.Int64,
        eps: cutlass.Float32,
        head_dim: cutlass.Constexpr,
        ratio: cutlass.Constexpr,
        elements: cutlass.Constexpr,
        lanes: cutlass.Constexpr,
        rope_first_lane: cutlass.Constexpr,
    ):
        half = elements // 2
        lane = cute.arch.lane_idx()
        team = lane // lanes
        t = lane % lanes
        per_warp = 32 // lanes
        warp = cutlass.Int64(cute.arch.block_idx()[0]) * WARPS + cutlass.Int64(cute.arch.warp_idx())
        warp_stride = cutlass.Int64(cute.arch.grid_dim()[0]) * WARPS
        group_stride = warp_stride * per_warp
        units = (groups + per_warp - 1) // per_warp

        kv = cute.make_tensor(kv_ptr, cute.make_layout((groups * ratio, head_dim), stride=(head_dim, 1)))
        score = cute.make_tensor(score_ptr, cute.make_layout(groups * ratio))
        weight = cute.make_tensor(weight_ptr, cute.make_layout(head_dim))
        cos_sin = cute.make_tensor(cos_sin_ptr, cute.make_layout((max_pos, ROPE_DIM), stride=(ROPE_DIM, 1)))
        positions = cute.make_tensor(positions_ptr, cute.make_layout(groups))
        slots = cute.make_tensor(slots_ptr, cute.make_layout(groups))
        out = cute.make_tensor(out_ptr, cute.make_layout((cache_rows, head_dim), stride=(head_dim, 1)))

        w = cute.make_rmem_tensor((elements,), cutlass.Float32)
        cute.autovec_copy(cute.local_tile(weight, (elements,), (t,)), w)

        row_layout = cute.make_layout((ratio, elements), stride=(elements, 1))
        rows_now = cute.make_rmem_tensor(row_layout, cutlass.BFloat16)
        rows_next = cute.make_rmem_tensor(row_layout, cutlass.BFloat16)
        logits_now = cute.make_rmem_tensor((ratio,), cutlass.Float32)
        logits_next = cute.make_rmem_tensor((ratio,), cutlass.Float32)
        pair_layout = cute.make_layout((2, half), stride=(half, 1))
        table_now = cute.make_rmem_tensor(pair_layout, cutlass.Float32)
        table_next = cute.make_rmem_tensor(pair_layout, cutlass.Float32)
        y = cute.make_rmem_tensor((elements,), cutlass.Float32)
        packed = cute.make_rmem_tensor((elements,), cutlass.BFloat16)
        rope_lane = t >= rope_first_lane
        cos_tile = t - rope_first_lane
        sin_tile = t - rope_first_lane + (ROPE_DIM // 2) // half

        # the slot and position of this warp's first two groups (two loads ahead)
        g = warp * per_warp + team
        slot = cutlass.Int64(-1)
        position = cutlass.Int64(0)
        if g < groups:
            slot = slots[g]
            position = positions[g]
        # the rows, logits and cos/sin of the first group (one load ahead)
        if slot >= 0:
            for j in cutlass.range_constexpr(ratio):
                source = cute.local_tile(kv[g * ratio + j, None], (elements,), (t,))
                cute.autovec_copy(source, rows_next[j, None])
            cute.autovec_copy(cute.local_tile(score, (ratio,), (g,)), logits_next)
            if rope_lane:
                cute.autovec_copy(cute.local_tile(cos_sin[position, None], (half,), (cos_tile,)), table_next[0, None])
                cute.autovec_copy(cute.local_tile(cos_sin[position, None], (half,), (sin_tile,)), table_next[1, None])
        g_next = g + group_stride
        slot_next = cutlass.Int64(-1)
        position_next = cutlass.Int64(0)
        if g_next < groups:
            slot_next = slots[g_next]
            position_next = positions[g_next]

        trips = (units - warp + warp_stride - 1) // warp_stride  # this warp's share of the groups
        for _trip in cutlass.range(trips):
            rows_now.store(rows_next.load())
            logits_now.store(logits_next.load())
            table_now.store(table_next.load())
            slot_now = slot
            # issue the next group's loads before computing this one
            if slot_next >= 0:
                for j in cutlass.range_constexpr(ratio):
                    source = cute.local_tile(kv[g_next * ratio + j, None], (elements,), (t,))
                    cute.autovec_copy(source, rows_next[j, None])
                cute.autovec_copy(cute.local_tile(score, (ratio,), (g_next,)), logits_next)
                if rope_lane:
                    row = cos_sin[position_next, None]
                    cute.autovec_copy(cute.local_tile(row, (half,), (cos_tile,)), table_next[0, None])
                    cute.autovec_copy(cute.local_tile(row, (half,), (sin_tile,)), table_next[1, None])
            slot = slot_next
            g_next = g_next + group_stride
            slot_next = cutlass.Int64(-1)
            position_next = cutlass.Int64(0)
            if g_next < groups:
                slot_next = slots[g_next]
                position_next = positions[g_next]

            # gate softmax over the ratio logits, folded into one reciprocal
            top = logits_now[0]
            for j in cutlass.range_constexpr(1, ratio):
                top = cute.arch.fmax(top, logits_now[j])
            gates = [cute.math.exp(logits_now[j] - top, fastmath=True) for j in range(ratio)]
            denom = gates[0]
            for j in cutlass.range_constexpr(1, ratio):
                denom = denom + gates[j]
            inverse = cute.arch.rcp_approx(denom)
            squares = cutlass.Float32(0.0)
            for e in cutlass.range_constexpr(elements):
                total = cutlass.Float32(0.0)
                for j in cutlass.range_constexpr(ratio):
                    total = total + gates[j] * rows_now[j, e].to(cutlass.Float32)
                y[e] = total * inverse
                squares = squares + y[e] * y[e]
            offset = lanes // 2
            while offset >= 1:  # unrolled at compile time: lanes is a constant
                squares = squares + cute.arch.shuffle_sync_bfly(squares, offset=offset)
                offset //= 2
            scale = cute.math.rsqrt(squares * (1.0 / head_dim) + eps, fastmath=True)
            for e in cutlass.range_constexpr(elements):
                y[e] = y[e] * scale * w[e]
            if rope_lane:
                for i in cutlass.range_constexpr(half):
                    even, odd = y[2 * i], y[2 * i + 1]
                    cos, sin = table_now[0, i], table_now[1, i]
                    y[2 * i] = even * cos - odd * sin
                    y[2 * i + 1] = even * sin + odd * cos
            packed.store(y.load().to(cutlass.BFloat16))
            if slot_now >= 0:
                cute.autovec_copy(packed, cute.local_tile(out[slot_now, None], (elements,), (t,)))

    @cute.jit
    def host(
        kv_ptr: cute.Pointer,
        score_ptr: cute.Pointer,
        weight_ptr: cute.Pointer,
        cos_sin_ptr: cute.Pointer,
        positions_ptr: cute.Pointer,
        slots_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        groups: cutlass.Int64,
        cache_rows: cutlass.Int64,
        max_pos: cutlass.Int64,
        eps: cutlass.Float32,
        ctas: cutlass.Int32,
        head_dim: cutlass.Constexpr,
        ratio: cutlass.Constexpr,
        elements: cutlass.Constexpr,
        lanes: cutlass.Constexpr,
        rope_first_lane: cutlass.Constexpr,
    ):
        kernel(
            kv_ptr,
            score_ptr,
            weight_ptr,
            cos_sin_ptr,
            positions_ptr,
            slots_ptr,
            out_ptr,
            groups,
            cache_rows,
            max_pos,
            eps,
            head_dim,
            ratio,
            elements,
            lanes,
            rope_first_lane,
        ).launch(grid=[ctas, 1, 1], block=[THREADS, 1, 1])

    return host


# ----------------------------------------------------------------------------- compile


def compile_ptx(head_dim: int, ratio: int, dump_dir: str | Path, *, arch: str = ARCH) -> str:
    """Compile with nvidia-cutlass-dsl for ``arch`` (no GPU needed) and return the PTX text."""
    import cutlass

    config = LaunchConfig(head_dim, ratio)
    config.validate()
    f32, i64 = cutlass.Float32, cutlass.Int64
    pointers = (cutlass.BFloat16, f32, f32, f32, i64, i64, cutlass.BFloat16)
    arguments = (
        *(gmem_pointer(dtype) for dtype in pointers),
        *(i64(1) for _ in range(3)),
        f32(1e-6),
        cutlass.Int32(1),
        head_dim,
        ratio,
        config.elements,
        config.lanes,
        config.rope_first_lane,
    )
    return compile_to_ptx(_define_kernel(), arguments, dump_dir, arch)


def prebuilt_path(head_dim: int, ratio: int) -> Path:
    return PTX_DIR / f"compress_norm_rope_store_d{head_dim}_r{ratio}.{ARCH}.ptx"


@functools.cache
def kernel_ptx(head_dim: int, ratio: int) -> str:
    """The PTX to load: compiled here when nvidia-cutlass-dsl is importable, else the shipped copy."""
    missing = (
        f"no compiled kernel for head dim {head_dim}, ratio {ratio}: install nvidia-cutlass-dsl "
        f"to compile it, or use one of the shipped pairs {PREBUILT}"
    )
    return compiled_or_shipped(
        prebuilt_path(head_dim, ratio),
        lambda folder, arch: compile_ptx(head_dim, ratio, folder, arch=arch),
        missing,
    )


# ----------------------------------------------------------------------------- launch

# The kernel's parameters, in order, as PTX types: 7 pointers, 3 sizes, eps.
PARAM_TYPES = ("u64",) * 7 + ("u64", "u64", "u64", "f32")


def plan_launch(
    kv,
    score,
    weight,
    cos_sin_cache,
    positions,
    slot_mapping,
    kv_cache,
    ratio: int,
    eps: float,
    *,
    multiprocessors: int,
    ctas_per_sm: int = CTAS_PER_SM,
) -> KernelLaunch | None:
    """Validate and convert the inputs, and compute the grid and arguments (``None``: nothing to do)."""
    groups, head_dim = check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    config = LaunchConfig(head_dim, ratio)
    config.validate()
    if groups == 0:
        return None
    tensors = {
        "kv": kv.contiguous(),
        "score": score.contiguous(),
        "weight": weight.float().contiguous(),
        "cos_sin_cache": cos_sin_cache.float().contiguous(),
        "positions": positions.long().contiguous(),
        "slot_mapping": slot_mapping.long().contiguous(),
        "kv_cache": kv_cache,
    }
    tensors = aligned(tensors, in_place=("kv_cache",))
    pointers = tuple(t.data_ptr() for t in tensors.values())
    sizes = (groups, kv_cache.numel() // head_dim, cos_sin_cache.shape[0])
    return KernelLaunch(
        config=config,
        param_types=PARAM_TYPES,
        grid=(config.grid(groups, multiprocessors, ctas_per_sm), 1, 1),
        block=(THREADS, 1, 1),
        arguments=(*pointers, *sizes, float(eps)),
        keep_alive=tuple(tensors.values()),
    )


@functools.cache
def _load(device: int, head_dim: int, ratio: int) -> LoadedKernel:
    """Load the module into the device's context (torch's primary one) and look up the kernel."""
    kernel = load_kernel(device, kernel_ptx(head_dim, ratio), PARAM_TYPES, THREADS)
    return LoadedKernel(kernel.function, max(1, min(kernel.ctas_per_sm, CTAS_PER_SM)))


def _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio: int, eps: float) -> None:
    _, head_dim = check_inputs(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio)
    device = cuda_device_of(kv)
    with torch.cuda.device(device):
        kernel = _load(device, head_dim, ratio)
        multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
        launch = plan_launch(
            kv,
            score,
            weight,
            cos_sin_cache,
            positions,
            slot_mapping,
            kv_cache,
            ratio,
            eps,
            multiprocessors=multiprocessors,
            ctas_per_sm=kernel.ctas_per_sm,
        )
        if launch is not None:
            launch_kernel(kernel, launch, torch.cuda.current_stream(device).cuda_stream)


def compress_norm_rope_store_cutedsl(
    kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, *, ratio: int = 4, eps: float = 1e-6
) -> torch.Tensor:
    """The CuTe DSL backend (CUDA only); writes and returns ``kv_cache``."""
    _launch(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio, eps)
    return kv_cache
