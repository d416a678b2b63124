"""CUDA initialized after the imports returned: by a thread, at exit, or found without the driver hook."""

from __future__ import annotations

import pytest

from tests.conftest import MARK, marked_line

LATE_THREAD = f"""
    import ctypes, threading, time

    def late():
        time.sleep(0.3)
        ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}

    threading.Thread(target=late, daemon=True, name="late-init").start()  # <- start
"""


@pytest.mark.parametrize("hook", ["driver-hook", "no-hook"])
def test_a_daemon_thread_that_initializes_after_the_import_is_blamed_on_its_starter(
    sim_scan, make_tree, monkeypatch, hook
):
    if hook == "no-hook":
        monkeypatch.setenv("DIAGTOOLS_SIMCUDA_NO_HOOK", "1")
    root = make_tree({"latepkg/__init__.py": "from . import worker\n", "latepkg/worker.py": LATE_THREAD})
    result = sim_scan("latepkg", path=[root])
    assert result.status == "ok", result.error
    assert result.verdict == "initializes-cuda"
    culprit = result.culprit
    assert culprit.module == "latepkg.worker"
    assert culprit.phase == "thread"
    assert culprit.chain == ("latepkg", "latepkg.worker")
    assert (culprit.thread, culprit.thread_started_by) == ("late-init", "latepkg.worker")
    source = root / "latepkg/worker.py"
    assert culprit.thread_started_at.line == marked_line(source, "# <- start")
    assert culprit.module_site.line == marked_line(source)  # never a line of threading.py
    assert "threading.py" not in culprit.module_site.file


def test_settle_ends_early_when_the_threads_finish(sim_scan, make_tree):
    root = make_tree({"quick.py": "import threading\nthreading.Thread(target=lambda: None).start()\n"})
    result = sim_scan("quick", path=[root], settle=30.0)
    assert result.verdict == "clean", result.doubts()
    assert result.duration_s < 10  # it did not sit out the 30 s
    assert result.threads_alive == ()


def test_threads_still_running_are_reported_by_name_and_starting_line(sim_scan, make_tree):
    root = make_tree(
        {
            "sleeper.py": f"""
                import threading, time
                threading.Thread(target=time.sleep, args=(60,), daemon=True, name="poller").start()  {MARK}
            """
        }
    )
    result = sim_scan("sleeper", path=[root], settle=0.2)
    assert result.status == "ok", result.error
    (alive,) = result.threads_alive
    assert alive.name == "poller"
    assert alive.starter == "sleeper"
    assert alive.started_at.line == marked_line(root / "sleeper.py")
    assert result.to_json()["threads_alive"][0]["name"] == "poller"


def test_an_atexit_handler_is_phase_shutdown_and_blamed_on_the_module_that_defined_it(sim_scan, make_tree):
    root = make_tree(
        {
            "goodbye.py": f"""
                import atexit, ctypes

                def bye():
                    ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}

                atexit.register(bye)
            """
        }
    )
    result = sim_scan("goodbye", path=[root])
    assert result.verdict == "initializes-cuda"
    culprit = result.culprit
    assert culprit.phase == "shutdown"
    assert culprit.module == "goodbye"
    assert culprit.module_site.line == marked_line(root / "goodbye.py")


def test_the_working_directory_does_not_shadow_the_standard_library(sim_scan, make_tree, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "colorsys.py").write_text("raise RuntimeError('the cwd shadowed the stdlib')\n", encoding="utf-8")
    root = make_tree({"usescolors.py": "import colorsys\n"})
    monkeypatch.chdir(cwd)
    result = sim_scan("usescolors", path=[root])
    assert result.status == "ok", result.error
    assert result.module("colorsys").file != str(cwd / "colorsys.py")
