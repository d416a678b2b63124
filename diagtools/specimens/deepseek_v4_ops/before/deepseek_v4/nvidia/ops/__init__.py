"""NVIDIA kernels for DeepSeek-V4."""

from .sparse_attn_compress_cutedsl import sparse_attn_compress

__all__ = ["sparse_attn_compress"]
