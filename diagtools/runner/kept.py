"""Start any command under a keeper, so that nothing it starts outlives it.

The keeper (:mod:`diagtools.runner.keeper`, run as a script) is a child
subreaper that starts the command in a new session and, when the command
exits or the host asks (or dies), kills every descendant it has.
:func:`start_kept` starts one and returns a :class:`Kept` handle; its
:meth:`Kept.release` ends the tree on every path and gives the command's
exit code.  :func:`keeper_command` is the keeper's command line, for a host
that reads the keeper's status itself (:func:`diagtools.runner.subkernel.run_subkernel`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["KEEPER", "Kept", "absolute_executable", "cached_code", "keeper_command", "start_kept"]

KEEPER = Path(__file__).with_name("keeper.py")
KEEPER_WAIT_S = 40.0  # the keeper's own sweep gives up after 30 s
_START_WAIT_S = 30.0
_END_WAIT_S = 2.0  # the keeper has left: its last line is there already


def keeper_command(
    python: str,
    command: Sequence[str],
    *,
    status: int | None = None,
    lifeline: int | None = None,
    out: int | None = None,
    channel: int | None = None,
    dump: int | None = None,
    census_ms: int | None = None,
) -> list[str]:
    """The keeper's command line: run ``command`` under it, with these descriptors (see the keeper's options)."""
    options = {
        "status": status,
        "lifeline": lifeline,
        "out": out,
        "channel": channel,
        "dump": dump,
        "census": census_ms,
    }
    words = [word for name, fd in options.items() if fd is not None for word in (f"--{name}", str(fd))]
    return [absolute_executable(python), "-I", "-S", "-c", _KEEPER_START, str(KEEPER), *words, "--", *command]


def cached_code(path: str, name: str = "__main__") -> str:
    """A Python expression: the code of the file ``path``, read from its bytecode cache, for module ``name``.

    ``python FILE`` and ``exec(compile(...))`` compile the file on every start
    (milliseconds for the keeper, the protocol and the probe, on every scan).
    The import system's own source loader, present in every interpreter even
    under ``-I -S``, reads and checks ``__pycache__`` instead (writing it on a
    miss, unless bytecode writing is off) and imports nothing.  The
    expression needs ``sys`` in scope.
    """
    return f"{_LOADER}({name!r}, {path!r}).get_code({name!r})"


_LOADER = "sys.modules['_frozen_importlib_external'].SourceFileLoader"
# ``python -c`` runs the keeper from its cached bytecode; its path stays on the command line (as ``ps`` shows
# it) and becomes ``sys.argv[0]``, so the keeper sees the argv that ``python keeper.py`` would give it.
_KEEPER_START = (
    f"import sys\nsys.argv[:2] = sys.argv[1:2]\nexec({_LOADER}('__main__', sys.argv[0]).get_code('__main__'))\n"
)


def absolute_executable(python: str) -> str:
    """An absolute interpreter path: the keeper starts its command with ``execve``, which does not search PATH."""
    return python if os.path.isabs(python) else (shutil.which(python) or python)


class Kept:
    """A running keeper and its command: the command's pid, and the way to end them both.

    ``pid`` is the command's own pid (``None`` if it could not be started,
    ``error`` then says why).  Whatever happens, call :meth:`release` once.
    """

    def __init__(self, keeper: subprocess.Popen[bytes], status: int, lifeline: int) -> None:
        self.keeper = keeper
        self.pid: int | None = None
        self.error: str | None = None
        self.exitcode: int | None = None
        self.leftover = False
        self.pythons: dict[int, tuple[str, ...]] = {}  # with a census: the Python descendants the keeper saw
        self._status: int | None = status
        self._lifeline: int | None = lifeline
        self._said = b""

    def running(self) -> bool:
        """Whether the keeper is still there (it leaves only once the whole tree is gone)."""
        return self.keeper.poll() is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the keeper to leave; whether it did."""
        try:
            self.keeper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """Ask the keeper to kill the whole tree now (it then leaves)."""
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.write(self._lifeline, b"k")

    def release(self) -> int | None:
        """End the tree if it still runs, wait for the keeper, close every pipe; the command's exit code.

        Safe to call more than once; after the first call it only returns the code.
        """
        if self._lifeline is None:
            return self.exitcode
        if self.running():
            self.kill()
        os.close(self._lifeline)  # even if this process dies now, the closed lifeline makes the keeper sweep
        self._lifeline = None
        stop = time.monotonic() + KEEPER_WAIT_S
        while not self.wait(0) and time.monotonic() < stop:
            self._read(timeout=0.05)  # its last lines (a census can be long) must not fill the pipe it waits on
        if not self.wait(0):
            self.keeper.kill()
            self.keeper.wait()
        self._read(timeout=_END_WAIT_S)
        if self._status is not None:
            os.close(self._status)
            self._status = None
        return self.exitcode

    def _read(self, *, timeout: float, until_pid: bool = False) -> None:
        """Read the keeper's status lines until the pipe ends (or ``pid`` is said), for ``timeout`` s at most."""
        stop = time.monotonic() + timeout
        while self._status is not None:
            ready, _, _ = select.select([self._status], [], [], max(0.0, stop - time.monotonic()))
            data = os.read(self._status, 65536) if ready else b""
            self._said += data
            self._parse(final=bool(ready) and not data)
            if not data:  # the end of the pipe, or nothing within the time
                return
            if until_pid and (self.pid is not None or self.error is not None):
                return

    def _parse(self, *, final: bool = False) -> None:
        """Take every complete line said so far (and, at the end of the pipe, what is left)."""
        complete, _, rest = self._said.rpartition(b"\n")
        if final:
            complete, rest = self._said, b""
        self._said = rest
        for line in complete.decode("ascii", "replace").split("\n"):
            self._line(line)

    def _line(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "pid":
            self.pid = int(rest)
        elif word == "error":
            errno, _, message = rest.partition(" ")
            self.error = message or f"errno {errno}"
        elif word == "python":
            pid, _, words = rest.partition(" ")
            with contextlib.suppress(ValueError):
                self.pythons[int(pid)] = tuple(bytes.fromhex(words).decode("utf-8", "replace").split("\0"))
        elif word == "exit":
            code, _, tail = rest.partition(" ")
            self.exitcode, self.leftover = (None if self.error else int(code)), tail == "leftover"


def start_kept(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    channel: int | None = None,
    dump: int | None = None,
    python: str = sys.executable,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    census_ms: int | None = None,
) -> Kept:
    """Start ``command`` under a keeper, with these streams (``None``: this process's), and wait until it runs.

    ``channel`` and ``dump`` are handed to the command as the subkernel's are
    (moved high, named in its environment); the caller keeps its own copies.
    ``census_ms`` has the keeper note the Python descendants it sees (:attr:`Kept.pythons`).
    Raises what ``popen`` raises; once it returns, the caller must call
    :meth:`Kept.release`.  A command that could not be executed gives a
    handle with ``error`` set (its tree is already gone).
    """
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    argv = keeper_command(
        python, command, status=status_w, lifeline=life_r, channel=channel, dump=dump, census_ms=census_ms
    )
    passed = tuple(fd for fd in (status_w, life_r, channel, dump) if fd is not None)
    try:
        keeper = popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=passed,
            start_new_session=True,
        )
    except BaseException:
        for fd in (status_r, life_w):
            os.close(fd)
        raise
    finally:
        for fd in (status_w, life_r):
            os.close(fd)
    kept = Kept(keeper, status_r, life_w)
    try:
        kept._read(timeout=_START_WAIT_S, until_pid=True)
    except BaseException:
        kept.release()
        raise
    return kept
