"""Package zygotes: a package with modules below it is imported once for all of them, rows unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagtools.usecases.sweep import sweep
from tests.conftest import cli, sweep_verdicts

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
# A fork handler as torch registers one, but fatal: a child that ran it would never report.
ABORT_IN_FORKED_CHILDREN = (
    "libc = ctypes.CDLL(None)\nlibc.__register_atfork(None, None, ctypes.cast(libc.abort, ctypes.c_void_p), None)\n"
)
DEVICE_COUNT = (
    "import ctypes\nfound = ctypes.c_int(0)\n"
    "result = ctypes.CDLL('libcuda.so.1').cuDeviceGetCount(ctypes.byref(found))\n"
)


def counted(log: Path, name: str, body: str = "") -> str:
    """Module text that appends ``name`` to ``log`` each time it is imported."""
    return f"with open({str(log)!r}, 'a') as _log:\n    _log.write({name!r} + '\\n')\n{body}"


@pytest.fixture
def tree(make_tree, tmp_path):
    log = tmp_path / "imports.log"
    files = {
        "pz/__init__.py": "",
        "pz/helper.py": CUINIT,
        "pz/heavy/__init__.py": counted(log, "pz.heavy", "import pz.heavy.core\n"),
        "pz/heavy/core.py": "TABLE = {n: n * n for n in range(1000)}\n",
        "pz/heavy/a.py": "from pz.heavy.core import TABLE\n",
        "pz/heavy/b.py": "VALUE = 2\n",
        "pz/heavy/culprit.py": "import json\nimport pz.helper\n",
        "pz/heavy/sub/__init__.py": counted(log, "pz.heavy.sub"),
        "pz/heavy/sub/x.py": "VALUE = 3\n",
        "pz/heavy/sub/y.py": "import pz.helper\n",
        "pz/gpu/__init__.py": counted(
            log, "pz.gpu", "import pz.gpu_deps\nimport pz.gpu.early\n" + CUINIT + "import pz.gpu_after\n"
        ),
        "pz/gpu/early.py": "VALUE = 5\n",
        "pz/gpu/l1.py": "VALUE = 4\n",
        "pz/gpu/l2.py": "import pz.heavy\n",
        "pz/gpu_deps.py": counted(log, "pz.gpu_deps", "import json\n"),
        "pz/gpu_after.py": counted(log, "pz.gpu_after"),
    }
    return make_tree(files), log


def rows(result):
    """Each row's verdict, culprit and line, and the files it depends on."""
    change = {r.module: r.culprit.own_line if r.culprit else None for r in result.rows}
    found = sweep_verdicts(result)
    return {r.module: (*found[r.module], change[r.module], r.deps) for r in result.rows}


def test_a_package_is_imported_once_by_its_row_which_goes_on_to_scan_the_modules_below_it(tree):
    root, log = tree
    forked = sweep("pz", path=[root], driver="simulated", timeout=30, jobs=2, adapt=False)
    imports = log.read_text().split()
    assert forked.mode == "zygote", forked.fallback
    # pz.heavy: its own row's child, whose process goes on to scan its 5 modules and sub's 2, and
    # pz.gpu.l2 (outside it, but below pz.gpu: continued from pz.gpu's row, it imports pz.heavy itself)
    assert imports.count("pz.heavy") == 2
    assert imports.count("pz.heavy.sub") == 1
    # pz.gpu initializes CUDA: its row goes on all the same (the simulated driver is handed on), so
    # nothing it imports is imported again by the 3 modules below it
    assert imports.count("pz.gpu") == 1
    assert imports.count("pz.gpu_deps") == 2  # its own row and pz.gpu's
    assert imports.count("pz.gpu_after") == 2
    notes = " ".join(forked.preload_notes)
    assert "3 package(s) imported once, by their own row, whose process went on to scan the 10 module(s)" in notes
    assert "(1 of them had initialized the simulated driver, handed on to each)" in notes

    log.write_text("")
    fresh = sweep("pz", path=[root], driver="simulated", timeout=30, jobs=2, fresh=True)
    assert rows(forked) == rows(fresh)  # verdicts, culprits, lines and the files each row depends on
    found = rows(forked)
    assert found["pz.heavy.sub.y"][:5] == ("ok", True, "self", "pz.helper", ("pz.heavy.sub.y", "pz.helper"))
    assert found["pz.gpu.l1"][:4] == ("ok", True, "parent", "pz.gpu")
    assert found["pz.heavy.a"][-1] == ("pz/__init__.py", "pz/heavy/__init__.py", "pz/heavy/a.py", "pz/heavy/core.py")


def test_where_the_driver_cannot_be_handed_on_what_a_package_imports_before_cuda_is_preloaded(tree, monkeypatch):
    """As with the real driver: a child forked after the initialization could not use it."""
    monkeypatch.setenv("DIAGTOOLS_SIMCUDA_NO_ADOPT", "1")
    root, log = tree
    forked = sweep("pz", path=[root], driver="simulated", timeout=30, jobs=2, adapt=False)
    imports = log.read_text().split()
    # pz.heavy and its sub go on from their rows as before; pz.gpu's row cannot, so its row and each
    # of its 3 modules import it...
    assert imports.count("pz.heavy") == 2
    assert imports.count("pz.gpu") == 4
    # ...but what it imports before that (pz.gpu_deps) is imported once for the 3 modules below it
    # (besides its own row and pz.gpu's row); what it imports after the initialization
    # (pz.gpu_after) is not preloaded: every child imports it again
    assert imports.count("pz.gpu_deps") == 3
    assert imports.count("pz.gpu_after") == 5
    notes = " ".join(forked.preload_notes)
    assert "2 package(s) imported once, by their own row, whose process went on to scan the 7 module(s)" in notes
    assert "initialized the simulated driver" not in notes
    assert "1 package(s) that initialize CUDA: what they import before that was imported once for the 3" in notes

    fresh = sweep("pz", path=[root], driver="simulated", timeout=30, jobs=2, fresh=True)
    assert rows(forked) == rows(fresh)


def test_modules_below_a_package_that_initialized_cuda_use_the_driver_as_a_fresh_subkernel_would(make_tree):
    """The children go on as the row: the driver answers them, and no fork handler marks them forked."""
    root = make_tree(
        {
            "pc/__init__.py": "",
            "pc/gpu/__init__.py": CUINIT + ABORT_IN_FORKED_CHILDREN,
            "pc/gpu/count.py": DEVICE_COUNT + "assert found.value == 1 and result == 0, (result, found.value)\n",
            "pc/gpu/plain.py": "",
            "pc/gpu/broken.py": "raise ValueError('broken on purpose')\n",
        }
    )
    forked = sweep("pc", path=[root], driver="simulated", timeout=30, jobs=2, adapt=False)
    fresh = sweep("pc", path=[root], driver="simulated", timeout=30, jobs=2, fresh=True)
    assert "handed on to each" in " ".join(forked.preload_notes)
    assert rows(forked) == rows(fresh)
    statuses = {row.module: row.status for row in forked.rows}
    assert statuses == {
        "pc": "ok",
        "pc.gpu": "ok",
        "pc.gpu.count": "ok",
        "pc.gpu.plain": "ok",
        "pc.gpu.broken": "import-error",
    }
    errors = {row.module: row.error for row in forked.rows}
    assert errors["pc.gpu.broken"] == {row.module: row.error for row in fresh.rows}["pc.gpu.broken"]
    assert "broken on purpose" in errors["pc.gpu.broken"]


def test_a_package_zygote_that_hangs_is_killed_and_its_modules_still_scanned(make_tree):
    root = make_tree(
        {
            "ph/__init__.py": "",
            "ph/slow/__init__.py": "import time\ntime.sleep(60)\n",
            "ph/slow/a.py": "",
            "ph/slow/b.py": "",
            "ph/ok.py": "",
        }
    )
    result = sweep("ph", path=[root], driver="simulated", timeout=3, jobs=2, adapt=False)
    statuses = {row.module: row.status for row in result.rows}
    assert statuses == {"ph": "ok", "ph.slow": "timeout", "ph.slow.a": "timeout", "ph.slow.b": "timeout", "ph.ok": "ok"}
    notes = " ".join(result.preload_notes)
    assert "ph.slow (it ended (exit code -9) before it had imported the package)" in notes


def test_the_cli_says_which_packages_were_imported_once(tree):
    root, _ = tree
    done = cli("sweep", "pz", "--path", str(root), "--driver", "simulated", "--jobs", "2", "--no-adapt")
    assert "preload: 3 package(s) imported once, by their own row, whose process went on" in done.stdout


def test_a_module_loaded_under_another_name_from_the_package_folder_is_a_dependency(make_tree):
    """A folder of the package put on ``sys.path`` (vLLM's third_party): its modules have other names."""
    root = make_tree(
        {
            "tp/__init__.py": "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'vendor'))\n",
            "tp/vendor/__init__.py": "",
            "tp/vendor/kernels/__init__.py": "VALUE = 1\n",
            "tp/heavy/__init__.py": "import kernels\n",
            "tp/heavy/a.py": "",
            "tp/heavy/b.py": "",
        }
    )
    forked = sweep("tp", path=[root], driver="simulated", timeout=30, jobs=2, adapt=False, exclude=["tp.vendor*"])
    fresh = sweep("tp", path=[root], driver="simulated", timeout=30, jobs=2, fresh=True, exclude=["tp.vendor*"])
    assert "1 package(s) imported once" in " ".join(forked.preload_notes)
    deps = {row.module: row.deps for row in forked.rows}
    assert deps == {row.module: row.deps for row in fresh.rows}
    assert "tp/vendor/kernels/__init__.py" in deps["tp.heavy.a"]


def test_no_more_than_jobs_modules_run_at_once_whatever_the_packages_below_one_another(make_tree, tmp_path):
    """Every zygote serving a package below another shares the sweep's ``--jobs``."""
    log = tmp_path / "running.log"
    body = (
        "import os, time\n"
        f"with open({str(log)!r}, 'a') as _log:\n    _log.write(f'+ {{time.monotonic()}}\\n')\n"
        "time.sleep(0.3)\n"
        f"with open({str(log)!r}, 'a') as _log:\n    _log.write(f'- {{time.monotonic()}}\\n')\n"
    )
    files = {"pj/__init__.py": ""}
    for outer in ("a", "b"):
        files[f"pj/{outer}/__init__.py"] = ""
        for inner in ("x", "y"):
            files[f"pj/{outer}/{inner}/__init__.py"] = ""
            files.update({f"pj/{outer}/{inner}/m{n}.py": body for n in range(3)})
    root = make_tree(files)
    result = sweep("pj", path=[root], driver="simulated", timeout=30, jobs=2, adapt=False)
    assert {row.status for row in result.rows} == {"ok"}
    assert "6 package(s) imported once, by their own row" in " ".join(result.preload_notes)
    events = sorted((float(line[2:]), 1 if line[0] == "+" else -1) for line in log.read_text().splitlines())
    assert len(events) == 2 * 12
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2
