"""Run the probe in a fresh subkernel and bring back everything it recorded.

The subkernel is the caller's own interpreter started as ``python -S`` in a new
session, with a private pipe for results.  Whatever the target does (prints,
closes fd 1, segfaults, hangs, calls ``os._exit``) the runner keeps reading,
enforces the deadline, dumps the stacks of a hung subkernel before killing its
whole process group, and returns every event that reached the pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diagtools import protocol

__all__ = ["RawRun", "SubkernelRequest", "run_subkernel"]

OUTPUT_LIMIT = 64 * 1024
SUBKERNEL_MARKER = protocol.SUBKERNEL_MARKER
_DUMP_SIGNAL = signal.SIGUSR1
_DUMP_GRACE_S = 0.5
_BATCH_S = 0.01
_CHANNEL_PIPE_BYTES = 1 << 20


@dataclass(frozen=True)
class SubkernelRequest:
    """One subkernel run: which program, its settings, the driver's environment, the limits.

    ``settings`` are the ``DIAGTOOLS_*`` variables the program reads; ``env``
    is what the chosen driver needs (``LD_LIBRARY_PATH`` and the like).
    """

    program: Path
    settings: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 120.0
    flags: tuple[str, ...] = ()
    python: str = sys.executable
    cwd: str | None = None

    def with_settings(self, settings: Mapping[str, str]) -> SubkernelRequest:
        return replace(self, settings={**self.settings, **settings})


@dataclass(frozen=True)
class CapturedOutput:
    """A stream the target wrote to, truncated but with its full byte count."""

    text: str
    total_bytes: int

    def describe(self) -> str:
        if self.total_bytes <= len(self.text.encode("utf-8", "backslashreplace")):
            return self.text
        return self.text + f"\n[... truncated: {self.total_bytes} bytes in all]"


@dataclass(frozen=True)
class RawRun:
    """The unprocessed outcome of one subkernel: events, outputs, exit, dumps."""

    events: tuple[dict[str, Any], ...]
    returncode: int | None
    timed_out: bool
    stdout: CapturedOutput
    stderr: CapturedOutput
    fault_dump: str
    duration_s: float
    marker: str
    started_at: float = 0.0
    skipped_events: int = 0


class _Buffer:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.kept = 0
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = OUTPUT_LIMIT - self.kept
        if room > 0:
            self.chunks.append(data[:room])
            self.kept += min(room, len(data))

    def captured(self) -> CapturedOutput:
        return CapturedOutput(b"".join(self.chunks).decode("utf-8", "backslashreplace"), self.total)


class _EventStream:
    """Collects the channel's bytes; decoded and validated by the protocol once, at the end."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def add(self, data: bytes) -> None:
        self.chunks.append(data)

    def decoded(self) -> protocol.DecodedEvents:
        return protocol.decode_events(b"".join(self.chunks))


def _subkernel_env(request: SubkernelRequest, channel_fd: int, dump_fd: int, marker: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(request.env)
    env.update(request.settings)
    env.update(
        {
            protocol.CHANNEL_FD: str(channel_fd),
            protocol.PROGRAM_FILE: str(request.program),
            protocol.DUMP_FD: str(dump_fd),
            protocol.DUMP_SIGNAL: str(int(_DUMP_SIGNAL)),
            SUBKERNEL_MARKER: marker,
        }
    )
    return env


def _bootstrap_code(program: Path) -> str:
    """Load the protocol module by hand (no import system: the probe's tree stays bare), then run ``program``.

    ``python -c`` would make the working directory the first import root, so a
    ``colorsys.py`` lying there would shadow the standard library's: it is removed.
    """
    module, source = protocol.AGENT_MODULE, str(Path(protocol.__file__).resolve())
    return (
        "import sys\n"
        "if sys.path[:1] == ['']: del sys.path[0]\n"  # the caller's working directory is not an import root
        f"_m = type(sys)({module!r}); _m.__file__ = {source!r}\n"
        f"exec(compile(open({source!r}, 'rb').read(), {source!r}, 'exec'), _m.__dict__)\n"
        f"sys.modules[{module!r}] = _m\n"
        "del _m\n"
        f"exec(compile(open({str(program)!r}, 'rb').read(), {str(program)!r}, 'exec'))\n"
    )


def run_subkernel(
    request: SubkernelRequest,
    *,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    clock: Callable[[], float] = time.monotonic,
) -> RawRun:
    """Run the program once in a new session and return what it recorded, however it ended."""
    marker = os.urandom(16).hex()
    read_fd, write_fd = os.pipe()
    _enlarge_pipe(write_fd)
    dump_fd = os.memfd_create("diagtools-faults", 0)  # inherited: faulthandler writes here
    env = _subkernel_env(request, write_fd, dump_fd, marker)
    wall_start = time.time()
    started = clock()
    try:
        process = popen(
            [request.python, *request.flags, "-c", _bootstrap_code(request.program)],
            env=env,
            cwd=request.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd, dump_fd),
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        os.close(dump_fd)
        raise
    finally:
        os.close(write_fd)
    collected = _collect(process, read_fd, started + request.timeout, clock, marker)
    fault_dump = _read_all(dump_fd)
    decoded = collected.events.decoded()
    return RawRun(
        events=tuple(decoded.events),
        returncode=collected.returncode,
        timed_out=collected.timed_out,
        stdout=collected.stdout.captured(),
        stderr=collected.stderr.captured(),
        fault_dump=fault_dump,
        duration_s=clock() - started,
        marker=marker,
        started_at=wall_start,
        skipped_events=decoded.skipped,
    )


@dataclass
class _Collected:
    events: _EventStream
    stdout: _Buffer
    stderr: _Buffer
    returncode: int | None = None
    timed_out: bool = False


def _collect(
    process: subprocess.Popen[bytes], channel_fd: int, deadline: float, clock: Callable[[], float], marker: str
) -> _Collected:
    """Read all three streams until the subkernel exits or the deadline passes."""
    assert process.stdout is not None
    assert process.stderr is not None
    collected = _Collected(_EventStream(), _Buffer(), _Buffer())
    sinks: dict[int, Callable[[bytes], None]] = {
        channel_fd: collected.events.add,
        process.stdout.fileno(): collected.stdout.add,
        process.stderr.fileno(): collected.stderr.add,
    }
    with selectors.DefaultSelector() as selector:
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        while not _exited(process.pid):
            if clock() >= deadline:
                collected.timed_out = True
                _dump_and_kill(process, selector, sinks)
                break
            _pump(selector, sinks, min(0.05, max(0.0, deadline - clock())))
            time.sleep(_BATCH_S)  # read in batches: waking per event would slow the target
        _kill_group(process.pid)
        _kill_marked(marker)
        _drain(selector, sinks)
    collected.returncode = process.wait()
    os.close(channel_fd)
    process.stdout.close()
    process.stderr.close()
    return collected


def _enlarge_pipe(fd: int) -> None:
    """Room for a burst of events between two batched reads (Linux only; best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHANNEL_PIPE_BYTES)


def _exited(pid: int) -> bool:
    """True once the subkernel has exited; it stays a zombie until ``wait``."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _pump(selector: selectors.BaseSelector, sinks: dict[int, Callable[[bytes], None]], timeout: float) -> None:
    for key, _ in selector.select(timeout):
        data = os.read(key.fd, 65536)
        if data:
            sinks[key.fd](data)
        else:
            selector.unregister(key.fd)


def _drain(selector: selectors.BaseSelector, sinks: dict[int, Callable[[bytes], None]]) -> None:
    """Read what is left; every writer is dead, so every stream ends soon."""
    stop = time.monotonic() + 2.0
    while selector.get_map() and time.monotonic() < stop:
        _pump(selector, sinks, 0.05)


def _dump_and_kill(
    process: subprocess.Popen[bytes], selector: selectors.BaseSelector, sinks: dict[int, Callable[[bytes], None]]
) -> None:
    """Ask the hung subkernel for its stacks, then kill its process group."""
    try:
        os.kill(process.pid, _DUMP_SIGNAL)
    except ProcessLookupError:
        return
    stop = time.monotonic() + _DUMP_GRACE_S
    while time.monotonic() < stop and not _exited(process.pid):
        _pump(selector, sinks, 0.05)
    _kill_group(process.pid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_marked(marker: str) -> None:
    """Kill what escaped the process group (a ``setsid`` grandchild) but still carries the marker."""
    needle = f"{SUBKERNEL_MARKER}={marker}".encode()
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


def _read_all(fd: int) -> str:
    """Everything faulthandler wrote to the dump file, then close it."""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0).decode("utf-8", "backslashreplace")
    finally:
        os.close(fd)
