"""What ``diagtools run`` saw: processes, their first cuInit, their starts, and the findings.

Frozen dataclasses with one ``to_json`` / ``from_json`` pair each; the document
schema is ``diagtools.run/1``.  Stacks are outermost first, as in a scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagtools.model._display import present
from diagtools.model.common import check_schema
from diagtools.model.scan import DriverInfo, Site

__all__ = [
    "FINDING_KINDS",
    "RUN_SCHEMA",
    "START_KINDS",
    "VERDICTS",
    "ChildSaw",
    "CudaInit",
    "DriverRefusal",
    "Finding",
    "ProcessRecord",
    "ProcessStart",
    "RunResult",
]

RUN_SCHEMA = "diagtools.run/1"
START_KINDS = ("fork", "forkserver", "spawn", "subprocess")
FINDING_KINDS = ("poisoned-fork", "cuda-initialized")
VERDICTS = ("poisoned-fork", "initializes-cuda", "clean", "unknown")


def _stack(data: Any) -> tuple[Site, ...]:
    return tuple(Site.from_json(frame) for frame in data or ())


def _stack_json(stack: tuple[Site, ...]) -> list[dict[str, Any]]:
    return [frame.to_json() for frame in stack]


@dataclass(frozen=True)
class CudaInit:
    """The first cuInit of one process.

    ``module`` is the module whose code was running (the innermost module body
    on the stack: ``__main__`` for a script's own code); ``chain`` lists the
    module bodies on the stack, outermost first; ``site`` is the innermost
    frame that made the call; ``module_site`` the innermost frame in
    ``module``'s own source.  ``phase`` is ``startup``, ``import``, ``main``,
    ``thread`` or ``shutdown``; ``context`` is what the watcher was doing (a
    pytest node id), when it knows; ``evidence`` is ``driver-hook`` or
    ``state-probe`` (seen only through the driver's state, without a stack).
    """

    module: str | None
    chain: tuple[str, ...]
    site: Site | None
    module_site: Site | None
    stack: tuple[Site, ...]
    phase: str
    thread: str = "MainThread"
    evidence: str = "driver-hook"
    context: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "chain": list(self.chain),
            "site": self.site.to_json() if self.site else None,
            "module_site": self.module_site.to_json() if self.module_site else None,
            "stack": _stack_json(self.stack),
            "phase": self.phase,
            "thread": self.thread,
            "evidence": self.evidence,
            "context": self.context,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CudaInit:
        return cls(
            module=data.get("module"),
            chain=tuple(data.get("chain", ())),
            site=Site.optional(data.get("site")),
            module_site=Site.optional(data.get("module_site")),
            stack=_stack(data.get("stack")),
            phase=data.get("phase", "import"),
            thread=data.get("thread", "MainThread"),
            evidence=data.get("evidence", "driver-hook"),
            context=data.get("context"),
        )


@dataclass(frozen=True)
class ProcessStart:
    """A fork, forkserver fork, spawn or subprocess started by a process, with its stack."""

    kind: str
    child: int | None
    stack: tuple[Site, ...]
    driver_initialized: bool
    argv: tuple[str, ...] | None = None
    context: str | None = None

    @property
    def site(self) -> Site | None:
        """The innermost frame of the start."""
        return self.stack[-1] if self.stack else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "child": self.child,
            "stack": _stack_json(self.stack),
            "driver_initialized": self.driver_initialized,
            "argv": list(self.argv) if self.argv is not None else None,
            "context": self.context,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessStart:
        argv = data.get("argv")
        return cls(
            kind=data["kind"],
            child=data.get("child"),
            stack=_stack(data.get("stack")),
            driver_initialized=bool(data.get("driver_initialized", False)),
            argv=tuple(argv) if argv is not None else None,
            context=data.get("context"),
        )


@dataclass(frozen=True)
class DriverRefusal:
    """A driver call refused in a poisoned child (only the simulated driver reports these)."""

    call: str
    code: int
    site: Site | None
    stack: tuple[Site, ...] = ()

    def describe(self) -> str:
        where = f" at {self.site.file}:{self.site.line}" if self.site else ""
        name = "CUDA_ERROR_NOT_INITIALIZED" if self.code == 3 else f"error {self.code}"
        return f"{self.call}{where} answered {name} ({self.code})"

    def to_json(self) -> dict[str, Any]:
        return {
            "call": self.call,
            "code": self.code,
            "site": self.site.to_json() if self.site else None,
            "stack": _stack_json(self.stack),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriverRefusal:
        return cls(data["call"], int(data.get("code", 3)), Site.optional(data.get("site")), _stack(data.get("stack")))


@dataclass(frozen=True)
class ChildSaw:
    """What a forked child met: refused driver calls, an uncaught exception, its exit."""

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
            parts.append(f"exited with code {self.exitcode}")
        return "; ".join(parts) or "nothing recorded (it made no driver call the driver refused)"

    def to_json(self) -> dict[str, Any]:
        return {
            "refused": [refusal.to_json() for refusal in self.refused],
            "exception": self.exception,
            "exitcode": self.exitcode,
            "execed": self.execed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildSaw:
        return cls(
            refused=tuple(DriverRefusal.from_json(item) for item in data.get("refused", ())),
            exception=data.get("exception"),
            exitcode=data.get("exitcode"),
            execed=bool(data.get("execed", False)),
        )


@dataclass(frozen=True)
class ProcessRecord:
    """One instrumented Python process of the command's tree.

    ``via`` is ``exec`` (a program started) or ``fork`` (a copy of ``parent``);
    ``saw`` is how a forked child ended, as far as it could tell.
    """

    pid: int
    parent: int | None
    argv: tuple[str, ...]
    cuinit: CudaInit | None
    starts: tuple[ProcessStart, ...] = ()
    via: str = "exec"
    saw: ChildSaw | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "parent": self.parent,
            "argv": list(self.argv),
            "via": self.via,
            "cuinit": self.cuinit.to_json() if self.cuinit else None,
            "starts": [start.to_json() for start in self.starts],
            "saw": self.saw.to_json() if self.saw else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        cuinit, saw = data.get("cuinit"), data.get("saw")
        return cls(
            pid=int(data["pid"]),
            parent=data.get("parent"),
            argv=tuple(data.get("argv", ())),
            cuinit=CudaInit.from_json(cuinit) if cuinit else None,
            starts=tuple(ProcessStart.from_json(start) for start in data.get("starts", ())),
            via=data.get("via", "exec"),
            saw=ChildSaw.from_json(saw) if saw else None,
        )


@dataclass(frozen=True)
class Finding:
    """A poisoned fork (``pid`` forked ``child`` after its own cuInit), or a warning that a
    process initialized CUDA (``cuda-initialized``: no fork after it was seen)."""

    kind: str
    pid: int
    child: int | None
    fork_stack: tuple[Site, ...]
    cuinit: CudaInit | None
    start_kind: str | None = None
    child_saw: ChildSaw | None = None
    context: str | None = None

    @property
    def fork_site(self) -> Site | None:
        return self.fork_stack[-1] if self.fork_stack else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pid": self.pid,
            "child": self.child,
            "fork_stack": _stack_json(self.fork_stack),
            "cuinit": self.cuinit.to_json() if self.cuinit else None,
            "start_kind": self.start_kind,
            "child_saw": self.child_saw.to_json() if self.child_saw else None,
            "context": self.context,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        cuinit, saw = data.get("cuinit"), data.get("child_saw")
        return cls(
            kind=data["kind"],
            pid=int(data["pid"]),
            child=data.get("child"),
            fork_stack=_stack(data.get("fork_stack")),
            cuinit=CudaInit.from_json(cuinit) if cuinit else None,
            start_kind=data.get("start_kind"),
            child_saw=ChildSaw.from_json(saw) if saw else None,
            context=data.get("context"),
        )


@dataclass(frozen=True)
class RunResult:
    """Everything ``diagtools run`` saw of one command's process tree.

    ``verdict`` is ``poisoned-fork`` (a finding of that kind), ``initializes-cuda``
    (CUDA was initialized, no poisoned fork seen), ``clean``, or ``unknown`` when
    the run could not see everything (``notes`` say why).  ``exitcode`` is the
    command's (``-N``: killed by signal N; ``None``: it never started).
    """

    command: tuple[str, ...]
    exitcode: int | None
    driver: DriverInfo
    processes: tuple[ProcessRecord, ...]
    findings: tuple[Finding, ...]
    verdict: str
    notes: tuple[str, ...] = ()
    timed_out: bool = False
    duration_s: float = 0.0
    stdout: str | None = None
    stderr: str | None = None

    @property
    def poisoned_forks(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if finding.kind == "poisoned-fork")

    def process(self, pid: int) -> ProcessRecord:
        """The record of ``pid`` (the last one, when a pid exec'd); ``KeyError`` when unseen."""
        for record in reversed(self.processes):
            if record.pid == pid:
                return record
        raise KeyError(pid)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "command": list(self.command),
            "exitcode": self.exitcode,
            "driver": self.driver.to_json(),
            "processes": [record.to_json() for record in self.processes],
            "findings": [finding.to_json() for finding in self.findings],
            "verdict": self.verdict,
            "notes": list(self.notes),
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 6),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        check_schema(data, RUN_SCHEMA)
        return cls(
            command=tuple(data.get("command", ())),
            exitcode=data.get("exitcode"),
            driver=DriverInfo.from_json(data["driver"]),
            processes=tuple(ProcessRecord.from_json(record) for record in data.get("processes", ())),
            findings=tuple(Finding.from_json(finding) for finding in data.get("findings", ())),
            verdict=data["verdict"],
            notes=tuple(data.get("notes", ())),
            timed_out=bool(data.get("timed_out", False)),
            duration_s=float(data.get("duration_s", 0.0)),
            stdout=data.get("stdout"),
            stderr=data.get("stderr"),
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view (saved beside the HTML): the readable report, not the dataclass fields."""
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return str(present("run.html", self))

    def __str__(self) -> str:
        return str(present("run.text", self))
