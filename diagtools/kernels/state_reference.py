"""The torch reference for compress_state_store (the contract is in :mod:`diagtools.kernels.state`).

Used as the ``torch`` backend (fp32 math) and, in float64, as the yardstick the Triton kernel is
checked against.  Also: the paged ``fp8_ds_mla`` cache's writer and reader, and fresh random
inputs (a state cache whose unused rows are NaN, an output cache poisoned with ``0xFF``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from diagtools.kernels import ROPE_DIM
from diagtools.kernels.reference import (
    TILES,
    dequantize_fp8_ds_mla,
    normalize_and_rotate,
    quantize_fp8_ds_mla,
    rope_cache,
)
from diagtools.kernels.state import DATA_BYTES, HEAD_DIM, SCALE_BYTES, VLLM_STATE_BLOCK, StateLayout, layout_for

__all__ = [
    "BENCH_SIZES",
    "POISON",
    "StateInputs",
    "boundary_tokens",
    "cache_block_bytes",
    "check_state_inputs",
    "compress_state_store_reference",
    "compressed_state_rows",
    "decode_batch",
    "dequantized_cache_rows",
    "make_state_inputs",
    "min_bytes",
    "read_fp8_ds_mla_cache",
    "request_tokens",
    "write_fp8_ds_mla_cache",
]

TOKEN_BYTES = DATA_BYTES + SCALE_BYTES
POISON = 0xFF  # an FP8 NaN, a bf16 NaN and a scale of 2**128: any unwritten byte shows
_INDEX_DTYPES = (torch.int32, torch.int64)


def check_state_inputs(
    state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache, ratio: int
) -> tuple[int, StateLayout, int]:
    """Validate shapes and dtypes (``ValueError`` saying what is wrong); return ``(T, layout, block_size)``."""
    layout = layout_for(ratio)
    if state_cache.dim() != 3 or state_cache.dtype != torch.float32 or state_cache.shape[2] != layout.row_floats:
        raise ValueError(
            f"state_cache must be fp32 [num_blocks, block, {layout.row_floats}] for ratio {ratio}, "
            f"got {state_cache.dtype} {tuple(state_cache.shape)}"
        )
    if block_table.dim() != 2 or block_table.dtype not in _INDEX_DTYPES:
        raise ValueError(f"block_table must be int32/int64 [requests, blocks], got {block_table.dtype}")
    tokens = positions.shape[0] if positions.dim() == 1 else -1
    for name, index in (("request_indices", request_indices), ("positions", positions), ("slot_mapping", slot_mapping)):
        if index.dim() != 1 or index.shape[0] != tokens or index.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{name} must be an int32/int64 [T] tensor, got {index.dtype} {tuple(index.shape)}")
    if weight.shape != (HEAD_DIM,):
        raise ValueError(f"weight must be [{HEAD_DIM}], got {tuple(weight.shape)}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != ROPE_DIM or cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache must be fp32 [max_pos, {ROPE_DIM}], got {tuple(cos_sin_cache.shape)}")
    paged = kv_cache.dim() == 3 and kv_cache.shape[2] == TOKEN_BYTES  # vLLM's shape
    flat = kv_cache.dim() == 2 and kv_cache.shape[1] % TOKEN_BYTES == 0
    if kv_cache.dtype != torch.uint8 or not (paged or flat) or kv_cache.shape[1] == 0:
        raise ValueError(
            f"kv_cache must be uint8 [num_blocks, block_size, {TOKEN_BYTES}] or [num_blocks, block_size * "
            f"{TOKEN_BYTES}], got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    if not kv_cache.is_contiguous() or not state_cache.is_contiguous():
        raise ValueError("kv_cache and state_cache must be contiguous")
    tensors = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return tokens, layout, kv_cache.shape[1] if paged else kv_cache.shape[1] // TOKEN_BYTES


def cache_block_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    """The paged cache, of either accepted shape, as a ``[num_blocks, block_size * 584]`` byte view."""
    return kv_cache.view(kv_cache.shape[0], -1)


def boundary_tokens(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """Which tokens close a group: ``(p + 1) % ratio == 0``."""
    return (positions.long() + 1) % ratio == 0


def _window(state_cache, block_table, request_indices, positions, layout: StateLayout, dtype):
    """Each token's window: kv and score ``[N, window, D]`` (the columns its rows use) and which rows exist."""
    window, width = layout.window, layout.width
    steps = torch.arange(window, device=positions.device)
    q = positions.long()[:, None] - window + 1 + steps  # [N, window], oldest first
    exists = q >= 0
    q = q.clamp_min(0)
    state_block = state_cache.shape[1]
    blocks = block_table.long()[request_indices.long()[:, None], q // state_block]
    rows = state_cache[blocks, q % state_block].to(dtype)  # [N, window, 2W]
    first = torch.where(steps >= window - layout.ratio, width - HEAD_DIM, 0)  # [window]
    columns = (first[:, None] + torch.arange(HEAD_DIM, device=positions.device)).expand(q.shape[0], -1, -1)
    kv = rows.gather(2, columns).masked_fill(~exists[..., None], 0.0)
    score = rows.gather(2, columns + width).masked_fill(~exists[..., None], -math.inf)
    return kv, score


def compressed_state_rows(
    state_cache,
    block_table,
    request_indices,
    positions,
    weight,
    cos_sin_cache,
    *,
    ratio: int,
    eps: float = 1e-6,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``[N, 512]`` values the operation stores for the ``N`` given tokens (treated as boundary
    tokens), computed in ``dtype`` with no FP8 or bf16 rounding."""
    layout = layout_for(ratio)
    kv, score = _window(state_cache, block_table, request_indices, positions, layout, dtype)
    compressed = (torch.softmax(score, dim=1) * kv).sum(dim=1)  # one softmax per feature
    rope_positions = positions.long() // ratio * ratio
    return normalize_and_rotate(compressed, weight, cos_sin_cache, rope_positions, eps=eps)


def write_fp8_ds_mla_cache(kv_cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Quantize ``[N, 512]`` values and write them at ``slots`` of the paged cache: each token's 576
    data bytes and its 8-byte scale record (7 UE8M0 bytes, then the padding byte, written as 0)."""
    data, scales = quantize_fp8_ds_mla(values)
    record = torch.cat((scales, scales.new_zeros(scales.shape[0], SCALE_BYTES - TILES)), dim=1)
    blocks_bytes = cache_block_bytes(kv_cache)
    block_size = blocks_bytes.shape[1] // TOKEN_BYTES
    blocks, rows = (slots.long() // block_size)[:, None], (slots.long() % block_size)[:, None]
    device = kv_cache.device
    blocks_bytes[blocks, rows * DATA_BYTES + torch.arange(DATA_BYTES, device=device)] = data
    blocks_bytes[blocks, block_size * DATA_BYTES + rows * SCALE_BYTES + torch.arange(SCALE_BYTES, device=device)] = (
        record
    )


def read_fp8_ds_mla_cache(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(data uint8 [N, 576], scales uint8 [N, 8])`` stored at ``slots`` (scale byte 7 is padding)."""
    blocks_bytes = cache_block_bytes(kv_cache)
    block_size = blocks_bytes.shape[1] // TOKEN_BYTES
    blocks, rows = (slots.long() // block_size)[:, None], (slots.long() % block_size)[:, None]
    device = kv_cache.device
    data = blocks_bytes[blocks, rows * DATA_BYTES + torch.arange(DATA_BYTES, device=device)]
    scales = blocks_bytes[
        blocks, block_size * DATA_BYTES + rows * SCALE_BYTES + torch.arange(SCALE_BYTES, device=device)
    ]
    return data, scales


def dequantized_cache_rows(kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The ``[N, 512]`` fp32 values stored at ``slots``."""
    data, scales = read_fp8_ds_mla_cache(kv_cache, slots)
    return dequantize_fp8_ds_mla(data, scales[:, :TILES])


def compress_state_store_reference(
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
    """The operation in torch eager (fp32 math); writes and returns ``kv_cache``."""
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    check_state_inputs(*arguments, ratio)
    work = boundary_tokens(positions, ratio) & (slot_mapping >= 0)
    if bool(work.any()):
        tables = (state_cache, block_table, request_indices[work], positions[work])
        values = compressed_state_rows(*tables, weight, cos_sin_cache, ratio=ratio, eps=eps)
        write_fp8_ds_mla_cache(kv_cache, slot_mapping[work], values)
    return kv_cache


@dataclass(frozen=True)
class StateInputs:
    """One random input set for compress_state_store, the output cache poisoned."""

    state_cache: torch.Tensor
    block_table: torch.Tensor
    request_indices: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    weight: torch.Tensor
    cos_sin_cache: torch.Tensor
    kv_cache: torch.Tensor
    ratio: int
    eps: float = 1e-6  # the RMSNorm epsilon the kernel is given

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.state_cache,
            self.block_table,
            self.request_indices,
            self.positions,
            self.slot_mapping,
            self.weight,
            self.cos_sin_cache,
            self.kv_cache,
        )

    def working(self) -> torch.Tensor:
        """Which tokens must be written: boundary tokens with a slot."""
        return boundary_tokens(self.positions, self.ratio) & (self.slot_mapping >= 0)

    def expected(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The unrounded values of the working tokens, in token order."""
        work = self.working()
        tables = (self.state_cache, self.block_table, self.request_indices[work], self.positions[work])
        return compressed_state_rows(
            *tables, self.weight, self.cos_sin_cache, ratio=self.ratio, eps=self.eps, dtype=dtype
        )

    def min_bytes(self) -> int:
        """Fewest bytes the operation must move (see :func:`min_bytes`)."""
        return min_bytes(
            self.ratio,
            self.positions,
            self.slot_mapping,
            state_block=self.state_cache.shape[1],
            index_bytes=self.positions.element_size(),
            table_bytes=self.block_table.element_size(),
        )


def min_bytes(
    ratio: int,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    state_block: int,
    index_bytes: int = 8,
    table_bytes: int = 4,
) -> int:
    """Fewest bytes the operation must move: only what a kernel that skips idle tokens reads and writes.

    Every token reads its position, and a boundary token its slot.  A working token (boundary, slot
    >= 0) also reads its request index, the block-table entries its window spans, the ``D``-wide
    kv and score parts of its ``window`` rows (C4 reads half of each row: the part for its place
    in the window), one cos/sin row, and writes 576 data bytes and its 8-byte scale record (7
    scales and the zero padding byte); the weight is read once.
    """
    layout = layout_for(ratio)
    boundary = boundary_tokens(positions, ratio)
    work = boundary & (slot_mapping >= 0)
    kept = int(work.sum())
    last = positions.long()[work]
    first = (last - layout.window + 1).clamp_min(0)
    table_entries = int((last // state_block - first // state_block + 1).sum())
    reads = positions.numel() * index_bytes + int(boundary.sum()) * index_bytes
    reads += kept * index_bytes + table_entries * table_bytes
    reads += kept * (layout.window * 2 * HEAD_DIM * 4 + ROPE_DIM * 4) + HEAD_DIM * 4
    return reads + kept * (DATA_BYTES + SCALE_BYTES)


def decode_batch(requests: int, ratio: int) -> tuple[tuple[int, int], ...]:
    """A decode step: one new token for each of ``requests`` requests, at positions spread so that
    each residue mod ``ratio`` comes equally often: one request in ``ratio`` is on a boundary, as in
    a real batch.  Contexts stay short (32..63 for C4, 128..255 for C128) to keep the state small."""
    span = max(32, ratio)
    return tuple((span + r % span, 1) for r in range(requests))


# The benchmark's batches, as (ratio, requests of (context, new)), with real boundary density:
# prefills from position 0 (one token in R closes a group; the C4 one is KERNEL-NOTES' 32768-token
# prefill, the C128 one has its 256 boundary tokens) and decode steps of 1024 requests (256 C4
# boundaries, 8 C128 ones).
BENCH_SIZES = {
    "C4 decode 1024": (4, decode_batch(1024, 4)),
    "C4 prefill 32768": (4, ((0, 32768),)),
    "C128 decode 1024": (128, decode_batch(1024, 128)),
    "C128 prefill 32768": (128, ((0, 32768),)),
}


def request_tokens(requests: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ``(request_indices, positions)`` for requests given as ``(context, new)``."""
    indices = torch.cat([torch.full((new,), r, dtype=torch.int64) for r, (_, new) in enumerate(requests)])
    positions = torch.cat([torch.arange(context, context + new) for context, new in requests])
    return indices, positions


def make_state_inputs(
    ratio: int,
    requests: Sequence[tuple[int, int]],
    *,
    padding: float = 0.125,
    state_block: int | None = None,
    block_size: int = 64,
    seed: int | None = None,
    device: str | torch.device = "cpu",
) -> StateInputs:
    """Fresh random inputs for requests given as ``(context, new)``: request ``r``'s state holds
    positions ``0 .. context + new - 1`` and its batch tokens are the last ``new`` of them.

    ``state_block`` (rows per state-cache block) defaults to vLLM's: 4 for C4, 8 for C128.  State
    blocks are a random permutation; rows no request owns are NaN, so reading one shows.  Every
    token gets a distinct compressed-cache slot, about ``padding`` of them -1; non-boundary tokens
    keep real slots, so a kernel that wrote them would be caught.  The output cache has vLLM's
    shape, uint8 ``[num_blocks, block_size, 584]``, poisoned with ``0xFF``.
    """
    if state_block is None:
        state_block = VLLM_STATE_BLOCK[ratio]
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed if seed is not None else torch.seed() % (2**31))
    layout = layout_for(ratio)
    lengths = [context + new for context, new in requests]
    per_request = [math.ceil(length / state_block) for length in lengths]
    state_blocks = sum(per_request) + 1
    order = torch.randperm(state_blocks, generator=generator, device=device)
    block_table = torch.zeros(len(requests), max(per_request, default=1), dtype=torch.int32, device=device)
    state = torch.full((state_blocks, state_block, layout.row_floats), math.nan, device=device)
    taken = 0
    for r, (count, length) in enumerate(zip(per_request, lengths, strict=True)):
        block_table[r, :count] = order[taken : taken + count].int()
        taken += count
        blocks = block_table[r, :count].long()
        rows = torch.randn(count * state_block, layout.row_floats, generator=generator, device=device)
        rows[:, layout.width :] *= 2  # scores (their position bias included) spread wider than kv
        rows[length:] = math.nan
        state[blocks] = rows.view(count, state_block, -1)
    request_indices, positions = request_tokens(requests)
    tokens = positions.numel()
    cache_blocks = math.ceil(tokens * 1.25 / block_size) + 1
    slots = torch.randperm(cache_blocks * block_size, generator=generator, device=device)[:tokens]
    slots[torch.rand(tokens, generator=generator, device=device) < padding] = -1
    weight = 1 + 0.1 * torch.randn(HEAD_DIM, generator=generator, device=device)
    cache = torch.full((cache_blocks, block_size, TOKEN_BYTES), POISON, dtype=torch.uint8, device=device)
    max_pos = max(lengths, default=1) + 1
    return StateInputs(
        state,
        block_table,
        request_indices.to(device),
        positions.to(device),
        slots,
        weight,
        rope_cache(max_pos, device=device),
        cache,
        ratio=ratio,
    )
