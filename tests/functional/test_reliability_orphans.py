"""No process a target starts outlives its scan, whatever it does and however the scan ends.

Survivors are found by the PIDs the target's processes write down, not by the
environment marker, since a hostile descendant can drop its environment.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import diagtools
from tests.conftest import DIAGTOOLS


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def recorded_pids(folder: Path) -> list[int]:
    return [int(path.name) for path in folder.iterdir() if path.name.isdigit()]


def assert_all_dead(folder: Path, timeout: float = 5.0) -> None:
    pids = recorded_pids(folder)
    assert pids, "the target recorded no process"
    stop = time.monotonic() + timeout
    while time.monotonic() < stop and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    assert [pid for pid in pids if alive(pid)] == []


RECORD = "import os\nopen(os.path.join({folder!r}, str(os.getpid())), 'w').close()\n"


def daemon_package(root: Path, folder: Path, *, then: str = "") -> None:
    """``daemonic``: a double-forked, setsid daemon that execs with an empty environment."""
    record = RECORD.format(folder=str(folder))
    daemon = record + "import time\ntime.sleep(600)\n"
    source = (
        record
        + "import sys, time\n"
        + "first = os.fork()\n"
        + "if first == 0:\n"
        + "    os.setsid()\n"
        + "    if os.fork() == 0:\n"
        + f"        os.execve(sys.executable, [sys.executable, '-S', '-c', {daemon!r}], {{}})\n"
        + "    os._exit(0)\n"
        + "os.waitpid(first, 0)\n"
        + f"while len(os.listdir({str(folder)!r})) < 2:\n"
        + "    time.sleep(0.01)\n"
        + then
        + "\n"
    )
    (root / "daemonic.py").write_text(source, encoding="utf-8")


def test_a_double_forked_daemon_without_environment_is_killed(tmp_path):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    daemon_package(root, folder)
    result = diagtools.scan("daemonic", path=[root], driver="simulated", timeout=60)
    assert result.status == "ok", result.error
    assert len(recorded_pids(folder)) == 2
    assert_all_dead(folder)


HYDRA = """
import os, time
FOLDER = {folder!r}

def grow(depth):
    children = set()
    while True:
        open(os.path.join(FOLDER, str(os.getpid())), "w").close()
        while depth < 4 and len(children) < 2:
            pid = os.fork()
            if pid == 0:
                children, depth = set(), depth + 1
                open(os.path.join(FOLDER, str(os.getpid())), "w").close()
            else:
                children.add(pid)
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)  # a child was killed: grow a new one at once
        except ChildProcessError:
            children.clear()
        time.sleep(0.002)

if os.fork() == 0:
    os.setsid()
    grow(0)
while len(os.listdir(FOLDER)) < 20:
    time.sleep(0.01)
"""


def test_a_tree_that_keeps_forking_during_cleanup_is_killed(tmp_path):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    (root / "hydra.py").write_text(HYDRA.format(folder=str(folder)), encoding="utf-8")
    result = diagtools.scan("hydra", path=[root], driver="simulated", timeout=60)
    assert result.status == "ok", result.error
    time.sleep(0.2)  # a survivor would be forking (and writing its PID) by now
    assert_all_dead(folder)


def hanging_target(root: Path, folder: Path) -> None:
    daemon_package(root, folder, then="time.sleep(600)")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_cli_kills_the_whole_tree_and_exits_with_the_signal_code(tmp_path, signum, code):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    hanging_target(root, folder)
    cli = subprocess.Popen(
        [DIAGTOOLS, "scan", "daemonic", "--path", str(root), "--driver", "simulated", "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_pids(folder, 2)
        cli.send_signal(signum)
        _, stderr = cli.communicate(timeout=30)
    finally:
        cli.kill()
    assert cli.returncode == code, stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert_all_dead(folder)


def wait_for_pids(folder: Path, count: int, timeout: float = 60.0) -> None:
    stop = time.monotonic() + timeout
    while len(recorded_pids(folder)) < count:
        assert time.monotonic() < stop, "the target never started its processes"
        time.sleep(0.05)


NOTEBOOK = """
import _thread, os, sys, threading, time
import diagtools

folder, root = sys.argv[1], sys.argv[2]

def interrupt_when_started():
    while len(os.listdir(folder)) < 2:
        time.sleep(0.05)
    _thread.interrupt_main()

threading.Thread(target=interrupt_when_started, daemon=True).start()
started = time.monotonic()
try:
    diagtools.scan("daemonic", path=[root], driver="simulated", timeout=120)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s")
"""


def test_keyboard_interrupt_in_the_python_api_kills_the_tree(tmp_path):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    hanging_target(root, folder)
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, str(folder), str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "interrupted after" in done.stdout
    assert_all_dead(folder)


CHILD_THEN_HANG = """
import os, time
FOLDER = {folder!r}
if os.fork() == 0:  # keeps the environment, hence the marker; orphaned when the subkernel dies
    open(os.path.join(FOLDER, str(os.getpid())), "w").close()
    time.sleep(600)
    os._exit(0)
while not os.listdir(FOLDER):
    time.sleep(0.01)
time.sleep(600)
"""


def test_a_killed_keeper_still_leaves_no_marked_process(tmp_path):
    """The keeper never reports its sweep: the runner kills what carries the marker itself."""
    import threading

    from diagtools.driver import resolve_driver
    from diagtools.runner.subkernel import run_subkernel
    from diagtools.usecases.scan import probe_request

    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    (root / "orphaning.py").write_text(CHILD_THEN_HANG.format(folder=str(folder)), encoding="utf-8")
    keepers: list[subprocess.Popen[bytes]] = []

    def popen(*args, **kwargs):
        keepers.append(subprocess.Popen(*args, **kwargs))
        return keepers[-1]

    def kill_the_keeper() -> None:
        stop = time.monotonic() + 60
        while not recorded_pids(folder) and time.monotonic() < stop:
            time.sleep(0.01)
        keepers[0].kill()

    setup = resolve_driver("simulated")
    killer = threading.Thread(target=kill_the_keeper)
    killer.start()
    raw = run_subkernel(probe_request(("orphaning",), (str(root),), setup.env, 60.0), popen=popen)
    killer.join()
    assert raw.returncode is None  # the keeper never said how the subkernel ended
    assert keepers[0].returncode == -signal.SIGKILL
    assert_all_dead(folder)


def test_work_done_while_the_subkernel_starts_that_fails_still_ends_the_tree(tmp_path):
    """``run_subkernel(meanwhile=...)`` runs the caller's work once the keeper is started: when that work
    raises, the error reaches the caller and the keeper still kills every process of the tree."""
    from diagtools.driver import resolve_driver
    from diagtools.runner.subkernel import run_subkernel
    from diagtools.usecases.scan import probe_request

    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    (root / "orphaning.py").write_text(CHILD_THEN_HANG.format(folder=str(folder)), encoding="utf-8")

    def meanwhile() -> None:
        stop = time.monotonic() + 60
        while not recorded_pids(folder) and time.monotonic() < stop:  # the target's child is running
            time.sleep(0.01)
        raise RuntimeError("the caller's own work failed")

    setup = resolve_driver("simulated")
    with pytest.raises(RuntimeError, match="caller's own work"):
        run_subkernel(probe_request(("orphaning",), (str(root),), setup.env, 60.0), meanwhile=meanwhile)
    assert_all_dead(folder)


def test_work_done_while_the_subkernel_starts_runs_once_and_loses_no_event(tmp_path):
    """What the subkernel sends while the caller's work runs waits in the channel: the run is whole."""
    from diagtools.driver import resolve_driver
    from diagtools.runner.subkernel import run_subkernel
    from diagtools.usecases.scan import probe_request

    calls: list[float] = []

    def meanwhile() -> None:
        time.sleep(0.3)  # the subkernel runs to its end meanwhile: nothing is read yet
        calls.append(time.monotonic())

    setup = resolve_driver("simulated")
    raw = run_subkernel(probe_request(("colorsys",), (), setup.env, 60.0), meanwhile=meanwhile)
    assert len(calls) == 1
    assert raw.returncode == 0
    assert raw.skipped_events == 0
    kinds = [event["e"] for event in raw.events]
    assert kinds[0] == "hello"
    assert kinds[-1] == "shutdown"
    assert "done" in kinds
    assert any(event["e"] == "begin" and event["n"] == "colorsys" for event in raw.events)


def test_replay_leaves_no_temporary_directory(tmp_path, make_tree, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    root = make_tree({"setup_only.py": "X = 1\n"})
    result = diagtools.replay_fork("setup_only", path=[root], driver="simulated", timeout=60)
    assert result.status == "ok", result.error
    hung = make_tree({"hangs_child.py": "def act():\n    import time\n    time.sleep(600)\n"})
    diagtools.replay_fork("setup_only", child="hangs_child:act", path=[root, hung], driver="simulated", timeout=4)
    assert list(scratch.iterdir()) == []


# ---- every entry point: diagtools run, and the sweep's zygote --------------------------

SELF_KILL = "import signal\nos.kill(os.getpid(), signal.SIGUSR2)\n"


@pytest.mark.parametrize(
    ("then", "timeout", "code"),
    [("", 60.0, 0), ("time.sleep(600)", 3.0, -9), (SELF_KILL, 60.0, -signal.SIGUSR2)],
    ids=["exit", "timeout", "signal"],
)
def test_diagtools_run_kills_a_daemon_without_environment(tmp_path, then, timeout, code):
    from diagtools.usecases.run import run

    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    daemon_package(root, folder, then=then)
    result = run([sys.executable, str(root / "daemonic.py")], driver="simulated", timeout=timeout, output="capture")
    assert result.exitcode == code, result.stderr
    assert result.timed_out == (code == -9)
    assert len(recorded_pids(folder)) == 2
    assert result.processes, "the run agent's records were lost"
    assert_all_dead(folder, timeout=0.5)


def test_diagtools_run_cli_keeps_the_streams_and_the_signal_exit_code(tmp_path):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    daemon_package(root, folder, then="print(sys.stdin.read().upper(), end='')\n" + SELF_KILL)
    done = subprocess.run(
        [DIAGTOOLS, "run", "--driver", "simulated", "--", sys.executable, str(root / "daemonic.py")],
        input="from stdin",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 128 + signal.SIGUSR2, done.stderr
    assert done.stdout == "FROM STDIN"
    assert_all_dead(folder, timeout=0.5)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_diagtools_run_kills_the_daemon(tmp_path, signum):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    hanging_target(root, folder)
    cli = subprocess.Popen(
        [DIAGTOOLS, "run", "--driver", "simulated", "--", sys.executable, str(root / "daemonic.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_pids(folder, 2)
        cli.send_signal(signum)
        _, stderr = cli.communicate(timeout=30)
    finally:
        cli.kill()
    # one rule: an interrupted CLI exits 130 (SIGINT) or 143 (SIGTERM), after passing the signal on to the command
    assert cli.returncode == 128 + signum, stderr
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr  # the command's stderr, untouched
    assert f"interrupted by {signal.Signals(signum).name}: the command's process tree was stopped" in stderr
    assert_all_dead(folder, timeout=0.5)


def zygote_package(root: Path, folder: Path, *, then: str = "") -> None:
    """``dz``: ``dz.daemonic`` double-forks a daemon without environment; ``dz.later`` sees it still alive."""
    (root / "dz").mkdir()
    (root / "dz" / "__init__.py").write_text("", encoding="utf-8")
    daemon_package(root / "dz", folder, then=then)
    later = (
        "import os, time\n"
        f"folder = {str(folder)!r}\n"
        "stop = time.monotonic() + 30\n"
        "while len(os.listdir(folder)) < 2 and time.monotonic() < stop:\n"
        "    time.sleep(0.01)\n"
        "def is_daemon(pid):\n"
        "    try:\n"
        "        return b'sleep(600)' in open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        return False\n"
        "if not any(is_daemon(pid) for pid in os.listdir(folder)):\n"
        "    raise ImportError('the daemon was killed while the sweep was running')\n"
    )
    (root / "dz" / "later.py").write_text(later, encoding="utf-8")


def test_the_sweep_zygote_kills_a_daemon_without_environment_only_at_the_end(tmp_path):
    from diagtools.usecases.sweep import sweep

    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    zygote_package(root, folder)
    result = sweep("dz", path=[root], driver="simulated", timeout=60, jobs=2)
    assert result.mode == "zygote", result.fallback
    assert {row.module: row.status for row in result.rows} == {"dz": "ok", "dz.daemonic": "ok", "dz.later": "ok"}
    assert len(recorded_pids(folder)) == 2
    assert_all_dead(folder, timeout=0.5)


def test_a_signalled_sweep_kills_the_zygote_s_daemon(tmp_path):
    folder, root = tmp_path / "pids", tmp_path / "src"
    folder.mkdir()
    root.mkdir()
    zygote_package(root, folder, then="time.sleep(600)")
    cli = subprocess.Popen(
        [DIAGTOOLS, "sweep", "dz", "--path", str(root), "--driver", "simulated", "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_pids(folder, 2)
        cli.send_signal(signal.SIGTERM)
        _, stderr = cli.communicate(timeout=30)
    finally:
        cli.kill()
    assert cli.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert_all_dead(folder, timeout=0.5)
