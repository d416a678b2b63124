"""``--python``: the subkernel runs with another supported interpreter, the environment under test."""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest

import diagtools
from diagtools.specimens import get
from diagtools.usecases.replay import replay_fork
from tests.conftest import cli


def _other_python() -> str | None:
    """A CPython 3.10+ of another minor version than this one (pyenv's, or one on PATH)."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin/python")))
    for path in candidates:
        version = path.split("/versions/")[1].split("/")[0]
        if not version.startswith(mine + ".") and os.access(path, os.X_OK):
            return path
    return None


OTHER = _other_python()
needs_other = pytest.mark.skipif(OTHER is None, reason="no other CPython 3.10+ is installed here")
SPECIMEN = get("third_party_init")


@needs_other
def test_scan_runs_the_subkernel_with_the_given_interpreter(tmp_path):
    out = tmp_path / "scan.json"
    done = cli(
        "scan", SPECIMEN.target, "--path", str(SPECIMEN.tree("before")), "--driver", "simulated",
        "--python", OTHER, "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    version = OTHER.split("/versions/")[1].split("/")[0]
    assert document["python"] == version != sys.version.split()[0]
    assert document["culprits"][0]["own_line"]["source"] == "from jitkern import rmsnorm"


@needs_other
@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_sweep_runs_with_the_given_interpreter(fresh):
    swept = diagtools.sweep(
        "ringllm", path=[SPECIMEN.tree("before")], driver="simulated", jobs=1, fresh=fresh, python=OTHER
    )
    assert swept.row("ringllm.layers.quant_fusion").culprit.own_line.source == "from jitkern import rmsnorm"
    assert [cause.key for cause in swept.causes] == [
        "ringllm.layers.quant_fusion: `from jitkern import rmsnorm` <- jitkern.jit.env"
    ]
    assert swept.mode == ("fresh" if fresh else "zygote"), swept.fallback


@needs_other
def test_replay_runs_with_the_given_interpreter():
    result = replay_fork(SPECIMEN.target, path=[SPECIMEN.tree("before")], driver="simulated", python=OTHER)
    assert result.reproduced, result


def test_a_bad_interpreter_is_a_one_line_error(tmp_path):
    script = tmp_path / "notpython"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    for value, message in (
        (str(tmp_path / "missing"), "is not an executable file"),
        (str(script), "is not a Python interpreter"),
    ):
        done = cli("scan", "colorsys", "--driver", "none", "--python", value)
        assert done.returncode == 2
        assert done.stderr.startswith(f"diagtools: error: --python {value!r} {message}")
        assert "Traceback" not in done.stderr
    old = glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python"))
    if old:
        done = cli("scan", "colorsys", "--driver", "none", "--python", old[0])
        assert done.returncode == 2
        assert "diagtools needs CPython 3.10+" in done.stderr


def test_a_wrapper_that_never_runs_the_probe_is_named_with_its_exit_status(tmp_path):
    wrapper = tmp_path / "python-once"
    wrapper.write_text(  # answers the interpreter check, then exits 7 without running what it was given
        f'#!/bin/sh\nif [ -e "{tmp_path}/asked" ]; then echo gone >&2; exit 7; fi\n'
        f'touch "{tmp_path}/asked"\nexec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    result = diagtools.scan("colorsys", driver="none", python=str(wrapper))
    assert result.status == "exited"
    assert result.error.message.startswith("the interpreter never ran the probe: it exited with status 7")
    assert "None" not in result.error.message
    assert result.error.exitcode == 7
