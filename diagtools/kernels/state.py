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
  ``state_cache[block_table[r, q // state_block], q % state_block]``.
- ``block_table`` int32/int64 ``[num_requests, max_blocks]`` and ``request_indices`` ``[T]``
  (which request each token belongs to).
- ``positions`` ``[T]``: each token's position in its request.
- ``slot_mapping`` ``[T]``: each token's slot in the compressed cache (``block * block_size +
  row``); read only for boundary tokens; negative means skip.
- ``weight`` ``[512]`` (RMSNorm), ``cos_sin_cache`` fp32 ``[max_pos, 64]`` (32 cosines, then 32 sines).
- ``kv_cache`` uint8 ``[num_blocks, block_size * 584]``: the ``fp8_ds_mla`` paged cache, written in place.

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
   block_size``; ``kv_cache[b, 576 t : 576 t + 448]`` holds ``y[:448]`` as FP8 e4m3 in 7 tiles of
   64, each divided by its power-of-two scale (the smallest with ``amax / scale <= 448``);
   ``kv_cache[b, 576 t + 448 : 576 (t + 1)]`` holds ``y[448:]`` as bf16 (128 bytes); the 7 scales
   are UE8M0 bytes (``scale = 2 ** (byte - 127)``) at ``kv_cache[b, 576 B + 8 t : 576 B + 8 t + 7]``
   (``B = block_size``): all the block's token data first, then its scales, 8 bytes a token (the
   eighth is padding and never written).  576 data bytes a token.

The entry point is :func:`diagtools.kernels.compress_state_store`.  Backends (leaf modules,
imported only when called): ``torch`` (``state_reference.py``) and ``triton`` (``state_triton.py``,
one program per token, a ``[chunk, 512]`` tile with an online softmax over the window axis).
``auto`` picks Triton on CUDA and torch elsewhere.  There is no CuTe DSL kernel for this variant
yet.  This module holds the contract and its constants only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DATA_BYTES",
    "HEAD_DIM",
    "LAYOUTS",
    "SCALE_BYTES",
    "StateLayout",
    "layout_for",
]

HEAD_DIM = 512
DATA_BYTES = 576  # 448 FP8 bytes + 64 bf16 values
SCALE_BYTES = 8  # 7 UE8M0 scales, one padding byte


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
