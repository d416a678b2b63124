"""A sweep's answer in a few lines: rows grouped by root cause, a baseline of known causes, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from diagtools.usecases.sweep import sweep
from tests.conftest import DIAGTOOLS, cli, write_tree

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
THIRD_PARTY = {"kernlib/__init__.py": "from kernlib import env\n", "kernlib/env.py": CUINIT}
PACKAGE = {
    "app/__init__.py": "",
    "app/fusion.py": "import json\nfrom kernlib import env\n",  # the line every user of fusion reaches
    "app/user1.py": "from app import fusion\n",
    "app/user2.py": "import app.fusion\n",
    "app/layers/__init__.py": "from app.fusion import env\n",
    "app/layers/leaf.py": "VALUE = 1\n",
    "app/clean.py": "VALUE = 2\n",
}
DIRECT = {"app/direct.py": CUINIT}


@pytest.fixture
def trees(tmp_path):
    third, own = tmp_path / "site", tmp_path / "src"
    write_tree(third, THIRD_PARTY)
    write_tree(own, PACKAGE)
    return own, third


def test_rows_are_grouped_by_root_cause(trees):
    own, third = trees
    result = sweep("app", path=[own, third], driver="simulated", jobs=2)
    causes = result.causes
    assert len(causes) == 1
    cause = causes[0]
    assert cause.key == "app.fusion: `from kernlib import env` <- kernlib.env"
    assert cause.modules == ("app.fusion", "app.layers", "app.layers.leaf", "app.user1", "app.user2")
    assert cause.through_parent == ("app.layers.leaf",)
    assert (cause.own_line.file, cause.own_line.line) == (str(own / "app" / "fusion.py"), 2)
    assert cause.initialized_at.file == str(third / "kernlib" / "env.py")
    document = result.to_json()["causes"]
    assert [(c["key"], c["count"], c["through_parent"]) for c in document] == [(cause.key, 5, ["app.layers.leaf"])]
    text = str(result)
    assert "root causes: 1 (for 5 modules that initialize CUDA)" in text
    assert "reached by 5 module(s), 1 only through a parent package" in text
    assert "Root causes" in result._repr_html_()


def test_baseline_fails_only_on_new_root_causes(trees, tmp_path):
    own, third = trees
    summary, journal = tmp_path / "known.json", tmp_path / "known.jsonl"
    paths = ["--path", str(own), "--path", str(third), "--driver", "simulated", "--jobs", "2"]
    first = cli("sweep", "app", *paths, "--summary", str(summary), "--json", str(journal), "--fail-on-cuda")
    assert first.returncode == 1, first.stderr
    assert json.loads(summary.read_text())["causes"][0]["count"] == 5
    for baseline in (summary, journal):
        known = cli("sweep", "app", *paths, "--baseline", str(baseline))
        assert known.returncode == 0, known.stderr
        assert "0 new root cause(s), 1 known" in known.stdout
    (own / "app" / "direct.py").write_text(DIRECT["app/direct.py"])
    for baseline in (summary, journal):
        new = cli("sweep", "app", *paths, "--baseline", str(baseline))
        assert new.returncode == 1, new.stderr
        assert "1 new root cause(s), 1 known" in new.stdout
        assert "NEW: app.direct: `ctypes.CDLL('libcuda.so.1').cuInit(0)` <- app.direct (1 module(s))" in new.stdout


def test_a_bad_baseline_is_a_one_line_error(trees, tmp_path):
    own, _ = trees
    bogus = tmp_path / "bogus.json"
    bogus.write_text("[1, 2]\n")
    done = cli("sweep", "app", "--path", str(own), "--baseline", str(bogus))
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"diagtools: error: the baseline {bogus} is not a diagtools.sweep/1 journal or summary"
    )
    missing = cli("sweep", "app", "--path", str(own), "--baseline", str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert "cannot read the baseline" in missing.stderr


def test_ctrl_c_prints_the_summary_of_what_the_sweep_has(tmp_path):

    files = {"slow/__init__.py": "", "slow/gpu.py": CUINIT}
    files.update({f"slow/m{n:02}.py": "import time\ntime.sleep(0.4)\n" for n in range(30)})
    root = write_tree(tmp_path / "src", files)
    journal = tmp_path / "slow.jsonl"
    command = [DIAGTOOLS, "sweep", "slow", "--path", str(root), "--driver", "simulated", "--jobs", "1"]
    summary = tmp_path / "partial.json"
    process = subprocess.Popen(
        [*command, "--json", str(journal), "--summary", str(summary)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count("\n") < 5):
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "diagtools: interrupted, subkernels killed" in err
    assert "interrupted:" in out
    assert "modules were not scanned; rerun with the same --json to resume" in out
    assert "module " in out.splitlines()[0]  # the table of the rows it had
    partial = json.loads(summary.read_text())
    assert 0 < partial["interrupted"] < 31
    assert len(partial["rows"]) + partial["interrupted"] == 32
