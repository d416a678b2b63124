"""The host side of the run agent: the environment that loads it, and reading what it recorded.

Every Python process of a watched command loads the agent through a
``sitecustomize`` directory put first on ``PYTHONPATH`` (:func:`agent_environment`)
and writes one record file; :func:`read_records` reads them back through the
protocol's validating reader, so a torn, forged or malformed line is skipped
and counted, never trusted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.runner.events import decode_events
from diagtools.runner.kept import bounded_lines

__all__ = ["RunRecords", "agent_environment", "read_records"]


def agent_environment(
    directory: str,
    hook_dir: str | os.PathLike[str],
    *,
    marker: tuple[str, str],
    cuprobe: str | None,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The variables that put the agent into every Python process of the tree.

    ``marker`` is the (name, value) pair every process of the tree carries, so
    leftovers can be found; ``cuprobe`` the driver-state extension built for
    this interpreter (``None``: the driver's hook alone decides).
    """
    existing = base.get("PYTHONPATH", "")
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(hook_dir), existing) if p),
        protocol.RUN_DIR: directory,
        marker[0]: marker[1],
    }
    if cuprobe:
        env[protocol.RUN_CUPROBE] = cuprobe
        env[protocol.RUN_CUPROBE_FOR] = _python_version()
    return env


def _python_version() -> str:
    import sys

    return sys.version


@dataclass(frozen=True)
class RunRecords:
    """Every process file's valid events, in file order (each file is one process image),
    how many lines had to be skipped, and the pids whose agent lost its file (their records stop early)."""

    files: tuple[tuple[dict[str, Any], ...], ...]
    skipped: int = 0
    lost: tuple[int, ...] = ()


def read_records(directory: str | os.PathLike[str]) -> RunRecords:
    """Read every ``*.jsonl`` record file under ``directory`` with the protocol's validating reader."""
    files, skipped, lost = [], 0, []
    for path in sorted(Path(directory).glob("*.jsonl")):
        data, dropped = bounded_lines(path)  # a flooding process reads as a fresh subkernel's channel does
        decoded = decode_events(data)
        skipped += decoded.skipped + dropped
        if decoded.events:
            files.append(tuple(decoded.events))
        if path.name.endswith(protocol.LOST_SUFFIX) and path.name.split("-")[0].isdigit():
            lost.append(int(path.name.split("-")[0]))
    return RunRecords(tuple(files), skipped, tuple(lost))
