"""A third-party initializer: the line to change is a verified cut in the user's code, never the library's line.

The ``third_party_init`` specimen: ``ringllm.layers.quant_fusion`` (the user's
package) imports ``jitkern`` (a "third-party" kernel library) whose
``jit/env.py`` initializes CUDA at import.  The nearest verified cut is the
re-export in ``ringllm/layers/__init__.py:3``, the deepest first-party cut the
import in ``quant_fusion.py:3`` (where the user's code reaches the library);
``jitkern/jit/env.py`` is named as where CUDA was initialized.  Every chain
edge carries the ``import`` statement that made it.
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
from tests.conftest import cli, unwrapped

SPECIMEN = get("third_party_init")
USER_LINE = "from jitkern import rmsnorm"
REEXPORT = "from .quant_fusion import fused_rms_quant"


@pytest.fixture(scope="module")
def result() -> ScanResult:
    return diagtools.scan(SPECIMEN.target, path=[SPECIMEN.tree("before")], driver="simulated", timeout=60.0)


def test_headline_is_the_nearest_cut_the_deepest_is_the_users_import_and_the_initializer_is_named(result):
    culprit = result.culprit
    assert culprit.module == "jitkern.jit.env"
    line = result.line_to_change
    assert line.file.endswith("ringllm/layers/__init__.py")
    assert (line.line, line.source) == (3, REEXPORT)
    deepest = result.headline.deepest.site
    assert deepest.file.endswith("ringllm/layers/quant_fusion.py")
    assert (deepest.line, deepest.source) == (3, USER_LINE)
    assert culprit.own_line == deepest  # where the user's code reaches the library
    assert culprit.initialized_at.file.endswith("jitkern/jit/env.py")
    assert "cuInit(0)" in culprit.initialized_at.source


def test_every_chain_edge_has_its_import_line_in_json(result):
    scan_document = result.to_json()
    document = scan_document["culprits"][0]
    assert document["own_line"]["source"] == USER_LINE
    assert document["initialized_at"]["file"].endswith("jitkern/jit/env.py")
    assert scan_document["headline"]["rule"] == "nearest-cut"
    assert scan_document["headline"]["line"]["source"] == REEXPORT
    assert [e["site"]["source"] for e in scan_document["cuts"]["deepest"]["edges"]] == [USER_LINE]
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
    lines = unwrapped(done.stdout).splitlines()
    headline = next(i for i, line in enumerate(lines) if "line to change (the nearest verified cut):" in line)
    assert lines[headline].rstrip().endswith("ringllm/layers/__init__.py:3 in <module>")
    assert REEXPORT in lines[headline + 1]
    assert "deepest first-party cut:" in lines[headline + 2]
    assert lines[headline + 2].rstrip().endswith("ringllm/layers/quant_fusion.py:3 in <module>")
    assert USER_LINE in lines[headline + 3]
    assert "CUDA initialized at:" in lines[headline + 4]
    assert "jitkern/jit/env.py:11" in lines[headline + 4]
    edge = next(i for i, line in enumerate(lines) if "jitkern -> jitkern.jit.env:" in line)
    assert "jitkern/__init__.py:3" in " ".join(lines[edge : edge + 2])  # the site, on the edge's line or the next
    assert "from jitkern.jit.env import CONTEXT" in " ".join(lines[edge : edge + 3])


def test_own_patterns_move_the_line_to_change():
    tree = SPECIMEN.tree("before")
    theirs = diagtools.scan(SPECIMEN.target, path=[tree], driver="simulated", own=["jitkern"])
    assert theirs.line_to_change.file.endswith("jitkern/__init__.py")  # only jitkern's imports may be cut
    assert theirs.line_to_change.source == "from jitkern.jit.env import CONTEXT"
    assert theirs.culprit.own_line.file.endswith("jitkern/jit/env.py")
    nobody = diagtools.scan(SPECIMEN.target, path=[tree], driver="simulated", own=["elsewhere.*"])
    assert nobody.culprit.first_party is None
    assert nobody.culprit.own_line == nobody.culprit.module_site
    assert nobody.line_to_change is None
    assert nobody.cuts.reason.startswith("every import on the chain to jitkern.jit.env is in third-party code")


def test_bad_own_pattern_is_a_one_line_usage_error():
    done = cli("scan", "colorsys", "--driver", "none", "--own", "not a package")
    assert done.returncode == 2
    assert done.stderr.startswith("diagtools: error: --own 'not a package'")
    assert "Traceback" not in done.stderr


def test_panel_and_postmortem_headline_the_verified_cut(result, tmp_path):
    html = scan_html(result)
    assert "<b>Line to change</b> (the nearest verified cut): " in html
    change = html.index("<b>Line to change</b>")
    assert "layers/<wbr>__init__.py:3" in html[change : change + 600]
    assert "Deepest first-party cut" in html
    assert "CUDA initialized at" in html
    assert "from jitkern.jit.env import CONTEXT" in html
    files = postmortem(result, out=tmp_path / "pm")
    markdown = files.markdown.read_text(encoding="utf-8")
    summary = next(line for line in markdown.splitlines() if line.startswith("- **The line to change:**"))
    assert "layers/\\_\\_init\\_\\_.py:3" in summary or "layers/__init__.py:3" in summary
    assert REEXPORT in summary
    assert "CUDA initialized at" in summary
    assert "jitkern -> jitkern.jit.env:" in markdown


@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_sweep_rows_headline_the_users_line(fresh):
    swept = diagtools.sweep("ringllm", path=[SPECIMEN.tree("before")], driver="simulated", jobs=1, fresh=fresh)
    row = swept.row("ringllm.layers.quant_fusion")
    assert row.culprit.own_line.source == USER_LINE
    assert row.culprit.initialized_at.file.endswith("jitkern/jit/env.py")
    text = render_sweep(swept)
    line = next(line for line in text.splitlines() if line.startswith("ringllm.layers.quant_fusion "))
    assert line.endswith("quant_fusion.py:3")  # a long cell is cut in the middle: the user's line stays
    assert "     your code reaches it at: " in text
    assert "     CUDA initialized at: " in text
    assert "     line to change: none verified (not searched: sweep --cuts, or diagtools fix MODULE)" in text


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
    assert (cuinit.own_line.file, cuinit.own_line.line) == (str(script), 2)
    assert cuinit.initialized_at.file == str(installed / "jitkern" / "jit" / "env.py")
    assert result.to_json()["findings"][0]["cuinit"]["own_line"]["source"] == "from jitkern import rmsnorm"
    text = unwrapped(render_run(result))
    assert f"your code reaches it at: {script}:2 in <module>" in text
    assert "CUDA initialized at: " in text
    assert "line to change: none verified (no cut was searched: diagtools fix jitkern verifies one)" in text
    shared = run_html(result)
    assert "serve.py:2" in shared
    assert ".cache/diagtools" not in shared  # a fragment to paste names no machine's driver cache
    assert os.path.expanduser("~") + "/" not in shared
