"""diagtools: find which import initializes the CUDA driver, down to the line.

Importing this package is cheap and side-effect free: every public name is
resolved on first use (PEP 562), so neither torch, triton, cutlass, cuda,
ipywidgets nor graphviz is imported until a feature that needs it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ChildOutcome",
    "Culprit",
    "DiagtoolsError",
    "DriverInfo",
    "ImportNode",
    "ParentState",
    "ReplayComparison",
    "ReplayResult",
    "RunError",
    "RunResult",
    "ScanResult",
    "Site",
    "StartupInfo",
    "UsageError",
    "compare_replays",
    "diff_scans",
    "load_ipython_extension",
    "notebook_progress",
    "process_cuda_state",
    "render_scan",
    "replay_fork",
    "run",
    "scan",
    "specimens",
    "sweep",
]
__version__ = "0.1.0"

_LOCATIONS = {
    "Culprit": "diagtools._model",
    "DriverInfo": "diagtools._model",
    "ImportNode": "diagtools._model",
    "RunError": "diagtools._model",
    "ScanResult": "diagtools._model",
    "Site": "diagtools._model",
    "StartupInfo": "diagtools._model",
    "DiagtoolsError": "diagtools._errors",
    "UsageError": "diagtools._errors",
    "render_scan": "diagtools._render_text",
    "scan": "diagtools._scan",
    "ChildOutcome": "diagtools._replay_model",
    "ParentState": "diagtools._replay_model",
    "ReplayComparison": "diagtools._replay_model",
    "ReplayResult": "diagtools._replay_model",
    "compare_replays": "diagtools._replay",
    "replay_fork": "diagtools._replay",
    "diff_scans": "diagtools._diff",
    "notebook_progress": "diagtools._progress",
    "process_cuda_state": "diagtools._selfcheck",
    "sweep": "diagtools._sweep",
    "RunResult": "diagtools.model.run",
    "run": "diagtools.usecases.run",
    "load_ipython_extension": "diagtools.frontends.magics",
}

if TYPE_CHECKING:
    from diagtools import specimens
    from diagtools._diff import diff_scans
    from diagtools._errors import DiagtoolsError, UsageError
    from diagtools._model import Culprit, DriverInfo, ImportNode, RunError, ScanResult, Site, StartupInfo
    from diagtools._progress import notebook_progress
    from diagtools._render_text import render_scan
    from diagtools._replay import compare_replays, replay_fork
    from diagtools._replay_model import ChildOutcome, ParentState, ReplayComparison, ReplayResult
    from diagtools._scan import scan
    from diagtools._selfcheck import process_cuda_state
    from diagtools._sweep import sweep
    from diagtools.frontends.magics import load_ipython_extension
    from diagtools.model.run import RunResult
    from diagtools.usecases.run import run


def __getattr__(name: str) -> Any:
    if name == "specimens":
        return importlib.import_module("diagtools.specimens")
    if name not in _LOCATIONS:
        raise AttributeError(f"module 'diagtools' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LOCATIONS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
