"""Every notebook runs top to bottom on this machine, headless, on the simulated driver."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from tests.conftest import require

require("nbclient", "notebook")

from diagtools.frontends.demo import NOTEBOOKS, run_notebook  # noqa: E402

NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))
EXPECTED = {
    "00_onboarding": ["deepseek_v4_ops", "this process: libcuda not loaded"],
    "01_root_cause": [
        'class="node culprit"',
        "vmodels.platforms",
        "driver.cuInit(0)",
        "no longer initializes CUDA",
        "line to change: diagtools/specimens/common_ops/before/vmodels/common/ops/__init__.py:3 (the nearest verified",
        "CUDA initialized at: diagtools/specimens/common_ops/before/vmodels/platforms.py:8 in vmodels.platforms",
        "from .fused_allreduce_rms_norm import fused_allreduce_rms_norm (the regression edge)",
        "verified",
        "test_vmodels_common_ops_cuda_free.py",
        "cuda.*</del>: 47 modules",
    ],
    "02_fork_replay": [
        "CUDA_ERROR_NOT_INITIALIZED",
        "Reproduced: before/fork fails; fixed: after passes fork and spawn",
        "Fork: pid",
    ],
    "03_kernels_after_fix": [
        "compress_norm_rope_store",
        "does not initialize CUDA",
        "faithful variant, CPU",
        "C128     triton",
    ],
    "04_postmortem": ["postmortem.html", "Regression guard", "How to fix", "def test_importing_vmodels_common_ops"],
}


ROOT = NOTEBOOKS.parent
# the line to change (its whole path on hover), then, under its row, the source line it names
SHOWN_LINE = re.compile(
    r'title="(diagtools/specimens/[^"]+?):(\d+)">(?:(?!</tr>).)*</tr>'
    r'<tr class="dt-under"><td[^>]*><span class="dt-label">source:</span> <code class="dt-line">([^<]*)</code>'
)


def assert_lines_are_the_specimens_own(text: str) -> None:
    """Each line the specimen table shows is a line of the specimen's own file, with the text shown beside it."""
    shown = SHOWN_LINE.findall(text)
    assert len(shown) >= 3, text[:3000]
    for path, number, source in shown:
        lines = (ROOT / path).read_text().splitlines()
        assert lines[int(number) - 1].strip() == html.unescape(source), (path, number, source)


def outputs_text(notebook: Path) -> str:
    document = json.loads(notebook.read_text())
    parts = []
    for cell in document["cells"]:
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            for value in output.get("data", {}).values():
                parts.append("".join(value) if isinstance(value, list) else str(value))
    return "\n".join(parts)


def _files_under(folder: Path) -> dict[str, int]:
    """Each file under ``folder`` with its modification time: what a notebook run must leave as it was."""
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def test_all_five_notebooks_exist():
    assert [p.stem for p in NOTEBOOK_FILES] == sorted(EXPECTED)


@pytest.mark.parametrize("source", NOTEBOOK_FILES, ids=[p.stem for p in NOTEBOOK_FILES])
def test_notebook_executes_and_shows_its_findings(source, tmp_path, monkeypatch):
    parameters = {"DRIVER": "simulated", "OUT_DIR": str(tmp_path / "out")}
    if source.stem == "04_postmortem":  # with no folder chosen it writes into a new temporary one, never the checkout
        monkeypatch.setenv("TMPDIR", str(tmp_path / "temporary"))
        (tmp_path / "temporary").mkdir()
        parameters.pop("OUT_DIR")
    checkout_report = _files_under(ROOT / "build" / "report")
    outcome = run_notebook(source, tmp_path / "executed", parameters)
    assert _files_under(ROOT / "build" / "report") == checkout_report
    assert outcome.error == "", outcome.error
    text = outputs_text(tmp_path / "executed" / source.name)
    for expected in EXPECTED[source.stem]:
        assert expected in text, expected
    exported = outcome.html.read_text()
    assert exported.startswith("<!DOCTYPE html>")
    assert "widget-state+json" not in exported  # no widget script to fetch: the static results read offline
    for wrong in ("VBox(", "press the button", "replay_child.py", "^^^^", str(ROOT)):
        assert wrong not in text, wrong
    if source.stem != "01_root_cause":  # each long cell leaves what it did and how long it took
        assert re.search(r": done in \d+\.\d s", text), "no long cell says what it did"
    if source.stem == "00_onboarding":
        assert_lines_are_the_specimens_own(text)
    if source.stem == "04_postmortem":
        (written,) = (tmp_path / "temporary").glob("diagtools-postmortem-*")
        assert f"{written}/postmortem.html" in text  # the notebook says where it went
        page = (written / "postmortem.html").read_text()
        for section in (
            "Summary",
            "How to fix",
            "Timeline of the analysis",
            "Root cause",
            "Replay",
            "The fix",
            "Kernel timing after the fix",
            "Regression guard",
        ):
            assert f"<h2>{section}</h2>" in page
        assert 'class="node culprit"' in page
        markdown = (written / "postmortem.md").read_text()
        assert "assert_import_cuda_free('vmodels.common.ops')" in markdown
        assert "![" not in markdown  # the graph is the Mermaid block; the SVG is named beside it
        assert (written / "postmortem-graph.svg").exists()
