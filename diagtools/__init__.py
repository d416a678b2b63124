"""diagtools: find which import initializes the CUDA driver, down to the line.

Importing this package is cheap and side-effect free: every public name is
resolved on first use (PEP 562), so neither torch, triton, cutlass, cuda,
ipywidgets nor graphviz is imported until a feature that needs it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from diagtools._version import __version__ as __version__

__all__ = [
    "ChildOutcome",
    "Culprit",
    "CutSearch",
    "DiagtoolsError",
    "DriverInfo",
    "FixResult",
    "ImportNode",
    "ParentState",
    "ReplayComparison",
    "ReplayResult",
    "RunInterrupted",
    "RunResult",
    "ScanResult",
    "SchemaError",
    "Site",
    "StartupInfo",
    "TargetError",
    "TargetFailure",
    "UsageError",
    "compare_replays",
    "diff_scans",
    "fix",
    "load_ipython_extension",
    "notebook_progress",
    "postmortem",
    "process_cuda_state",
    "render_scan",
    "replay_fork",
    "run",
    "scan",
    "specimens",
    "sweep",
    "working",
]

_LOCATIONS = {
    "Culprit": "diagtools.model.scan",
    "CutSearch": "diagtools.model.cuts",
    "FixResult": "diagtools.model.fix",
    "fix": "diagtools.usecases.fix",
    "DriverInfo": "diagtools.model.scan",
    "ImportNode": "diagtools.model.scan",
    "TargetError": "diagtools.model.scan",
    "TargetFailure": "diagtools.model.scan",
    "ScanResult": "diagtools.model.scan",
    "Site": "diagtools.model.site",
    "StartupInfo": "diagtools.model.scan",
    "DiagtoolsError": "diagtools.errors",
    "UsageError": "diagtools.errors",
    "SchemaError": "diagtools.errors",
    "render_scan": "diagtools.render.text",
    "scan": "diagtools.usecases.scan",
    "ChildOutcome": "diagtools.model.replay",
    "ParentState": "diagtools.model.replay",
    "ReplayComparison": "diagtools.model.replay",
    "ReplayResult": "diagtools.model.replay",
    "compare_replays": "diagtools.usecases.replay",
    "replay_fork": "diagtools.usecases.replay",
    "diff_scans": "diagtools.model.diff",
    "notebook_progress": "diagtools.frontends.progress",
    "working": "diagtools.frontends.progress",
    "postmortem": "diagtools.render.postmortem",
    "process_cuda_state": "diagtools.usecases.selfcheck",
    "sweep": "diagtools.usecases.sweep",
    "RunResult": "diagtools.model.run",
    "run": "diagtools.usecases.run",
    "RunInterrupted": "diagtools.usecases.run",
    "load_ipython_extension": "diagtools.frontends.magics",
}

if TYPE_CHECKING:
    from diagtools import specimens
    from diagtools.errors import DiagtoolsError, SchemaError, UsageError
    from diagtools.frontends.magics import load_ipython_extension
    from diagtools.frontends.progress import notebook_progress, working
    from diagtools.model.cuts import CutSearch
    from diagtools.model.diff import diff_scans
    from diagtools.model.fix import FixResult
    from diagtools.model.replay import ChildOutcome, ParentState, ReplayComparison, ReplayResult
    from diagtools.model.run import RunResult
    from diagtools.model.scan import (
        Culprit,
        DriverInfo,
        ImportNode,
        ScanResult,
        StartupInfo,
        TargetError,
        TargetFailure,
    )
    from diagtools.model.site import Site
    from diagtools.render.postmortem import postmortem
    from diagtools.render.text import render_scan
    from diagtools.usecases.fix import fix
    from diagtools.usecases.replay import compare_replays, replay_fork
    from diagtools.usecases.run import RunInterrupted, run
    from diagtools.usecases.scan import scan
    from diagtools.usecases.selfcheck import process_cuda_state
    from diagtools.usecases.sweep import sweep


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
