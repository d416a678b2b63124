"""Run the sweep zygote: one preloading subkernel that forks a child per module.

The zygote is started like any subkernel (``python -S`` under a keeper, in a
new session, the runner's bootstrap, a private pipe for its own events); the
keeper kills every process left of its tree once the sweep is over, daemons
that dropped the environment marker included, and never before.  Its children
write their probe events, stdout, stderr and fault dumps to files in a
private folder; when the zygote reports a child's exit status, those files
become one :class:`RawRun`, exactly what a fresh subkernel would have
returned.  The deadline of each child is kept here: a child past it gets
the stack-dump signal, then its process group is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.runner.events import decode_events
from diagtools.runner.kept import (
    DUMP_GRACE_S,
    DUMP_LIMIT,
    DUMP_SIGNAL,
    OUTPUT_LIMIT,
    Kept,
    bounded_lines,
    enlarge_pipe,
    kill_group,
    kill_marked,
    start_kept,
)
from diagtools.runner.subkernel import CapturedOutput, RawRun, SubkernelRequest, bootstrap_code, subkernel_env

__all__ = ["PackageZygote", "ZygoteOutcome", "run_zygote"]

_POLL_S = 0.02

ChildDone = Callable[[int, "RawRun | None", "ZygoteOutcome"], None]


@dataclass
class ZygoteOutcome:
    """How the zygote went: what it preloaded, why it refused, which modules it never finished."""

    ready: bool = False
    refused: str = ""
    refused_item: str | None = None
    preloaded: list[tuple[str, float]] = field(default_factory=list)
    passed_over: list[tuple[str, str]] = field(default_factory=list)  # (candidate, why it was not preloaded)
    environment_kept: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (candidate, variables)
    scanned_while_searching: list[tuple[str, int, float]] = field(default_factory=list)  # (candidate, rows, s)
    inside: list[tuple[str, str | None]] = field(default_factory=list)
    loaded: int = 0
    present: list[int] = field(default_factory=list)
    unfinished: tuple[int, ...] = ()
    detail: str = ""
    child_inside: dict[int, list[tuple[str, str | None]]] = field(default_factory=dict)
    watching: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (candidate or "", aliases watched)
    guarding: list[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=list)  # candidate, (module, why)
    looked_up: dict[int, str] = field(default_factory=dict)  # child -> the watched module its lookup was of
    packages: dict[int, PackageZygote] = field(default_factory=dict)
    huge_pages: list[tuple[int, float]] = field(default_factory=list)  # (bytes moved into huge pages, seconds)

    def watched_lines(self) -> tuple[str, ...]:
        """What this zygote watched, for zygotes elsewhere that preload the same list: each module watched
        with the candidate that guards it, an alias marked so (``NAME<TAB>CANDIDATE[<TAB>alias]``)."""
        aliases = [f"{name}\t{candidate}\talias" for candidate, names in self.watching for name in names]
        return (*aliases, *(f"{module}\t{candidate}" for candidate, guarded in self.guarding for module, _ in guarded))

    def inside_of(self, index: int) -> list[tuple[str, str | None]]:
        """The package's modules loaded in the zygote that forked child ``index``, before it ran."""
        return self.child_inside.get(index, self.inside)


@dataclass
class PackageZygote:
    """A zygote forked for the modules below one package: it imported the package once for all of them."""

    seconds: float | None = None  # None: it never finished importing the package
    before_cuda: bool = False  # it imported only what the package imports before it initializes CUDA
    continued: bool = False  # it went on from the package's own row, after its traced import
    handed_cuda: bool = False  # ...which had initialized the simulated driver, handed to each child
    loaded: int = 0
    served: int = 0
    refused: str = ""


@dataclass
class _Child:
    index: int
    pid: int
    started: float
    wall_start: float
    dump_sent: float | None = None
    timed_out: bool = False


class _Zygote:
    """The host's view of one zygote run: its events, its children, their deadlines."""

    def __init__(self, workdir: Path, count: int, timeout: float, on_child: ChildDone, marker: str) -> None:
        self.workdir = workdir
        self.timeout = timeout
        self.on_child = on_child
        self.marker = marker
        self.outcome = ZygoteOutcome()
        self.children: dict[int, _Child] = {}
        self.finished: set[int] = set()
        self.count = count
        self.pending = b""
        # what each package zygote had loaded, by package index (-1: where a candidate's rows are scanned)
        self.insides: dict[int, list[tuple[str, str | None]]] = {}
        self.parents: dict[int, int] = {}
        self.importing: dict[int, _Child] = {}  # package zygotes still importing their package

    def feed(self, data: bytes) -> None:
        lines, _, self.pending = (self.pending + data).rpartition(b"\n")
        if lines:
            for event in decode_events(lines + b"\n").events:
                self.handle(event)

    def handle(self, event: dict[str, Any]) -> None:
        kind = event["e"]
        if kind in ("preloaded", "passed-over", "environment-kept", "watching", "guarding"):
            self.preload_event(kind, event)
        elif kind == "refused":
            self.outcome.refused, self.outcome.refused_item = str(event["reason"]), event["item"]
        elif kind == "ready":
            self.outcome.ready, self.outcome.loaded = True, int(event["count"])
            self.outcome.inside = [(str(name), file) for name, file in event["inside"]]
            self.insides.pop(-1, None)  # the zygote's own, from now on
        elif kind == "scanned-while-searching":
            self.outcome.scanned_while_searching.append((str(event["n"]), int(event["rows"]), float(event["s"])))
        elif kind == "preloading-inside":  # rows scanned while a candidate is checked: what was loaded by then
            self.insides[-1] = [(str(name), file) for name, file in event["inside"]]
        elif kind == "forked":
            index, zygote = int(event["i"]), int(event.get("z", -1))
            self.children[index] = _Child(index, int(event["pid"]), time.monotonic(), time.time())
            self.outcome.child_inside[index] = self.insides.get(zygote, self.outcome.inside)
            if zygote in self.outcome.packages:
                self.outcome.packages[zygote].served += 1
        elif kind in ("descend", "descended", "descent-refused", "ascended"):
            self.package_event(kind, event)
        elif kind == "present":
            self.outcome.present.append(int(event["i"]))
            self.finished.add(int(event["i"]))
            self.on_child(int(event["i"]), None, self.outcome)
        elif kind == "reaped":
            self.reaped(int(event["i"]), int(event["code"]))
        elif kind == "huge-pages":
            self.outcome.huge_pages.append((int(event["moved"]), float(event["s"])))

    def preload_event(self, kind: str, event: dict[str, Any]) -> None:
        """One preload item: imported, passed over, kept though it set variables, kept with aliases watched."""
        name = str(event["n"])
        if kind == "preloaded":
            self.outcome.preloaded.append((name, float(event["s"])))
        elif kind == "passed-over":
            self.outcome.passed_over.append((name, str(event["reason"])))
        elif kind == "watching":
            self.outcome.watching.append((name, tuple(str(alias) for alias in event["names"])))
        elif kind == "guarding":
            guarded = tuple((str(module), str(why)) for module, why in zip(event["names"], event["why"], strict=False))
            self.outcome.guarding.append((name, guarded))
        else:
            self.outcome.environment_kept.append((name, tuple(str(variable) for variable in event["names"])))

    def package_event(self, kind: str, event: dict[str, Any]) -> None:
        """A package zygote's life: forked, done importing (or refused), ended."""
        index = int(event["i"])
        if kind == "descend":
            self.parents[index] = int(event["z"])
            self.importing[index] = _Child(index, int(event["pid"]), time.monotonic(), time.time())
            self.outcome.packages[index] = PackageZygote(
                before_cuda=bool(event["before_cuda"]),
                continued=bool(event["continued"]),
                handed_cuda=bool(event["cuda"]),
            )
            return
        self.importing.pop(index, None)
        package = self.outcome.packages.setdefault(index, PackageZygote())
        if kind == "descended":
            package.seconds, package.loaded = float(event["s"]), int(event["n"])
            above = self.insides.get(self.parents.get(index, -1), self.outcome.inside)
            self.insides[index] = above + _loaded_inside(self.workdir / f"{index}.package")
        elif kind == "descent-refused":
            package.refused = str(event["reason"])
        elif package.seconds is None and not package.refused:
            package.refused = f"it ended (exit code {event['code']}) before it had imported the package"

    def reaped(self, index: int, code: int) -> None:
        child = self.children.pop(index, None)
        if child is None:
            return
        self.finished.add(index)
        marked = self.workdir / f"{index}.alias"
        if marked.exists():
            self.outcome.looked_up[index] = marked.read_text(encoding="utf-8", errors="replace").strip()
        self.on_child(index, self.raw_run(child, code), self.outcome)

    def raw_run(self, child: _Child, code: int) -> RawRun:
        base = self.workdir / str(child.index)
        events, dropped = bounded_lines(base.with_suffix(".events"))
        decoded = decode_events(events)
        return RawRun(
            events=tuple(decoded.events),
            returncode=code,
            timed_out=child.timed_out,
            stdout=_captured(base.with_suffix(".out")),
            stderr=_captured(base.with_suffix(".err")),
            fault_dump=_read(base.with_suffix(".dump"), DUMP_LIMIT).decode("utf-8", "backslashreplace"),
            duration_s=time.monotonic() - child.started,
            marker=self.marker,
            started_at=child.wall_start,
            skipped_events=decoded.skipped + dropped,
            channel_truncated=dropped > 0,
        )

    def enforce_deadlines(self) -> None:
        """Dump the stacks of a child past its deadline, then kill its group after a grace period.

        A package zygote that has not imported its package within the deadline
        is killed; its parent then scans the modules below it itself.
        """
        now = time.monotonic()
        for package in self.importing.values():
            if now - package.started >= self.timeout:
                _signal(package.pid, signal.SIGKILL)
        for child in self.children.values():
            if child.dump_sent is None and now - child.started >= self.timeout:
                child.timed_out, child.dump_sent = True, now
                _signal(child.pid, DUMP_SIGNAL)
            elif child.dump_sent is not None and now - child.dump_sent >= DUMP_GRACE_S:
                kill_group(child.pid)
                _signal(child.pid, signal.SIGKILL)


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, number)


def _loaded_inside(path: Path) -> list[tuple[str, str | None]]:
    """The package modules a package zygote loaded, as it wrote them (nothing when unreadable)."""
    try:
        pairs = json.loads(_read(path) or b"[]")
        return [(str(name), file if isinstance(file, str) else None) for name, file in pairs]
    except (ValueError, TypeError):
        return []


def _read(path: Path, limit: int = -1) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(limit)
    except OSError:
        return b""


def _captured(path: Path) -> CapturedOutput:
    try:
        with path.open("rb") as handle:
            kept = handle.read(OUTPUT_LIMIT)
            total = os.fstat(handle.fileno()).st_size
    except OSError:
        return CapturedOutput("", 0)
    return CapturedOutput(kept.decode("utf-8", "backslashreplace"), total)


def run_zygote(
    request: SubkernelRequest,
    modules: Sequence[str],
    *,
    preload: Sequence[str],
    package: str,
    probe: Path,
    jobs: int,
    timeout: float,
    on_child: ChildDone,
    scan_first: Sequence[str] = (),
    failed_alone: Sequence[str] = (),
    libraries: Sequence[str] = (),
    names_imported: Sequence[str] = (),
    watched: Sequence[str] = (),
) -> ZygoteOutcome:
    """Preload in one subkernel, then scan each of ``modules`` in a child forked from it.

    ``request.timeout`` bounds the start-up and the preloading; ``timeout``
    bounds each child.  ``on_child(index, raw, outcome)`` is called as each child
    ends, and with ``raw=None`` for a module the zygote had already loaded.
    A module of both ``preload`` and ``scan_first`` is a learned candidate: the
    zygote imports it once with a stopped copy of itself to go back to, scans
    the modules of ``modules`` that import loaded (itself included) from that
    copy, and passes it over when it changes what later imports find, or loads a
    module that fails to import on its own (``failed_alone``: rows already
    scanned; the rows it scans first count too): importing that module first,
    as a fresh subkernel would, gives another result than preloading it.
    ``libraries`` are learned candidates outside the package: their own changes to what later imports
    find are accepted, as for an explicit preload.  ``names_imported``: the top-level names the
    package's sources import, by which a module registered under another name could be looked up.
    ``watched``: what a checked preload's zygote watched (:meth:`ZygoteOutcome.watched_lines`), watched
    as a kept candidate's are: a child whose row made a lookup that calls for it is in ``outcome.looked_up``.
    """
    candidates, outside = set(scan_first), set(libraries)
    first = {name: index for index, name in enumerate(modules) if name in candidates}
    items = [_item(name, first, candidates, outside) for name in preload]
    workdir = Path(tempfile.mkdtemp(prefix="diagtools-zygote-"))
    try:
        (workdir / "modules").write_text("\n".join(modules) + "\n", encoding="utf-8")
        settings = {
            protocol.SWEEP_MODULES_FILE: str(workdir / "modules"),
            protocol.SWEEP_PRELOAD: "\n".join(items),
            protocol.SWEEP_PACKAGE: package,
            protocol.SWEEP_JOBS: str(jobs),
            protocol.SWEEP_WORKDIR: str(workdir),
            protocol.SWEEP_PROBE: str(probe),
            protocol.SWEEP_FAILED_ALONE: "\n".join(failed_alone),
            protocol.SWEEP_NAMES_IMPORTED: "\n".join(names_imported),
            protocol.SWEEP_WATCHED: "\n".join(watched),
        }
        return _run(request.with_settings(settings), workdir, len(modules), timeout, on_child)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _item(name: str, first: dict[str, int], candidates: set[str], libraries: set[str]) -> str:
    """One line of the zygote's preload: a name, or a candidate with its row's index (and ``library``)."""
    if name in libraries:
        return f"{name}\t{first.get(name, '-')}\tlibrary"
    return f"{name}\t{first.get(name, '-')}" if name in candidates else name


def _run(request: SubkernelRequest, workdir: Path, count: int, timeout: float, on_child: ChildDone) -> ZygoteOutcome:
    marker = os.urandom(16).hex()
    read_fd, write_fd = os.pipe()
    enlarge_pipe(write_fd)
    dump_fd = os.memfd_create("diagtools-zygote-faults", 0)
    env = subkernel_env(request, write_fd, dump_fd, marker)
    zygote = _Zygote(workdir, count, timeout, on_child, marker)
    with (workdir / "zygote.out").open("wb") as out, (workdir / "zygote.err").open("wb") as err:
        try:
            kept = start_kept(
                [request.python, *request.flags, "-c", bootstrap_code(request.program)],
                env=env,
                cwd=request.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                channel=write_fd,
                dump=dump_fd,
                python=request.python,
            )
        except BaseException:
            for fd in (read_fd, dump_fd):
                os.close(fd)
            raise
        finally:
            os.close(write_fd)
        try:
            _follow(kept, read_fd, zygote, time.monotonic() + request.timeout)
        finally:
            returncode = kept.release()  # the keeper kills the zygote and every descendant, daemons included
            kill_marked(marker)
            os.close(read_fd)
            os.close(dump_fd)
    return _finish(zygote, returncode, workdir)


def _follow(kept: Kept, channel_fd: int, zygote: _Zygote, preload_deadline: float) -> None:
    """Read the zygote's events until its channel closes, keeping every deadline."""
    with selectors.DefaultSelector() as selector:
        selector.register(channel_fd, selectors.EVENT_READ)
        while True:
            if not zygote.outcome.ready and not zygote.outcome.refused and time.monotonic() > preload_deadline:
                zygote.outcome.detail = "the zygote did not finish preloading in time"
                return
            zygote.enforce_deadlines()
            if selector.select(_POLL_S):
                data = os.read(channel_fd, 1 << 16)
                if not data:
                    return
                zygote.feed(data)
            elif not kept.running() and not selector.select(0):
                return


def _finish(zygote: _Zygote, returncode: int | None, workdir: Path) -> ZygoteOutcome:
    outcome = zygote.outcome
    outcome.unfinished = tuple(i for i in range(zygote.count) if i not in zygote.finished) if outcome.ready else ()
    if not outcome.ready and not outcome.refused:
        stderr = _captured(workdir / "zygote.err").text.strip().splitlines()
        last = stderr[-1] if stderr else f"exit code {returncode}"
        outcome.refused = outcome.detail or f"the zygote ended before it was ready ({last})"
    elif outcome.unfinished and not outcome.detail:
        outcome.detail = f"the zygote ended (exit code {returncode}) with {len(outcome.unfinished)} module(s) unscanned"
    return outcome
