"""Loading PTX and launching a kernel through the CUDA driver API (ctypes on ``libcuda.so.1``).

Shared by the CuTe DSL kernels: they are compiled to PTX ahead of time (no GPU needed), so a
GPU machine needs neither nvidia-cutlass-dsl nor cuda-python to run them, only the driver that
torch has already loaded.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ARCH",
    "PTX_DIR",
    "VECTOR_BYTES",
    "CudaDriver",
    "KernelLaunch",
    "LoadedKernel",
    "aligned",
    "compile_to_ptx",
    "compiled_or_shipped",
    "cuda_device_of",
    "cuda_driver",
    "entry_of",
    "gmem_pointer",
    "launch_kernel",
    "load_kernel",
    "pack_arguments",
]

VECTOR_BYTES = 16  # the kernels' 128-bit vectors: every pointer they get starts on this boundary
ARCH = "sm_90a"  # the architecture the shipped PTX is compiled for
PTX_DIR = Path(__file__).resolve().parent / "ptx"

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


@dataclass(frozen=True)
class KernelLaunch:
    """Everything one launch needs, computed from the real tensors (testable without a GPU)."""

    config: Any  # the kernel's launch configuration
    param_types: tuple[str, ...]  # the PTX parameter types, in order
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arguments: tuple[int | float, ...]
    keep_alive: tuple[Any, ...]  # the tensors the pointers point into, converted copies included
    # device work to run before each launch (and to capture with it in a CUDA graph): refreshing the copies
    # the kernel reads from the caller's tensors; None when the plan read everything once, on the host
    prepare: Callable[[], object] | None = None
    # the launch that follows on the same stream and reads what this one wrote (a kernel's second stage)
    then: KernelLaunch | None = None

    def stages(self) -> tuple[KernelLaunch, ...]:
        """This launch and the ones that follow it, in launch order."""
        return (self, *(self.then.stages() if self.then is not None else ()))

    def packed(self) -> tuple[Any, Any]:
        """The ``void**`` the driver reads, and the ctypes values it points to."""
        return pack_arguments(self.param_types, self.arguments)


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel's handle in one device's context, and how many of its CTAs fit on a multiprocessor."""

    function: int
    ctas_per_sm: int


def require_aligned(**in_place: Any) -> None:
    """``ValueError`` for a tensor used in place that does not start on a 16-byte boundary.

    Checked before anything else about a launch, so an input that can never run is refused even on a
    batch that happens to need no launch (every token padded)."""
    for name, tensor in in_place.items():
        if tensor.data_ptr() % VECTOR_BYTES:
            raise ValueError(f"{name} must start on a 16-byte boundary (it is used in place)")


def aligned(tensors: dict[str, Any], in_place: Iterable[str]) -> dict[str, Any]:
    """The tensors, each starting on a 16-byte boundary: a misaligned one is copied (a fresh
    allocation is aligned), except those used in place, which raise ``ValueError``."""
    require_aligned(**{name: tensors[name] for name in in_place})
    return {name: t.clone() if t.data_ptr() % VECTOR_BYTES else t for name, t in tensors.items()}


def load_kernel(device: int, ptx: str, param_types: Sequence[str], threads: int) -> LoadedKernel:
    """Load ``ptx`` into the device's context and look its kernel up, after checking that its
    parameters are the ``param_types`` the launcher packs."""
    name, params = entry_of(ptx)
    if tuple(params) != tuple(param_types):
        raise RuntimeError(f"the kernel's parameters {params} are not the {tuple(param_types)} this launcher packs")
    function, fitting = cuda_driver().load(device, ptx, name, threads)
    return LoadedKernel(function, fitting)


def cuda_device_of(tensor: Any) -> int:
    """The CUDA device index of ``tensor`` (the current device for a bare ``cuda``); a CPU tensor
    raises ``ValueError``: the CuTe DSL kernels run on CUDA only."""
    if not tensor.is_cuda:
        raise ValueError("the CuTe DSL backend runs on CUDA tensors only; use backend='torch' or 'triton' here")
    if tensor.device.index is not None:
        return int(tensor.device.index)
    import torch

    return int(torch.cuda.current_device())


def launch_kernel(kernel: LoadedKernel, launch: KernelLaunch, stream: int) -> None:
    """Launch on ``stream`` (a raw ``cudaStream_t``), after the plan's device-side preparation; a launch
    error raises ``RuntimeError``."""
    if launch.prepare is not None:
        launch.prepare()
    array, _values = launch.packed()  # _values keeps the pointed-to scalars alive through the call
    cuda_driver().launch(kernel.function, launch.grid, launch.block, stream, ctypes.addressof(array))


# ----------------------------------------------------------------------------- compiling


def gmem_pointer(dtype: Any) -> Any:
    """A placeholder global pointer of ``dtype`` for compiling, 16-byte aligned (needs cutlass)."""
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=VECTOR_BYTES)


def compile_to_ptx(host: Any, arguments: Sequence[Any], dump_dir: str | Path, arch: str = ARCH) -> str:
    """Compile a ``@cute.jit`` host function for ``arch`` (no GPU needed) and return its PTX text."""
    from cutlass import cute

    Path(dump_dir).mkdir(parents=True, exist_ok=True)
    options = f"--keep-ptx --dump-dir={dump_dir} --gpu-arch {arch}"
    ptx = cute.compile(host, *arguments, options=options).artifacts.PTX
    return Path(ptx).read_text() if "\n" not in ptx and Path(ptx).is_file() else ptx


def compiles_here() -> bool:
    """Whether nvidia-cutlass-dsl is importable, so :func:`compiled_or_shipped` compiles the PTX instead of
    reading the shipped copy (a report says which it did)."""
    try:
        import cutlass  # noqa: F401
    except ImportError:
        return False
    return True


def compiled_or_shipped(shipped: Path, compile_into: Callable[[str, str], str], missing: str) -> str:
    """The PTX to load: ``compile_into(folder, arch)`` when nvidia-cutlass-dsl is importable (for
    ``CUTE_DSL_ARCH``, default sm_90a), else the shipped copy; ``ValueError(missing)`` without either."""
    if not compiles_here():
        if not shipped.is_file():
            raise ValueError(missing) from None
        return shipped.read_text()
    with tempfile.TemporaryDirectory() as folder:
        return compile_into(folder, os.environ.get("CUTE_DSL_ARCH", ARCH))
