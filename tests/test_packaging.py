"""Project metadata stays consistent: environment.yml mirrors pyproject.toml, CI's tools are pinned."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # 3.10: the same parser, as a package (the core venvs install it; pytest needs it there too)
    import tomli as tomllib

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


def test_torch_is_a_range_not_a_pin():
    """An exact torch pin conflicts with every environment that brings its own (vLLM pins one)."""
    torch = [req for req in pyproject_requirements() if re.match(r"torch\b", req)]
    assert torch == ["torch>=2.13,<2.15"]


# The tools CI runs; each must be pinned (==) in constraints.txt.
CI_TOOLS = (
    "pytest",
    "pytest-timeout",
    "hypothesis",
    "ruff",
    "mypy",
    "import-linter",
    "playwright",
    "pip",
    "setuptools",
)


def constraints() -> dict[str, str]:
    pins = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower()] = version
    return pins


def test_every_tool_ci_runs_is_pinned_and_make_uses_the_pins():
    pins = constraints()
    assert [tool for tool in CI_TOOLS if tool not in pins] == []
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS := constraints.txt" in makefile
    assert makefile.count("$(PIP) install --quiet -c $(CONSTRAINTS)") == 2
    assert "$(STAMP): pyproject.toml $(CONSTRAINTS)" in makefile  # a pin bump reinstalls
    script = (ROOT / "scripts/test_pythons.py").read_text()
    assert 'CONSTRAINTS = ROOT / "constraints.txt"' in script
    assert '"-c", str(CONSTRAINTS)' in script


def test_library_ranges_stay_open():
    """pyproject.toml pins nothing exactly: the pins live in constraints.txt, for the tools only."""
    assert [req for req in pyproject_requirements() if "==" in req] == []


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci/run").read_text()


def test_the_version_is_written_once_and_the_installed_metadata_reads_it():
    from importlib.metadata import version

    import diagtools

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in data["project"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "diagtools._version.__version__"}
    assert version("diagtools") == diagtools.__version__
    assert re.search(r'__version__ = "[\d.]+"', (ROOT / "diagtools" / "_version.py").read_text())
    assert "__version__ =" not in (ROOT / "diagtools" / "__init__.py").read_text()
