"""Ops resolved lazily (PEP 562): importing the package touches no GPU code."""

import importlib

__all__ = ["gemm", "norm"]
_SUBMODULES = {"gemm": "lazyops.gemm", "norm": "lazyops.norm"}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'lazyops' has no attribute {name!r}")
