"""NVIDIA kernels for DeepSeek-V4.

These modules import ``cutlass`` at module top level, so this package does not
re-export them: callers import the leaf module they need, where they need it.
"""
