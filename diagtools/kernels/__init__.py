"""compress_norm_rope_store: gated compression, RMSNorm, RoPE and a paged bf16 store.

The operation, per group ``g`` of ``ratio`` consecutive tokens (``D`` = head
dim, ``rope_dim`` = 64):

1. ``w = softmax(score[g*ratio : (g+1)*ratio])`` (fp32 gate logits, one per token);
2. ``c = sum_j w[j] * kv[g*ratio + j]`` in fp32 (``kv`` is bf16 ``[G*ratio, D]``);
3. ``y = c * rsqrt(mean(c**2) + eps) * weight`` (RMSNorm over ``D``);
4. RoPE on the last ``rope_dim`` channels of ``y``, interleaved pairs
   ``(y[2i], y[2i+1])`` rotated by ``cos_sin_cache[positions[g]]``, whose first
   half holds the cosines and second half the sines;
5. ``kv_cache.view(-1, D)[slot_mapping[g]] = y.to(bfloat16)``, skipped where
   ``slot_mapping[g] < 0`` (padding).

This is the simplified contract.  DeepSeek-V4's compressor in vLLM differs, and
these kernels say where they follow the simplification instead: there, only
boundary tokens (``(pos+1) % R == 0``) do work, reading fp32 ``kv`` and
``score`` halves from a paged state cache (C4: an overlapping window of
``2R`` rows; C128: ``R = 128``) with a per-position score bias and a
softmax per feature; the RoPE position is ``(p // R) * R``; and the store is
``fp8_ds_mla`` (448 FP8 e4m3 dims with UE8M0 scales per 64, then 64 bf16 dims).
The dispatch rule is the same: on CUDA, head dim 512 runs the CuTe DSL kernel
and other head dims (the indexer's 128) run Triton.

The faithful variant is :func:`compress_state_store` (contract in
:mod:`diagtools.kernels.state`): boundary tokens only, a paged fp32 state cache
read as C4 (overlapping window) or C128, a softmax per feature, RoPE at
``(p // R) * R`` and the ``fp8_ds_mla`` store.

Each backend is a leaf module imported only when it is called, so importing
this package initializes nothing and imports neither torch, triton nor cutlass.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BACKENDS",
    "ROPE_DIM",
    "STATE_BACKENDS",
    "SUPPORTED_HEAD_DIMS",
    "choose_backend",
    "compress_norm_rope_store",
    "compress_state_store",
]

BACKENDS = ("torch", "triton", "cutedsl")
ROPE_DIM = 64
SUPPORTED_HEAD_DIMS = (128, 512)


def choose_backend(head_dim: int, on_cuda: bool) -> str:
    """vLLM's rule: CuTe DSL for head dim 512 on CUDA, Triton for other head dims, torch off CUDA."""
    if not on_cuda:
        return "torch"
    return "cutedsl" if head_dim == 512 else "triton"


def compress_norm_rope_store(
    kv: Any,
    score: Any,
    weight: Any,
    cos_sin_cache: Any,
    positions: Any,
    slot_mapping: Any,
    kv_cache: Any,
    *,
    ratio: int = 4,
    eps: float = 1e-6,
    backend: str = "auto",
) -> Any:
    """Compress, normalize, rotate and store; returns ``kv_cache`` (written in place).

    ``backend`` is ``auto`` (the head-dim rule above), ``torch``, ``triton`` or ``cutedsl``.
    """
    if backend == "auto":
        backend = choose_backend(int(kv.shape[-1]), bool(kv.is_cuda))
    if backend == "torch":
        from diagtools.kernels.reference import compress_norm_rope_store_reference as run
    elif backend == "triton":
        from diagtools.kernels.triton_impl import compress_norm_rope_store_triton as run
    elif backend == "cutedsl":
        from diagtools.kernels.cutedsl_impl import compress_norm_rope_store_cutedsl as run
    else:
        raise ValueError(f"unknown backend {backend!r}: use auto, {', '.join(BACKENDS)}")
    return run(kv, score, weight, cos_sin_cache, positions, slot_mapping, kv_cache, ratio=ratio, eps=eps)


STATE_BACKENDS = ("torch", "triton", "cutedsl")


def compress_state_store(
    state_cache: Any,
    block_table: Any,
    request_indices: Any,
    positions: Any,
    slot_mapping: Any,
    weight: Any,
    cos_sin_cache: Any,
    kv_cache: Any,
    *,
    ratio: int,
    eps: float = 1e-6,
    backend: str = "auto",
) -> Any:
    """The faithful variant: compress each boundary token's window from the paged state cache,
    normalize, rotate and store it as ``fp8_ds_mla``; returns ``kv_cache`` (written in place).

    The contract is in :mod:`diagtools.kernels.state`.  ``ratio`` is 4 (C4) or 128 (C128);
    ``backend`` is ``auto`` (Triton on CUDA, torch elsewhere), ``torch``, ``triton`` or
    ``cutedsl`` (CUDA only).  vLLM runs the CuTe DSL kernel on CUDA; ``auto`` keeps Triton there
    until the CuTe DSL kernel has passed ``tests/gpu/test_state_gpu.py`` on a GPU.
    """
    if backend == "auto":
        backend = "triton" if bool(state_cache.is_cuda) else "torch"
    if backend == "torch":
        from diagtools.kernels.state_reference import compress_state_store_reference as run
    elif backend == "triton":
        from diagtools.kernels.state_triton import compress_state_store_triton as run
    elif backend == "cutedsl":
        from diagtools.kernels.state_cutedsl import compress_state_store_cutedsl as run
    else:
        raise ValueError(f"unknown backend {backend!r} for compress_state_store: use auto, {', '.join(STATE_BACKENDS)}")
    arguments = (state_cache, block_table, request_indices, positions, slot_mapping, weight, cos_sin_cache, kv_cache)
    return run(*arguments, ratio=ratio, eps=eps)
