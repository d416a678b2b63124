"""Loading PTX and launching a kernel through the CUDA driver API (ctypes on ``libcuda.so.1``).

Shared by the CuTe DSL kernels: they are compiled to PTX ahead of time (no GPU needed), so a
GPU machine needs neither nvidia-cutlass-dsl nor cuda-python to run them, only the driver that
torch has already loaded.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["CudaDriver", "cuda_driver", "entry_of", "pack_arguments"]

_CTYPES: dict[str, Any] = {"u64": ctypes.c_uint64, "s64": ctypes.c_int64, "u32": ctypes.c_uint32, "f32": ctypes.c_float}


def entry_of(ptx: str) -> tuple[str, list[str]]:
    """The kernel's entry name and its parameter types, read off the PTX."""
    match = re.search(r"\.visible \.entry (\w+)\(([^)]*)\)", ptx)
    if match is None:
        raise ValueError("no kernel entry in the PTX")
    params = re.findall(r"\.param \.(\w+)", match.group(2))
    return match.group(1), params


def pack_arguments(param_types: Sequence[str], values: Sequence[int | float]) -> tuple[Any, list[Any]]:
    """The ``void**`` array ``cuLaunchKernel`` reads for PTX parameters of ``param_types``, and
    the ctypes values it points to (keep both alive through the call)."""
    if len(param_types) != len(values):
        raise ValueError(f"{len(values)} values for {len(param_types)} kernel parameters")
    boxed: list[Any] = [_CTYPES[kind](value) for kind, value in zip(param_types, values, strict=True)]
    array = (ctypes.c_void_p * len(boxed))(*(ctypes.addressof(v) for v in boxed))
    return array, boxed


class CudaDriver:
    """The few CUDA driver calls a launch needs, through ctypes on ``libcuda.so.1``."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        void_p, uint = ctypes.c_void_p, ctypes.c_uint
        self.lib.cuLaunchKernel.argtypes = [void_p, *[uint] * 7, void_p, void_p, void_p]
        self.lib.cuModuleGetFunction.argtypes = [void_p, void_p, ctypes.c_char_p]
        self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [void_p, void_p, ctypes.c_int, ctypes.c_size_t]
        self.lib.cuCtxSetCurrent.argtypes = [void_p]

    def check(self, name: str, *arguments: Any) -> None:
        result = getattr(self.lib, name)(*arguments)
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(text))
            raise RuntimeError(f"{name} failed: {(text.value or b'?').decode()} ({result})")

    def load(self, device: int, ptx: str, name: str, threads: int) -> tuple[int, int]:
        """Load ``ptx`` into the current context (the device's primary one if none); return the
        kernel's handle and how many of its CTAs of ``threads`` fit on one multiprocessor."""
        context = ctypes.c_void_p()
        self.check("cuCtxGetCurrent", ctypes.byref(context))
        if not context.value:
            handle = ctypes.c_int()
            self.check("cuDeviceGet", ctypes.byref(handle), device)
            self.check("cuDevicePrimaryCtxRetain", ctypes.byref(context), handle)
            self.check("cuCtxSetCurrent", context)
        module, function, fitting = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
        self.check("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(ptx.encode()))
        self.check("cuModuleGetFunction", ctypes.byref(function), module, name.encode())
        self.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(fitting), function, threads, 0)
        return int(function.value or 0), fitting.value

    def launch(self, function: int, grid: tuple, block: tuple, stream: int, params: int) -> None:
        self.check("cuLaunchKernel", function, *grid, *block, 0, stream, params, None)


@functools.cache
def cuda_driver() -> CudaDriver:
    return CudaDriver()
