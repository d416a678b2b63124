"""Kernel registry that can run on Triton when a GPU driver is active."""

from .backend import has_gpu

__all__ = ["has_gpu"]
