"""Agents: the programs that run inside subkernels and their children, never in the caller's process.

Standard library only (an import-linter contract and a ``python -S`` test
enforce it), so they cannot disturb the import tree they measure.  The
runner executes ``scan_probe`` and ``replay_parent`` as main programs;
``replay_child`` is imported by the replay's child process.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["AGENTS_DIR", "program"]

AGENTS_DIR = Path(__file__).resolve().parent


def program(name: str) -> Path:
    """The file of the agent program ``name`` (``scan_probe``, ``replay_parent``)."""
    return AGENTS_DIR / f"{name}.py"
