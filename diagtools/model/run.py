"""What ``diagtools run`` saw: processes, their first cuInit, their starts, and the findings.

Frozen dataclasses read and written by the one derived mapping of
:mod:`diagtools.model.serial`; the document schema is ``diagtools.run/1``.
A process's first cuInit is a :class:`~diagtools.model.scan.Culprit`, the
same type (and the same attribution rule) as a scan's.  Stacks are outermost
first, as in a scan.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from diagtools import protocol
from diagtools.model._display import present
from diagtools.model.common import describe_exit
from diagtools.model.scan import Culprit, DriverInfo, Site
from diagtools.model.serial import Serial
from diagtools.model.verdict import Verdict

__all__ = [
    "FINDING_KINDS",
    "FORKING_STARTS",
    "RUN_SCHEMA",
    "START_KINDS",
    "ChildSaw",
    "DriverRefusal",
    "Finding",
    "ProcessRecord",
    "ProcessStart",
    "RunResult",
    "run_verdict",
]

RUN_SCHEMA = "diagtools.run/1"
#: ``fork``: a copy of the process (``os.fork``, multiprocessing fork); ``forkserver``: a fork the
#: forkserver process made for a requester; ``spawn``: multiprocessing's fresh interpreter (fork and
#: exec); ``subprocess``: any other program started by fork and exec or ``posix_spawn`` (subprocess,
#: the forkserver and resource tracker themselves).  Only ``fork`` and ``forkserver`` copy the driver.
START_KINDS = ("fork", "forkserver", "spawn", "subprocess")
FORKING_STARTS = frozenset({"fork", "forkserver"})
FINDING_KINDS = ("poisoned-fork", "cuda-initialized")
PROCESS_VIA = ("exec", "fork")


@dataclass(frozen=True)
class ProcessStart(Serial):
    """A fork, forkserver fork, spawn or subprocess started by a process, with its stack."""

    kind: str = field(metadata={"choices": START_KINDS})
    child: int | None
    stack: tuple[Site, ...]
    driver_initialized: bool
    argv: tuple[str, ...] | None = None
    context: str | None = None

    @property
    def site(self) -> Site | None:
        """The innermost frame of the start."""
        return self.stack[-1] if self.stack else None

    @property
    def copies_the_driver(self) -> bool:
        """Whether the child is a copy of this process (a fork), not a fresh program."""
        return self.kind in FORKING_STARTS


@dataclass(frozen=True)
class DriverRefusal(Serial):
    """A driver call refused in a poisoned child (only the simulated driver reports these)."""

    call: str
    code: int
    site: Site | None
    stack: tuple[Site, ...] = ()

    def describe(self) -> str:
        where = f" at {self.site.file}:{self.site.line}" if self.site else ""
        name = protocol.CUDA_ERROR_NAMES.get(self.code, f"error {self.code}")
        return f"{self.call}{where} answered {name} ({self.code})"


@dataclass(frozen=True)
class ChildSaw(Serial):
    """What a forked child met: refused driver calls, an uncaught exception, its exit.

    ``exitcode`` is the child's exit status however it ended (``os._exit``,
    ``sys.exit``, an uncaught exception, or ``-N`` for signal N), as the child
    or its parent saw it.
    """

    refused: tuple[DriverRefusal, ...] = ()
    exception: str | None = None
    exitcode: int | None = None
    execed: bool = False

    def describe(self) -> str:
        parts = [refusal.describe() for refusal in self.refused[:1]]
        if self.exception:
            parts.append(f"raised {self.exception}")
        if self.execed:
            parts.append("replaced itself with exec")
        if self.exitcode is not None:
            parts.append(describe_exit(self.exitcode))
        return "; ".join(parts) or "nothing recorded (it made no driver call the driver refused)"


@dataclass(frozen=True)
class ProcessRecord(Serial):
    """One instrumented Python process of the command's tree.

    ``via`` is ``exec`` (a program started) or ``fork`` (a copy of ``parent``);
    ``saw`` is how a forked child ended, as far as it could tell.
    """

    pid: int
    parent: int | None
    argv: tuple[str, ...]
    cuinit: Culprit | None
    starts: tuple[ProcessStart, ...] = ()
    via: str = field(default="exec", metadata={"choices": PROCESS_VIA})
    saw: ChildSaw | None = None


@dataclass(frozen=True)
class Finding(Serial):
    """A poisoned fork (``pid`` forked ``child`` after its own cuInit), or a warning that a
    process initialized CUDA (``cuda-initialized``: no fork after it was seen)."""

    kind: str = field(metadata={"choices": FINDING_KINDS})
    pid: int
    child: int | None
    fork_stack: tuple[Site, ...]
    cuinit: Culprit | None
    start_kind: str | None = None
    child_saw: ChildSaw | None = None
    context: str | None = None

    @property
    def fork_site(self) -> Site | None:
        return self.fork_stack[-1] if self.fork_stack else None


def run_verdict(findings: Sequence[Finding], processes: Sequence[ProcessRecord], notes: Sequence[str]) -> Verdict:
    """The run's verdict by the one rule: a poisoned fork wins; any note (something the run could not see) makes
    it ``unknown``; a process that initialized CUDA makes it ``initializes-cuda``; else ``clean``."""
    if any(finding.kind == "poisoned-fork" for finding in findings):
        return Verdict.POISONED_FORK
    if notes:
        return Verdict.UNKNOWN
    if any(record.cuinit is not None for record in processes):
        return Verdict.INITIALIZES_CUDA
    return Verdict.CLEAN


@dataclass(frozen=True)
class RunResult(Serial):
    """Everything ``diagtools run`` saw of one command's process tree.

    ``verdict`` is ``poisoned-fork`` (a finding of that kind), ``initializes-cuda``
    (CUDA was initialized, no poisoned fork seen), ``clean``, or ``unknown`` when
    the run could not see everything (``notes`` say why).  ``exitcode`` is the
    command's (``-N``: killed by signal N; ``None``: it never started).
    ``cell`` names the notebook cell the command ran (``%%cuda_watch``: ``In[5]``, with its cell id), as the
    reports title it instead of the command line.
    """

    SCHEMA: ClassVar[str] = RUN_SCHEMA

    command: tuple[str, ...]
    exitcode: int | None
    driver: DriverInfo
    processes: tuple[ProcessRecord, ...]
    findings: tuple[Finding, ...]
    verdict: Verdict
    notes: tuple[str, ...] = ()
    timed_out: bool = False
    duration_s: float = 0.0
    stdout: str | None = None
    stderr: str | None = None
    cell: str | None = None

    def __post_init__(self) -> None:
        # One rule, applied whatever was given or read back: a document's stored verdict is never trusted over
        # its own findings and notes (as a scan's verdict is computed from its status, culprits and doubts).
        Verdict(self.verdict)  # still a verdict word: a document that says otherwise is refused
        object.__setattr__(self, "verdict", run_verdict(self.findings, self.processes, self.notes))

    @property
    def poisoned_forks(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if finding.kind == "poisoned-fork")

    @property
    def title(self) -> str:
        """What ran, as a report names it: the cell (``cell In[5]``), else the command line, shell-quoted."""
        return f"cell {self.cell}" if self.cell else shlex.join(self.command)

    def process(self, pid: int) -> ProcessRecord:
        """The record of ``pid`` (the last one, when a pid exec'd); ``KeyError`` when unseen."""
        for record in reversed(self.processes):
            if record.pid == pid:
                return record
        raise KeyError(pid)

    def _repr_html_(self) -> str:
        return str(present("run.html", self))

    def __str__(self) -> str:
        return str(present("run.text", self))
