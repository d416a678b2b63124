"""Project metadata stays consistent: environment.yml mirrors pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = data["project"]["optional-dependencies"]
    return {req for name, reqs in extras.items() if name != "all" for req in reqs} | set(
        data["project"]["dependencies"]
    )


def environment_pip_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    entries = [line.strip()[2:] for line in lines[start + 1 :] if line.strip().startswith("- ")]
    return {entry for entry in entries if not entry.startswith("-e ")}


def test_environment_yml_lists_exactly_the_pyproject_requirements():
    assert environment_pip_requirements() == pyproject_requirements()


def test_environment_yml_brings_graphviz_dot_and_a_compiler():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*- graphviz\s*$", text, re.MULTILINE)
    assert "conda-forge" in text
    assert "c-compiler" in text


def test_torch_is_pinned():
    assert "torch==2.13.0" in pyproject_requirements()


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci/run").read_text()
