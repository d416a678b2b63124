"""The GPU tests' way of running their checks: in a child process (the test process must not
initialize CUDA), one JSON record a line, so a child that dies still leaves the cases before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def child_timeout(default: float) -> float:
    """A child's time limit: ``GPU_CHILD_TIMEOUT_S`` where the GPU check sets it to fit its step, else ``default``."""
    return float(os.environ.get("GPU_CHILD_TIMEOUT_S") or default)


def run_check_child(
    code: str, arguments: Sequence[str], key: Callable[[dict[str, Any]], Hashable], *, timeout: float
) -> dict[Hashable, dict[str, Any]]:
    """Run ``code`` with ``arguments`` from the repository root; return its records by ``key``,
    plus ``"_child"`` (exit code and stderr tail).  A child that sees no GPU skips the test; one that runs
    past ``timeout`` is killed and its records so far are kept (the cases after them fail, saying so)."""
    command = [sys.executable, "-c", code, *arguments]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        stdout, returncode, stderr = done.stdout, done.returncode, done.stderr
    except subprocess.TimeoutExpired as expired:
        stdout = _text(expired.stdout)
        returncode, stderr = None, f"killed after {timeout:g} s\n{_text(expired.stderr)}"
    records: dict[Hashable, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("no_gpu"):
                pytest.skip("torch is a CPU build or sees no GPU")
            records[key(record)] = record
    records["_child"] = {"returncode": returncode, "stderr": stderr[-3000:]}
    return records


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""
