"""The IPython magics in a real InteractiveShell: the work runs elsewhere, the shell stays CUDA-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diagtools.render.paths import shareable
from diagtools.specimens import get
from diagtools.usecases.selfcheck import process_cuda_state
from tests.conftest import MARK, require

CELL = f"""
import ctypes
import multiprocessing as mp

def child():
    pass

ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}
worker = mp.get_context("fork").Process(target=child)
worker.start()
worker.join()
print("joined", worker.exitcode)
"""
CELL_LINE = next(number for number, line in enumerate(CELL.splitlines(), start=1) if MARK in line)


@pytest.fixture(scope="module")
def shell():
    interactiveshell = require("IPython.core.interactiveshell", "notebook")
    ip = interactiveshell.InteractiveShell.instance()
    ip.run_line_magic("load_ext", "diagtools")
    yield ip
    interactiveshell.InteractiveShell.clear_instance()


def test_cuda_watch_names_the_cell_line_and_the_poisoned_fork(shell, capsys):
    result = shell.run_cell_magic("cuda_watch", "--driver simulated --timeout 60", CELL)
    assert "joined 0" in capsys.readouterr().out
    assert result.verdict == "poisoned-fork"
    finding = result.findings[0]
    assert finding.cuinit.module == "__main__"
    # numbered as the notebook shows the cell: the %%cuda_watch line is line 1
    assert finding.cuinit.module_site.line == CELL_LINE + 1
    assert finding.cuinit.module_site.file == f"In[{shell.execution_count}]"
    assert "diagtools-cell-" not in str(result)
    assert "diagtools-cell-" not in result._repr_html_()
    assert any(frame.source == "worker.start()" for frame in finding.fork_stack)
    assert "verdict: POISONED FORK" in result._repr_html_()
    assert shell.display_formatter.format(result)[0]["text/plain"].startswith("diagtools run:")
    assert process_cuda_state().clean


def test_cuda_watch_names_the_cell_by_its_prompt_number(shell):
    cell = '%%cuda_watch --driver simulated --timeout 60\nimport ctypes\nctypes.CDLL("libcuda.so.1").cuInit(0)\n'
    executed = shell.run_cell(cell, store_history=True)
    site = executed.result.findings[0].cuinit.module_site
    assert (site.file, site.line) == (f"In[{executed.execution_count}]", 3)  # as the notebook numbers it


def test_cuda_scan_renders_a_scan(shell, make_tree):
    root = make_tree({"early.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"})
    result = shell.run_line_magic("cuda_scan", f"early --path {root} --driver simulated")
    assert result.culprit.module == "early"
    plain = shell.display_formatter.format(result)[0]["text/plain"]
    # the text report, not an 18,000-character dataclass repr, with the paths a saved notebook may keep
    assert plain == str(shareable(result))
    assert str(root) not in plain
    assert plain.startswith("diagtools scan early")
    assert process_cuda_state().clean


def test_cuda_scan_shows_where_to_cut(shell):
    specimen = get("common_ops")
    where = f"{specimen.target} --path {specimen.tree('before')} --driver simulated"
    html = shell.run_line_magic("cuda_scan", where)._repr_html_()
    assert "<b>Where to cut</b>" in html
    assert "<b>Line to change</b> (the nearest verified cut)" in html
    assert shell.run_line_magic("cuda_scan", f"{where} --no-cuts").cuts is None


def test_bad_driver_is_reported_not_raised(shell, capsys):
    assert shell.run_cell_magic("cuda_watch", "--timeout -1", "print(1)") is None
    assert "diagtools: error: --timeout must be finite, positive" in capsys.readouterr().err


def test_import_diagtools_does_not_import_ipython():
    code = "import sys, diagtools\nprint('IPython' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_cuda_watch_leaves_the_cells_own_output_as_the_cell_printed_it(shell, capsys):
    cell = "import sys\nprint(sys.executable)\nprint(sys.executable, file=sys.stderr)\n"
    result = shell.run_cell_magic("cuda_watch", "--driver simulated --timeout 60", cell)
    captured = capsys.readouterr()
    assert captured.out == sys.executable + "\n"
    assert captured.err == sys.executable + "\n"
    assert result.stdout == sys.executable + "\n"
    assert result.command[0] == "python"  # diagtools' own report still names the interpreter shortly
    cell = f"In[{shell.execution_count}]"
    assert result.cell == cell
    assert str(result).startswith(f"diagtools run: cell {cell}\n")  # the cell, as the notebook names it
    assert f"cell {cell}" in result._repr_html_()


def test_cuda_watch_names_the_cell_line_that_imported_the_initializing_module(shell, make_tree, monkeypatch):
    root = make_tree({"registry.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"})
    monkeypatch.chdir(root)  # the kernel's working directory is importable, as in a notebook
    result = shell.run_cell_magic("cuda_watch", "--driver simulated --timeout 60", "import os\nimport registry\n")
    culprit = result.findings[0].cuinit
    assert culprit.module == "registry"
    cell = f"In[{shell.execution_count}]"
    assert [(i, site.file, site.line, site.source) for i, site in enumerate(culprit.chain_imports) if site] == [
        (1, cell, 3, "import registry")
    ]
    assert f"__main__ -> registry: {cell}:3  import registry" in str(result)
    assert f'title="{cell}:3">{cell}:3</code>' in result._repr_html_()  # the cell line, as the path of its site
