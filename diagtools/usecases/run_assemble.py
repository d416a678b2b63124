"""Turn the run agent's records into a :class:`RunResult`: pure, events in, frozen dataclasses out.

Each record file is one process image.  Its first cuInit is attributed by the
scan's own rule (:func:`diagtools.usecases.attribution.attribute`, with the
chain of module bodies the agent saw); a start that copied the process
(``fork``, ``forkserver``) after CUDA was initialized there is a poisoned fork,
unless the child replaced itself with ``exec`` before touching the driver.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagtools.model.run import ChildSaw, DriverRefusal, Finding, ProcessRecord, ProcessStart, RunResult, run_verdict
from diagtools.model.scan import Culprit, DriverInfo
from diagtools.runner.watch import RunRecords
from diagtools.usecases.attribution import StackChain, attribute, best_event, pick_site, stack_sites

__all__ = ["CONFTEST_CONTEXT", "RunOutcome", "assemble_run", "looks_like_python"]

CONFTEST_CONTEXT = "pytest start-up: conftest.py"
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
# multiprocessing's resource tracker: the standard library's own helper, which runs no code of the
# program's and never touches CUDA.  The keeper ends it with the tree when the command exits, and
# on a loaded machine that can come before its interpreter reached the agent.
_RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"


@dataclass(frozen=True)
class RunOutcome:
    """How the command's top process ended, as the runner saw it.

    ``seen`` lists the Python processes of the tree (pid and command line): each
    one the start recorder saw begin (``driver/starts.c``, preloaded into the
    whole tree), then those the keeper's census saw, as a cross-check for a
    program that dropped the preload; one that never reported to the agent is
    named.
    """

    pid: int | None
    exitcode: int | None
    timed_out: bool = False
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0
    stdout: str | None = None
    stderr: str | None = None
    seen: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class _Image:
    """One process image while assembling: its header and events."""

    hello: dict[str, Any]
    events: tuple[dict[str, Any], ...]

    @property
    def pid(self) -> int:
        return int(self.hello["pid"])

    @property
    def forked(self) -> bool:
        return self.hello.get("via") == "fork"

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["e"] in kinds]


@dataclass(frozen=True)
class _Start:
    """A start while assembling: when it happened, and the record."""

    when: float
    start: ProcessStart


def _images(records: RunRecords) -> list[_Image]:
    images = []
    for events in records.files:
        hello = next((event for event in events if event["e"] == "hello"), None)
        if hello is not None:
            images.append(_Image(hello, events))
    return sorted(images, key=lambda image: float(image.hello.get("t", 0.0)))


def _fork_children(images: Sequence[_Image]) -> dict[tuple[int, int], int]:
    """(parent pid, fork number) -> child pid, from the parents' ``fork-child`` and the children's headers."""
    children = {
        (image.pid, int(event["seq"])): int(event["child"])
        for image in images
        for event in image.of_kind("fork-child")
        if event["seq"] is not None
    }
    for image in images:
        parent, seq = image.hello.get("parent"), image.hello.get("fork_seq")
        if image.forked and parent is not None and seq is not None:
            children.setdefault((parent, seq), image.pid)
    return children


def _starts(image: _Image, children: Mapping[tuple[int, int], int]) -> list[_Start]:
    starts = []
    for event in image.of_kind("start"):
        child = event.get("child")
        if child is None and event.get("seq") is not None:
            child = children.get((image.pid, int(event["seq"])))
        argv = event.get("argv")
        start = ProcessStart(
            kind=event["kind"] if event["kind"] in ("fork", "forkserver", "spawn") else "subprocess",
            child=child,
            stack=stack_sites(event["stack"]),
            driver_initialized=event["driver_initialized"],
            argv=tuple(argv) if argv is not None else None,
            context=event.get("context"),
        )
        starts.append(_Start(float(event.get("t", 0.0)), start))
    return starts


def _exit_statuses(images: Sequence[_Image]) -> dict[int, int]:
    """Child pid -> exit status, as the parents collected them (the most reliable account)."""
    return {event["child"]: event["exitcode"] for image in images for event in image.of_kind("waited")}


def _saw(image: _Image, waited: Mapping[int, int]) -> ChildSaw | None:
    if not image.forked:
        return None
    refused = tuple(
        DriverRefusal(e["call"], e["code"], pick_site(e["stack"]), stack_sites(e["stack"]))
        for e in image.of_kind("refusal")
    )
    raised = image.of_kind("raised")
    ended = [e["exitcode"] for e in image.of_kind("ended") if e["exitcode"] is not None]
    exitcode = waited.get(image.pid, ended[0] if ended else None)
    return ChildSaw(
        refused=refused,
        exception=f"{raised[0]['type']}: {raised[0]['msg']}" if raised else None,
        exitcode=exitcode,
        execed=bool(image.of_kind("exec")),
    )


def _cuinit(image: _Image) -> Culprit | None:
    event = best_event(image.events)
    if event is None:
        return None
    main_thread = image.hello.get("main_thread")
    context = event.get("context") or _startup_context(event)
    return attribute(
        event,
        StackChain(event.get("chain"), event.get("stack")),
        main_thread if isinstance(main_thread, int) else 0,
        context,
    )


def _startup_context(event: dict[str, Any]) -> str | None:
    """A cuInit while pytest loaded a ``conftest.py``, before any node ran, is named so."""
    files = [str(frame[0]) for frame in event.get("stack") or ()]
    return CONFTEST_CONTEXT if any(os.path.basename(file) == "conftest.py" for file in files) else None


def _record(image: _Image, starts: Sequence[_Start], waited: Mapping[int, int]) -> ProcessRecord:
    parent = image.hello.get("parent")
    return ProcessRecord(
        pid=image.pid,
        parent=parent if isinstance(parent, int) else None,
        argv=tuple(image.hello.get("argv") or ()),
        cuinit=_cuinit(image),
        starts=tuple(item.start for item in starts),
        via="fork" if image.forked else "exec",
        saw=_saw(image, waited),
    )


def _poisoned(record: ProcessRecord, item: _Start, by_child: Mapping[int, ProcessRecord]) -> Finding | None:
    """A finding when ``item`` copied a process whose driver was initialized, and the copy did not exec."""
    start = item.start
    if not start.copies_the_driver or not start.driver_initialized:
        return None
    child = by_child.get(start.child) if start.child is not None else None
    saw = child.saw if child is not None else None
    if saw is not None and saw.execed and not saw.refused:
        return None  # fork and exec: the child never used the copied driver
    return Finding("poisoned-fork", record.pid, start.child, start.stack, record.cuinit, start.kind, saw, start.context)


def _findings(records: Sequence[tuple[ProcessRecord, list[_Start]]]) -> tuple[Finding, ...]:
    """Poisoned forks first, in the order they happened; then processes that initialized CUDA."""
    by_child = {record.pid: record for record, _ in records if record.via == "fork"}
    poisoned: list[tuple[float, Finding]] = []
    for record, starts in records:
        for item in starts:
            finding = _poisoned(record, item, by_child)
            if finding is not None:
                poisoned.append((item.when, finding))
    poisoned.sort(key=lambda pair: pair[0])
    forked = {finding.pid for _, finding in poisoned}
    warnings = [
        Finding("cuda-initialized", record.pid, None, (), record.cuinit, context=record.cuinit.context)
        for record, _ in records
        if record.cuinit is not None and record.pid not in forked
    ]
    return (*(finding for _, finding in poisoned), *warnings)


def looks_like_python(argv: Sequence[str] | None) -> bool:
    """Whether a started program is a Python interpreter (so it should have reported in)."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    return bool(_PYTHON_NAME.match(name)) or os.path.realpath(argv[0]) == os.path.realpath(sys.executable)


def _unwatched(
    images: Sequence[_Image], starts: Sequence[list[_Start]], outcome: RunOutcome, command: Sequence[str]
) -> list[str]:
    """Python processes that ran but never reported: the agent did not load there."""
    reported = {image.pid for image in images}
    notes = []
    named = set(reported)
    if outcome.pid is not None and looks_like_python(command) and outcome.pid not in reported:
        notes.append(f"the command's Python process (pid {outcome.pid}) did not load the agent (python -I, -S or -E?)")
        named.add(outcome.pid)
    execs = [item.start for image_starts in starts for item in image_starts if not item.start.copies_the_driver]
    started = [
        (start.child, start.argv or ())
        for start in execs
        if looks_like_python(start.argv) and not _is_resource_tracker(start.argv or ())
    ]
    for pid, argv in [*started, *outcome.seen]:
        if pid is not None and pid not in named and not _is_resource_tracker(argv):
            named.add(pid)
            notes.append(
                f"pid {pid} ({' '.join(argv[:3]) or 'command line unknown'}) is a Python process that never reported;"
                " its CUDA use is unseen"
            )
    return notes


def _is_resource_tracker(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts multiprocessing's resource tracker (``python [flags] -c "from ..."``)."""
    return any(word == "-c" and code.startswith(_RESOURCE_TRACKER) for word, code in itertools.pairwise(argv))


def _unaskable_forks(images: Sequence[_Image]) -> list[str]:
    """Forks made while a driver was loaded that could not be asked whether it was initialized."""
    return [
        f"pid {image.pid} forked while a CUDA driver was loaded whose state cannot be asked (no cuDeviceGetCount) "
        "and that reported no cuInit through the injection library: whether the fork was poisoned is unknown"
        for image in images
        for event in image.of_kind("start")
        if event.get("driver_unaskable") is True
    ]


def _lost_children(images: Sequence[_Image], starts: Sequence[list[_Start]]) -> list[str]:
    """Forked children whose records never arrived (their file could not be written)."""
    reported = {image.pid for image in images}
    return [
        f"pid {item.start.child} (forked by pid {image.pid}) left no records: what it did is unknown"
        for image, image_starts in zip(images, starts, strict=True)
        for item in image_starts
        if item.start.copies_the_driver and item.start.child is not None and item.start.child not in reported
    ]


def assemble_run(records: RunRecords, command: Sequence[str], driver: DriverInfo, outcome: RunOutcome) -> RunResult:
    """Build the result from the processes' records and how the command ended; pure."""
    images = _images(records)
    children = _fork_children(images)
    waited = _exit_statuses(images)
    starts = [_starts(image, children) for image in images]
    pairs = [
        (_record(image, image_starts, waited), image_starts) for image, image_starts in zip(images, starts, strict=True)
    ]
    processes = tuple(record for record, _ in pairs)
    findings = _findings(pairs)
    notes = [
        *([driver.blind] if driver.blind else []),
        *outcome.notes,
        *_unwatched(images, starts, outcome, command),
        *_lost_children(images, starts),
        *_unaskable_forks(images),
        *(f"pid {pid}: the program took the agent's record file and it could not be reopened, so what the process"
          " did after that is unknown" for pid in records.lost),
    ]  # fmt: skip
    return RunResult(
        command=tuple(command),
        exitcode=outcome.exitcode,
        driver=driver,
        processes=processes,
        findings=findings,
        verdict=run_verdict(findings, processes, notes),
        notes=tuple(notes),
        timed_out=outcome.timed_out,
        duration_s=outcome.duration_s,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
    )
