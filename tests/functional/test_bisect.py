"""Bisect on a generated repository: names the commit that added the eager re-export."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from diagtools.errors import UsageError
from diagtools.usecases.bisect import bisect
from tests.conftest import cli, write_tree

REEXPORT = 15  # the commit that adds `from .cutedsl import ...` to ops/__init__.py
BROKEN = range(8, 12)  # commits where the target does not even import


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    write_tree(repo, files)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path):
    """A 22-commit repository: ops/ becomes CUDA-initializing at commit REEXPORT."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = [
        commit(
            repo,
            {
                "src/ops/__init__.py": "",
                "src/ops/cutedsl.py": "from cuda.bindings import driver\n(STATUS,) = driver.cuInit(0)\n",
            },
            "start",
        )
    ]
    for number in range(1, 22):
        files = {f"src/ops/helper{number}.py": f"VALUE = {number}\n"}
        if number in BROKEN:
            files["src/ops/__init__.py"] = "from .helper1 import VALUE\nthis is not python\n"
        elif number == BROKEN.stop:
            files["src/ops/__init__.py"] = ""
        if number == REEXPORT:
            files["src/ops/__init__.py"] = "from .cutedsl import STATUS\n"
        message = "re-export the cutedsl kernels from ops" if number == REEXPORT else f"add helper {number}"
        shas.append(commit(repo, files, message))
    (repo / "untracked.txt").write_text("user's own file\n")
    return repo, shas


def snapshot(repo: Path) -> tuple[str, str, str, list[str]]:
    git_files = sorted(str(p.relative_to(repo)) for p in (repo / ".git").rglob("*") if p.is_file())
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        git(repo, "symbolic-ref", "HEAD"),
        git_files,
    )


def test_bisect_names_the_reexport_commit_and_leaves_the_repo_alone(history):
    repo, shas = history
    before = snapshot(repo)
    result = bisect(repo, shas[0], shas[-1], "ops", path_in_repo="src", driver="simulated")
    assert result.first_bad == shas[REEXPORT]
    assert result.subject == "re-export the cutedsl kernels from ops"
    assert result.files == ("src/ops/__init__.py", f"src/ops/helper{REEXPORT}.py")
    assert result.culprit.module == "ops.cutedsl"
    assert result.culprit.site.file == "src/ops/cutedsl.py"
    assert result.culprit.site.line == 2
    # where CUDA was initialized and the chain's import lines too: the clone they were found in is deleted
    assert result.culprit.module_site.file == "src/ops/cutedsl.py"
    assert result.culprit.initialized_at.file == "src/ops/cutedsl.py"
    assert result.culprit.chain_imports[1].file == "src/ops/__init__.py"
    # the line to change is the import the first bad commit added: its parent does not run it
    assert result.parent == shas[REEXPORT - 1]
    line = result.headline.line
    assert (line.file, line.line, line.source) == ("src/ops/__init__.py", 1, "from .cutedsl import STATUS")
    assert result.headline.rule == "regression-edge"
    skipped = {step.commit for step in result.steps if step.verdict == "skip"}
    assert skipped, "the broken commits sit where git bisect looks first, so some must be skipped"
    assert skipped <= {shas[n] for n in BROKEN}
    assert all(step.commit not in {shas[n] for n in BROKEN} or step.verdict == "skip" for step in result.steps)
    assert snapshot(repo) == before


def test_cli_bisect_json(history):
    repo, shas = history
    done = cli(
        "bisect",
        "ops",
        "--repo",
        str(repo),
        "--good",
        shas[0],
        "--bad",
        "main",
        "--path-in-repo",
        "src",
        "--driver",
        "simulated",
        "--json",
        "-",
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "diagtools.bisect/1"
    assert document["first_bad"] == shas[REEXPORT]


def test_wrong_endpoints_are_clear_errors(history, tmp_path):
    repo, shas = history
    with pytest.raises(UsageError, match="should initialize CUDA for a bisect"):
        bisect(repo, shas[0], shas[3], "ops", path_in_repo="src", driver="simulated")
    with pytest.raises(UsageError, match="is not a commit"):
        bisect(repo, "nope", shas[-1], "ops", path_in_repo="src", driver="simulated")
    with pytest.raises(UsageError, match="is not a git repository"):
        bisect(tmp_path, shas[0], shas[-1], "ops", driver="simulated")
