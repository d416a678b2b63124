"""A rerun on the same journal rescans only what changed: a file a row depends on, or the environment."""

from __future__ import annotations

import json
import shutil

import pytest

from diagtools.frontends.cli import main as cli_main
from diagtools.usecases.sweep import sweep
from diagtools.usecases.sweep_forked import ADAPT_MIN_MODULES
from tests.conftest import sweep_verdicts as verdicts

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
LEAVES = ADAPT_MIN_MODULES + 4  # enough for the first run to learn its preload


@pytest.fixture
def inc(make_tree):
    files = {
        "inc/__init__.py": "",
        "inc/common.py": "TABLE = {n: n for n in range(100)}\n",
        "inc/gpu.py": CUINIT,
        "inc/models/__init__.py": "import inc.common\n",
        **{f"inc/models/m{n}.py": "import inc.common\nVALUE = 1\n" for n in range(6)},
        "inc/other/__init__.py": "",
        **{f"inc/other/x{n:03}.py": "import inc.common\nVALUE = 2\n" for n in range(LEAVES)},
        "inc-1.0.dist-info/RECORD": "inc/__init__.py,sha256=abc,0\n",
        "extra-2.0.dist-info/RECORD": "extra/__init__.py,sha256=abc,0\n",
    }
    return make_tree(files)


def run(root, journal, **options):
    return sweep("inc", path=[root], driver="simulated", jobs=2, timeout=30, json_path=journal, **options)


def test_an_edit_rescans_exactly_the_rows_that_depend_on_it(inc, tmp_path):
    """The incremental rows are a full sweep's, the edited package's rows are rescanned with their reason, the
    rest reused, the learned preload reused without learning again, and a removed module's row dropped."""
    journal = tmp_path / "main.jsonl"
    first = run(inc, journal)
    assert first.rescanned == {}
    assert "inc.common" in first.preload, first.preload_notes  # learned on the first run
    (inc / "inc" / "models" / "__init__.py").write_text("import inc.common\nimport inc.gpu\n")
    (inc / "inc" / "other" / "x000.py").unlink()
    (inc / "inc" / "other" / "new.py").write_text("VALUE = 3\n")
    stages = []
    again = run(inc, journal, stage=stages.append)
    full = run(inc, tmp_path / "full.jsonl")
    assert verdicts(again) == verdicts(full)
    models = {"inc.models", *(f"inc.models.m{n}" for n in range(6))}
    assert again.rescanned == {
        **dict.fromkeys(models, "inc/models/__init__.py changed"),
        "inc.other.new": "it was not in the journal",
    }
    assert again.resumed == len(full.rows) - len(again.rescanned)
    assert "inc.other.x000" not in {row.module for row in again.rows}
    assert all(again.row(m).cuda_initialized for m in models)
    assert any("the journal's last run learned to preload" in note for note in again.preload_notes), again.preload
    assert "inc.common" in again.preload
    assert not any(stage.startswith("learning") for stage in stages), stages
    text = str(again)
    assert f"journal: reused {again.resumed} row(s), rescanned 8: 7 because inc/models/__init__.py changed; " in text


def test_a_changed_distribution_rescans_every_row_but_the_swept_ones_own_does_not(inc, tmp_path):
    journal = tmp_path / "sweep.jsonl"
    first = run(inc, journal, adapt=False)
    (inc / "inc-1.0.dist-info" / "RECORD").write_text("inc/__init__.py,sha256=def,0\n")  # reinstalled itself
    same = run(inc, journal, adapt=False)
    assert same.resumed == len(first.rows)
    assert same.rescanned == {}
    (inc / "extra-2.0.dist-info" / "RECORD").write_text("extra/__init__.py,sha256=def,0\n")
    again = run(inc, journal, adapt=False)
    assert again.resumed == 0
    assert set(again.rescanned.values()) == {"installed distributions changed: extra 2.0 reinstalled"}
    assert verdicts(again) == verdicts(first)
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sum("environment" in line for line in lines) == 2  # written again only when it changed


def test_the_cli_reruns_on_a_copy_of_mains_journal_and_fails_only_on_a_new_cause(inc, tmp_path, capsys):
    """On a pull request: the journal of main copied, the edited checkout swept against it, ``--baseline``
    the main sweep's summary: exit 1 for the root cause the edit brings in, with its reason on the line."""
    base, summary = tmp_path / "main.jsonl", tmp_path / "main.json"
    args = ["sweep", "inc", "--path", str(inc), "--driver", "simulated", "--jobs", "2", "--no-adapt"]
    assert cli_main([*args, "--json", str(base), "--summary", str(summary)]) == 0
    copy = tmp_path / "pr.jsonl"
    shutil.copy(base, copy)
    assert cli_main([*args, "--json", str(copy), "--baseline", str(summary)]) == 0  # nothing changed
    (inc / "inc" / "models" / "m0.py").write_text(CUINIT)  # a new initializer: a new root cause
    capsys.readouterr()
    assert cli_main([*args, "--json", str(copy), "--baseline", str(summary)]) == 1
    out = capsys.readouterr().out
    assert "rescanned 1: 1 because inc/models/m0.py changed" in out


def config_learned(make_tree, journal, extra=None):
    """A package whose leaves all import ``inc.config``, which imports the library ``extlib`` (outside it),
    swept once into ``journal``: the run learns ``inc.config``.  Its root."""
    files = {
        "extlib/__init__.py": "VALUE = 1\n",
        "inc/__init__.py": "",
        "inc/config.py": "import extlib\nSETTINGS = {}\n",
        "inc/leaves/__init__.py": "",
        **{f"inc/leaves/x{n:03}.py": "import inc.config\n" for n in range(LEAVES)},
        **(extra or {}),
    }
    root = make_tree(files)
    first = run(root, journal)
    assert "inc.config" in first.preload, first.preload_notes
    return root


def test_a_remembered_preload_is_tried_again_even_when_its_row_is_kept(make_tree, tmp_path):
    """``inc.config`` was learned clean; since then a library it imports (outside the package, so its row is
    kept) puts a folder on ``sys.path``.  The rerun tries it again before preloading it, passes it over, and
    the rescanned row that would only import with that folder on the path fails, as a fresh subkernel's."""
    journal = tmp_path / "sweep.jsonl"
    root = config_learned(make_tree, journal, {"vendored/hidden.py": "VALUE = 1\n", "inc/late.py": "VALUE = 0\n"})
    (root / "extlib" / "__init__.py").write_text(f"import sys\nsys.path.insert(0, {str(root / 'vendored')!r})\n")
    (root / "inc" / "late.py").write_text("import hidden\n")
    again = run(root, journal)
    assert again.rescanned == {"inc.late": "inc/late.py changed"}
    assert "inc.config" not in again.preload, again.preload_notes
    assert any(note.startswith("inc.config (not preloaded: it puts") for note in again.preload_notes)
    assert again.row("inc.late").status == "import-error"


def test_a_remembered_preload_that_now_initializes_cuda_is_passed_over_and_the_zygote_goes_on(make_tree, tmp_path):
    """Since the first run, a library ``inc.config`` imports initializes CUDA at import.  The zygote goes back
    to the copy of itself it forked before that import: the candidate is passed over, nothing is refused, no
    module falls back to a fresh subkernel, and every row is given once."""
    journal = tmp_path / "sweep.jsonl"
    root = config_learned(make_tree, journal)
    (root / "extlib" / "__init__.py").write_text(CUINIT)
    (root / "inc" / "leaves" / "__init__.py").write_text("# edited: every leaf is rescanned\n")
    seen: list[str] = []
    again = run(root, journal, progress=lambda done, total, row: seen.append(row.module))
    assert "inc.config" not in again.preload, again.preload_notes
    assert "inc.config (not preloaded: its import initialized CUDA)" in again.preload_notes, again.preload_notes
    assert again.mode == "zygote"
    assert not again.fallback, again.fallback
    assert all(row.mode == "zygote" for row in again.rows)
    assert sorted(seen) == sorted(set(seen))
    assert again.row("inc.leaves.x000").cuda_initialized
    # a kept row is the journal's (a folder on the path is no distribution); a rescanned one shows the change
    assert ("inc.config" in again.rescanned) == (again.row("inc.config").culprit is not None)
