"""Run the probe in a fresh subkernel and bring back everything it recorded.

The subkernel is the caller's own interpreter started as ``python -S`` in a new
session, with a private pipe for results, by a keeper process
(:mod:`diagtools.runner.keeper`) that is the subreaper of its whole tree.
Whatever the target does (prints, closes fd 1, segfaults, hangs, calls
``os._exit``, double-forks a daemon) the runner keeps reading, enforces the
deadline, dumps the stacks of a hung subkernel, has the keeper kill every
descendant, and returns every event that reached the pipe.  It does the same
when the caller is interrupted: every path out of :func:`run_subkernel` ends
the tree.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.runner import kept as keeper_client
from diagtools.runner.events import DecodedEvents, EventReader
from diagtools.runner.kept import (
    DUMP_GRACE_S,
    DUMP_LIMIT,
    DUMP_SIGNAL,
    OUTPUT_LIMIT,
    Kept,
    cached_code,
    enlarge_pipe,
    kill_marked,
    start_kept,
)

__all__ = [
    "CapturedOutput",
    "RawRun",
    "SubkernelRequest",
    "bootstrap_code",
    "run_subkernel",
    "starting_runs",
    "subkernel_env",
]

#: who hears each run of this context as it starts: a live display naming its phase (see :func:`starting_runs`)
_STARTING: ContextVar[Callable[[SubkernelRequest], object] | None] = ContextVar("diagtools_starting", default=None)


@contextlib.contextmanager
def starting_runs(listener: Callable[[SubkernelRequest], object]) -> Iterator[None]:
    """Within the block, ``listener(request)`` hears each subkernel run of this thread as it starts, whoever
    called :func:`run_subkernel` (a scan, a fix, a replay): how a display says what a long call does now."""
    token = _STARTING.set(listener)
    try:
        yield
    finally:
        _STARTING.reset(token)


def _announce(request: SubkernelRequest) -> None:
    listener = _STARTING.get()
    if listener is None:
        return
    with contextlib.suppress(Exception):  # a display that fails never stops the run it describes
        listener(request)


_BATCH_S = 0.01
_READ_BYTES = 1 << 20
_FULL_READ = 64 * 1024  # a read this large found a full pipe: the writer was waiting on us


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
    channel_truncated: bool = False
    never_kept: int | None = None
    """The exit status of an interpreter that ended without ever starting the keeper (a ``--python`` wrapper that
    does not run its arguments); ``None`` when the keeper ran."""


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
    """Collects the channel's bytes, up to a bound, and has the protocol read each line as it arrives.

    Reading while the subkernel runs (on a core the runner would leave idle)
    takes the events' decoding and validation off the time after the
    subkernel ends.  Once a read finds the pipe full (the subkernel writes
    faster than lines are read: a flood), the rest is only collected, and
    read at the end, so the pipe empties as fast as before.  Past
    :data:`CHANNEL_LIMIT` (far beyond any real import tree) whole lines are
    dropped and counted as skipped, and the run is marked truncated.
    """

    def __init__(self) -> None:
        self.reader = EventReader()
        self.later: list[bytes] = []  # after a flood: read by decoded()
        self.kept = 0
        self.dropped_lines = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        limit = keeper_client.CHANNEL_LIMIT
        if not self.truncated and self.kept + len(data) <= limit:
            self._keep(data)
            self.kept += len(data)
            return
        if not self.truncated:
            cut = data.rfind(b"\n", 0, limit - self.kept) + 1
            self._keep(data[:cut])
            self.kept += cut
            self.truncated = True
            data = data[cut:]
        self.dropped_lines += data.count(b"\n")

    def _keep(self, data: bytes) -> None:
        if self.later or len(data) >= _FULL_READ:
            self.later.append(data)
        else:
            self.reader.feed(data)

    def decoded(self) -> DecodedEvents:
        self.reader.feed(b"".join(self.later))
        self.later = []
        decoded = self.reader.close()
        decoded.skipped += self.dropped_lines
        return decoded


def subkernel_env(request: SubkernelRequest, channel_fd: int, dump_fd: int, marker: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(request.env)
    env.update(request.settings)
    env.update(
        {
            protocol.CHANNEL_FD: str(channel_fd),
            protocol.PROGRAM_FILE: str(request.program),
            protocol.DUMP_FD: str(dump_fd),
            protocol.DUMP_SIGNAL: str(int(DUMP_SIGNAL)),
            protocol.SUBKERNEL_MARKER: marker,
        }
    )
    return env


def bootstrap_code(program: Path) -> str:
    """Load the protocol module by hand (no import system: the probe's tree stays bare), then run ``program``.

    Both come from their bytecode caches (:func:`~diagtools.runner.kept.cached_code`),
    not compiled again on every start.  ``python -c`` would make the working
    directory the first import root, so a ``colorsys.py`` lying there would
    shadow the standard library's: it is removed.
    """
    module, source = protocol.PROTOCOL_MODULE, str(Path(protocol.__file__).resolve())
    return (
        "import sys\n"
        "if sys.path[:1] == ['']: del sys.path[0]\n"  # the caller's working directory is not an import root
        f"_m = type(sys)({module!r}); _m.__file__ = {source!r}\n"
        f"exec({cached_code(source, module)}, _m.__dict__)\n"
        f"sys.modules[{module!r}] = _m\n"
        "del _m\n"
        f"exec({cached_code(str(program))})\n"
    )


def run_subkernel(
    request: SubkernelRequest,
    *,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    clock: Callable[[], float] = time.monotonic,
    meanwhile: Callable[[], object] | None = None,
) -> RawRun:
    """Run the program once under a keeper and return what it recorded, however it ended.

    ``meanwhile``, when given, is called once the keeper is started and
    before anything is read: what the caller needs only afterwards (importing
    the modules that make a result of the events) then runs while the keeper
    and the subkernel start, not before them.  Its time counts toward the
    timeout, and the channel's pipe holds what the subkernel sends meanwhile.

    Whatever way this returns or raises (``KeyboardInterrupt`` included), the
    keeper has been told to kill the subkernel's whole process tree.
    """
    _announce(request)
    marker = os.urandom(16).hex()
    fds = _Fds()
    wall_start = time.time()
    started = clock()
    kept: Kept | None = None
    try:
        kept = start_kept(
            [request.python, *request.flags, "-c", bootstrap_code(request.program)],
            env=subkernel_env(request, fds.channel_w, fds.dump, marker),
            cwd=request.cwd,
            stdin=subprocess.DEVNULL,
            stdout=fds.out_w,
            stderr=fds.err_w,
            channel=fds.channel_w,
            dump=fds.dump,
            python=request.python,
            popen=popen,
            wait_for_pid=False,
        )
        fds.close_child_ends()
        if meanwhile is not None:
            meanwhile()
        collected = _collect(kept, fds, started, request.timeout, clock)
    except BaseException:
        _release(kept, marker)
        fds.close_all()
        raise
    _release(kept, marker)
    fault_dump = fds.read_dump()
    decoded = collected.events.decoded()
    return RawRun(
        events=tuple(decoded.events),
        returncode=kept.reported if kept.ended else None,
        timed_out=collected.timed_out,
        stdout=collected.stdout.captured(),
        stderr=collected.stderr.captured(),
        fault_dump=fault_dump,
        duration_s=clock() - started,
        marker=marker,
        started_at=wall_start,
        never_kept=kept.never_kept(),
        skipped_events=decoded.skipped,
        channel_truncated=collected.events.truncated,
    )


class _Fds:
    """The pipes between the runner and the subkernel, and its dump file; each end closed once."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.channel_r, self.channel_w = self._pipe()
        self.out_r, self.out_w = self._pipe()
        self.err_r, self.err_w = self._pipe()
        self.dump = os.memfd_create("diagtools-faults", 0)  # faulthandler writes here
        self.opened.append(self.dump)
        for fd in (self.channel_w, self.out_w, self.err_w):
            enlarge_pipe(fd)

    def _pipe(self) -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        self.opened += [read_fd, write_fd]
        return read_fd, write_fd

    def close(self, fd: int) -> None:
        if fd in self.opened:
            self.opened.remove(fd)
            os.close(fd)

    def close_child_ends(self) -> None:
        for fd in (self.channel_w, self.out_w, self.err_w):
            self.close(fd)

    def close_all(self) -> None:
        for fd in list(self.opened):
            self.close(fd)

    def read_dump(self) -> str:
        """Everything faulthandler wrote to the dump file (at most a few MiB), then close every descriptor."""
        try:
            size = min(os.fstat(self.dump).st_size, DUMP_LIMIT)
            return os.pread(self.dump, size, 0).decode("utf-8", "backslashreplace")
        finally:
            self.close_all()


@dataclass
class _Collected:
    events: _EventStream
    stdout: _Buffer
    stderr: _Buffer
    timed_out: bool = False


def _collect(kept: Kept, fds: _Fds, started: float, timeout: float, clock: Callable[[], float]) -> _Collected:
    """Read every stream until the keeper reports the tree gone, enforcing the deadline.

    The deadline is ``timeout`` seconds of the subkernel's own time: while
    the subkernel's output fills the pipes faster than one read empties them
    (it is waiting on the runner, not hung), the time spent reading is added
    back, up to one more ``timeout`` in all, so a target that prints forever
    still times out.
    """
    collected = _Collected(_EventStream(), _Buffer(), _Buffer())
    sinks: dict[int, Callable[[bytes], None]] = {
        fds.channel_r: collected.events.add,
        fds.out_r: collected.stdout.add,
        fds.err_r: collected.stderr.add,
        kept.status_fd: kept.feed,
    }
    deadline, extended, kill_at = started + timeout, 0.0, None
    with selectors.DefaultSelector() as selector:
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        while not kept.ended and kept.status_fd in selector.get_map():
            now = clock()
            if kill_at is None and now >= deadline:
                collected.timed_out = True
                kept.ask_for_stacks()
                kill_at = now + DUMP_GRACE_S
            if kill_at is not None and now >= kill_at:
                kept.kill()
                kill_at = float("inf")
            moved = _pump(selector, sinks, min(0.05, max(0.0, deadline - now)), skip=(fds.channel_r, kept.status_fd))
            if moved >= _FULL_READ and extended < timeout:
                spent = min(clock() - now, timeout - extended)
                deadline, extended = deadline + spent, extended + spent
            elif moved < _FULL_READ and not kept.ended:
                _await_keeper(kept.status_fd, _BATCH_S)
        _drain(selector, sinks)
    return collected


def _await_keeper(status: int, seconds: float) -> None:
    """Pause between batches of events, but end the pause the moment the keeper says something.

    Waking for every event would slow the target; sleeping through the
    keeper's ``exit`` would add the rest of the pause to every run.
    """
    select.select([status], [], [], seconds)


def _release(kept: Kept | None, marker: str) -> None:
    """End the run on every path: the keeper kills the tree and is reaped; what it could not reach is killed.

    When the keeper reported that it swept the whole tree (as subreaper,
    every descendant was its to kill) no process can carry the marker, and
    reading every process's environment (milliseconds, more on a busy
    machine) is skipped; on every other path the marked processes are killed.
    """
    if kept is not None:
        kept.release()
    if kept is None or not kept.swept:
        kill_marked(marker)


def _pump(
    selector: selectors.BaseSelector,
    sinks: dict[int, Callable[[bytes], None]],
    timeout: float,
    skip: tuple[int, ...] = (),
) -> int:
    """Read what is ready; the number of output bytes moved (the descriptors in ``skip`` not counted)."""
    moved = 0
    for key, _ in selector.select(timeout):
        data = os.read(key.fd, _READ_BYTES)
        sinks[key.fd](data)  # b"": the end of that stream (the keeper's status parser needs to know)
        if data:
            moved += len(data) if key.fd not in skip else 0
        else:
            selector.unregister(key.fd)
    return moved


def _drain(selector: selectors.BaseSelector, sinks: dict[int, Callable[[bytes], None]]) -> None:
    """Read what is left; every writer is dead, so every stream ends soon."""
    stop = time.monotonic() + 2.0
    while selector.get_map() and time.monotonic() < stop:
        _pump(selector, sinks, 0.05)
