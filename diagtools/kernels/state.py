"""compress_state_store: the DeepSeek-V4 compressor's boundary step, from a paged fp32 state cache to ``fp8_ds_mla``.

This is the faithful variant beside the simplified :func:`diagtools.kernels.compress_norm_rope_store`.
Head dim ``D = 512`` throughout.  Two compressors exist:

======  =====  ========  ======  ==============================================
name    ratio  window    W       state row ``[2W]``
======  =====  ========  ======  ==============================================
C4      4      8 (2R)    1024    ``kv_prev | kv_cur | score_prev | score_cur``
C128    128    128 (R)   512     ``kv | score``
======  =====  ========  ======  ==============================================

**Inputs** (``T`` tokens of a batch, all on one device):

- ``state_cache`` fp32 ``[num_state_blocks, state_block, 2W]``: one row per token position of
  each request, written earlier (by the projection, outside this operation).  The first ``W``
  columns are the kv half, the last ``W`` the score half; the score already carries the
  per-position additive bias.  The state of position ``q`` of request ``r`` is the row
  ``state_cache[block_table[r, q // state_block], q % state_block]``.  Any ``state_block`` works;
  vLLM's is 4 rows for C4 and 8 for C128 (:data:`VLLM_STATE_BLOCK`), which the random inputs use
  by default.
- ``block_table`` int32/int64 ``[num_requests, max_blocks]`` and ``request_indices`` ``[T]``
  (which request each token belongs to).
- ``positions`` ``[T]``: each token's position in its request.
- ``slot_mapping`` ``[T]``: each token's slot in the compressed cache (``block * block_size +
  row``); read only for boundary tokens; negative means skip (see the simplification below).
- ``weight`` ``[512]`` (RMSNorm), ``cos_sin_cache`` fp32 ``[max_pos, 64]`` (32 cosines, then 32 sines).
- ``kv_cache`` uint8 ``[num_blocks, block_size, 584]`` (vLLM's shape) or ``[num_blocks, block_size *
  584]``, contiguous: the ``fp8_ds_mla`` paged cache, written in place.  Either way each block is
  read as flat bytes (the layout below), not as ``block_size`` records of 584.

**Which tokens work.**  Only a boundary token, ``(p + 1) % R == 0``, with ``slot >= 0``; every
other token reads its position (and a boundary token its slot) and does nothing else.

**The window** of a boundary token at position ``p`` is the ``window`` rows of positions
``p - window + 1 .. p``, oldest first.  For C128 these are the current group's ``R`` rows and
each row uses its full ``kv`` and ``score`` halves (``W = D``).  For C4 (overlap), the window is
the previous group's ``R`` rows followed by the current group's ``R`` rows, and each half of a row
is two ``D``-wide parts: a row of the previous group contributes its *first* ``D`` columns
(``kv_prev``, ``score_prev``), a row of the current group its *last* ``D`` columns (``kv_cur``,
``score_cur``).  So every position's row is read twice over its life: its ``_cur`` parts when its
own group closes, its ``_prev`` parts when the next one does.  Rows at negative positions (the
previous group of the first group) are left out of the softmax.  In general a window row ``i``
reads columns ``[W - D, W)`` of each half when ``i >= window - R`` and ``[0, D)`` otherwise.

**Per boundary token**, in fp32 (the reference in any precision):

1. ``a = softmax(score_rows, dim=window)``: a separate softmax over the window rows for each of
   the 512 features (gated pooling); ``c = sum_rows a * kv_rows``;
2. ``y = c * rsqrt(mean(c**2) + eps) * weight`` (RMSNorm over 512);
3. interleaved (GPT-J) RoPE on ``y[448:]``, pairs ``(y[448 + 2i], y[449 + 2i])`` rotated by
   ``cos_sin_cache[(p // R) * R]``;
4. the ``fp8_ds_mla`` store at ``slot``: block ``b = slot // block_size``, row ``t = slot %
   block_size``, with the block's bytes ``K = kv_cache[b]`` seen flat; ``K[576 t : 576 t + 448]``
   holds ``y[:448]`` as FP8 e4m3 in 7 tiles of 64; ``K[576 t + 448 : 576 (t + 1)]`` holds
   ``y[448:]`` rounded once to bf16 (128 bytes); ``K[576 B + 8 t : 576 B + 8 (t + 1)]`` (``B =
   block_size``) is the token's scale record: 7 UE8M0 bytes (``scale = 2 ** (byte - 127)``), then
   a padding byte written as 0.  All the block's token data first, then its scale records; 576
   data bytes a token.  The FP8 tiles are quantized as vLLM does it: ``y[:448]`` is first rounded
   to bf16 (to nearest even); from those bf16 values, ``amax = max(max |tile|, 1e-4)``, the
   exponent ``e = ceil(log2(amax / 448))`` (the smallest power-of-two scale with ``amax / scale <=
   448``), the stored byte ``clamp(e + 127, 0, 255)``, and the values ``clamp(v / 2**e, -448, 448)``
   cast to e4m3 (to nearest even).  A tile of zeros stores zeros and scale byte 105.

**Checked against vLLM's kernel** (``_fused_kv_compress_norm_rope_insert_sparse_attn`` in its
DeepSeek-V4 ``fused_compress_quant_cache.py``): the C4 window's previous-group rows read columns
``[0, D)`` and its current-group rows ``[D, 2D)`` of each half, the score half after the kv half;
the state row of position ``q`` is at ``block_table[r, q // state_block]``, ``q % state_block``;
the block layout (576 data bytes a token, then 8 scale bytes a token, 7 UE8M0 and one pad byte
written as 0); RoPE at ``(p // R) * R``, GPT-J interleaved, the table's 32 cosines then 32 sines;
the bf16-first quantization above.  (vLLM runs that Triton kernel off NVIDIA; on NVIDIA GPUs it runs
a CuTe DSL kernel that floors ``amax / 448`` at ``1e-4`` instead of ``amax``, so there a tile with
``amax < 0.0448`` gets scale byte 114; otherwise the two quantize alike.)

**The one simplification left.**  vLLM reads two slot mappings per token: the state cache's (a
negative value marks a padding token, which is skipped) and the compressed cache's (the output
slot).  Here ``slot_mapping`` is the compressed cache's alone, and a negative value skips the
token.

The entry point is :func:`diagtools.kernels.compress_state_store`.  Backends (leaf modules,
imported only when called): ``torch`` (``state_reference.py``), ``triton`` (``state_triton.py``,
one program per token, a ``[chunk, 512]`` tile with an online softmax over the window axis) and
``cutedsl`` (``state_cutedsl.py``, CUDA only: launched over the working tokens only, a warp per
C4 token, eight warps per C128 token, warp-wide 128-bit loads of 512 contiguous bytes; it quantizes
by this contract's rule, the floor on ``amax``).  ``auto`` picks
Triton on CUDA and torch elsewhere.  This module holds the contract and its constants only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DATA_BYTES",
    "HEAD_DIM",
    "LAYOUTS",
    "SCALE_BYTES",
    "VLLM_STATE_BLOCK",
    "StateLayout",
    "layout_for",
]

HEAD_DIM = 512
DATA_BYTES = 576  # 448 FP8 bytes + 64 bf16 values
SCALE_BYTES = 8  # 7 UE8M0 scales, one padding byte (written as 0)
VLLM_STATE_BLOCK = {4: 4, 128: 8}  # vLLM's state-cache rows per block: C4 4, C128 8


@dataclass(frozen=True)
class StateLayout:
    """One compressor's shape: ratio ``R``, window rows, and ``W`` (half of a state row)."""

    ratio: int
    window: int
    width: int

    @property
    def overlap(self) -> bool:
        """Whether the window reaches into the previous group (C4)."""
        return self.window > self.ratio

    @property
    def row_floats(self) -> int:
        return 2 * self.width


LAYOUTS = {4: StateLayout(ratio=4, window=8, width=1024), 128: StateLayout(ratio=128, window=128, width=512)}


def layout_for(ratio: int) -> StateLayout:
    """The layout of the C4 or C128 compressor; ``ValueError`` for any other ratio."""
    if ratio not in LAYOUTS:
        raise ValueError(f"ratio {ratio} is not a DeepSeek-V4 compressor: use 4 (C4) or 128 (C128)")
    return LAYOUTS[ratio]
