"""The run use case: start a command with every Python process of its tree watched.

Steps: pick the driver, make a private record directory, start the command
under a keeper (:mod:`diagtools.runner.kept`: a subreaper that starts it in a
session of its own) with the agent on ``PYTHONPATH``, wait, have the keeper
kill every process left of the tree (at the command's exit, on timeout, on an
interrupt), read every process's JSON Lines file, and assemble the findings.
The command's stdin, stdout and stderr pass through untouched unless asked
otherwise, and its exit code is the keeper's report of it.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.agents.run_hook import AGENT_FILE, AGENT_MODULE, HOOK_DIR
from diagtools.driver import DriverSetup, build_probe_extension, resolve_driver
from diagtools.errors import DiagtoolsError, UsageError
from diagtools.model.run import (
    ChildSaw,
    CudaInit,
    DriverRefusal,
    Finding,
    ProcessRecord,
    ProcessStart,
    RunResult,
)
from diagtools.model.scan import DriverInfo, Site
from diagtools.runner.kept import Kept, start_kept
from diagtools.runner.subkernel import SUBKERNEL_MARKER, kill_marked

__all__ = [
    "OUTPUT_MODES",
    "RunRecords",
    "agent_environment",
    "assemble_run",
    "load_agent",
    "read_records",
    "run",
    "watch_result",
]

OUTPUT_MODES = ("inherit", "stderr", "capture")
DIR_ENV = "DIAGTOOLS_RUN_DIR"
_INTERRUPT_GRACE_S = 5.0
_CAPTURE_LIMIT = 1 << 20
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
_STDLIB = os.path.dirname(os.path.abspath(os.__file__))
Popen = Callable[..., "subprocess.Popen[bytes]"]


# ---- the environment every process of the tree inherits ------------------------


def agent_environment(
    directory: str, driver: DriverSetup, marker: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables that put the agent into every Python process of the tree."""
    env = dict(driver.env)
    existing = (os.environ if base is None else base).get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), existing) if p)
    env[DIR_ENV] = directory
    env[SUBKERNEL_MARKER] = marker
    cuprobe = _cuprobe_path()
    if cuprobe:
        env["DIAGTOOLS_RUN_CUPROBE"] = cuprobe
        env["DIAGTOOLS_RUN_CUPROBE_FOR"] = sys.version
    return env


def _cuprobe_path() -> str | None:
    """The driver-state extension for this interpreter; without it the driver's hook alone decides."""
    try:
        return str(build_probe_extension())
    except DiagtoolsError:
        return None


# ---- reading what the processes wrote -----------------------------------------------


@dataclass(frozen=True)
class RunRecords:
    """Every process file's events, in file order; each file is one process image."""

    files: tuple[tuple[dict[str, Any], ...], ...]


def read_records(directory: str | os.PathLike[str]) -> RunRecords:
    """Parse every ``*.jsonl`` file under ``directory``; a torn last line is dropped."""
    files = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        lines = path.read_bytes().split(b"\n")
        lines.pop()  # the part after the last newline: empty, or torn by a crash
        events = tuple(event for event in map(_parse, lines) if event is not None)
        if events:
            files.append(events)
    return RunRecords(tuple(files))


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line.decode("utf-8", "backslashreplace"))
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("e"), str) else None


# ---- assembling ------------------------------------------------------------------------


def _site(row: Sequence[Any] | None) -> Site | None:
    if not row:
        return None
    file, line = str(row[0]), int(row[1])
    return Site(file, line, str(row[2]), linecache.getline(file, line).strip() if line > 0 else "")


def _stack(rows: Iterable[Sequence[Any]] | None) -> tuple[Site, ...]:
    """Agent rows (innermost first) as sites, outermost first."""
    sites = [_site(row) for row in rows or ()]
    return tuple(site for site in reversed(sites) if site is not None)


def _cuinit(event: dict[str, Any]) -> CudaInit:
    return CudaInit(
        module=event.get("module"),
        chain=tuple(event.get("chain") or ()),
        site=_site(event.get("site")),
        module_site=_site(event.get("module_site")),
        stack=_stack(event.get("stack")),
        phase=event.get("phase", "main"),
        thread=event.get("thread", "MainThread"),
        evidence=event.get("evidence", "driver-hook"),
        context=event.get("context"),
    )


@dataclass
class _Image:
    """One process image while assembling: its header and events."""

    hello: dict[str, Any]
    events: tuple[dict[str, Any], ...]
    starts: list[tuple[float, int | None, ProcessStart]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return int(self.hello["pid"])


def _images(records: RunRecords) -> list[_Image]:
    images = []
    for events in records.files:
        hello = next((event for event in events if event["e"] == "hello"), None)
        if hello is not None and isinstance(hello.get("pid"), int):
            images.append(_Image(hello, events))
    return sorted(images, key=lambda image: float(image.hello.get("t", 0.0)))


def _fork_children(images: list[_Image]) -> dict[tuple[int, int], int]:
    """(parent pid, fork number) -> child pid, from the children's own headers."""
    return {
        (int(image.hello["parent"]), int(image.hello["fork_seq"])): image.pid
        for image in images
        if image.hello.get("via") == "fork" and image.hello.get("fork_seq") is not None
    }


def _starts(image: _Image, children: Mapping[tuple[int, int], int]) -> None:
    for event in image.events:
        if event["e"] != "start":
            continue
        child = event.get("child")
        if child is None and event.get("seq") is not None:
            child = children.get((image.pid, int(event["seq"])))
        argv = event.get("argv")
        start = ProcessStart(
            kind=event.get("kind", "fork"),
            child=child,
            stack=_stack(event.get("stack")),
            driver_initialized=bool(event.get("driver_initialized")),
            argv=tuple(argv) if argv is not None else None,
            context=event.get("context"),
        )
        image.starts.append((float(event.get("t", 0.0)), event.get("seq"), start))


def _saw(image: _Image) -> ChildSaw | None:
    if image.hello.get("via") != "fork":
        return None
    refused = tuple(
        DriverRefusal(str(e.get("call")), int(e.get("code", 3)), _site(e["stack"][0]), _stack(e["stack"]))
        for e in image.events
        if e["e"] == "refused" and e.get("stack")
    )
    exceptions = [f"{e.get('type')}: {e.get('message')}" for e in image.events if e["e"] == "exception"]
    codes = [e.get("code") for e in image.events if e["e"] == "exit" and isinstance(e.get("code"), int)]
    return ChildSaw(
        refused=refused,
        exception=exceptions[0] if exceptions else None,
        exitcode=codes[0] if codes else None,
        execed=any(e["e"] == "exec" for e in image.events),
    )


def _record(image: _Image) -> ProcessRecord:
    cuinit = next((event for event in image.events if event["e"] == "cuinit"), None)
    parent = image.hello.get("parent")
    return ProcessRecord(
        pid=image.pid,
        parent=int(parent) if isinstance(parent, int) else None,
        argv=tuple(str(arg) for arg in image.hello.get("argv") or ()),
        cuinit=_cuinit(cuinit) if cuinit else None,
        starts=tuple(start for _, _, start in image.starts),
        via=str(image.hello.get("via", "exec")),
        saw=_saw(image),
    )


def _findings(images: list[_Image], records: dict[int, ProcessRecord]) -> tuple[Finding, ...]:
    """Poisoned forks first, in the order they happened; then processes that initialized CUDA."""
    by_child = {record.pid: record for record in records.values() if record.via == "fork"}
    poisoned: list[tuple[float, Finding]] = []
    for image in images:
        record = records[id(image)]
        for when, _, start in image.starts:
            if start.kind not in ("fork", "forkserver") or not start.driver_initialized:
                continue
            child = by_child.get(start.child) if start.child is not None else None
            saw = child.saw if child is not None else None
            if saw is not None and saw.execed and not saw.refused:
                continue  # fork and exec: the child never used the copied driver
            finding = Finding(
                "poisoned-fork", record.pid, start.child, start.stack, record.cuinit, start.kind, saw, start.context
            )
            poisoned.append((when, finding))
    poisoned.sort(key=lambda item: item[0])
    forked = {finding.pid for _, finding in poisoned}
    warnings = [
        Finding("cuda-initialized", record.pid, None, (), record.cuinit, context=record.cuinit.context)
        for record in (records[id(image)] for image in images)
        if record.cuinit is not None and record.pid not in forked
    ]
    return (*(finding for _, finding in poisoned), *warnings)


def looks_like_python(argv: Sequence[str] | None) -> bool:
    """Whether a started program is a Python interpreter (so it should have reported in)."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    return bool(_PYTHON_NAME.match(name)) or os.path.realpath(argv[0]) == os.path.realpath(sys.executable)


def _unwatched(images: list[_Image], top: tuple[int | None, Sequence[str]]) -> list[str]:
    """Python processes that started but never reported: the agent did not load there."""
    execs = {image.pid for image in images if image.hello.get("via") == "exec"}
    notes = []
    top_pid, command = top
    if top_pid is not None and looks_like_python(command) and top_pid not in execs:
        notes.append(f"the command's Python process (pid {top_pid}) did not load the agent (python -I, -S or -E?)")
    for image in images:
        for _, _, start in image.starts:
            exec_start = start.kind in ("spawn", "subprocess", "forkserver") and start.child is not None
            if exec_start and looks_like_python(start.argv) and start.child not in execs:
                shown = " ".join((start.argv or ())[:3])
                notes.append(f"pid {start.child} ({shown}) started without the agent; its CUDA use is unseen")
    return notes


def _verdict(findings: Sequence[Finding], processes: Sequence[ProcessRecord], notes: Sequence[str]) -> str:
    if any(finding.kind == "poisoned-fork" for finding in findings):
        return "poisoned-fork"
    if notes:
        return "unknown"
    if any(record.cuinit is not None for record in processes):
        return "initializes-cuda"
    return "clean"


@dataclass(frozen=True)
class _Outcome:
    """How the command's top process ended, as the runner saw it."""

    pid: int | None
    exitcode: int | None
    timed_out: bool = False
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0
    stdout: str | None = None
    stderr: str | None = None


def assemble_run(records: RunRecords, command: Sequence[str], driver: DriverInfo, outcome: _Outcome) -> RunResult:
    """Build the result from the processes' records and how the command ended; pure."""
    images = _images(records)
    children = _fork_children(images)
    for image in images:
        _starts(image, children)
    by_image = {id(image): _record(image) for image in images}
    processes = tuple(by_image[id(image)] for image in images)
    findings = _findings(images, by_image)
    notes = [*outcome.notes, *_unwatched(images, (outcome.pid, command))]
    return RunResult(
        command=tuple(command),
        exitcode=outcome.exitcode,
        driver=driver,
        processes=processes,
        findings=findings,
        verdict=_verdict(findings, processes, notes),
        notes=tuple(notes),
        timed_out=outcome.timed_out,
        duration_s=outcome.duration_s,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
    )


# ---- starting and waiting ------------------------------------------------------------


def _validate(command: Sequence[str], output: str, timeout: float | None) -> tuple[str, ...]:
    if isinstance(command, str):
        raise UsageError("give the command as a list of arguments, e.g. ['python', 'app.py']")
    argv = tuple(command)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise UsageError("no command given: diagtools run [OPTIONS] -- COMMAND [ARGS...]")
    if output not in OUTPUT_MODES:
        raise UsageError(f"unknown output mode {output!r}: choose one of {', '.join(OUTPUT_MODES)}")
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
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
) -> tuple[bool, bool]:
    """Wait until the command's whole tree is gone; returns (timed out, interrupted).

    An interrupt passes SIGINT on to the command's process group and gives it
    a grace period to stop by itself.
    """
    try:
        while kept.running():
            if deadline is not None and clock() >= deadline:
                return True, False
            if capture is not None:
                capture.pump(0.05)
            else:
                kept.wait(0.05 if deadline is not None else None)
    except KeyboardInterrupt:
        if kept.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(kept.pid, signal.SIGINT)
        kept.wait(_INTERRUPT_GRACE_S)
        return False, True
    return False, False


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
        outcome = _run_in(argv, setup, directory, base, _Launch(timeout, cwd, output, popen, clock))
        records = read_records(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return assemble_run(records, argv, setup.info, outcome)


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
) -> _Outcome:
    timeout, output, clock = launch.timeout, launch.output, launch.clock
    marker = os.urandom(16).hex()
    env = {**base, **agent_environment(directory, setup, marker, base)}
    started = clock()
    try:
        kept = start_kept(argv, env=env, cwd=launch.cwd, popen=launch.popen, **_streams(output))
    except OSError as exc:
        return _Outcome(None, None, notes=(f"the command could not be started: {exc.strerror or exc}",))
    capture = None
    try:
        capture = _Capture(kept.keeper) if output == "capture" else None
        if kept.error is not None:
            return _Outcome(None, None, notes=(f"the command could not be started: {kept.error}",))
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
    notes = []
    if timed_out:
        notes.append(f"the command did not finish in {timeout:g} s; its whole process tree was killed")
    if interrupted:
        notes.append("interrupted: the command's process tree was stopped")
    return _Outcome(
        pid=kept.pid,
        exitcode=exitcode,
        timed_out=timed_out,
        notes=tuple(notes),
        duration_s=clock() - started,
        stdout=capture.text("stdout") if capture else None,
        stderr=capture.text("stderr") if capture else None,
    )


# ---- watching the current process (pytest --cuda-watch) ------------------------------


def load_agent(directory: str) -> Any:
    """The agent of this very process, recording into ``directory`` unless one already records.

    Loaded from its file under the same module name the ``sitecustomize``
    uses, so a process never holds two agents.
    """
    module = sys.modules.get(AGENT_MODULE)
    if module is None:
        import importlib.util

        sys.modules.setdefault(protocol.AGENT_MODULE, protocol)  # the agent's name for the protocol module
        spec = importlib.util.spec_from_file_location(AGENT_MODULE, AGENT_FILE)
        assert spec is not None  # a .py path always gives a spec with a loader
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[AGENT_MODULE] = module
        spec.loader.exec_module(module)
    agent = module.install(directory, _cuprobe_path())
    if not agent.directory:
        agent.directory = directory
        agent.open()
        agent.hello("exec")
    agent.startup_done()
    return agent


def _lineage(records: RunRecords, pid: int) -> RunRecords:
    """The files of ``pid`` and of the processes forked from it, directly or not."""
    pids = {pid}
    kept = []
    for image in _images(records):
        if image.pid in pids and image.hello.get("via") == "exec" and image.pid != pid:
            continue
        if image.pid == pid or (image.hello.get("via") == "fork" and image.hello.get("parent") in pids):
            pids.add(image.pid)
            kept.append(image.events)
    return RunRecords(tuple(kept))


def _watch_driver(agent_state: int | None) -> DriverInfo:
    kind = os.environ.get("DIAGTOOLS_DRIVER", "")
    if kind not in ("real", "simulated", "none"):
        kind = "none" if agent_state in (None, -1) else "real"
    return DriverInfo(kind, "inherited")


def watch_result(directory: str, pid: int, argv: Sequence[str], driver_state: int | None = None) -> RunResult:
    """What the agent recorded in process ``pid`` and its forked children, as a run result."""
    records = _lineage(read_records(directory), pid)
    return assemble_run(records, argv, _watch_driver(driver_state), _Outcome(pid=None, exitcode=0))
