"""The one keeper client: start any command under a keeper, so that nothing it starts outlives it.

The keeper (:mod:`diagtools.runner.keeper`, run as a script) is a child
subreaper that starts the command in a new session and, when the command
exits or the host asks (or dies), kills every descendant it has.
:func:`start_kept` starts one and returns a :class:`Kept` handle; its
:meth:`Kept.release` ends the tree on every path and gives the command's
exit code.  Fresh subkernels, ``diagtools run`` and the sweep zygote all
start their processes this way, and read what those processes leave with
the same bounds (:data:`CHANNEL_LIMIT`, :data:`DUMP_LIMIT`, :data:`OUTPUT_LIMIT`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from diagtools import protocol

__all__ = [
    "CHANNEL_LIMIT",
    "DUMP_GRACE_S",
    "DUMP_LIMIT",
    "DUMP_SIGNAL",
    "KEEPER",
    "OUTPUT_LIMIT",
    "Kept",
    "abort_all",
    "absolute_executable",
    "bounded_lines",
    "cached_code",
    "enlarge_pipe",
    "keeper_command",
    "kill_group",
    "kill_marked",
    "start_kept",
]

KEEPER = Path(__file__).with_name("keeper.py")
KEEPER_WAIT_S = 40.0  # the keeper's own sweep gives up after 30 s
_START_WAIT_S = 30.0
_END_WAIT_S = 2.0  # the keeper has left: its last line is there already

# what a host reads of a kept process, however it delivers it (a pipe or a file): far beyond any real import tree
OUTPUT_LIMIT = 64 * 1024  # of each of stdout and stderr
CHANNEL_LIMIT = 64 << 20  # of the events, in whole lines; the lines past it are counted and dropped
DUMP_LIMIT = 4 << 20  # of the fault and stack dumps
DUMP_SIGNAL = signal.SIGUSR1  # asks a hung program for its stacks (faulthandler answers in the dump file)
DUMP_GRACE_S = 0.5  # how long a program past its deadline has to write them before it is killed
_CHANNEL_PIPE_BYTES = 1 << 20


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
    ``error`` then says why).  ``ended`` says the keeper reported the tree
    gone; ``reported`` is the exit status it gave (127 when the command could
    not be executed), ``exitcode`` the command's own (``None`` then).  A host
    that waits on other descriptors too reads the keeper's lines itself:
    it watches :attr:`status_fd` and hands what it reads to :meth:`feed`.
    Whatever happens, call :meth:`release` once.
    """

    def __init__(self, keeper: subprocess.Popen[bytes], status: int, lifeline: int) -> None:
        self.keeper = keeper
        self.pid: int | None = None
        self.error: str | None = None
        self.exitcode: int | None = None
        self.reported: int | None = None
        self.ended = False
        self.leftover = False
        self.pythons: dict[int, tuple[str, ...]] = {}  # with a census: the Python descendants the keeper saw
        self._status: int | None = status
        self._status_ended = False
        self._lifeline: int | None = lifeline
        self._lock = threading.Lock()
        self._said = b""
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def status_fd(self) -> int:
        """The descriptor the keeper's status lines arrive on (valid until :meth:`release`)."""
        assert self._status is not None, "the keeper was released"
        return self._status

    @property
    def swept(self) -> bool:
        """Whether the keeper left normally, having killed every descendant (none can still carry a marker)."""
        return self.ended and not self.leftover and self.keeper.returncode == 0

    def never_kept(self) -> int | None:
        """The exit status of an interpreter that ended without ever running the keeper's code (a wrapper
        that does not run its arguments); ``None`` when the keeper ran."""
        if self.pid is None and not self.ended and self.error is None:
            return self.keeper.returncode
        return None

    def running(self) -> bool:
        """Whether the keeper is still there (it leaves only once the whole tree is gone)."""
        return self.keeper.poll() is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the keeper to leave, woken the moment it does; whether it did.

        ``Popen.wait`` with a timeout polls with sleeps that double up to
        50 ms; a pidfd (Linux 5.3+) says exactly when.
        """
        if self.keeper.returncode is None and timeout:
            with contextlib.suppress(AttributeError, OSError):  # no pidfd here, or already reaped
                pidfd = os.pidfd_open(self.keeper.pid)
                try:
                    select.select([pidfd], [], [], timeout)
                finally:
                    os.close(pidfd)
                timeout = 0
        try:
            self.keeper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """Ask the keeper to kill the whole tree now (it then leaves).  Safe from any thread."""
        with self._lock:
            if self._lifeline is not None:
                with contextlib.suppress(OSError):
                    os.write(self._lifeline, b"k")

    def ask_for_stacks(self) -> None:
        """Ask the command for its stacks (faulthandler answers in the dump file)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, DUMP_SIGNAL)

    def release(self) -> int | None:
        """End the tree if it still runs, wait for the keeper, close every pipe; the command's exit code.

        Safe to call more than once; after the first call it only returns the code.
        """
        if self._lifeline is None:
            return self.exitcode
        if self.running():
            self.kill()
        with self._lock, _LIVE_LOCK:
            _LIVE.discard(self)
            os.close(self._lifeline)  # even if this process dies now, the closed lifeline makes the keeper sweep
            self._lifeline = None
        stop = time.monotonic() + KEEPER_WAIT_S
        while not self.wait(0) and time.monotonic() < stop:
            if self._status_ended:
                self.wait(stop - time.monotonic())
            else:
                self._read(timeout=0.05)  # its last lines (a census can be long) must not fill the pipe it waits on
        if not self.wait(0):
            self.keeper.kill()
            self.keeper.wait()
        self._read(timeout=_END_WAIT_S)
        if self._status is not None:
            os.close(self._status)
            self._status = None
        return self.exitcode

    def feed(self, data: bytes) -> None:
        """Take bytes read from :attr:`status_fd` (``b""``: the pipe ended)."""
        self._said += data
        self._parse(final=not data)
        if not data:
            self._status_ended = True

    def _read(self, *, timeout: float, until_pid: bool = False) -> None:
        """Read the keeper's status lines until the pipe ends (or ``pid`` is said), for ``timeout`` s at most."""
        stop = time.monotonic() + timeout
        while self._status is not None and not self._status_ended:
            ready, _, _ = select.select([self._status], [], [], max(0.0, stop - time.monotonic()))
            if not ready:
                return
            self.feed(os.read(self._status, 65536))
            if until_pid and (self.pid is not None or self.error is not None or self.ended):
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
            self.reported, self.ended, self.leftover = int(code), True, tail == "leftover"
            self.exitcode = None if self.error else self.reported


_LIVE: set[Kept] = set()
_LIVE_LOCK = threading.Lock()


def abort_all() -> None:
    """Have every kept tree this process is running killed now (an interrupt: the threads waiting on them return)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for kept in live:
        kept.kill()


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
    wait_for_pid: bool = True,
) -> Kept:
    """Start ``command`` under a keeper, with these streams (``None``: this process's), and wait until it runs.

    ``channel`` and ``dump`` are handed to the command as the subkernel's are
    (moved high, named in its environment); the caller keeps its own copies.
    ``census_ms`` has the keeper note the Python descendants it sees (:attr:`Kept.pythons`).
    Raises what ``popen`` raises; once it returns, the caller must call
    :meth:`Kept.release`.  A command that could not be executed gives a
    handle with ``error`` set (its tree is already gone).  ``wait_for_pid=False``
    returns at once: the caller then reads the keeper's lines itself (:meth:`Kept.feed`).
    """
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    argv = keeper_command(
        python, command, status=status_w, lifeline=life_r, channel=channel, dump=dump, census_ms=census_ms
    )
    passed = tuple(fd for fd in (status_w, life_r, channel, dump) if fd is not None)
    try:
        streams = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
        keeper = popen(argv, env=env, cwd=cwd, **streams, pass_fds=passed, start_new_session=True)
    except BaseException:
        for fd in (status_r, life_w):
            os.close(fd)
        raise
    finally:
        for fd in (status_w, life_r):
            os.close(fd)
    kept = Kept(keeper, status_r, life_w)
    if not wait_for_pid:
        return kept
    try:
        kept._read(timeout=_START_WAIT_S, until_pid=True)
    except BaseException:
        kept.release()
        raise
    return kept


def bounded_lines(path: str | os.PathLike[str]) -> tuple[bytes, int]:
    """A record file's whole lines up to :data:`CHANNEL_LIMIT`, and how many lines past it were dropped.

    What lies past the bound is counted in chunks, never held: a flooding
    program gets the same result from a file as from the channel's pipe.
    """
    try:
        handle = open(path, "rb")  # noqa: SIM115 - read in two parts below
    except OSError:
        return b"", 0
    with handle:
        data = handle.read(CHANNEL_LIMIT + 1)
        if len(data) <= CHANNEL_LIMIT:
            return data, 0
        cut = data.rfind(b"\n", 0, CHANNEL_LIMIT) + 1
        dropped = data.count(b"\n", cut)
        while chunk := handle.read(1 << 20):
            dropped += chunk.count(b"\n")
    return data[:cut], max(dropped, 1)


def enlarge_pipe(fd: int) -> None:
    """Room for a burst of output between two batched reads (Linux only; best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHANNEL_PIPE_BYTES)


def kill_marked(marker: str) -> None:
    """Kill what the keeper could not reach (it was killed itself) but still carries the marker."""
    needle = f"{protocol.SUBKERNEL_MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
