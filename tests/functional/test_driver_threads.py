"""The simulated driver under threads: atomic init and reference counts, per-thread contexts, no GIL deadlock."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagtools.driver import build_injection_library, build_simulated_world, resolve_driver
from tests.conftest import MARK

HERE = Path(__file__).resolve().parent
SOURCES = Path(__file__).resolve().parents[2] / "diagtools" / "driver"
COMPILER = shlex.split(os.environ.get("CC", "cc"))


def compile_c(sources: list[Path], output: Path, *flags: str) -> Path:
    """Compile ``sources`` with the project's compiler; a failure shows the compiler's message."""
    command = [*COMPILER, "-O2", "-pthread", "-o", str(output), *map(str, sources), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{shlex.join(command)}\n{done.stderr}"
    return output


def run_stress(program: Path, library: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), str(library)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, **env),
    )


def test_sixteen_threads_init_switch_contexts_and_query_at_once(tmp_path):
    program = compile_c([HERE / "driver_stress.c"], tmp_path / "driver_stress", "-ldl")
    done = run_stress(program, build_simulated_world().directory / "libcuda.so.1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok threads=16 rounds=2000"


def _thread_sanitizer_works(tmp_path: Path) -> bool:
    probe = tmp_path / "tsan_probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    command = [*COMPILER, "-fsanitize=thread", "-o", str(tmp_path / "tsan_probe"), str(probe)]
    built = subprocess.run(command, capture_output=True, check=False, timeout=60)
    return built.returncode == 0 and subprocess.run([str(tmp_path / "tsan_probe")], check=False).returncode == 0


def test_the_stress_run_is_clean_under_the_thread_sanitizer(tmp_path):
    if not _thread_sanitizer_works(tmp_path):
        pytest.skip(f"{shlex.join(COMPILER)} cannot build and run a -fsanitize=thread program here")
    world = build_simulated_world().directory
    flags = ("-fsanitize=thread", "-g", "-O1")
    library = compile_c(
        [SOURCES / "simcuda.c", world / "simcuda_stubs.c"],
        tmp_path / "libcuda.so.1",
        "-shared",
        "-fPIC",
        f"-I{SOURCES}",
        "-ldl",
        *flags,
    )
    program = compile_c([HERE / "driver_stress.c"], tmp_path / "driver_stress", "-ldl", *flags)
    done = run_stress(program, library, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    assert "ThreadSanitizer" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok threads=16 rounds=2000"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose libcuda.so.1 is the simulated one."""
    full_env = dict(os.environ, **resolve_driver("simulated").env, **env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code).lstrip("\n")],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


RACE = """
import ctypes, sys, threading
calls = []

def hook(thread=None):
    frame = sys._getframe(1) if thread == threading.get_ident() else sys._current_frames()[thread]
    calls.append((thread, frame.f_code.co_name, frame.f_lineno))

sys._diagtools_on_cuinit = hook
lib = ctypes.CDLL("libcuda.so.1")
barrier = threading.Barrier(16)
idents, results = set(), []

def racer():
    idents.add(threading.get_ident())
    barrier.wait()
    results.append(lib.cuInit(0))  # <- here

threads = [threading.Thread(target=racer) for _ in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(results.count(0), len(calls))
thread, name, line = calls[0]
print(thread in idents, name, line)
"""


def test_threads_racing_cuinit_fire_the_hook_once_with_the_callers_line():
    done = run_python(RACE)
    line = next(n for n, text in enumerate(RACE.lstrip("\n").splitlines(), 1) if MARK in text)
    assert done.stdout.splitlines() == ["16 1", f"True racer {line}"]


def test_a_gil_holder_waiting_on_the_driver_cannot_deadlock_a_cuinit_without_the_gil(tmp_path):
    """Thread B calls cuInit without the GIL while the main thread, holding it, waits for B.

    Waiting on the GIL inside the driver without a bound deadlocks here (the old
    driver did, and the real driver's injection call would): the hook must be
    given up after the bounded wait and cuInit must return.
    """
    shim = compile_c([HERE / "driver_race_shim.c"], tmp_path / "shim.so", "-shared", "-fPIC", "-ldl")
    for library, function in (
        (build_simulated_world().directory / "libcuda.so.1", "cuInit"),
        (build_injection_library(), "InitializeInjection"),
    ):
        done = run_python(
            f"""
            import ctypes, os, sys, threading
            calls = []
            sys._diagtools_on_cuinit = lambda thread=None: calls.append(thread)
            free = ctypes.CDLL({str(shim)!r})
            holding = ctypes.PyDLL({str(shim)!r})
            ready, go, done = os.pipe(), os.pipe(), os.pipe()
            result = []
            racer = threading.Thread(target=lambda: result.append(
                free.init_then_signal({str(library).encode()!r}, {function.encode()!r}, ready[1], go[0], done[1])))
            racer.start()
            os.read(ready[0], 1)  # the racer is in C, without the GIL
            print(holding.signal_and_wait(go[1], done[0]))  # holds the GIL until the racer's init returned
            racer.join()
            print(result, calls)
            """,
            DIAGTOOLS_SIMCUDA_HOOK_WAIT_MS="300",
        )
        expected = 0 if function == "cuInit" else 1
        assert done.stdout.splitlines() == ["0", f"[{expected}] []"], (function, done.stdout)


def test_a_cuinit_made_while_holding_the_gil_calls_the_hook_on_that_thread():
    done = run_python(
        """
        import ctypes, sys, threading
        calls = []
        sys._diagtools_on_cuinit = lambda thread=None: calls.append((thread, threading.get_ident()))
        holding = ctypes.PyDLL("libcuda.so.1")
        free = ctypes.CDLL("libcuda.so.1")
        other = threading.Thread(target=free.cuInit, args=(0,))
        other.start()
        print(holding.cuInit(0))
        other.join()
        thread, current = calls[0]
        print(len(calls), thread == current or thread == other.ident)
        """
    )
    assert done.stdout.splitlines() == ["0", "1 True"]
