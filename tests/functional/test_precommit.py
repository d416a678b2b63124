"""The pre-commit hook this repository provides, run by pre-commit itself on a throwaway repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_tree

ROOT = Path(__file__).resolve().parents[2]
PRE_COMMIT = shutil.which("pre-commit", path=str(Path(sys.executable).parent))

pytestmark = pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (the dev extra has it)")


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def throwaway(tmp_path: Path, files: dict[str, str]) -> Path:
    """A git repository holding ``files``, all added: what pre-commit looks at."""
    repo = write_tree(tmp_path / "project", files)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    return repo


def hook_repository(tmp_path: Path) -> Path:
    """This checkout's hook definitions as a repository of their own, committed: what ``repo:`` points at."""
    source = tmp_path / "hooks"
    source.mkdir()
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", source)
    git(source, "init", "-q")
    git(source, "add", "-A")
    git(source, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "hooks")
    return source


def pre_commit(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # diagtools: language system
    }
    command = [PRE_COMMIT, *args]
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False)


FILES = {
    "mypkg/__init__.py": "",
    "mypkg/fine.py": "VALUE = 1\n",
    "mypkg/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
    "scripts/train.py": "raise SystemExit('a script is never imported by the hook')\n",
}


def test_try_repo_fails_a_changed_module_that_initializes_cuda(tmp_path):
    repo = throwaway(tmp_path, FILES)
    done = pre_commit(repo, tmp_path, "try-repo", str(hook_repository(tmp_path)), "cuda-import-guard", "--all-files")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "imports leave CUDA alone (diagtools)" in done.stdout
    assert "Failed" in done.stdout
    assert "culprit: mypkg.gpu" in done.stdout
    assert "mypkg/gpu.py:2" in done.stdout
    assert "never imported" not in done.stdout  # the script was left out


def test_a_config_with_listed_modules_passes_when_they_import_cleanly(tmp_path):
    files = {**FILES, "mypkg/gpu.py": "def init():\n    import ctypes\n    ctypes.CDLL('libcuda.so.1').cuInit(0)\n"}
    hooks = hook_repository(tmp_path)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hooks, capture_output=True, text=True, check=True).stdout
    config = (
        f"repos:\n  - repo: {hooks}\n    rev: {rev.strip()}\n    hooks:\n"
        "      - id: cuda-import-guard\n        args: [mypkg.fine]\n"
    )
    repo = throwaway(tmp_path, {**files, ".pre-commit-config.yaml": config})
    done = pre_commit(repo, tmp_path, "run", "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imports leave CUDA alone (diagtools)" in done.stdout
    assert "Passed" in done.stdout
