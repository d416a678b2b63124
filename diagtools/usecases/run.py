"""The run use case: start a command with every Python process of its tree watched.

Steps: pick the driver, make a private record directory, start the command
under a keeper (:mod:`diagtools.runner.kept`: a subreaper that starts it in a
session of its own) with the agent on ``PYTHONPATH``, wait, have the keeper
kill every process left of the tree (at the command's exit, on timeout, on an
interrupt), read every process's JSON Lines file, and assemble the findings.
The command's stdin, stdout and stderr pass through untouched unless asked
otherwise, and its exit code is the keeper's report of it.

An interrupt (Ctrl-C, or SIGTERM/SIGHUP turned into one by the CLI) is passed
on to the command's process group as that same signal, with a grace period,
then the tree is killed, the records are read, and :class:`RunInterrupted`
(a ``KeyboardInterrupt``) is raised carrying the result: the CLI prints the
report and exits 130 (143 for SIGTERM, 129 for SIGHUP), whatever the command
did with the signal.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagtools import protocol
from diagtools.agents.run_hook import HOOK_DIR
from diagtools.driver import DriverSetup, build_starts_library, preloaded, resolve_driver
from diagtools.errors import DiagtoolsError, Interrupted, UsageError
from diagtools.model.run import RunResult
from diagtools.runner.kept import Kept, kill_marked, start_kept
from diagtools.runner.watch import agent_environment, read_records
from diagtools.usecases.options import validate_timeout
from diagtools.usecases.run_assemble import RunOutcome, assemble_run
from diagtools.usecases.run_watch import agent_cuprobe

__all__ = ["OUTPUT_MODES", "RunInterrupted", "run"]

OUTPUT_MODES = ("inherit", "stderr", "capture")
_INTERRUPT_GRACE_S = 5.0
_CAPTURE_LIMIT = 1 << 20
Popen = Callable[..., "subprocess.Popen[bytes]"]


CENSUS_MS = 100  # how often the keeper looks for Python processes the agent never heard from


class RunInterrupted(Interrupted):
    """Raised by :func:`run` when it was interrupted: the tree is gone, ``result`` is what was seen.

    ``signum`` is the signal that stopped it (``SIGINT`` for Ctrl-C).
    """

    def __init__(self, signum: int, result: RunResult) -> None:
        super().__init__(signum, result)


# ---- starting and waiting ------------------------------------------------------------


def _validate(command: Sequence[str], output: str, timeout: float | None) -> tuple[str, ...]:
    if isinstance(command, str):
        raise UsageError("give the command as a list of arguments, e.g. ['python', 'app.py']")
    argv = tuple(command)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise UsageError("no command given: diagtools run [OPTIONS] -- COMMAND [ARGS...]")
    if output not in OUTPUT_MODES:
        raise UsageError(f"unknown output mode {output!r}: choose one of {', '.join(OUTPUT_MODES)}")
    if timeout is not None:
        validate_timeout(timeout)
    return argv


def _streams(output: str) -> dict[str, Any]:
    if output == "capture":
        return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    if output == "stderr":
        return {"stdout": _stderr_fd(), "stderr": None}
    return {"stdout": None, "stderr": None}


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


class _Capture:
    """Reads a child's pipes without blocking on grandchildren that keep them open."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.selector = selectors.DefaultSelector()
        self.data: dict[int, bytearray] = {}
        self.names: dict[int, str] = {}
        for name in ("stdout", "stderr"):
            stream = getattr(process, name)
            if stream is not None:
                self.selector.register(stream.fileno(), selectors.EVENT_READ)
                self.data[stream.fileno()] = bytearray()
                self.names[stream.fileno()] = name

    def pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.selector.unregister(key.fd)
                continue
            kept = self.data[key.fd]
            kept += chunk[: max(0, _CAPTURE_LIMIT - len(kept))]

    def drain(self) -> None:
        stop = time.monotonic() + 2.0
        while self.selector.get_map() and time.monotonic() < stop:
            self.pump(0.05)
        self.selector.close()

    def text(self, name: str) -> str:
        for fd, stream in self.names.items():
            if stream == name:
                return bytes(self.data[fd]).decode("utf-8", "backslashreplace")
        return ""


def _wait(
    kept: Kept, deadline: float | None, clock: Callable[[], float], capture: _Capture | None
) -> tuple[bool, int | None]:
    """Wait until the command's whole tree is gone; returns (timed out, the interrupting signal or None).

    An interrupt passes its signal (SIGINT, or the SIGTERM/SIGHUP the CLI
    turned into one) on to the command's process group and gives it a grace
    period to stop by itself.
    """
    try:
        while kept.running():
            if deadline is not None and clock() >= deadline:
                return True, None
            if capture is not None:
                capture.pump(0.05)
            else:
                kept.wait(0.05 if deadline is not None else None)
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        if kept.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(kept.pid, signum)
        kept.wait(_INTERRUPT_GRACE_S)
        return False, signum
    return False, None


def run(
    command: Sequence[str],
    *,
    driver: str = "auto",
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    output: str = "inherit",
    env: Mapping[str, str] | None = None,
    popen: Popen = subprocess.Popen,
    clock: Callable[[], float] = time.monotonic,
) -> RunResult:
    """Run ``command`` with every Python process of its tree watched, and report what it did with CUDA.

    Parameters
    ----------
    command
        The program and its arguments (no shell): ``["python", "app.py"]``,
        ``["pytest", "-x"]``, ``["sh", "start.sh"]``.
    driver
        ``auto``, ``real``, ``simulated`` or ``none``, as for a scan.
    timeout
        Seconds before the whole process tree is killed (``None``: no limit).
    output
        ``inherit`` (the command writes to this process's stdout and stderr),
        ``stderr`` (its stdout goes to stderr, keeping stdout free for a
        report) or ``capture`` (kept in the result, up to 1 MiB each).
    env
        The command's environment (default: this process's); the agent's
        variables are added to it.
    popen
        The seam that starts the command; tests pass a fake.
    """
    argv = _validate(command, output, timeout)
    setup = resolve_driver(driver)
    directory = tempfile.mkdtemp(prefix="diagtools-run-")
    try:
        base = dict(os.environ if env is None else env)
        outcome, interrupted = _run_in(argv, setup, directory, base, _Launch(timeout, cwd, output, popen, clock))
        records = read_records(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result = assemble_run(records, argv, setup.info, outcome)
    if interrupted is not None:
        raise RunInterrupted(interrupted, result)
    return result


@dataclass(frozen=True)
class _Launch:
    """How to start and wait for the command: limits, output handling, and the two seams."""

    timeout: float | None
    cwd: str | os.PathLike[str] | None
    output: str
    popen: Popen
    clock: Callable[[], float]


def _run_in(
    argv: tuple[str, ...], setup: DriverSetup, directory: str, base: dict[str, str], launch: _Launch
) -> tuple[RunOutcome, int | None]:
    """Start the command under a keeper, wait, end the tree; how it ended, and the interrupting signal."""
    timeout, output, clock = launch.timeout, launch.output, launch.clock
    marker = os.urandom(16).hex()
    watch = agent_environment(
        directory, HOOK_DIR, marker=(protocol.SUBKERNEL_MARKER, marker), cuprobe=agent_cuprobe(), base=base
    )
    env, recorder_note = _with_start_recorder({**base, **setup.env, **watch})
    started = clock()
    try:
        kept = start_kept(argv, env=env, cwd=launch.cwd, popen=launch.popen, census_ms=CENSUS_MS, **_streams(output))
    except OSError as exc:
        return RunOutcome(None, None, notes=(f"the command could not be started: {exc.strerror or exc}",)), None
    capture = None
    try:
        capture = _Capture(kept.keeper) if output == "capture" else None
        if kept.error is not None:
            return RunOutcome(None, None, notes=(f"the command could not be started: {kept.error}",)), None
        deadline = started + timeout if timeout is not None else None
        timed_out, interrupted = _wait(kept, deadline, clock, capture)
    finally:
        exitcode = kept.release()  # the keeper kills every descendant, daemons that dropped the marker included
        kill_marked(marker)
        if capture is not None:
            capture.drain()
        for stream in (kept.keeper.stdout, kept.keeper.stderr):
            if stream is not None:
                stream.close()
    notes = [recorder_note] if recorder_note else []
    if timed_out:
        notes.append(f"the command did not finish in {timeout:g} s; its whole process tree was killed")
    if interrupted is not None:
        notes.append(f"interrupted by {signal.Signals(interrupted).name}: the command's process tree was stopped")
    outcome = RunOutcome(
        pid=kept.pid,
        exitcode=exitcode,
        timed_out=timed_out,
        notes=tuple(notes),
        duration_s=clock() - started,
        stdout=capture.text("stdout") if capture else None,
        stderr=capture.text("stderr") if capture else None,
        seen=(
            *((pid, argv) for pid, argv in started_pythons(directory) if pid != kept.keeper.pid),
            *kept.pythons.items(),
        ),
    )
    return outcome, interrupted


def _with_start_recorder(env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """``env`` with the start recorder preloaded first: each Python program the command starts is named at once.

    Without a C compiler it cannot be built: the keeper's census alone then looks for Python processes the
    agent never heard from, and the note says that a short-lived one may be missed.
    """
    try:
        library = build_starts_library()
    except DiagtoolsError as exc:
        return env, f"Python processes were found by polling only (a short-lived one may be missed): {exc}"
    env["LD_PRELOAD"] = ":".join([str(library), *preloaded(env)])
    return env, None


def started_pythons(directory: str) -> list[tuple[int, tuple[str, ...]]]:
    """``(pid, argv)`` of each Python program the start recorder saw begin, in the order they began."""
    try:
        with open(os.path.join(directory, protocol.RUN_STARTS), "rb") as handle:
            data = handle.read(16 << 20)
    except OSError:
        return []
    started = []
    for line in data.splitlines():
        pid, _, rest = line.partition(b" ")
        _parent, _, words = rest.partition(b" ")
        try:
            argv = bytes.fromhex(words.decode("ascii")).split(b"\0")
            started.append((int(pid), tuple(os.fsdecode(word) for word in argv)))
        except ValueError:
            continue
    return started
