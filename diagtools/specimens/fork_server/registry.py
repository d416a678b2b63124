"""A model registry that detects the platform when it is imported: by initializing CUDA (the bug)."""

import ctypes


def _detect():
    return ctypes.CDLL("libcuda.so.1").cuInit(0)


PLATFORM = "cuda" if _detect() == 0 else "cpu"
