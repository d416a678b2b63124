"""The line to change is the user's own line: a third-party initializer is shown as "initialized in".

The ``third_party_init`` specimen: ``ringllm.layers.quant_fusion`` (the user's
package) imports ``jitkern`` (a "third-party" kernel library) whose
``jit/env.py`` initializes CUDA at import.  Every renderer that headlines the
line to change must name ``quant_fusion.py:3``, and every chain edge carries
the ``import`` statement that made it.
"""

from __future__ import annotations

import json
import os

import pytest

import diagtools
from diagtools.model.scan import ScanResult
from diagtools.render.html import scan_html
from diagtools.render.postmortem import postmortem
from diagtools.render.text import render_sweep
from diagtools.specimens import get
from tests.conftest import cli

SPECIMEN = get("third_party_init")
USER_LINE = "from jitkern import rmsnorm"


@pytest.fixture(scope="module")
def result() -> ScanResult:
    return diagtools.scan(SPECIMEN.target, path=[SPECIMEN.tree("before")], driver="simulated", timeout=60.0)


def test_headline_is_the_users_import_line_and_the_initializer_is_named(result):
    culprit = result.culprit
    assert culprit.module == "jitkern.jit.env"
    assert culprit.line_to_change.file.endswith("ringllm/layers/quant_fusion.py")
    assert (culprit.line_to_change.line, culprit.line_to_change.source) == (3, USER_LINE)
    assert culprit.initialized_in.file.endswith("jitkern/jit/env.py")
    assert "cuInit(0)" in culprit.initialized_in.source


def test_every_chain_edge_has_its_import_line_in_json(result):
    document = result.to_json()["culprits"][0]
    assert document["line_to_change"]["source"] == USER_LINE
    assert document["initialized_in"]["file"].endswith("jitkern/jit/env.py")
    imports = document["chain_imports"]
    assert len(imports) == len(document["chain"]) == 4
    assert imports[0] is None  # the scanned target itself was imported by the scan
    assert [(i["file"].rsplit("/", 2)[-2:], i["line"]) for i in imports[1:]] == [
        (["layers", "__init__.py"], 3),
        (["layers", "quant_fusion.py"], 3),
        (["jitkern", "__init__.py"], 3),
    ]
    assert ScanResult.from_json(json.loads(json.dumps(result.to_json()))).culprits == result.culprits


def test_cli_text_headlines_the_users_line_and_lists_imports_with_stack(tmp_path):
    done = cli("scan", SPECIMEN.target, "--path", str(SPECIMEN.tree("before")), "--driver", "simulated", "--stack")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    headline = next(i for i, line in enumerate(lines) if "line to change:" in line)
    assert lines[headline].rstrip().endswith("ringllm/layers/quant_fusion.py:3 in <module>")
    assert USER_LINE in lines[headline + 1]
    assert "initialized in:" in lines[headline + 2]
    assert "jitkern/jit/env.py:11" in lines[headline + 2]
    edge = next(line for line in lines if "jitkern -> jitkern.jit.env:" in line)
    assert "from jitkern.jit.env import CONTEXT" in edge


def test_own_patterns_move_the_line_to_change():
    tree = SPECIMEN.tree("before")
    theirs = diagtools.scan(SPECIMEN.target, path=[tree], driver="simulated", own=["jitkern"])
    assert theirs.culprit.line_to_change.file.endswith("jitkern/jit/env.py")
    assert theirs.culprit.initialized_in is None
    nobody = diagtools.scan(SPECIMEN.target, path=[tree], driver="simulated", own=["elsewhere.*"])
    assert nobody.culprit.first_party is None
    assert nobody.culprit.line_to_change == nobody.culprit.module_site


def test_bad_own_pattern_is_a_one_line_usage_error():
    done = cli("scan", "colorsys", "--driver", "none", "--own", "not a package")
    assert done.returncode == 2
    assert done.stderr.startswith("diagtools: error: --own 'not a package'")
    assert "Traceback" not in done.stderr


def test_panel_and_postmortem_headline_the_users_line(result, tmp_path):
    html = scan_html(result)
    assert "<b>Line to change</b>: " in html
    change = html.index("<b>Line to change</b>")
    assert "quant_fusion.py:3" in html[change : change + 400]
    assert "Initialized in" in html
    assert "from jitkern.jit.env import CONTEXT" in html
    files = postmortem(result, out=tmp_path / "pm")
    markdown = files.markdown.read_text(encoding="utf-8")
    summary = next(line for line in markdown.splitlines() if line.startswith("- **The line to change:**"))
    assert "quant_fusion.py:3" in summary
    assert USER_LINE in summary
    assert "initialized in" in summary
    assert "jitkern -> jitkern.jit.env:" in markdown


@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_sweep_rows_headline_the_users_line(fresh):
    swept = diagtools.sweep("ringllm", path=[SPECIMEN.tree("before")], driver="simulated", jobs=1, fresh=fresh)
    row = swept.row("ringllm.layers.quant_fusion")
    assert row.culprit.line_to_change.source == USER_LINE
    assert row.culprit.initialized_in.file.endswith("jitkern/jit/env.py")
    text = render_sweep(swept)
    line = next(line for line in text.splitlines() if line.startswith("ringllm.layers.quant_fusion "))
    assert line.endswith("quant_fusion.py:3")  # a long cell is cut in the middle: the line to change stays
    assert "     initialized in: " in text


def test_run_finding_headlines_the_scripts_import_line(tmp_path):
    """``diagtools run``: a script importing an installed library that initializes CUDA at import."""
    import shutil
    import sys

    from diagtools.render.run_html import run_html
    from diagtools.render.run_text import render_run
    from diagtools.usecases.run import run

    installed = tmp_path / "lib" / "site-packages"
    shutil.copytree(SPECIMEN.tree("before") / "jitkern", installed / "jitkern")
    script = tmp_path / "app" / "serve.py"
    script.parent.mkdir()
    script.write_text("import os\nfrom jitkern import rmsnorm\nprint('ready')\n")
    env = {**os.environ, "PYTHONPATH": str(installed)}
    result = run([sys.executable, str(script)], driver="simulated", output="capture", env=env)
    assert result.exitcode == 0, result.stderr
    cuinit = result.findings[0].cuinit
    assert cuinit.module == "jitkern.jit.env"
    assert (cuinit.line_to_change.file, cuinit.line_to_change.line) == (str(script), 2)
    assert cuinit.initialized_in.file == str(installed / "jitkern" / "jit" / "env.py")
    assert result.to_json()["findings"][0]["cuinit"]["line_to_change"]["source"] == "from jitkern import rmsnorm"
    text = render_run(result)
    assert f"line to change: {script}:2 in <module>" in text
    assert "initialized in: " in text
    assert "serve.py:2" in run_html(result)
