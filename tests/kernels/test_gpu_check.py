"""The GPU check (benchmarks/gpu_check.sh) cannot waste its one run: its plan fits its deadline, the comparison
that matters runs first, a skipped test is a failure, and a killed step leaves its rows and the summary.

These run the real script on this machine (no GPU: a dry run), with the repository's interpreter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def gpu_check(out: Path, **env: str) -> subprocess.Popen[str]:
    settings = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "REQUIRE_GPU": "0", **env}
    return subprocess.Popen(
        ["bash", str(SCRIPT)], cwd=ROOT, env=settings, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def summary(out: Path) -> dict[str, str]:
    """summary.txt's lines, ``NAME  RESULT`` (the name padded to 60 columns) and ``overall: STATE``."""
    said = {}
    for line in (out / "summary.txt").read_text().splitlines():
        name, _, result = line.partition(": ") if line.startswith("overall: ") else (line[:60], "", line[60:])
        said[name.strip()] = result.strip()
    return said


def test_the_plan_fits_the_deadline_and_runs_the_comparison_first():
    done = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PLAN_ONLY": "1"}, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split() for line in done.stdout.splitlines() if not line.startswith("planned")]
    assert steps[0][0] == "state-bench"  # CuTe DSL vs Triton at the seed shapes, before anything else
    assert "CuTe DSL vs Triton" in " ".join(steps[0])
    budgets = sum(int(step[1]) for step in steps)
    assert budgets + 20 + 40 <= 540  # the steps, the machine section and the margin inside the deadline
    assert done.stdout.splitlines()[-1].endswith("fits yes")
    over = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "DEADLINE_S": "300"}, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert over.returncode == 2  # refuses to start rather than lose the last steps
    assert "over the 300 s deadline" in over.stderr


def test_a_step_whose_tests_all_skipped_is_a_failure(tmp_path):
    process = gpu_check(tmp_path, ONLY="real-driver")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1, output
    said = summary(tmp_path)
    assert said["real-driver path (scan, replay)"].startswith("FAILED: 5 of 5 skipped"), said
    assert said["overall"] == "FAILED"


def table_rows(markdown: Path) -> int:
    return (
        sum(line.startswith(("| C4 ", "| C128 ")) for line in markdown.read_text().splitlines())
        if markdown.exists()
        else 0
    )


@pytest.mark.timeout(600)
def test_a_killed_step_leaves_its_rows_and_the_summary(tmp_path):
    """Killed once its first row is in the Markdown (each row goes to the JSON Lines file first, then the
    Markdown is rewritten): whatever the moment, the file and the summary keep every row measured before it."""
    require("torch", "kernels")
    process = gpu_check(tmp_path, ONLY="state-bench")
    markdown = tmp_path / "state_kernels.md"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None and table_rows(markdown) < 1:
        time.sleep(0.1)
    assert process.poll() is None, f"the step ended before it could be killed: {process.communicate()[0]}"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    said = summary(tmp_path)
    assert said.get("interrupted", "").startswith("by a signal during: faithful variant: CuTe DSL vs Triton"), (
        said,
        output,
    )
    assert said["overall"] == "FAILED"
    shown = table_rows(markdown)
    assert shown >= 1
    assert int(said["rows in state_kernels.jsonl"]) >= shown
    deadline = time.monotonic() + 30  # a killed process may take a moment to leave /proc (torch frees a lot)
    while running(f"--save-path {tmp_path}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(f"--save-path {tmp_path}"), "the step's processes outlived the script"


def running(fragment: str) -> list[int]:
    """Pids of processes whose command line holds ``fragment`` (read from /proc, no procps needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and fragment in command:
            found.append(int(entry.name))
    return found
