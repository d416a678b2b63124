"""The main job: specimens scanned, notebooks executed, the report written, where to look printed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from diagtools.frontends.demo import NOTEBOOKS, write_demo_report
from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[2]


def test_demo_cli_writes_the_specimen_report(tmp_path):
    earlier = tmp_path / "report"
    (earlier / "notebooks").mkdir(parents=True)
    for stale in ("postmortem.html", "postmortem.md", "notebooks/04_postmortem.html"):
        (earlier / stale).write_text("an earlier demo's page\n")
    (earlier / "notes.txt").write_text("the user's own file\n")
    done = cli("demo", "--out", str(tmp_path / "report"), "--driver", "simulated", "--no-notebooks")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # lines wrap at 100 columns between words
    assert "[ok ] common_ops/before: initializes-cuda: vmodels.platforms; line to change diagtools/" in said
    assert "before/vmodels/common/ops/__init__.py:3" in said  # the nearest verified cut
    assert "[ok ] lazy_clean/after: clean: CUDA not initialized" in said
    assert max(len(line) for line in done.stdout.splitlines()) <= 100
    assert f"report written to {tmp_path / 'report' / 'index.html'}" in done.stdout
    shared = (tmp_path / "report" / "specimens.json").read_text()
    scans = json.loads(shared)
    assert scans["common_ops/before"]["culprits"][0]["module"] == "vmodels.platforms"
    assert str(ROOT) not in shared  # meant for sharing
    assert os.path.expanduser("~") + "/" not in shared
    assert scans["common_ops/before"]["driver"]["library"] is None
    # one demo, one report: nothing an earlier demo wrote is left beside it, nothing else is touched
    assert not (earlier / "postmortem.html").exists()
    assert not (earlier / "notebooks" / "04_postmortem.html").exists()
    assert "postmortem" not in (earlier / "index.html").read_text()
    assert (earlier / "notes.txt").read_text() == "the user's own file\n"
    assert not scans["common_ops/after"]["cuda_initialized"]


def test_each_specimens_line_is_said_as_its_scan_ends(tmp_path):
    """The summary comes piece by piece, in the order it is printed at the end: the driver with the first scan,
    each specimen's line before the next scan starts."""
    from diagtools.usecases.scan import scan

    heard: list[str] = []

    def run(*args, **kwargs):
        heard.append("scan")
        return scan(*args, **kwargs)

    report = write_demo_report(tmp_path / "report", driver="simulated", notebooks=None, run=run, said=heard.extend)
    assert heard[0] == "scan"
    assert heard[1].startswith("driver: simulated driver")
    said = [line for line in heard if line != "scan"]
    assert "\n".join(said) == report.summary
    first_line = next(n for n, line in enumerate(heard) if line.startswith("  [ok ] "))
    assert heard.index("scan", first_line) > first_line  # told before the second scan began
    assert heard.count("scan") == len(report.outcomes)


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


def _wheel_install(tmp_path: Path) -> Path:
    """Build the project's wheel from a copy of the checkout and unpack it: an installed package, no repository."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "diagtools", source / "diagtools", ignore=ignore)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("diagtools-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_a_wheel_install_runs_the_demo_and_says_where_the_notebooks_are(tmp_path):
    site = _wheel_install(tmp_path)
    assert (site / "diagtools" / "driver" / "simcuda.c").exists()  # the driver builds from the package data
    assert not (site / "notebooks").exists()
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "diagtools.frontends.cli", "demo", "--driver", "simulated", "--out", "report"],
        cwd=work,
        env=dict(os.environ, PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"diagtools{os.sep}frontends" not in done.stderr
    assert f"note: no notebooks at {site / 'notebooks'}: they ship in the source repository's notebooks/" in (
        done.stdout
    )
    assert "[ok ] common_ops/before" in done.stdout


def test_demo_with_a_notebooks_folder_that_does_not_exist_is_a_usage_error(tmp_path):
    done = cli("demo", "--out", str(tmp_path / "report"), "--notebooks", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"--notebooks {str(tmp_path / 'nope')!r} is not a directory")
    assert "Traceback" not in done.stderr
