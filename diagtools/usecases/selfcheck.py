"""Has this very process touched CUDA?  Asked without importing or loading anything.

Notebooks call it to show that the analysis ran in subkernels and the
notebook's own kernel stayed clean.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessCudaState", "process_cuda_state"]


@dataclass(frozen=True)
class ProcessCudaState:
    """Whether libcuda is mapped into this process and which CUDA modules it imported."""

    libcuda_loaded: bool
    cuda_modules: tuple[str, ...]
    torch_cuda_initialized: bool | None

    @property
    def clean(self) -> bool:
        return not self.libcuda_loaded and not self.torch_cuda_initialized

    def __str__(self) -> str:
        if self.clean:
            return "this process: libcuda not loaded, CUDA never initialized"
        return (
            f"this process: libcuda loaded={self.libcuda_loaded}, torch.cuda initialized={self.torch_cuda_initialized}"
        )


def process_cuda_state() -> ProcessCudaState:
    """Read /proc/self/maps and sys.modules; touches no module attribute that could import."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    torch_cuda = sys.modules.get("torch.cuda")
    return ProcessCudaState(
        libcuda_loaded="libcuda.so" in maps,
        cuda_modules=tuple(sorted(name for name in sys.modules if name == "cuda" or name.startswith("cuda."))),
        torch_cuda_initialized=bool(vars(torch_cuda).get("_initialized")) if torch_cuda else None,
    )
