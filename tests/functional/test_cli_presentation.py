"""The command line as a person meets it: version, usage hints, colour, and the graph as SVG."""

from __future__ import annotations

import os
import subprocess

import pytest

import diagtools
from diagtools.specimens import get
from tests.conftest import DIAGTOOLS, cli


def test_version():
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"diagtools {diagtools.__version__}"


@pytest.mark.parametrize(
    ("args", "hint"),
    [(["bogus"], "(see diagtools --help)"), (["scan"], "(see diagtools scan --help)")],
)
def test_usage_errors_point_at_the_right_help(args, hint):
    done = cli(*args)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(hint)
    assert "diagtools diagtools" not in done.stderr


def scan_common_ops(*extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    specimen = get("common_ops")
    command = [DIAGTOOLS, "scan", specimen.target, "--path", str(specimen.tree("before")), "--driver", "simulated"]
    return subprocess.run(
        [*command, *extra], capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env}
    )


def test_colour_only_when_asked_or_on_a_terminal_and_never_with_no_color(tmp_path):
    plain = scan_common_ops(env={"NO_COLOR": "1", "FORCE_COLOR": "1"})
    assert plain.returncode == 0, plain.stderr
    assert "\x1b[" not in plain.stdout
    forced = scan_common_ops("--svg", str(tmp_path / "graph.svg"), env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert forced.returncode == 0, forced.stderr
    assert "\x1b[31mCUDA initialized: YES\x1b[0m" in forced.stdout
    svg = (tmp_path / "graph.svg").read_text()
    assert svg.lstrip().startswith("<?xml")
    assert 'class="node culprit"' in svg
