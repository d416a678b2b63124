"""The main job: specimens scanned, notebooks executed, the report written, where to look printed."""

from __future__ import annotations

import json
import shutil

from diagtools.frontends.demo import NOTEBOOKS, write_demo_report
from tests.conftest import cli


def test_demo_cli_writes_the_specimen_report(tmp_path):
    done = cli("demo", "--out", str(tmp_path / "report"), "--driver", "simulated", "--no-notebooks")
    assert done.returncode == 0, done.stderr
    assert "[ok ] common_ops/before: initializes-cuda: vmodels.platforms at " in done.stdout
    assert "[ok ] lazy_clean/after: clean: CUDA not initialized" in done.stdout
    assert f"report written to {tmp_path / 'report' / 'index.html'}" in done.stdout
    scans = json.loads((tmp_path / "report" / "specimens.json").read_text())
    assert scans["common_ops/before"]["culprits"][0]["module"] == "vmodels.platforms"
    assert not scans["common_ops/after"]["cuda_initialized"]


def test_demo_executes_notebooks_into_the_report(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy(NOTEBOOKS / "00_onboarding.ipynb", notebooks)
    report = write_demo_report(tmp_path / "report", driver="simulated", notebooks=notebooks)
    assert report.as_expected, report.summary
    assert (tmp_path / "report" / "notebooks" / "00_onboarding.html").exists()
    assert 'href="notebooks/00_onboarding.html"' in report.index.read_text()


def test_demo_reports_a_failing_notebook(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    broken = json.loads((NOTEBOOKS / "00_onboarding.ipynb").read_text())
    broken["cells"].append(
        {
            "cell_type": "code",
            "id": "broken-cell",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "raise RuntimeError('broken cell')",
        }
    )
    (notebooks / "99_broken.ipynb").write_text(json.dumps(broken))
    report = write_demo_report(tmp_path / "report", driver="simulated", notebooks=notebooks)
    assert not report.as_expected
    assert "notebook 99_broken: FAILED" in report.summary
    assert "broken cell" in report.summary
