"""Sweep through the preloading zygote: the same verdicts as fresh subkernels, honest fallbacks,
discovery rules, a fingerprinted and locked journal, and a dask.distributed executor."""

from __future__ import annotations

import fcntl
import importlib.machinery
import json
from pathlib import Path

import pytest

from diagtools.errors import JournalLockedError
from diagtools.usecases.sweep import discover_modules, sweep
from tests.conftest import CHANNEL_FLOOD, cli, huge_pages_available, require, sweep_verdicts

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
PACKAGE = {
    "zp/__init__.py": "import json\n",
    "zp/clean.py": "import json\nVALUE = 1\n",
    "zp/culprit.py": "import zp.helper\n",
    "zp/helper.py": CUINIT,
    "zp/crash.py": "import ctypes\nctypes.string_at(0)\n",
    "zp/hang.py": "import time\ntime.sleep(60)\n",
    "zp/exits.py": "import os\nos._exit(7)\n",
    "zp/sysexit.py": "raise SystemExit(3)\n",
    "zp/broken.py": "raise ImportError('missing piece')\n",
    "zp/gpu/__init__.py": CUINIT,
    "zp/gpu/leaf.py": "VALUE = 2\n",
    "zp/threads.py": "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
}


@pytest.fixture
def zp(make_tree):
    return make_tree(PACKAGE)


def run(root, **options):
    options.setdefault("exclude", ["zp.threads"])
    return sweep("zp", path=[root], driver="simulated", timeout=4, jobs=2, **options)


def test_zygote_verdicts_match_fresh_subkernels(zp):
    forked = run(zp)
    fresh = run(zp, fresh=True)
    assert forked.mode == "zygote", forked.fallback
    assert forked.preload == ("zp",)
    assert forked.fallback == ""
    assert fresh.mode == "fresh"
    assert sweep_verdicts(forked) == sweep_verdicts(fresh)
    found = sweep_verdicts(forked)
    assert found["zp.culprit"] == ("ok", True, "self", "zp.helper", ("zp.culprit", "zp.helper"), 2, "driver-hook")
    assert found["zp.gpu.leaf"][:4] == ("ok", True, "parent", "zp.gpu")
    assert forked.row("zp.gpu.leaf").inherited_from == "zp.gpu"
    assert found["zp.gpu"][:3] == ("ok", True, "self")
    assert found["zp.clean"] == ("ok", False, "none", None, None, None, None)
    statuses = {m: found[m][0] for m in ("zp.crash", "zp.hang", "zp.exits", "zp.sysexit", "zp.broken")}
    assert statuses == {
        "zp.crash": "crashed",
        "zp.hang": "timeout",
        "zp.exits": "exited",
        "zp.sysexit": "exited",
        "zp.broken": "import-error",
    }
    assert "hang.py:2" in forked.row("zp.hang").error
    assert "SIGSEGV" in forked.row("zp.crash").error
    assert forked.row("zp").preloaded
    assert not forked.row("zp.clean").preloaded
    assert {row.mode for row in forked.rows} == {"zygote"}


FINALIZED = {
    # the package makes finalizers while the zygote preloads it; its modules make their own
    "fz/__init__.py": "import weakref\n\nclass Box:\n    pass\n\nKEPT = [Box() for _ in range(50)]\n"
    "FINALIZERS = [weakref.finalize(box, print, 'preloaded finalizer') for box in KEPT]\n",
    "fz/exit_init.py": "import weakref, ctypes\n\nclass Box:\n    pass\n\nBOX = Box()\n"
    "weakref.finalize(BOX, ctypes.CDLL('libcuda.so.1').cuInit, 0)\n",
    "fz/atexit_init.py": "import atexit, ctypes\natexit.register(ctypes.CDLL('libcuda.so.1').cuInit, 0)\n",
    "fz/clean.py": "import weakref\n\nclass Box:\n    pass\n\nBOX = Box()\nweakref.finalize(BOX, print, 'own')\n",
}


def test_exit_handlers_and_finalizers_give_the_verdicts_of_a_fresh_subkernel(make_tree):
    """A child skips the finalizers the zygote preloaded but runs its module's own, before the
    shutdown check, as a fresh subkernel does."""
    root = make_tree(FINALIZED)
    forked = sweep("fz", path=[root], driver="simulated", timeout=10, jobs=2)
    fresh = sweep("fz", path=[root], driver="simulated", timeout=10, jobs=2, fresh=True)
    assert forked.mode == "zygote", forked.fallback
    found, expected = sweep_verdicts(forked), sweep_verdicts(fresh)
    assert {m: v[:4] for m, v in found.items()} == {m: v[:4] for m, v in expected.items()}
    assert found["fz.exit_init"] == expected["fz.exit_init"]
    assert found["fz.exit_init"][:2] == ("ok", True)
    assert found["fz.atexit_init"][:2] == ("ok", True)
    assert found["fz.clean"][:3] == ("ok", False, "none")


THREADED = {
    "tp/__init__.py": "",
    "tp/starter.py": "import ctypes, threading\n\n\ndef _probe():\n    ctypes.CDLL('libcuda.so.1').cuInit(0)\n\n\n"
    "WORKER = threading.Thread(target=_probe, name='gpu-probe')\nWORKER.start()\nWORKER.join()\n",
}


def test_a_culprit_thread_is_named_with_its_starter_when_threading_is_preloaded(make_tree):
    """torch preloads ``threading``, which keeps its own reference to the thread-start function:
    the child must still see who started the thread, and from which line, as a fresh subkernel does."""
    root = make_tree(THREADED)
    forked = sweep("tp", path=[root], driver="simulated", timeout=10, jobs=1, preload="threading,tp")
    fresh = sweep("tp", path=[root], driver="simulated", timeout=10, jobs=1, fresh=True)
    assert forked.mode == "zygote", forked.fallback
    zygote_culprit, fresh_culprit = forked.row("tp.starter").culprit, fresh.row("tp.starter").culprit
    assert (fresh_culprit.thread, fresh_culprit.thread_started_by) == ("gpu-probe", "tp.starter")
    assert fresh_culprit.thread_started_at.line == 9
    assert (zygote_culprit.thread, zygote_culprit.thread_started_by, zygote_culprit.thread_started_at) == (
        fresh_culprit.thread,
        fresh_culprit.thread_started_by,
        fresh_culprit.thread_started_at,
    )
    assert (zygote_culprit.module, zygote_culprit.chain, zygote_culprit.phase) == (
        "tp.starter",
        ("tp.starter",),
        "thread",
    )


def test_fallback_when_preloading_initializes_cuda(zp):
    result = run(zp, preload=["zp.helper"])
    assert result.mode == "fresh"
    assert "preloading zp.helper initialized CUDA" in result.fallback
    assert result.row("zp.culprit").culprit.module == "zp.helper"

    partial = run(zp, preload="zp,zp.gpu")
    assert partial.mode == "zygote"
    assert partial.preload == ("zp",)
    assert "preloading zp.gpu initialized CUDA" in partial.fallback
    assert partial.row("zp.gpu.leaf").cuda_source == "parent"


def test_fallback_when_preloading_starts_a_thread(zp):
    result = run(zp, preload=["zp.threads"], exclude=["zp.hang"])
    assert result.mode == "fresh"
    assert "preloading zp.threads started 1 thread(s)" in result.fallback
    assert result.row("zp.threads").status == "ok"


def test_cli_says_how_the_sweep_ran(zp):
    done = cli("sweep", "zp", "--path", str(zp), "--driver", "simulated", "--exclude", "zp.h*", "--preload", "zp.gpu")
    assert done.returncode == 0, done.stderr
    assert "mode: fresh subkernels" in done.stdout
    assert "fallback: preloading zp.gpu initialized CUDA" in done.stdout
    assert "zp.hang" not in done.stdout
    assert "(inherited from zp.gpu)" in done.stdout


def test_discovery_rules(make_tree):
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    root = make_tree(
        {
            "dp/__init__.py": "",
            "dp/mod.py": "",
            "dp/__pycache__/mod.py": "",
            "dp/data/notes.txt": "",
            "dp/data/deeper/table.csv": "",
            "dp/ns/inner/leaf.py": "",
            f"dp/fast{suffix}": "",
            "dp/fast2.abi3.so": "",
            "dp/not-a-module.py": "",
            "dp/tests/__init__.py": "",
            "dp/tests/test_mod.py": "",
        }
    )
    assert discover_modules("dp", [root]) == (
        "dp",
        "dp.fast",
        "dp.fast2",
        "dp.mod",
        "dp.ns",
        "dp.ns.inner",
        "dp.ns.inner.leaf",
        "dp.tests",
        "dp.tests.test_mod",
    )
    assert discover_modules("dp", [root], exclude=["dp.tests", "dp.tests.*", "*.fast?"]) == (
        "dp",
        "dp.fast",
        "dp.mod",
        "dp.ns",
        "dp.ns.inner",
        "dp.ns.inner.leaf",
    )


def test_journal_rescans_what_changed_and_accepts_an_empty_file(zp, tmp_path):
    journal = tmp_path / "sweep.jsonl"
    journal.touch()
    options = {"exclude": ["zp.threads", "zp.hang", "zp.crash"], "json_path": journal}
    first = run(zp, **options)
    assert first.resumed == 0
    header = json.loads(journal.read_text().splitlines()[0])
    assert header == {"schema": "diagtools.sweep/1", "package": "zp", "paths": [str(zp)]}

    again = run(zp, **options)
    assert again.resumed == len(first.rows)

    (zp / "zp" / "helper.py").write_text("VALUE = 'fixed'\n")  # the fix
    seen = []
    fixed = run(zp, progress=lambda done, total, row: seen.append(row.module), **options)
    assert sorted(seen) == ["zp.culprit", "zp.helper"]
    assert not fixed.row("zp.culprit").cuda_initialized

    (zp / "zp" / "gpu" / "__init__.py").write_text("")  # a parent package: its subtree is rescanned
    seen.clear()
    run(zp, progress=lambda done, total, row: seen.append(row.module), **options)
    assert sorted(seen) == ["zp.gpu", "zp.gpu.leaf"]


def test_a_locked_journal_is_refused_in_one_line(zp, tmp_path):
    journal = tmp_path / "sweep.jsonl"
    with journal.open("a") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        with pytest.raises(JournalLockedError, match="in use by another sweep"):
            run(zp, json_path=journal)
        done = cli("sweep", "zp", "--path", str(zp), "--driver", "simulated", "--json", str(journal))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"diagtools: error: {journal} is in use by another sweep; wait for it to finish or choose another --json"
    )


def test_the_loser_of_a_race_on_a_new_journal_meets_the_winners_lock(zp, tmp_path, monkeypatch, capsys):
    """Two sweeps started together on one new journal: the winner creates and locks it between the
    loser's "does it exist?" and its open.  Replayed deterministically: the loser is told the file
    does not exist yet while the winner (this test) already holds it."""
    from diagtools.frontends import cli as cli_module

    journal = tmp_path / "new.jsonl"
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: False if self == journal else real_exists(self))
    with journal.open("a") as winner:
        fcntl.flock(winner.fileno(), fcntl.LOCK_EX)
        code = cli_module.main(["sweep", "zp", "--path", str(zp), "--driver", "simulated", "--json", str(journal)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"diagtools: error: {journal} is in use by another sweep; wait for it to finish or choose another --json"
    )


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning", "ignore::UserWarning")
def test_dask_distributed_executor(zp):
    distributed = require("distributed", "dev")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        executor = client.get_executor()
        forked = run(zp, executor=executor, exclude=["zp.threads", "zp.hang"])
        fresh = run(zp, executor=executor, fresh=True, exclude=["zp.threads", "zp.hang"])
    assert forked.mode == "zygote"
    assert sweep_verdicts(forked) == sweep_verdicts(fresh)
    assert forked.row("zp.culprit").culprit.module == "zp.helper"


AT_EXIT_PACKAGE = {
    "ax/__init__.py": "import atexit\n\n\ndef _goodbye():\n"
    + "".join(f"    {line}\n" for line in CUINIT.splitlines())
    + "\n\natexit.register(_goodbye)\n",
    "ax/sub.py": "VALUE = 1\n",
    "quiet/__init__.py": "import atexit\natexit.register(print, 'bye')\n",
    "quiet/sub.py": "VALUE = 1\n",
}


def _rows(root, package, fresh):
    swept = sweep(package, path=[root], driver="simulated", jobs=1, fresh=fresh)
    return {
        row.module: (row.verdict, row.cuda_source, row.culprit.module if row.culprit else None, row.preloaded)
        for row in swept.rows
    }


def test_a_preloaded_packages_atexit_cuinit_reads_as_in_fresh_subkernels(make_tree):
    root = make_tree(AT_EXIT_PACKAGE)
    zygote, fresh = _rows(root, "ax", fresh=False), _rows(root, "ax", fresh=True)
    assert zygote == fresh
    assert zygote["ax"] == ("initializes-cuda", "self", "ax", False)
    assert zygote["ax.sub"] == ("initializes-cuda", "parent", "ax", False)


def test_a_preloaded_packages_harmless_atexit_handler_leaves_every_row_clean(make_tree):
    root = make_tree(AT_EXIT_PACKAGE)
    zygote = _rows(root, "quiet", fresh=False)
    assert {module: verdict for module, (verdict, *_) in zygote.items()} == {"quiet": "clean", "quiet.sub": "clean"}


def test_a_module_flooding_its_channel_reads_the_same_in_zygote_and_fresh_mode(make_tree):
    """The zygote's child has its channel where a fresh subkernel's is, read to the same bound."""
    root = make_tree({"fl/__init__.py": "", "fl/floods.py": CHANNEL_FLOOD + CUINIT, "fl/quiet.py": "VALUE = 1\n"})
    rows = {
        fresh: {
            r.module: (str(r.status), r.verdict)
            for r in sweep("fl", path=[root], driver="simulated", jobs=1, fresh=fresh).rows
        }
        for fresh in (False, True)
    }
    assert rows[False] == rows[True]
    assert rows[False]["fl.floods"] == ("channel-lost", "unknown")


@pytest.mark.skipif(not huge_pages_available(), reason="this kernel has no transparent huge pages")
def test_the_zygote_forks_its_rows_from_memory_moved_into_huge_pages(make_tree, monkeypatch):
    """The preloaded memory every child inherits is in huge pages before the first row is forked, and the
    rows are what fresh subkernels give."""
    from diagtools.usecases import sweep_forked

    root = make_tree(
        {
            "hp/__init__.py": "",
            "hp/held.py": "HELD = bytearray(48 << 20)\nfor at in range(0, len(HELD), 4096):\n    HELD[at] = 1\n",
            "hp/user.py": "import hp.held\nVALUE = len(hp.held.HELD)\n",
            "hp/culprit.py": CUINIT,
            "hp/plain.py": "VALUE = 1\n",
        }
    )
    outcomes = []
    real = sweep_forked.run_zygote
    monkeypatch.setattr(sweep_forked, "run_zygote", lambda *a, **k: outcomes.append(real(*a, **k)) or outcomes[-1])
    forked = sweep("hp", path=[root], driver="simulated", preload=["hp.held"], jobs=2, timeout=30)
    assert forked.mode == "zygote", forked.fallback
    moved = [moved for outcome in outcomes for moved, _ in outcome.huge_pages]
    assert moved, "the zygote moved nothing into huge pages"
    assert moved[-1] >= 24 << 20, moved
    fresh = sweep("hp", path=[root], driver="simulated", jobs=2, timeout=30, fresh=True)
    assert sweep_verdicts(forked) == sweep_verdicts(fresh)
    assert sweep_verdicts(forked)["hp.culprit"][:3] == ("ok", True, "self")
