"""Where to cut, verified by running the code: the headline line to change is a line the fix changes.

Real subkernels on the simulated driver: every cut is checked by scanning the
target again with its statements deferred, and every patch by applying it
(``git apply``) to a copy of the tree and scanning that copy.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import diagtools
from diagtools.driver import resolve_driver
from diagtools.model.cuts import Outcome
from diagtools.model.diff import diff_scans
from diagtools.model.fix import FixResult
from diagtools.model.verdict import Verdict
from diagtools.specimens import all_specimens, get
from diagtools.usecases.fix import fix
from tests.conftest import cli, require_installed

LEAF = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n\ndef kernel():\n    pass\n"  # initializes CUDA
FIXED = [s for s in all_specimens() if set(s.variants) == {"before", "after"}]
NEEDS = {"deepseek_v4_ops": "cutlass", "triton_is_active": "triton"}  # the kernels extra's packages


def needs(specimen) -> None:
    if specimen.name in NEEDS:
        require_installed(NEEDS[specimen.name], "kernels")


def changed_lines(before: Path, after: Path) -> set[int]:
    """The line numbers of ``before`` that ``after`` removed or rewrote (all of them when ``after`` is gone)."""
    old = before.read_text().splitlines()
    if not after.exists():
        return set(range(1, len(old) + 1))
    kept: set[int] = set()
    for block in difflib.SequenceMatcher(a=old, b=after.read_text().splitlines()).get_matching_blocks():
        kept.update(range(block.a + 1, block.a + block.size + 1))
    return set(range(1, len(old) + 1)) - kept


@pytest.mark.parametrize("specimen", FIXED, ids=[s.name for s in FIXED])
def test_the_diff_headlines_a_line_the_fix_changed(sim_scan, specimen):
    needs(specimen)
    before = sim_scan(specimen.target, path=[specimen.tree("before")], cuts=False)
    after = sim_scan(specimen.target, path=[specimen.tree("after")])
    diff = diff_scans(before, after)
    line = diff.headline.line
    assert diff.headline.rule == "regression-edge"
    relative = Path(line.file).relative_to(specimen.tree("before"))
    assert line.line in changed_lines(Path(line.file), specimen.tree("after") / relative), (relative, line)
    assert line.source in Path(line.file).read_text().splitlines()[line.line - 1]


def apply_patch(result: FixResult, tree: Path, tmp_path: Path) -> Path:
    """A copy of ``tree`` (a fresh git repository) with the patch applied by ``git apply``."""
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    patch = tmp_path / "fix.patch"
    patch.write_text(result.patch.replace(os.path.relpath(tree, result.root) + "/", ""))
    done = subprocess.run(["git", "-C", str(copy), "apply", str(patch)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return copy


def resolve_in_subprocess(copy: Path, module: str, names: tuple[str, ...]) -> str:
    """``from module import name`` for each name, in a fresh interpreter on the simulated driver."""
    code = (
        f"import {module} as m\nfor n in {names!r}:\n    getattr(__import__({module!r}, fromlist=[n]), n)\nprint('ok')"
    )
    env = {**os.environ, **resolve_driver("simulated").env, "PYTHONPATH": str(copy)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    return done.stdout.strip() or done.stderr


@pytest.mark.parametrize("specimen", FIXED, ids=[s.name for s in FIXED])
def test_a_bare_scan_headlines_a_verified_cut_whose_patch_applies_and_scans_clean(sim_scan, specimen, tmp_path):
    needs(specimen)
    result = fix(specimen.target, path=[specimen.tree("before")], driver="simulated")
    scan = result.scan
    assert scan.headline.rule == "nearest-cut"
    assert scan.line_to_change == result.cut.edges[0].site
    assert result.verified, (result.check, result.reason)
    copy = apply_patch(result, specimen.tree("before"), tmp_path)
    patched = sim_scan(specimen.target, path=[copy])
    assert patched.verdict == Verdict.CLEAN
    names = tuple(name for change in result.changes for name in change.lazy)
    assert names
    assert resolve_in_subprocess(copy, specimen.target, names) == "ok"


@pytest.mark.parametrize("name", ["common_ops", "deepseek_v4_ops"])
def test_the_seed_shaped_specimens_headline_the_reexport_as_the_seeds_did(sim_scan, name):
    specimen = get(name)
    needs(specimen)
    scan = sim_scan(specimen.target, path=[specimen.tree("before")])
    line = scan.line_to_change
    assert line.file.endswith("ops/__init__.py")
    assert line.source.startswith("from .")
    edges = scan.cuts.nearest.edges
    assert all(edge.site.file == line.file for edge in edges)
    assert len(edges) == (2 if name == "deepseek_v4_ops" else 1)  # DeepSeek-V4 re-exports two CuTe DSL modules
    assert scan.cuts.nearest.verified == Outcome.CLEAN


@pytest.mark.parametrize(
    ("parent", "cut"),
    [
        ("from . import ops  # noqa: F401\n", ["pk.models.ops"]),  # the parent only imports the package
        ("from .ops import kernel  # noqa: F401\n", ["pk.models", "pk.models.ops"]),  # it pulls the lazy name
    ],
    ids=["parent-not-needed", "parent-needed"],
)
def test_a_parent_packages_edge_is_in_the_cut_only_when_the_target_needs_it(sim_scan, make_tree, parent, cut):
    root = make_tree(
        {
            "pk/__init__.py": "",
            "pk/models/__init__.py": parent,
            "pk/models/ops/__init__.py": "from .leaf import kernel\n",
            "pk/models/ops/leaf.py": LEAF,
        }
    )
    scan = sim_scan("pk.models.ops", path=[root])
    assert scan.culprit.chain[0] == "pk.models"  # the parent's import is on the chain
    assert sorted(e.importer for e in scan.cuts.nearest.edges) == cut
    assert scan.cuts.nearest.verified == Outcome.CLEAN


def test_a_deferral_that_breaks_the_import_is_named_and_the_next_edge_is_cut(sim_scan, make_tree):
    root = make_tree(
        {
            "br/__init__.py": "from . import user  # noqa: F401\n",
            "br/user.py": "from br.mid import kernel  # noqa: F401\n",
            "br/mid.py": "from br.leaf import kernel\n\n\ndef run():\n    return kernel()\n",
            "br/leaf.py": LEAF,
        }
    )
    scan = sim_scan("br", path=[root])
    broke = [t for t in scan.cuts.tries if t.outcome == Outcome.BREAKS]
    assert broke, scan.cuts.tries
    assert "ImportError" in broke[0].reason
    assert broke[0].at is not None
    assert broke[0].at.file.endswith("br/user.py")
    assert scan.cuts.nearest is not None
    assert all(e.site.file.endswith(("br/__init__.py", "br/user.py")) for e in scan.cuts.nearest.edges)


def test_a_deferred_import_still_run_at_import_time_is_not_taken_for_a_cut(sim_scan, make_tree):
    root = make_tree(
        {
            "st/__init__.py": "",
            "st/mid.py": "from st.leaf import kernel\n\n\ndef load():\n    return kernel()\n\n\nVALUE = load()\n",
            "st/leaf.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n\ndef kernel():\n    return 1\n",
        }
    )
    scan = sim_scan("st.mid", path=[root])  # mid's import of leaf moves into load(), which mid calls at import
    assert scan.cuts.nearest is None
    assert all(t.outcome != Outcome.CLEAN for t in scan.cuts.tries)
    assert scan.line_to_change is None
    assert scan.headline.reason.startswith("no verified cut")


def test_a_culprit_whose_own_code_initializes_cuda_has_no_import_to_cut(sim_scan, make_tree):
    root = make_tree({"own.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"})
    scan = sim_scan("own", path=[root])
    assert scan.cuts.nearest is None
    assert "own top-level code initializes CUDA" in scan.cuts.reason
    assert "make that call lazy" in str(scan)


def test_fix_cli_writes_the_patch_and_a_guard_that_fails_before_and_passes_after(tmp_path):
    specimen = get("common_ops")
    out = tmp_path / "out" / "fix.patch"
    out.parent.mkdir()
    done = cli(
        "fix", specimen.target, "--path", str(specimen.tree("before")), "--driver", "simulated", "--write", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert "check on a temporary copy: passed" in done.stdout
    assert "deepseek_v32/model.py:3  from vmodels.common.ops import fused_allreduce_rms_norm" in done.stdout
    assert f"patch written to {out}" in done.stdout
    guard = out.parent / "test_vmodels_common_ops_cuda_free.py"
    assert "assert_import_cuda_free('vmodels.common.ops')" in guard.read_text()
    result = FixResult.from_json(fix(specimen.target, path=[specimen.tree("before")], driver="simulated").to_json())
    copy = apply_patch(result, specimen.tree("before"), tmp_path)
    for tree, expected in ((specimen.tree("before"), 1), (copy, 0)):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(guard)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
        )  # fmt: skip
        assert ran.returncode == expected, ran.stdout[-3000:]
    assert "line to change" in ran.stdout or expected == 0


def test_fix_on_a_clean_target_says_there_is_nothing_to_fix():
    specimen = get("common_ops")
    done = cli("fix", specimen.target, "--path", str(specimen.tree("after")), "--driver", "simulated")
    assert done.returncode == 0, done.stderr
    assert "no patch: nothing to fix: importing it leaves CUDA uninitialized" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_fix_never_writes_into_a_read_only_tree(tmp_path):
    tree = tmp_path / "ro"
    shutil.copytree(get("common_ops").tree("before"), tree)
    contents = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    for path in [*tree.rglob("*"), tree]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        done = cli("fix", "vmodels.common.ops", "--path", str(tree), "--driver", "simulated")
        assert done.returncode == 0, done.stderr
        assert "+++ b/vmodels/common/ops/__init__.py" in done.stdout  # printed, never written
        assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file() and "__pycache__" not in str(p)} == contents
    finally:
        for path in [tree, *tree.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_fix_with_a_bad_sweep_journal_is_a_one_line_error(tmp_path):
    bad = tmp_path / "j.jsonl"
    bad.write_text("not json\n")
    done = cli("fix", "vmodels.common.ops", "--sweep", str(bad), "--driver", "simulated")
    assert done.returncode == 2
    assert done.stderr.startswith("diagtools: error: the sweep ")
    assert "Traceback" not in done.stderr


def test_sweep_cuts_give_each_root_cause_its_verified_line_and_reach(make_tree):
    root = make_tree(
        {
            "sw/__init__.py": "",
            "sw/ops/__init__.py": "from .leaf import kernel\n",
            "sw/ops/leaf.py": LEAF,
            "sw/user.py": "from sw.ops import kernel  # noqa: F401\n",
        }
    )
    result = diagtools.sweep("sw", path=[root], driver="simulated", jobs=1, fresh=True, cuts=True)
    (cause,) = result.causes
    assert cause.headline.line is not None
    assert cause.cuts.nearest.reach is not None
    assert cause.cuts.nearest.reach >= 2
    text = str(result)
    assert "line to change (the nearest verified cut, on " in text
    assert "sw/ops/__init__.py:1" in text
