"""Agents: the programs that run inside subkernels and their children, never in the caller's process.

Standard library only (an import-linter contract and a ``python -S`` test
enforce it), so they cannot disturb the import tree they measure.  There are
six:

- ``scan_probe``: the scan's subkernel program (main program);
- ``sweep_zygote``: the sweep's preloading worker, which forks one child per
  module (main program); its fork scheduler (``zygote_serving``) and its
  package descent and continuation (``zygote_descent``) are files of their
  own, loaded by it with ``protocol.load_source``;
- ``replay_parent``: the replay's subkernel program (main program);
- ``replay_child``: imported by the replay's forked or spawned child;
- ``resolve_names``: a patch's name check, ``from MODULE import NAME`` for
  each name a fix made lazy (main program);
- ``run_hook``: the ``sitecustomize.py`` (and its ``_diagtools_run_agent``)
  that ``diagtools run`` puts first on every watched interpreter's path.

:func:`program` gives the file of the main programs.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["AGENTS_DIR", "program"]

AGENTS_DIR = Path(__file__).resolve().parent


def program(name: str) -> Path:
    """The file of the agent program ``name`` (``scan_probe``, ``sweep_zygote``, ``replay_parent``,
    ``resolve_names``)."""
    return AGENTS_DIR / f"{name}.py"
