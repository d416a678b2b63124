"""The GPU tests' way of running their checks: in a child process (the test process must not
initialize CUDA), one JSON record a line, so a child that dies still leaves the cases before it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_check_child(
    code: str, arguments: Sequence[str], key: Callable[[dict[str, Any]], Hashable], *, timeout: float
) -> dict[Hashable, dict[str, Any]]:
    """Run ``code`` with ``arguments`` from the repository root; return its records by ``key``,
    plus ``"_child"`` (exit code and stderr tail).  A child that sees no GPU skips the test."""
    done = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    records: dict[Hashable, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("no_gpu"):
                pytest.skip("torch is a CPU build or sees no GPU")
            records[key(record)] = record
    records["_child"] = {"returncode": done.returncode, "stderr": done.stderr[-3000:]}
    return records
