"""``diagtools run`` defects: labels of each start, children's ends, attribution, the agent's descriptors,
processes the agent never heard from, interrupts, terminal safety, grouping, bad input.

Real programs, real forks, the simulated driver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import diagtools
from diagtools.errors import DriverBuildError, UsageError
from diagtools.model.run import RunResult
from diagtools.render.run_text import render_run
from diagtools.usecases.run import run
from diagtools.usecases.run_assemble import CONFTEST_CONTEXT
from tests.conftest import DIAGTOOLS, MARK, RUN_REGISTRY, marked_line

FORKSERVER_APP = """
    import multiprocessing as mp

    import registry

    def work(index):
        return index

    if __name__ == "__main__":
        ctx = mp.get_context("forkserver")
        worker = ctx.Process(target=work, args=(1,))
        worker.start()
        worker.join()
        print("worker exit", worker.exitcode)
"""


def sim_run(command, **kwargs) -> RunResult:
    kwargs.setdefault("timeout", 90.0)
    return run(command, driver="simulated", output="capture", **kwargs)


def python(script: Path, *args: str) -> list[str]:
    return [sys.executable, str(script), *args]


# ---- the start labels and the forkserver ---------------------------------------------


def test_forkserver_is_not_a_poisoned_fork_and_each_start_is_labelled(make_tree):
    root = make_tree({"registry.py": RUN_REGISTRY, "app.py": FORKSERVER_APP})
    result = sim_run(python(root / "app.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    assert "worker exit 0" in result.stdout
    assert result.verdict == "initializes-cuda", render_run(result)
    assert result.poisoned_forks == ()
    top = result.processes[0]
    kinds = {" ".join(start.argv or ()): start.kind for start in top.starts}
    # the resource tracker and the forkserver are started by fork and exec: programs, not copies
    assert set(kinds.values()) == {"subprocess"}, kinds
    assert any("resource_tracker" in argv for argv in kinds)
    assert any("forkserver" in argv for argv in kinds)
    forkserver = next(
        r for r in result.processes if "multiprocessing.forkserver" in " ".join(r.argv) and r.via == "exec"
    )
    assert [start.kind for start in forkserver.starts] == ["forkserver"]


def test_forkserver_childs_cuinit_is_blamed_on_the_users_module(make_tree):
    root = make_tree(
        {
            "app.py": f"""
                import ctypes
                import multiprocessing as mp

                def work():
                    ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}

                if __name__ == "__main__":
                    worker = mp.get_context("forkserver").Process(target=work)
                    worker.start()
                    worker.join()
            """
        }
    )
    result = sim_run(python(root / "app.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    (cuinit,) = [record.cuinit for record in result.processes if record.cuinit is not None]
    assert cuinit.module == "__mp_main__"  # the user's script, as the forkserver child knows it
    assert cuinit.module_site is not None
    assert (cuinit.module_site.file, cuinit.module_site.line) == (str(root / "app.py"), marked_line(root / "app.py"))
    assert cuinit.own_line.file != "<string>"


# ---- how forked children end ------------------------------------------------------------


def test_every_forked_childs_end_is_recorded(make_tree):
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "ends.py": """
                import os, signal, sys
                import registry

                def child(how):
                    if how == "exit":
                        sys.exit(5)
                    if how == "raise":
                        raise ValueError("boom")
                    os.kill(os.getpid(), signal.SIGTERM)

                for how in ("exit", "raise", "signal"):
                    pid = os.fork()
                    if pid == 0:
                        child(how)
                    os.waitpid(pid, 0)
            """,
        }
    )
    result = sim_run(python(root / "ends.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    saws = [finding.child_saw for finding in result.poisoned_forks]
    assert [saw.exitcode for saw in saws] == [5, 1, -signal.SIGTERM]
    assert saws[1].exception == "ValueError: boom"
    assert "killed by signal 15" in saws[2].describe()


# ---- attribution ------------------------------------------------------------------------


def test_a_conftest_cuinit_names_pytest_start_up(make_tree):
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "conftest.py": "import registry\n",
            "test_one.py": "def test_one():\n    pass\n",
        }
    )
    result = sim_run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root)], cwd=root)
    assert result.exitcode == 0, result.stdout + result.stderr
    (cuinit,) = [record.cuinit for record in result.processes if record.cuinit is not None]
    assert cuinit.context == CONFTEST_CONTEXT == "pytest start-up: conftest.py"
    assert "while: pytest start-up: conftest.py" in render_run(result)


def test_a_threads_cuinit_has_the_starter_modules_chain(make_tree):
    root = make_tree(
        {
            "tmod.py": f"""
                import ctypes, threading

                def _init():
                    ctypes.CDLL("libcuda.so.1").cuInit(0)

                worker = threading.Thread(target=_init, name="warmup")
                worker.start()  {MARK}
                worker.join()
            """,
            "main.py": "import tmod\n",
        }
    )
    result = sim_run(python(root / "main.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    cuinit = result.processes[0].cuinit
    assert cuinit.phase == "thread"
    assert cuinit.module == "tmod"
    assert cuinit.chain == ("__main__", "tmod")
    assert (cuinit.thread, cuinit.thread_started_by) == ("warmup", "tmod")  # data, not prose
    assert cuinit.thread_started_at.line == marked_line(root / "tmod.py")


# ---- the agent's descriptors ---------------------------------------------------------------


def test_the_agent_never_writes_into_a_file_the_program_owns(make_tree, tmp_path):
    data = tmp_path / "data.txt"
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "owner.py": f"""
                import os, sys
                os.closerange(3, 65536)
                fd = os.open({str(data)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                assert fd == 3, fd
                import registry
                pid = os.fork()
                if pid == 0:
                    os.write(fd, b"child line\\n")
                    os._exit(0)
                os.waitpid(pid, 0)
                os.write(fd, b"parent line\\n")
            """,
        }
    )
    result = sim_run(python(root / "owner.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    assert data.read_bytes() == b"child line\nparent line\n"
    assert result.verdict == "poisoned-fork", render_run(result)
    assert result.poisoned_forks[0].child_saw.exitcode == 0


@pytest.mark.parametrize(
    ("limit", "verdict"),
    [(None, "poisoned-fork"), ("-S -n 1024", "poisoned-fork"), ("-n 1024", "unknown")],
    ids=["default-limit", "soft-1024", "hard-1024"],
)
def test_dev_null_over_every_low_descriptor_is_never_clean(make_tree, limit, verdict):
    """Above a soft limit of 1024 the agent's file is out of reach; with a hard limit of 1024 it is not,
    and the lost records make the verdict unknown, with a note."""
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "blind.py": """
                import ctypes, os
                lib = ctypes.CDLL("libcuda.so.1")  # loaded first: with a limit of 1024 nothing opens afterwards
                null = os.open(os.devnull, os.O_WRONLY)
                for fd in range(3, 1024):
                    if fd != null:
                        os.dup2(null, fd)
                lib.cuInit(0)
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            """,
        }
    )
    command = python(root / "blind.py")
    if limit is not None:
        command = ["sh", "-c", f'ulimit {limit} && exec "$@"', "sh", *command]
    result = sim_run(command, cwd=root)
    assert result.exitcode == 0, result.stderr
    assert result.verdict == verdict, render_run(result)
    if verdict == "unknown":
        assert any("could not be reopened" in note for note in result.notes), result.notes


def test_a_fork_whose_child_left_no_records_is_not_clean(tmp_path):
    from diagtools.model.scan import DriverInfo
    from diagtools.runner.watch import RunRecords
    from diagtools.usecases.run_assemble import RunOutcome, assemble_run

    hello = {"e": "hello", "pid": 10, "parent": 1, "via": "exec", "argv": ["python"], "python": "3", "t": 1.0}
    start = {"e": "start", "kind": "fork", "seq": 1, "child": None, "stack": [], "driver_initialized": False, "t": 2}
    child = {"e": "fork-child", "seq": 1, "child": 11, "t": 2.5}
    result = assemble_run(RunRecords(((hello, start, child),)), ["python"], DriverInfo("simulated"), RunOutcome(10, 0))
    assert result.verdict == "unknown"
    assert "pid 11 (forked by pid 10) left no records" in result.notes[0]


# ---- processes the agent never heard from ------------------------------------------------------


@pytest.mark.parametrize("hide", ["env -u PYTHONPATH", "exec_isolated"], ids=["no-pythonpath", "python-I"])
def test_a_python_started_through_a_shell_without_the_agent_is_named(make_tree, hide):
    root = make_tree({"quiet.py": "VALUE = 1\n"})  # however short it lives, its start is recorded
    python_line = (
        f"{sys.executable} -I {root / 'quiet.py'}"
        if hide == "exec_isolated"
        else (f"env -u PYTHONPATH {sys.executable} {root / 'quiet.py'}")
    )
    script = root / "start.sh"
    script.write_text(f"#!/bin/sh\n{python_line}\necho done\n")
    result = sim_run(["sh", str(script)], cwd=root)
    assert result.exitcode == 0, result.stderr
    assert result.verdict == "unknown", render_run(result)
    assert any("quiet.py" in note and "never reported" in note for note in result.notes), result.notes


@pytest.mark.parametrize("driver", ["simulated", "none"])
def test_a_python_that_lives_a_moment_without_the_agent_is_named_without_any_polling(make_tree, monkeypatch, driver):
    """The start recorder names it as it starts: with the census off, nothing else could."""
    monkeypatch.setattr("diagtools.usecases.run.CENSUS_MS", 0)
    root = make_tree(
        {"app.py": "import ctypes\ntry:\n    ctypes.CDLL('libcuda.so.1').cuInit(0)\nexcept OSError:\n    pass\n"}
    )
    line = f"unset PYTHONPATH; exec {sys.executable} {root / 'app.py'} --flag"
    result = run(["sh", "-c", line], driver=driver, output="capture", timeout=90.0, cwd=root)
    assert result.exitcode == 0, result.stderr
    assert result.verdict == "unknown", render_run(result)
    named = [note for note in result.notes if "never reported" in note]
    assert len(named) == 1, result.notes
    assert f"({sys.executable} {root / 'app.py'} --flag)" in named[0]


def test_without_the_start_recorder_the_census_alone_looks_and_the_report_says_so(make_tree, monkeypatch):
    def cannot_build():
        raise DriverBuildError("the process-start recorder", "cc ...", "cc: not found")

    monkeypatch.setattr("diagtools.usecases.run.build_starts_library", cannot_build)
    root = make_tree({"app.py": "VALUE = 1\n"})
    result = sim_run(python(root / "app.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    assert result.verdict == "unknown"
    assert any("polling only" in note and "cc: not found" in note for note in result.notes), result.notes


# ---- interrupts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_cli_exits_130_or_143_even_when_the_command_ignores_it(make_tree, signum, code):
    root = make_tree(
        {
            "stubborn.py": """
                import signal, sys, time
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("ready", flush=True)
                time.sleep(60)
            """
        }
    )
    process = subprocess.Popen(
        [DIAGTOOLS, "run", "--driver", "simulated", "--", *python(root / "stubborn.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert "diagtools run:" in err  # the report is still printed
    assert f"interrupted by {signal.Signals(signum).name}" in err


# ---- terminal safety and grouping ------------------------------------------------------------------


def test_run_output_is_terminal_safe(tmp_path):
    folder = tmp_path / "evil\x1b[2J\u202edir"
    folder.mkdir()
    (folder / "registry.py").write_text(
        'import ctypes\nCODE = "\x07\x1b]0;title\x07"\nctypes.CDLL("libcuda.so.1").cuInit(0)  # \x1b[31m\u202e\n'
    )
    (folder / "app.py").write_text("import registry\n")
    result = sim_run([sys.executable, str(folder / "app.py"), "arg\x1b[2J\x07"], cwd=folder)
    assert result.exitcode == 0, result.stderr
    text = render_run(result)
    assert result.verdict == "initializes-cuda"
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in text
    assert "\\x1b" in text


def test_two_hundred_identical_forks_are_one_block(make_tree):
    """200 workers forked after one cuInit: one block, x200; the keeper's long census does not stall the end."""
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "many.py": """
                import os, time
                import registry
                pids = []
                for _ in range(200):
                    pid = os.fork()
                    if pid == 0:
                        time.sleep(0.4)  # alive long enough for the keeper to count every one
                        os._exit(0)
                    pids.append(pid)
                for pid in pids:
                    os.waitpid(pid, 0)
            """,
        }
    )
    started = time.monotonic()
    result = sim_run(python(root / "many.py"), cwd=root, timeout=180.0)
    assert result.exitcode == 0, result.stderr
    assert time.monotonic() - started < 35  # the keeper's wait limit is 40 s
    assert len(result.poisoned_forks) == 200
    assert result.verdict == "poisoned-fork"
    text = render_run(result)
    assert "poisoned fork x200" in text
    assert text.count("finding ") == 1
    assert len(text.splitlines()) < 40


# ---- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0])
def test_a_bad_timeout_is_refused(value):
    with pytest.raises(UsageError, match="--timeout"):
        diagtools.run(["true"], driver="none", timeout=value)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "x"])
def test_the_cli_refuses_a_bad_timeout(value, tmp_path):
    marker = tmp_path / "ran"
    done = subprocess.run(
        [DIAGTOOLS, "run", "--timeout", value, "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("option", ["--json", "--html"])
def test_a_bad_output_path_is_refused_before_the_command_runs(option, tmp_path):
    marker = tmp_path / "ran"
    done = subprocess.run(
        [DIAGTOOLS, "run", "--driver", "none", option, str(tmp_path / "missing" / "out"), "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()


def test_json_and_html_are_written_after_the_report(tmp_path):
    out, page = tmp_path / "run.json", tmp_path / "run.html"
    done = subprocess.run(
        [DIAGTOOLS, "run", "--driver", "none", "--json", str(out), "--html", str(page), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "diagtools run:" in done.stderr
    assert RunResult.from_json(__import__("json").loads(out.read_text())).command == ("true",)
    assert page.read_text().startswith("<!doctype html>")
    assert time.time() - os.path.getmtime(out) < 60


# ---- the report's words and colours --------------------------------------------------------------


def test_the_report_uses_the_scans_words_once_and_colours_like_a_scan(make_tree):
    root = make_tree({"registry.py": RUN_REGISTRY, "main.py": "import registry\n"})
    command = [DIAGTOOLS, "run", "--driver", "simulated", "--", *python(root / "main.py")]
    env = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "FORCE_COLOR")}
    coloured = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False,
                              env={**env, "FORCE_COLOR": "1"}, cwd=root)  # fmt: skip
    assert coloured.returncode == 0, coloured.stderr
    assert "\x1b[31m" in coloured.stderr
    plain = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False,
                           env={**env, "FORCE_COLOR": "1", "NO_COLOR": "1"}, cwd=root)  # fmt: skip
    assert "\x1b[" not in plain.stderr
    report = plain.stderr
    assert "culprit: registry" in report
    assert report.count("line to change:") == 1
    assert "via:" not in report  # the calling line is the line to change: said once
    assert f"registry.py:{marked_line(root / 'registry.py')} in _detect_platform" in report


def test_the_pytest_watch_names_a_conftest_cuinit(make_tree):
    from diagtools.driver import resolve_driver

    root = make_tree(
        {"registry.py": RUN_REGISTRY, "conftest.py": "import registry\n", "test_a.py": "def test_a():\n    pass\n"}
    )
    env = {**os.environ, **resolve_driver("simulated").env}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--cuda-watch", "-p", "no:cacheprovider", "-q", "test_a.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "while: pytest start-up: conftest.py" in done.stdout, done.stdout


def test_records_lost_with_no_descriptor_left_make_the_verdict_unknown(make_tree):
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "starved.py": """
                import os, resource
                import registry

                def target(fd):
                    try:
                        return os.readlink(f"/proc/self/fd/{fd}")
                    except OSError:
                        return ""

                ours = [int(fd) for fd in os.listdir("/proc/self/fd") if target(fd).endswith(".jsonl")]
                assert ours and min(ours) >= 1024, ours
                null = os.open(os.devnull, os.O_WRONLY)
                for fd in [*range(3, 64), *ours]:
                    if fd != null:
                        os.dup2(null, fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            """,
        }
    )
    result = sim_run(python(root / "starved.py"), cwd=root)
    assert result.exitcode == 0, result.stderr
    assert result.verdict == "unknown", render_run(result)
    assert any("could not be reopened" in note for note in result.notes), result.notes
