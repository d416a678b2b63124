"""Adaptive preload: learn from the first children what most of them import, preload it, same rows."""

from __future__ import annotations

import json
import os
import re
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest

from diagtools.model.sweep import SweepRow, cuda_source, rate_holds
from diagtools.usecases.scan import scan
from diagtools.usecases.sweep import sweep
from diagtools.usecases.sweep_forked import ADAPT_MIN_MODULES, ADAPT_SAMPLE

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
LEAVES = ADAPT_MIN_MODULES + 10


@pytest.fixture
def shared_package(make_tree):
    files = {
        "ad/__init__.py": "",
        "ad/common.py": "import json\nTABLE = {n: n * n for n in range(1000)}\n",
        "ad/config.py": "import ad.common\nSETTINGS = dict(ad.common.TABLE)\n",
        "ad/gpu_a.py": "import ad.config\n" + CUINIT,
        "ad/gpu/__init__.py": "import ad.config\n" + CUINIT,
        "ad/gpu/leaf.py": "VALUE = 1\n",
        "ad/worker.py": "import ad.config, threading\n\ndef _run():\n    import ctypes\n"
        "    ctypes.CDLL('libcuda.so.1').cuInit(0)\n\n"
        "T = threading.Thread(target=_run, name='w')\nT.start()\nT.join()\n",
    }
    files.update({f"ad/leaves/m{n:03}.py": f"import ad.config\nVALUE = {n}\n" for n in range(LEAVES)})
    files["ad/leaves/__init__.py"] = ""
    return make_tree(files)


def verdict(row: SweepRow) -> tuple:
    culprit = row.culprit
    return (
        row.status,
        row.cuda_initialized,
        row.cuda_source,
        culprit.module if culprit else None,
        culprit.chain if culprit else None,
        culprit.own_line.line if culprit and culprit.own_line else None,
        culprit.thread if culprit else None,
        culprit.evidence if culprit else None,
    )


def test_adaptive_preload_learns_the_shared_modules_and_keeps_the_rows(shared_package):
    result = sweep("ad", path=[shared_package], driver="simulated", jobs=2, timeout=30)
    assert result.mode == "zygote", result.fallback
    assert result.preload[:1] == ("ad",)
    assert {"ad.common", "ad.config"} <= set(result.preload), result.preload_notes
    assert not {"ad.gpu", "ad.gpu_a", "ad.worker"} & set(result.preload)
    assert any(note.startswith("ad.config (+1 module it imports): imported by ") for note in result.preload_notes)
    assert "preload: ad.config (+1 module it imports): imported by" in str(result)
    assert result.to_json()["preload_notes"] == list(result.preload_notes)
    sample = ["ad.common", "ad.config", "ad.gpu_a", "ad.gpu", "ad.gpu.leaf", "ad.worker", "ad.leaves.m000"]
    sample += [f"ad.leaves.m{n:03}" for n in (7, 55, LEAVES - 1)]
    for module in sample:
        fresh = scan(module, path=[shared_package], driver="simulated", timeout=30)
        expected = SweepRow.from_scan(module, fresh, 0.0, 0.0)
        assert verdict(result.row(module)) == verdict(expected), module
        assert result.row(module).cuda_source == cuda_source(module, fresh)
    assert not result.row("ad.config").preloaded  # its own row came from a child, before it was preloaded
    assert len(result.rows) == LEAVES + 8


def test_no_adapt_keeps_the_preload_as_given(shared_package):
    result = sweep("ad", path=[shared_package], driver="simulated", jobs=2, timeout=30, adapt=False)
    assert result.preload == ("ad",)
    assert [note for note in result.preload_notes if "package(s) imported once" not in note] == []


def test_nothing_to_learn_costs_no_second_zygote(make_tree, monkeypatch):
    from diagtools.usecases import sweep_forked

    root = make_tree({"pl/__init__.py": "", **{f"pl/m{n:03}.py": f"VALUE = {n}\n" for n in range(LEAVES)}})
    started = []
    real = sweep_forked.run_zygote
    monkeypatch.setattr(sweep_forked, "run_zygote", lambda *a, **k: started.append(1) or real(*a, **k))
    stages = []
    result = sweep("pl", path=[root], driver="simulated", jobs=2, timeout=30, stage=stages.append)
    assert stages == [f"learning what to preload from {ADAPT_SAMPLE} sampled modules", "scanning"]
    assert len(started) == 1
    assert result.preload == ("pl",)
    # "pl" is sampled too; preloaded, it has no child to learn from
    assert result.preload_notes == (
        f"learned from {ADAPT_SAMPLE - 1} of {ADAPT_SAMPLE} sampled children: no module most of them import",
    )
    assert len(result.rows) == LEAVES + 1
    assert all(row.mode == "zygote" for row in result.rows)


def test_learning_stops_the_first_zygote_and_every_module_gets_one_row(shared_package, monkeypatch):
    from diagtools.usecases import sweep_forked

    started = []
    real = sweep_forked.run_zygote
    monkeypatch.setattr(sweep_forked, "run_zygote", lambda *a, **k: started.append(k["preload"]) or real(*a, **k))
    stages = []
    result = sweep("ad", path=[shared_package], driver="simulated", jobs=2, timeout=30, stage=stages.append)
    assert stages == [
        f"learning what to preload from {ADAPT_SAMPLE} sampled modules",
        f"checking {len(started[1]) - len(started[0])} learned preload(s)",
        "scanning",
    ]
    assert [rate_holds(stage) for stage in stages] == [False, False, True]  # a time left only once scanning
    assert len(started) == 2
    assert "ad.config" in started[1]
    assert len(result.rows) == LEAVES + 8
    assert {row.status for row in result.rows} == {"ok"}


FOUND_ALIAS = "try:\n    import {name}\nexcept ImportError:\n    FOUND = False\nelse:\n    FOUND = True\n"


@pytest.fixture
def side_effects(make_tree):
    """Candidates with side effects a fresh subkernel never sees (as on vLLM).

    ``fx.base`` imports ``fx.b``, which imports ``fx.a`` in the one order that works: ``fx.a`` alone
    fails on its circular import, as vLLM's ``flashinfer_utils`` does.  ``fx.vendor_path`` puts a
    folder on ``sys.path``, after which ``fx.uses_vendored`` imports, and ``fx.alias`` registers a
    module under another name, as vLLM registers its ``third_party/triton_kernels`` as ``triton_kernels``:
    ``fx.uses_alias`` looks that name up, and ``fx.apkg``'s import does, for
    ``fx.apkg.s1`` and ``s2``, which fail when it found the name (they never do in a fresh subkernel).
    ``fx.pkgc`` loads ``fx.m_util``, which fails on its own (it imports ``fx.pkgc`` back), so
    ``fx.user``, which imports it, fails in a fresh subkernel but not after ``fx.pkgc`` (vLLM's
    ``fused_moe``, ``flashinfer_utils`` and ``b12x_moe``); so does ``fx.user_attr``, which takes it
    from its package (``from fx import m_util``), while ``fx.user_after`` imports ``fx.pkgc`` first and
    never fails.
    """
    files = {
        "fx/__init__.py": "",
        "fx/base.py": "import fx.b\n",
        "fx/a.py": "from fx.b import B\nA = 1\n",
        "fx/b.py": "B = 2\nfrom fx.a import A\n",
        "fx/vendor_path.py": "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'lib'))\n",
        "fx/lib/vendored_mod.py": "VALUE = 1\n",
        "fx/uses_vendored.py": "import vendored_mod\n",
        "fx/alias.py": "import sys\nimport fx.a_target\nsys.modules['fx_alias'] = fx.a_target\n",
        "fx/a_target.py": "VALUE = 1\n",
        "fx/uses_alias.py": "import fx_alias\n",
        "fx/pkgc/__init__.py": "from fx.m_util import helper\n",
        "fx/pkgc/act.py": "X = 1\n",
        "fx/pkgc/more1.py": "from fx.pkgc import helper\n",  # below fx.pkgc, not loaded by its import
        "fx/pkgc/more2.py": "from fx.pkgc import helper\n",
        "fx/m_util.py": "from fx.pkgc.act import X\n\n\ndef helper():\n    return X\n",
        "fx/user.py": "import fx.m_util\n",
        "fx/user_attr.py": "from fx import m_util\n",
        "fx/user_after.py": "import fx.pkgc\nimport fx.m_util\nfrom fx import m_util\n"
        "assert fx.pkgc.__spec__.name == 'fx.pkgc' and fx.pkgc.__spec__.origin.endswith('__init__.py')\n",
        "fx/apkg/__init__.py": FOUND_ALIAS.format(name="fx_alias"),
        "fx/apkg/s1.py": "from fx.apkg import FOUND\nassert not FOUND\n",
        "fx/apkg/s2.py": "from fx.apkg import FOUND\nassert not FOUND\n",
        "fx/leaves/__init__.py": "",
    }
    leaf = "import fx.base, fx.vendor_path, fx.alias, fx.pkgc\n"
    files.update({f"fx/leaves/m{n:03}.py": leaf for n in range(LEAVES)})
    return make_tree(files)


def test_a_candidate_is_preloaded_only_after_the_rows_its_import_would_change(side_effects):
    """Every row is a fresh subkernel's: what a candidate loads is scanned before it is preloaded, and a
    candidate is passed over when it changes what every later import finds.  One that registers an alias
    is preloaded, and each row whose import looks that name up is scanned again fresh; so is one that
    loads a module that fails on its own, and each row that imports that module before the candidate
    (where a fresh subkernel would fail) is scanned again fresh."""
    options = {"path": [side_effects], "driver": "simulated", "jobs": 2, "timeout": 30, "exclude": ["fx.lib*"]}
    result = sweep("fx", **options)
    fresh = sweep("fx", fresh=True, **options)
    assert "fx.leaves" in result.preload, result.preload_notes
    assert "fx.vendor_path" not in result.preload
    notes = " ".join(result.preload_notes)
    assert "fx.alias" in result.preload, notes
    assert "fx.vendor_path: imported by" in notes
    assert "fx.alias (+1 module it imports): imported by" in notes
    assert f"(not preloaded: it puts {side_effects / 'fx' / 'lib'} on sys.path, which every later import" in notes
    watched = next((n for n in result.preload_notes if n.startswith("fx.alias: preloaded though")), notes)
    assert "its import registers a module as fx_alias; " in watched, watched
    assert " row(s) looked it up before fx.alias and were scanned in fresh subkernels: " in watched
    named = _rows_named(watched)  # fx.uses_alias too, unless sampled before fx.alias was preloaded
    assert "fx.apkg" in named, watched
    assert named <= {"fx.uses_alias", "fx.apkg", "fx.apkg.s1", "fx.apkg.s2"}, watched
    assert {row.module: row.status for row in result.rows if row.module.startswith("fx.apkg")} == dict.fromkeys(
        ("fx.apkg", "fx.apkg.s1", "fx.apkg.s2"), "ok"
    )
    assert {"fx.pkgc", "fx.base"} <= set(result.preload), notes
    guarded = next((n for n in result.preload_notes if n.startswith("fx.pkgc: preloaded though")), notes)
    assert "it loads fx.m_util, which fails to import on its own (" in guarded, guarded
    assert " row(s) imported it before fx.pkgc and were scanned in fresh subkernels: " in guarded, guarded
    assert _rows_named(guarded) <= {"fx.user", "fx.user_attr"}  # or sampled before fx.pkgc was preloaded
    assert "fx.user_after" not in guarded
    assert "fx.base: preloaded though it loads fx.a, which fails to import on its own (" in notes
    assert {row.module: verdict(row) for row in result.rows} == {row.module: verdict(row) for row in fresh.rows}
    statuses = {row.module: row.status for row in result.rows}
    assert statuses["fx.a"] == "import-error"  # its circular import, as alone in a fresh subkernel
    assert statuses["fx.uses_vendored"] == statuses["fx.uses_alias"] == "import-error"
    assert statuses["fx.m_util"] == statuses["fx.user"] == statuses["fx.user_attr"] == "import-error"
    assert statuses["fx.user_after"] == statuses["fx.pkgc.more1"] == "ok"
    assert not any(row.preloaded for row in result.rows if row.module in ("fx.a", "fx.b"))
    fresh_deps = {row.module: set(row.deps) for row in fresh.rows}
    missing = {row.module: sorted(fresh_deps[row.module] - set(row.deps)) for row in result.rows}
    assert not {module: files for module, files in missing.items() if files}  # the preload's files count too


def _rows_named(note: str) -> set[str]:
    """The rows a note names at its end (``...: a, b and 2 more``)."""
    return set(note.rpartition(": ")[2].replace(" and ", ", ").split(", ")) - {"1 more", "2 more", "3 more"}


def test_a_candidate_looking_up_an_alias_an_earlier_one_registered_is_passed_over(make_tree, monkeypatch):
    """``lk.looker`` finds ``lk_alias`` only because ``lk.reg``, preloaded before it, registered it: it is
    passed over.  Every row imports ``lk.reg`` before ``lk.looker`` looks the name up, as in a fresh
    subkernel, so none is scanned again."""
    from diagtools.usecases import sweep_forked

    monkeypatch.setattr(sweep_forked, "ADAPT_MIN_MODULES", 10)
    monkeypatch.setattr(sweep_forked, "ADAPT_SAMPLE", 6)
    files = {
        "lk/__init__.py": "",
        "lk/target.py": "VALUE = 1\n",
        "lk/reg.py": "import sys\nimport lk.target\nsys.modules['lk_alias'] = lk.target\n",
        "lk/looker.py": FOUND_ALIAS.format(name="lk_alias"),
        "lk/leaves/__init__.py": "",
    }
    files.update({f"lk/leaves/m{n}.py": "import lk.reg, lk.looker\nassert not lk.looker.FOUND\n" for n in range(8)})
    options = {"path": [make_tree(files)], "driver": "simulated", "jobs": 2, "timeout": 30}
    result = sweep("lk", **options)
    notes = " ".join(result.preload_notes)
    assert "lk.reg" in result.preload, notes
    assert "lk.looker" not in result.preload
    assert "(not preloaded: its import looks up lk_alias before lk.reg, which registered it)" in notes
    assert "lk.reg: preloaded though its import registers a module as lk_alias; 0 row(s) looked it up before" in notes
    fresh = sweep("lk", fresh=True, **options)
    assert {row.module: verdict(row) for row in result.rows} == {row.module: verdict(row) for row in fresh.rows}
    assert {row.status for row in result.rows if row.module.startswith("lk.leaves.")} == {"import-error"}


@pytest.fixture
def slow_library(make_tree):
    """A package whose modules all import a slow library outside it that changes what later imports see,
    as transformers adds a finder to ``sys.meta_path`` and torch's compiler sets an environment variable;
    ``lb.config``, a candidate, imports it too.  ``quicklib`` is imported by every module as well but costs
    nothing, so it is not worth a preload."""
    files = {
        "slowlib/__init__.py": "import os, sys, time\ntime.sleep(0.3)\n"
        "class Finder:\n    def find_spec(self, *args):\n        return None\n\n"
        "sys.meta_path.append(Finder())\nos.environ['SLOWLIB_CACHE'] = '/tmp/slowlib'\n",
        "quicklib/__init__.py": "VALUE = 1\n",
        "lb/__init__.py": "",
        "lb/config.py": "import slowlib\nimport quicklib\nSETTINGS = {n: n for n in range(100)}\n",
        "lb/gpu.py": "import lb.config\n" + CUINIT,
        "lb/leaves/__init__.py": "",
    }
    files.update({f"lb/leaves/m{n:03}.py": f"import lb.config\nVALUE = {n}\n" for n in range(LEAVES)})
    return make_tree(files)


def test_a_slow_library_most_children_import_is_preloaded_first(slow_library):
    """The library's own changes (a finder, an environment variable) are accepted, as torch's are, so the
    candidate that imports it is preloaded instead of passed over; the rows stay a fresh subkernel's."""
    result = sweep("lb", path=[slow_library], driver="simulated", jobs=2, timeout=30)
    assert result.mode == "zygote", result.fallback
    assert result.preload[:2] == ("lb", "slowlib"), result.preload_notes
    assert "lb.config" in result.preload, result.preload_notes
    assert "quicklib" not in result.preload  # imported by every child, but in no time
    assert "1 library most sampled children import, preloaded first: slowlib" in result.preload_notes
    assert not any("not preloaded" in note for note in result.preload_notes), result.preload_notes
    for module in ("lb.config", "lb.gpu", "lb.leaves.m000", f"lb.leaves.m{LEAVES - 1:03}"):
        fresh = scan(module, path=[slow_library], driver="simulated", timeout=30)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module
    assert result.row("lb.gpu").cuda_initialized
    assert len(result.rows) == LEAVES + 4


def test_a_library_that_initializes_cuda_is_never_preloaded(make_tree):
    """A library on every chain to a cuInit stays out of the zygote: each row finds it itself."""
    files = {
        "gpulib/__init__.py": "import time\ntime.sleep(0.2)\n" + CUINIT,
        "lc/__init__.py": "",
        **{f"lc/m{n:03}.py": "import gpulib\n" for n in range(LEAVES)},
    }
    root = make_tree(files)
    result = sweep("lc", path=[root], driver="simulated", jobs=2, timeout=30)
    assert "gpulib" not in result.preload, result.preload_notes
    assert all(row.cuda_initialized for row in result.rows if row.module != "lc"), result.preload_notes
    assert {row.culprit.chain[-1] for row in result.rows if row.culprit} == {"gpulib"}


def test_a_slow_module_a_third_of_the_children_import_is_preloaded_a_quick_one_not(make_tree):
    """What a preload saves is the share of rows that import a module times its import time: a slow module
    a third of the rows import is worth it (as vLLM's ``layers.linear``), a quick one they import is not."""
    files = {
        "co/__init__.py": "",
        "co/slow.py": "import time\ntime.sleep(0.4)\n",
        "co/quick.py": "VALUE = 1\n",
        "co/leaves/__init__.py": "",
    }
    kinds = ("import co.slow\n", "import co.quick\n", "VALUE = 0\n")
    files.update({f"co/leaves/m{n:03}.py": kinds[n % 3] for n in range(LEAVES)})
    root = make_tree(files)
    result = sweep("co", path=[root], driver="simulated", jobs=2, timeout=30)
    assert "co.slow" in result.preload, result.preload_notes
    assert "co.quick" not in result.preload, result.preload_notes
    assert not result.row("co.slow").preloaded  # its own row was scanned before it was preloaded
    assert {row.status for row in result.rows} == {"ok"}


@pytest.mark.parametrize("shared", [False, True], ids=["nothing-learned", "learned"])
def test_a_sampled_module_below_a_package_is_scanned_once(make_tree, shared):
    """The sample is scanned before the packages above it (and what learning left in flight comes first in
    the next zygote): a package's zygote must not scan again the modules below it that already have a row."""
    files = {"ns/__init__.py": "", "ns/common.py": "TABLE = list(range(1000))\n"}
    body = "import ns.common\n" if shared else "VALUE = 0\n"
    for group in range(4):
        files[f"ns/g{group}/__init__.py"] = ""
        files[f"ns/g{group}/inner/__init__.py"] = ""
        files.update({f"ns/g{group}/inner/m{n:03}.py": body for n in range(LEAVES // 4 + 1)})
    root = make_tree(files)
    seen: list[str] = []
    result = sweep(
        "ns",
        path=[root],
        driver="simulated",
        jobs=2,
        timeout=30,
        progress=lambda done, total, row: seen.append(row.module),
    )
    assert ("ns.common" in result.preload) is shared, result.preload_notes
    twice = sorted({module for module in seen if seen.count(module) > 1})
    assert twice == [], twice
    assert len(seen) == len(result.rows) == len(files)  # one module per file


def test_a_candidate_setting_a_variable_no_other_file_names_is_preloaded_one_another_reads_is_not(make_tree):
    """vLLM's ``_aiter_ops`` sets ``AITER_SITUV2_A4W4`` at import, and most of vLLM imports it: kept, since no
    file a row could run holds that name.  A variable another module reads (here to decide whether to
    initialize CUDA) is never kept: that module's row would differ from a fresh subkernel's."""
    token = uuid.uuid4().hex.upper()
    keep, read = f"EV_KEPT_{token}", f"EV_READ_{token}"
    files = {
        "ev/__init__.py": "",
        "ev/setter.py": f"import os\nos.environ['{keep}'] = '1'\n",
        "ev/hub.py": "import ev.setter\nTABLE = list(range(1000))\n",
        "ev/setter2.py": f"import os\nos.environ['{read}'] = '1'\n",
        "ev/hub2.py": "import ev.setter2\n",
        "ev/reader.py": f"import os\nif os.environ.get('{read}'):\n"
        + "".join("    " + line + "\n" for line in CUINIT.splitlines()),
        "ev/leaves/__init__.py": "",
    }
    files.update({f"ev/leaves/m{n:03}.py": "import ev.hub, ev.hub2\n" for n in range(LEAVES)})
    root = make_tree(files)
    result = sweep("ev", path=[root], driver="simulated", jobs=2, timeout=60)
    notes = " ".join(result.preload_notes)
    assert {"ev.hub", "ev.setter"} <= set(result.preload), notes
    assert not {"ev.hub2", "ev.setter2"} & set(result.preload), notes
    assert f"preloaded though its import sets {keep}, a name no file a row could run holds" in notes
    assert (
        f"(not preloaded: it sets the environment variable {read} ({root / 'ev' / 'reader.py'} holds its name)" in notes
    )
    for module in ("ev.reader", "ev.setter", "ev.setter2", "ev.leaves.m000", f"ev.leaves.m{LEAVES - 1:03}"):
        fresh = scan(module, path=[root], driver="simulated", timeout=60)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module
    assert result.row("ev.reader").culprit is None


def test_rows_still_to_do_are_scanned_while_a_candidates_search_runs(make_tree):
    """A search that reads every file (vLLM's ``AITER_SITUV2_A4W4`` is held by none, and a cold disk takes half
    a minute over the environment) leaves the jobs busy with rows still to do, from the end of the order: each
    still one row, what a fresh subkernel gives, and the candidate kept as before.  A sparse file of a gigabyte
    beside the package makes the search long enough to see."""
    kept = f"SW_KEPT_{uuid.uuid4().hex.upper()}"
    files = {
        "sw/__init__.py": "",
        "sw/setter.py": f"import os\nos.environ['{kept}'] = '1'\n",
        "sw/hub.py": "import sw.setter\nTABLE = list(range(1000))\n",
        "sw/leaves/__init__.py": "",
        **{f"sw/leaves/m{n:03}.py": f"import sw.hub\nVALUE = {n}\n" for n in range(LEAVES)},
    }
    root = make_tree(files)
    (root / "sw" / "blob.bin").touch()
    os.truncate(root / "sw" / "blob.bin", 1 << 30)
    result = sweep("sw", path=[root], driver="simulated", jobs=2, timeout=60)
    notes = " ".join(result.preload_notes)
    assert {"sw.hub", "sw.setter"} <= set(result.preload), notes
    assert f"preloaded though its import sets {kept}, a name no file a row could run holds" in notes
    found = re.search(r"sw\.hub: (\d+) row\(s\) still to do were scanned while the search for the names", notes)
    assert found, notes
    assert int(found[1]) >= 1
    modules = [row.module for row in result.rows]
    assert len(modules) == len(set(modules)) == len(files), modules  # one row each
    assert {row.status for row in result.rows} == {"ok"}
    for module in (f"sw.leaves.m{LEAVES - 1:03}", f"sw.leaves.m{LEAVES - 2:03}", "sw.leaves.m000", "sw.setter"):
        fresh = scan(module, path=[root], driver="simulated", timeout=60)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module


def test_a_candidate_is_imported_once_by_the_zygote_never_first_by_a_child_of_it(make_tree, tmp_path):
    """The zygote imports a candidate itself, with a stopped copy to go back to, and the candidate's own row
    is scanned by a child of that copy: no process imports it after a child of its own has (a trial import
    first, then the real one, would pay for the candidate's import twice)."""
    log = tmp_path / "imports.log"
    files = {
        "io1/__init__.py": "",
        "io1/hub.py": f"import os\nwith open({str(log)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()} {os.getppid()}\\n')\n",
        "io1/leaves/__init__.py": "",
        **{f"io1/leaves/m{n:03}.py": "import io1.hub\n" for n in range(LEAVES)},
    }
    root = make_tree(files)
    result = sweep("io1", path=[root], driver="simulated", jobs=2, timeout=30)
    assert "io1.hub" in result.preload, result.preload_notes
    importers = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    pids = {pid for pid, _ in importers}
    assert [pid for pid, parent in importers if parent in pids] == []
    assert {row.status for row in result.rows} == {"ok"}


def test_a_candidate_loading_a_module_that_fails_alone_is_preloaded_when_no_other_file_names_it(make_tree):
    """vLLM's ``vllm.config`` loads ``model_arch_config_convertor``, which fails alone on its circular import,
    and only ``vllm/config/model.py``, loaded with it, names it: no row can import it first, so the candidates
    that load it are kept as they are.  A module that fails alone and that another file names is guarded by
    its loader: that file's row would import it cleanly after the preload, where a fresh subkernel fails, so
    it is scanned again fresh."""
    kept, named = f"conv_{uuid.uuid4().hex}", f"conv_{uuid.uuid4().hex}"
    files = {
        "fa/__init__.py": "",
        "fa/config/__init__.py": "from fa.config.model import ModelConfig\n",
        "fa/config/model.py": f"class ModelConfig:\n    pass\n\nfrom fa.{kept} import Convertor\n",
        f"fa/{kept}.py": "from fa.config.model import ModelConfig\n\nclass Convertor(ModelConfig):\n    pass\n",
        "fa/hub.py": "import fa.config\nTABLE = list(range(1000))\n",
        "fa/other/__init__.py": f"class Base:\n    pass\n\nfrom fa.{named} import Other\n",
        f"fa/{named}.py": "from fa.other import Base\n\nclass Other(Base):\n    pass\n",
        "fa/hub2.py": "import fa.other\n",
        "fa/reader.py": f"import fa.{named}\n",
        "fa/leaves/__init__.py": "",
        "fa_dist-1.0.dist-info/RECORD": f"fa/{kept}.py,,\nfa/{named}.py,,\n",  # names every module: not a reader
        "fa_dist-1.0.dist-info/METADATA": f"Name: fa-dist\n\nfa.config loads fa.{kept}.\n",  # nor its description
    }
    files.update({f"fa/leaves/m{n:03}.py": "import fa.hub, fa.hub2\n" for n in range(LEAVES)})
    root = make_tree(files)
    result = sweep("fa", path=[root], driver="simulated", jobs=2, timeout=60)
    notes = " ".join(result.preload_notes)
    assert {"fa.hub", "fa.config"} & set(result.preload), notes
    assert {"fa.hub2", "fa.other"} & set(result.preload), notes
    reader = root / "fa" / "reader.py"
    guarded = f"preloaded though it loads fa.{named}, which fails to import on its own ({reader} holds its name); "
    assert guarded in notes, notes
    assert " row(s) imported it before fa." in notes
    assert f"fa.{kept}, which fails" not in notes
    statuses = {row.module: row.status for row in result.rows}
    assert statuses[f"fa.{kept}"] == statuses[f"fa.{named}"] == statuses["fa.reader"] == "import-error"
    for module in (f"fa.{kept}", "fa.reader", "fa.config", "fa.hub", "fa.leaves.m000", f"fa.leaves.m{LEAVES - 1:03}"):
        fresh = scan(module, path=[root], driver="simulated", timeout=60)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module


def test_executor_tasks_preload_what_a_sample_scanned_here_taught(shared_package, tmp_path):
    """Across machines each task's zygote preloads what the sample taught (learned and checked once, on the
    sweeping machine), the journal remembers it, and the rows stay a fresh subkernel's."""
    stages: list[str] = []
    journal = tmp_path / "sweep.jsonl"
    with ProcessPoolExecutor(2) as pool:
        result = sweep(
            "ad",
            path=[shared_package],
            driver="simulated",
            jobs=2,
            timeout=30,
            executor=pool,
            stage=stages.append,
            json_path=journal,
        )
    assert result.mode == "zygote", result.fallback
    assert {"ad.common", "ad.config"} <= set(result.preload), (result.preload, result.preload_notes)
    assert stages[0] == f"learning what to preload from {ADAPT_SAMPLE} sampled modules"
    assert stages[1].startswith("checking ")
    assert stages[2].startswith("scanning in executor tasks, each preloading the ")
    assert [rate_holds(stage) for stage in stages[:3]] == [False, False, True]
    assert any(note.startswith("ad.config (+1 module it imports): imported by ") for note in result.preload_notes)
    assert len(result.rows) == LEAVES + 8
    remembered = [json.loads(line)["preload"] for line in journal.read_text().splitlines() if '"preload"' in line]
    assert remembered
    assert {"ad.common", "ad.config"} <= set(remembered[-1]["learned"]), remembered
    for module in ("ad.config", "ad.gpu_a", "ad.gpu", "ad.worker", "ad.leaves.m000", f"ad.leaves.m{LEAVES - 1:03}"):
        fresh = scan(module, path=[shared_package], driver="simulated", timeout=30)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module


def test_executor_tasks_preload_only_what_was_checked_against_every_row(side_effects):
    """A candidate is checked on the sweeping machine against the rows its import loads, whichever task
    would have scanned them: ``fx.vendor_path`` stays out; ``fx.pkgc`` loads ``fx.m_util``, which fails
    alone, and each task guards it as the check here did, so ``fx.user`` (which imports ``fx.m_util``
    first) fails as in a fresh subkernel, in whatever task; the alias ``fx.alias`` registers is watched in
    every task."""
    with ProcessPoolExecutor(2) as pool:
        result = sweep(
            "fx", path=[side_effects], driver="simulated", jobs=2, timeout=30, executor=pool, exclude=["fx.lib*"]
        )
    assert result.mode == "zygote", result.fallback
    assert "fx.leaves" in result.preload, result.preload_notes
    assert "fx.vendor_path" not in result.preload, result.preload
    assert {"fx.pkgc", "fx.base"} <= set(result.preload), result.preload_notes
    assert "fx.alias" in result.preload  # each task watches the name it registers, as the check here did
    statuses = {row.module: row.status for row in result.rows}
    assert (
        statuses["fx.a"] == statuses["fx.m_util"] == statuses["fx.user"] == statuses["fx.user_attr"] == "import-error"
    )
    assert statuses["fx.user_after"] == "ok"
    assert statuses["fx.uses_vendored"] == statuses["fx.uses_alias"] == "import-error"
    assert statuses["fx.apkg"] == statuses["fx.apkg.s1"] == statuses["fx.apkg.s2"] == "ok"
    for module in ("fx.user", "fx.user_attr", "fx.pkgc", "fx.uses_alias", "fx.apkg.s1", "fx.leaves.m000"):
        fresh = scan(module, path=[side_effects], driver="simulated", timeout=30)
        assert verdict(result.row(module)) == verdict(SweepRow.from_scan(module, fresh, 0.0, 0.0)), module


def test_a_package_scanned_before_a_candidate_that_was_passed_over_still_serves_the_modules_below(side_effects):
    """``fx.pkgc``'s row is scanned before its import is tried as a preload, which is then passed over (as a
    library, it loads a module that fails alone, which no library is guarded for): the modules below it that
    its import did not load are still served by one zygote that imports it once, not each by a child
    importing it again."""
    from diagtools.driver import resolve_driver
    from diagtools.usecases.options import ScanOptions
    from diagtools.usecases.sweep_discover import discover_modules, locate_tree
    from diagtools.usecases.sweep_forked import ZygoteJob, zygote_pass

    roots, exclude = [str(side_effects)], ["fx.lib*", "fx.leaves*"]
    rows: list[SweepRow] = []
    job = ZygoteJob(
        locate_tree("fx", roots, exclude=exclude),
        ScanOptions.of(path=roots, driver="simulated", timeout=30),
        resolve_driver("simulated"),
        ["fx"],
        2,
        rows.append,
        learned=(("fx.pkgc",), ("fx.pkgc",)),  # as a journal remembers it: checked first, then passed over
    )
    done = zygote_pass(discover_modules("fx", roots, exclude=exclude), job, adapt=True)
    assert "fx.pkgc" in done.passed_over, done.notes
    assert "1 package(s) imported once in a zygote of their own for the 2 module(s) below them" in " ".join(
        done.notes
    ), done.notes
    assert {row.module: row.status for row in rows if row.module.startswith("fx.pkgc.")} == dict.fromkeys(
        ("fx.pkgc.act", "fx.pkgc.more1", "fx.pkgc.more2"), "ok"
    )


def _two_groups(make_tree, *, package_s: float, slow_s: float):
    """``tw``: 40 leaves import ``tw.config``; 70 more import ``tw.slow`` too.  A first sample of 3 (``tw``
    itself, preloaded, and one leaf of each group) sees ``tw.slow`` in one child only."""
    files = {
        "tw/__init__.py": f"import time\ntime.sleep({package_s})\n",
        "tw/config.py": "SETTINGS = {n: n for n in range(100)}\n",
        "tw/slow.py": f"import time\ntime.sleep({slow_s})\n",
        "tw/p/__init__.py": "",
        "tw/q/__init__.py": "",
    }
    files.update({f"tw/p/m{n:03}.py": "import tw.config\n" for n in range(40)})
    files.update({f"tw/q/m{n:03}.py": "import tw.config, tw.slow\n" for n in range(70)})
    return make_tree(files)


def _counting_zygotes(monkeypatch) -> list[tuple[str, ...]]:
    from diagtools.usecases import sweep_forked

    started: list[tuple[str, ...]] = []
    real = sweep_forked.run_zygote
    monkeypatch.setattr(
        sweep_forked, "run_zygote", lambda *a, **k: started.append(tuple(k["preload"])) or real(*a, **k)
    )
    monkeypatch.setattr(sweep_forked, "ADAPT_SAMPLE", 3)
    return started


def test_a_second_sample_learns_what_the_first_missed_when_it_pays(make_tree, monkeypatch):
    """The first, small sample learns ``tw.config``; the second, scanned by the zygote that preloads it,
    finds ``tw.q`` and ``tw.slow`` in most children, worth a third zygote: every row is still a fresh
    subkernel's."""
    started = _counting_zygotes(monkeypatch)
    root = _two_groups(make_tree, package_s=0.0, slow_s=0.2)
    stages: list[str] = []
    result = sweep("tw", path=[root], driver="simulated", jobs=2, timeout=30, stage=stages.append)
    assert stages == [
        "learning what to preload from 3 sampled modules",
        "checking 1 learned preload(s)",
        "checking 2 more learned preload(s)",  # tw.q, which the 70 leaves below it import, and tw.slow
        "scanning",
    ]
    assert started == [("tw",), ("tw", "tw.config"), ("tw", "tw.config", "tw.q", "tw.slow")]
    assert result.preload == ("tw", "tw.config", "tw.q", "tw.slow"), result.preload_notes
    assert any(note.startswith("tw.config: imported by 2 of 2 sampled children") for note in result.preload_notes)
    assert any(
        note.startswith("tw.slow: imported by ") and note.endswith(" of 16 sampled children")
        for note in result.preload_notes
    ), result.preload_notes
    assert len(result.rows) == 115
    assert len({row.module for row in result.rows}) == 115  # each row once
    assert not result.row("tw.slow").preloaded
    assert not result.row("tw.config").preloaded
    fresh = sweep("tw", path=[root], driver="simulated", jobs=2, timeout=30, fresh=True)
    assert {row.module: verdict(row) for row in result.rows} == {row.module: verdict(row) for row in fresh.rows}


def test_a_second_sample_starts_no_zygote_that_would_not_pay_for_itself(make_tree, monkeypatch):
    """Here ``tw.slow`` is quick and the preload slow (``tw`` takes a second): a third zygote would cost more
    than it saves the rows left, so the second goes on, and the second sample's rows are ordinary rows."""
    started = _counting_zygotes(monkeypatch)
    root = _two_groups(make_tree, package_s=1.0, slow_s=0.0)
    stages: list[str] = []
    result = sweep("tw", path=[root], driver="simulated", jobs=2, timeout=30, stage=stages.append)
    assert stages == ["learning what to preload from 3 sampled modules", "checking 1 learned preload(s)", "scanning"]
    assert started == [("tw",), ("tw", "tw.config")]
    assert result.preload == ("tw", "tw.config"), result.preload_notes
    declined = [note for note in result.preload_notes if note.startswith("learned tw.q, tw.slow from 16 more")]
    assert declined, result.preload_notes
    assert declined[0].endswith(" s to start")
    assert ", not preloaded: they would save the " in declined[0]
    assert len(result.rows) == 115
    assert {row.status for row in result.rows} == {"ok"}


def test_no_second_sample_when_the_candidates_rows_are_all_that_is_left(make_tree, monkeypatch):
    """The first sample is every module but ``cv.e``, a candidate: the second sample has nothing to draw from,
    and the checked zygote scans ``cv.e`` first, as a candidate's row."""
    from diagtools.usecases import sweep_forked

    monkeypatch.setattr(sweep_forked, "ADAPT_MIN_MODULES", 5)
    monkeypatch.setattr(sweep_forked, "ADAPT_SAMPLE", 5)
    files = {"cv/__init__.py": "", "cv/d.py": "VALUE = 1\n", "cv/e.py": "VALUE = 2\n"}
    files.update({f"cv/{name}.py": "import cv.d, cv.e\n" for name in "abc"})
    stages: list[str] = []
    result = sweep("cv", path=[make_tree(files)], driver="simulated", jobs=2, timeout=30, stage=stages.append)
    assert stages == ["learning what to preload from 5 sampled modules", "checking 2 learned preload(s)"]
    assert result.preload == ("cv", "cv.d", "cv.e"), result.preload_notes
    assert sorted(row.module for row in result.rows) == ["cv", "cv.a", "cv.b", "cv.c", "cv.d", "cv.e"]
    assert not result.row("cv.e").preloaded


def _package_rows_served(make_tree, tmp_path, top: str, files: dict[str, str], *, candidate: str, most_runs: int):
    """Sweep ``top`` (its package ``TOP.big`` holding 20 modules, written with ``files``) in a zygote that
    checks ``candidate`` as a journal remembers it (first, no sample), and check that it is preloaded, that
    ``TOP/big/__init__.py`` ran at most ``most_runs`` times, and that every row is a fresh subkernel's: the
    rows, and the fresh subkernels' rows."""
    from diagtools.driver import resolve_driver
    from diagtools.usecases.options import ScanOptions
    from diagtools.usecases.sweep_discover import discover_modules, locate_tree
    from diagtools.usecases.sweep_forked import ZygoteJob, zygote_pass

    runs = tmp_path / "runs"  # one byte per execution of TOP/big/__init__.py
    parts = [f"s{n:02}" for n in range(20)]
    counter = f"import os\n_fd = os.open({str(runs)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
    counter += "os.write(_fd, b'x')\nos.close(_fd)\n"
    tree = {f"{top}/__init__.py": "", **{f"{top}/big/{part}.py": "VALUE = 1\n" for part in parts}}
    tree.update({path: text.format(counter=counter, parts=", ".join(parts)) for path, text in files.items()})
    roots = [str(make_tree(tree))]
    rows: list[SweepRow] = []
    job = ZygoteJob(
        locate_tree(top, roots),
        ScanOptions.of(path=roots, driver="simulated", timeout=60),
        resolve_driver("simulated"),
        [top],
        2,
        rows.append,
        learned=((candidate,), ()),
    )
    done = zygote_pass(discover_modules(top, roots), job, adapt=True)
    assert candidate in done.preload, done.notes
    assert not done.leftover, done.notes
    assert not any(row.preloaded for row in rows if row.module.startswith(f"{top}.big"))
    assert len(runs.read_bytes()) <= most_runs, done.notes  # before the fresh subkernels, which each run it
    fresh = sweep(top, path=roots, driver="simulated", jobs=2, timeout=60, fresh=True)
    assert {row.module: verdict(row) for row in rows} == {row.module: verdict(row) for row in fresh.rows}
    return rows, fresh.rows


def test_a_candidate_package_is_imported_once_for_the_rows_below_it_that_its_import_loads(make_tree, tmp_path):
    """``cp.big``, a candidate (as a journal remembers it: checked first, no sample), loads its 20 modules:
    their rows are scanned before it is preloaded, from the zygote's state before it, by the one child
    that imports ``cp.big`` for its own row and goes on to scan the modules below it, not by 20 children
    that each import it again; every row is a fresh subkernel's."""
    files = {"cp/big/__init__.py": "{counter}from cp.big import {parts}\n"}
    # the zygote's own import and the row's (a zygote of its own importing it once, were the row not to go on)
    rows, fresh = _package_rows_served(make_tree, tmp_path, "cp", files, candidate="cp.big", most_runs=3)
    fresh_deps = {row.module: set(row.deps) for row in fresh}
    assert all(fresh_deps[row.module] <= set(row.deps) for row in rows)


def test_a_package_a_candidate_loads_after_its_modules_still_serves_their_rows(make_tree, tmp_path):
    """``cq.cand``'s first import of ``cq.big`` fails half way (a circular import) and its second succeeds, so
    ``cq.big`` enters ``sys.modules`` after the 20 modules below it, as ``vllm.config`` does after its own: the
    package's row is still scanned first, by the one child that goes on to scan the modules below, not by 20
    children that each import the package again; every row is a fresh subkernel's."""
    files = {
        "cq/cand.py": "try:\n    import cq.big\nexcept ImportError:\n    pass\nNAME = 1\nimport cq.big\n",
        "cq/big/__init__.py": "{counter}from cq.big import {parts}\nfrom cq.cand import NAME\n",
    }
    # the zygote's two imports, the package's row, the candidate's row's two: never one per module below
    _package_rows_served(make_tree, tmp_path, "cq", files, candidate="cq.cand", most_runs=6)
