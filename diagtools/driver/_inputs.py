"""Where the simulated libraries' declarations come from: the files, found without reading them.

The driver's cache check stats these files on every scan, so this module
imports only ``os``, ``sys`` and ``pathlib``; :mod:`diagtools.driver._generate`
reads them when a build is due.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cuda_headers", "first_in_site", "input_files", "real_runtimes", "site_dirs"]


def site_dirs() -> Iterator[Path]:
    """The import roots that are directories, each once, in ``sys.path`` order."""
    seen: set[str] = set()
    for entry in sys.path:
        if entry and entry not in seen and os.path.isdir(entry):
            seen.add(entry)
            yield Path(entry)


def first_in_site(relative: str) -> Path | None:
    """The first file at ``relative`` under an import root, or ``None``."""
    for directory in site_dirs():
        candidate = directory / relative
        if candidate.is_file():
            return candidate
    return None


def cuda_headers() -> Iterator[Path]:
    """Every ``cuda.h`` an installed package (CUDA wheels, Triton) or toolkit ships."""
    for directory in site_dirs():
        yield from directory.glob("nvidia/*/include/cuda.h")
        yield from directory.glob("triton/backends/nvidia/include/cuda.h")
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(variable)
        if root:
            yield Path(root) / "include" / "cuda.h"
    yield Path("/usr/local/cuda/include/cuda.h")


def real_runtimes() -> Iterator[Path]:
    """Every real ``libcudart.so.N`` an installed NVIDIA wheel ships, in ``sys.path`` order."""
    for directory in site_dirs():
        for pattern in ("nvidia/*/lib/libcudart.so.[0-9]*", "nvidia/cuda_runtime/lib/libcudart.so.[0-9]*"):
            yield from sorted(directory.glob(pattern))


def input_files() -> tuple[Path, ...]:
    """The files the generated lists are read from; their stat is a cheap freshness key."""
    found = [
        first_in_site("cuda/bindings/cydriver.pxd"),
        first_in_site("cuda/bindings/cynvml.pxd"),
        first_in_site("pynvml.py"),
        *(path for path in cuda_headers() if path.is_file()),
        *real_runtimes(),
    ]
    return tuple(path for path in found if path is not None)
