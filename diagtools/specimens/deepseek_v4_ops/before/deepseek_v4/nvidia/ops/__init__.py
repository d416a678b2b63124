"""NVIDIA kernels for DeepSeek-V4."""

from .sparse_attn_compress_cutedsl import sparse_attn_compress
from .dequant_gather_k_cutedsl import dequantize_and_gather_k_cache_cutedsl

__all__ = ["dequantize_and_gather_k_cache_cutedsl", "sparse_attn_compress"]
