"""The GitHub Actions workflow under examples/: its sweep step, run as the workflow runs it, on throwaway
packages (the install step is the runner's; here the package is put on PYTHONPATH instead)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_tree
from tests.functional.test_sweep import junit_cases

yaml = pytest.importorskip("yaml", reason="PyYAML comes with pre-commit (the dev extra)")

WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "github-actions" / "cuda-import-guard.yml"


def sweep_step() -> tuple[str, dict[str, str]]:
    document = yaml.safe_load(WORKFLOW.read_text())
    triggers = document.get("on", document.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers
    steps = document["jobs"]["sweep"]["steps"]
    (step,) = [s for s in steps if "diagtools sweep" in s.get("run", "")]
    junit = [s for s in steps if "junit" in s.get("uses", "")]
    assert junit
    assert junit[0]["with"]["report_paths"] == "sweep-junit.xml"
    assert junit[0]["if"] == "always()"  # the report is shown when the sweep step fails too
    return step["run"], {key: str(value) for key, value in document["env"].items()}


def run_step(project: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        **env,
        "PYTHONPATH": str(project),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    command = ["bash", "-e", "-c", script]
    return subprocess.run(
        command, cwd=project, env=environment, capture_output=True, text=True, timeout=600, check=False
    )


PACKAGE = {"mypkg/__init__.py": "", "mypkg/fine.py": "VALUE = 1\n"}
CULPRIT = {"mypkg/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"}


def test_the_workflow_fails_a_module_that_initializes_cuda_and_reports_it(tmp_path):
    script, env = sweep_step()
    project = write_tree(tmp_path / "project", {**PACKAGE, **CULPRIT})
    done = run_step(project, script, env)
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = junit_cases(project / "sweep-junit.xml")
    assert outcomes["mypkg.gpu"] == "failure"
    assert outcomes["mypkg.fine"] == "passed"
    assert (project / "sweep-summary.json").is_file()


def test_the_workflow_passes_a_clean_package_and_a_known_cause_with_a_baseline(tmp_path):
    script, env = sweep_step()
    clean = write_tree(tmp_path / "clean", PACKAGE)
    assert run_step(clean, script, env).returncode == 0
    known = write_tree(tmp_path / "known", {**PACKAGE, **CULPRIT})
    first = run_step(known, script, env)
    assert first.returncode == 1
    (known / ".diagtools").mkdir()
    (known / "sweep-summary.json").rename(known / ".diagtools" / "baseline.json")
    again = run_step(known, script, env)
    assert again.returncode == 0, again.stdout + again.stderr  # the cause is in the baseline: not new
