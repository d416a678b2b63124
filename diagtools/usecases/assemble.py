"""Turn the subkernel's raw events into a :class:`ScanResult`.

Pure functions: events in, frozen dataclasses out, so every rule here (who is
the culprit, what the chain is, which status a run gets) is testable without
a process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagtools import protocol
from diagtools.model.common import describe_exit, iso_time, signal_name
from diagtools.model.scan import (
    AliveThread,
    Culprit,
    DriverInfo,
    ImportNode,
    ScanResult,
    Site,
    StartupInfo,
    TargetFailure,
)
from diagtools.model.verdict import ScanStatus
from diagtools.runner.subkernel import RawRun
from diagtools.usecases.attribution import (
    FRAME_LIMIT,
    attribute,
    best_event,
    capped,
    frame_site,
    own_patterns,
    pick_site,
    source_line,
    start_site,
    visible,
)

__all__ = ["assemble", "capped", "pick_site", "source_line", "start_site", "subkernel_failure"]


@dataclass
class _Node:
    name: str
    parent: str | None
    file: str | None
    begin: float
    thread: int
    phase: str
    imported_at: Sequence[Any] | None = None
    end: float | None = None
    raised: bool = False
    threads_started: int = 0
    children: list[str] = field(default_factory=list)


class _Tree:
    """The import tree as the events describe it, in first-import order."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.last_time = 0.0

    def begin(self, event: dict[str, Any]) -> None:
        name = event["n"]
        if name in self.nodes:
            return
        node = _Node(name, event.get("p"), event.get("f"), event["t"], event.get("th", 0), event.get("ph", "import"))
        node.imported_at = event.get("l")
        self.nodes[name] = node
        if node.parent in self.nodes:
            self.nodes[node.parent].children.append(name)

    def end(self, event: dict[str, Any]) -> None:
        node = self.nodes.get(event["n"])
        if node is not None and node.end is None:
            node.end = event["t"]
            node.raised = event.get("ok") is False

    def thread_started(self, starter: str | None) -> None:
        if starter in self.nodes:
            self.nodes[starter].threads_started += 1

    def file_of(self, module: str | None) -> str | None:
        node = self.nodes.get(module) if module is not None else None
        return node.file if node is not None else None

    def import_line(self, module: str) -> Site | None:
        """The statement that imported ``module``, when it is the program's own code (not the probe's)."""
        node = self.nodes.get(module)
        frame = node.imported_at if node is not None else None
        return frame_site(frame) if frame is not None and visible([frame]) else None

    def chain(self, module: str | None) -> tuple[str, ...]:
        chain: list[str] = []
        while module is not None and module in self.nodes and module not in chain:
            chain.append(module)
            module = self.nodes[module].parent
        return tuple(reversed(chain))

    def import_nodes(self, culprit_modules: set[str]) -> tuple[ImportNode, ...]:
        return tuple(self._import_node(node, culprit_modules) for node in self.nodes.values())

    def _import_node(self, node: _Node, culprit_modules: set[str]) -> ImportNode:
        cumulative = self._cumulative(node)
        nested = sum(
            self._cumulative(self.nodes[child]) for child in node.children if self._nested_in(self.nodes[child], node)
        )
        return ImportNode(
            name=node.name,
            parent=node.parent,
            file=node.file,
            self_s=max(0.0, cumulative - nested),
            cumulative_s=cumulative,
            initializes_cuda=node.name in culprit_modules,
            threads_started=node.threads_started,
            phase=node.phase,
            complete=node.end is not None and not node.raised,
        )

    def _cumulative(self, node: _Node) -> float:
        end = node.end if node.end is not None else self.last_time
        return max(0.0, end - node.begin)

    def _nested_in(self, child: _Node, parent: _Node) -> bool:
        parent_end = parent.end if parent.end is not None else self.last_time
        return child.thread == parent.thread and parent.begin <= child.begin <= parent_end


_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)', re.MULTILINE)


def _fault_where(dump: str) -> str:
    """The innermost user frame of the first thread in a faulthandler dump."""
    current = dump.split("Current thread", 1)[-1] if "Current thread" in dump else dump
    for match in _FAULT_FRAME.finditer(current):
        if visible([(match["file"],)]):
            return f"{match['file']}:{match['line']} in {match['function']}"
    return ""


def _format_traceback(frames: Sequence[Sequence[Any]], message: str) -> str:
    lines = ["Traceback (most recent call last):"]
    shown = visible(frames)
    if len(shown) > FRAME_LIMIT:
        lines.append(f"  [... {len(shown) - FRAME_LIMIT} outer frames dropped]")
    for frame in shown[-FRAME_LIMIT:]:
        site = frame_site(frame)
        lines.append(f'  File "{site.file}", line {site.line}, in {site.function}')
        if site.source:
            lines.append(f"    {site.source}")
    lines.append(message)
    return "\n".join(lines)


def _import_error(event: dict[str, Any]) -> TargetFailure:
    frames = event.get("tb") or []
    file, line = event.get("file"), event.get("line")
    if file is None:
        innermost = pick_site(list(reversed(frames)))
        file, line = (innermost.file, innermost.line) if innermost else (None, None)
    message = capped(f"{event['target']}: {event['msg']}")
    return TargetFailure("import-error", message, _format_traceback(frames, capped(event["msg"])), file, line)


def subkernel_failure(raw: RawRun) -> tuple[ScanStatus, TargetFailure] | None:
    """``timeout`` or ``crashed`` with the stack dump's innermost frame, ``exited`` when the interpreter never
    started the probe; ``None`` otherwise."""
    code = raw.returncode
    if raw.never_kept is not None and not raw.timed_out:
        message = (
            "the interpreter never ran the probe: "
            + (f"it exited with status {status}" if (status := raw.never_kept) >= 0 else describe_exit(status))
            + " before starting it (is --python a wrapper that drops its arguments?)"
        )
        return ScanStatus.EXITED, TargetFailure("exited", message, raw.stderr.text[-4000:], exitcode=raw.never_kept)
    if raw.timed_out:
        where = _fault_where(raw.fault_dump)
        message = "the subkernel did not finish in time" + (f"; it was at {where}" if where else "")
        return ScanStatus.TIMEOUT, TargetFailure("timeout", message, raw.fault_dump, where=where)
    if code is not None and code < 0:
        name = signal_name(-code)
        where = _fault_where(raw.fault_dump)
        message = f"the subkernel was killed by {name}" + (f" at {where}" if where else "")
        return ScanStatus.CRASHED, TargetFailure("crashed", message, raw.fault_dump, signal=-code, where=where)
    return None


CHANNEL_LOST_MESSAGE = (
    "the target closed, replaced or flooded the subkernel's result channel, so what it did after that is unknown"
)


def channel_lost(raw: RawRun, kinds: set[str]) -> bool:
    """The agent said its channel broke, a flood overran it, or a subkernel that exited normally sent
    nothing; ``kinds`` are the event kinds that arrived.  Scans and replays judge it alike."""
    if raw.channel_truncated:
        return True
    if raw.returncode == protocol.CHANNEL_LOST_EXIT and "exit" not in kinds:
        return True
    return raw.returncode == 0 and "hello" not in kinds


def _status_and_error(raw: RawRun, events: Sequence[dict[str, Any]]) -> tuple[ScanStatus, TargetFailure | None]:
    kinds = {event["e"] for event in events}
    errors = [event for event in events if event["e"] == "error"]
    code = raw.returncode
    failure = subkernel_failure(raw)
    if failure is not None:
        return failure
    if "done" not in kinds and channel_lost(raw, kinds):
        return ScanStatus.CHANNEL_LOST, TargetFailure(
            "channel-lost", CHANNEL_LOST_MESSAGE, raw.stderr.text[-4000:], exitcode=code
        )
    if "done" not in kinds:
        exit_events = [event for event in events if event["e"] == "exit"]
        reason = "sys.exit" if exit_events else "os._exit or a closed interpreter"
        message = f"the target ended the subkernel ({reason}; {describe_exit(code)})"
        return ScanStatus.EXITED, TargetFailure("exited", message, raw.stderr.text[-4000:], exitcode=code)
    if errors:
        return ScanStatus.IMPORT_ERROR, _import_error(errors[0])
    return ScanStatus.OK, None


def assemble(raw: RawRun, targets: Sequence[str], driver: DriverInfo, own: Iterable[str] = ()) -> ScanResult:
    """Build the scan result from one run's events, keeping whatever was recorded.

    ``own`` names the user's packages (default: the targets' top-level
    packages); the culprit's ``first_party`` line is looked for there.
    """
    events = [event for event in raw.events if isinstance(event.get("e"), str)]
    tree = _Tree()
    hello = next((event for event in events if event["e"] == "hello"), {})
    main_thread = hello.get("main_thread", 0)
    for event in events:
        tree.last_time = max(tree.last_time, float(event.get("t", 0.0)))
        if event["e"] == "begin":
            tree.begin(event)
        elif event["e"] == "end":
            tree.end(event)
        elif event["e"] == "thread":
            tree.thread_started(event.get("by"))
    culprit_event = best_event(events)
    mine = own_patterns(targets, own)
    culprits = (attribute(culprit_event, tree, main_thread, own=mine),) if culprit_event else ()
    status, error = _status_and_error(raw, events)
    final = next((event for event in events if event["e"] == "final"), None)
    cuda_initialized = bool(final["initialized"]) if final else bool(culprits)
    return ScanResult(
        targets=tuple(targets),
        status=status,
        driver=_driver_seen(driver, hello),
        cuda_initialized=cuda_initialized or bool(culprits),
        modules=tree.import_nodes({c.module for c in culprits if c.module}),
        culprits=culprits,
        startup=_startup(events, tree, culprits),
        error=error,
        torch_cuda_initialized=final.get("torch") if final else None,
        exitcode=raw.returncode,
        stdout=raw.stdout.describe(),
        stderr=raw.stderr.describe(),
        duration_s=raw.duration_s,
        python=(str(hello.get("python") or "").split() or [""])[0],
        started_at=iso_time(raw.started_at),
        threads_alive=_alive_threads(events),
        simulation_gaps=simulation_gaps(final.get("refusals") if final else None),
        skipped_events=raw.skipped_events,
        own=mine,
        blind_spots=() if cuda_initialized or culprits else blind_spots(driver, hello, final),
    )


def blind_spots(driver: DriverInfo, hello: dict[str, Any], final: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Why neither the driver's hook nor its state could have shown a cuInit (``()``: something could).

    A real driver reports cuInit only by calling the injection library, and
    only a driver whose ``cuDeviceGetCount`` answers can be asked afterwards; a
    driver with neither leaves a scan that saw nothing unable to say "clean".
    """
    state = hello.get("state")
    library = hello.get("library") or driver.library or "libcuda.so.1"
    if state == protocol.DRIVER_UNASKABLE:
        return (
            f"the driver ({library}) has no cuDeviceGetCount, so its state cannot be asked, and it never called the "
            "injection library (CUDA_INJECTION64_PATH): a cuInit could not have been seen",
        )
    if driver.kind == "real" and state == protocol.NO_DRIVER:
        return ("libcuda.so.1 did not load in the subkernel, so a cuInit could not have been seen",)
    foreign = [path for path in (final or {}).get("foreign") or () if isinstance(path, str)]
    if driver.kind == "simulated" and foreign:
        return (
            "CUDA libraries outside the simulated world were loaded, so a call into them could not have been seen: "
            + ", ".join(foreign[:4]),
        )
    if driver.kind == "simulated" and state == protocol.NO_DRIVER:
        return ("the simulated libcuda.so.1 did not load in the subkernel, so a cuInit could not have been seen",)
    return ()


def simulation_gaps(refusals: object) -> tuple[str, ...]:
    """Where the simulated driver, NVML or runtime could not play along, in words (``driver/sim*.c``)."""
    if not isinstance(refusals, dict):
        return ()
    driver, nvml = refusals.get("driver"), refusals.get("nvml")
    first, nvml_first = refusals.get("first") or "?", refusals.get("nvml_first") or "?"
    gaps = []
    if isinstance(driver, int) and driver & protocol.SIM_EXPORT_TABLE_REFUSED:
        gaps.append(f"the CUDA runtime asked for an undocumented export table ({first}); its calls fail after it")
    if (
        isinstance(driver, int)
        and driver & protocol.SIM_UNMODELLED_CALLED
        and not driver & protocol.SIM_EXPORT_TABLE_REFUSED
    ):
        gaps.append(f"an unmodelled driver function was called ({first}) and answered CUDA_ERROR_NOT_SUPPORTED")
    if isinstance(nvml, int) and nvml & protocol.SIM_UNMODELLED_CALLED:
        gaps.append(f"an unmodelled NVML function was called ({nvml_first}) and answered NVML_ERROR_NOT_SUPPORTED")
    if isinstance(driver, int) and driver & protocol.SIM_INIT_INFERRED:
        gaps.append("cuInit was inferred from the runtime's export-table request, not called by name")
    gaps += _runtime_gaps(refusals.get("runtime"), refusals.get("runtime_first") or "?")
    return tuple(gaps)


def _runtime_gaps(runtime: object, first: str) -> list[str]:
    """The simulated CUDA runtime's refusals: kernel launches (no GPU code runs) and unmodelled calls."""
    if not isinstance(runtime, int):
        return []
    gaps = []
    if runtime & protocol.SIM_KERNEL_LAUNCH_REFUSED:
        gaps.append(f"a kernel launch was refused: no GPU code runs on the simulated GPU (first refusal: {first})")
    if runtime & protocol.SIM_UNMODELLED_CALLED:
        gaps.append(f"an unmodelled CUDA runtime function answered cudaErrorNotSupported (first refusal: {first})")
    return gaps


def _alive_threads(events: Sequence[dict[str, Any]]) -> tuple[AliveThread, ...]:
    report = next((event for event in events if event["e"] == "threads"), None)
    alive = report.get("alive") if report else None
    if not isinstance(alive, list):
        return ()
    return tuple(
        AliveThread(str(item.get("name") or "?"), item.get("by"), start_site(item.get("stack")))
        for item in alive
        if isinstance(item, dict)
    )


def _driver_seen(driver: DriverInfo, hello: dict[str, Any]) -> DriverInfo:
    library = hello.get("library") or driver.library
    return DriverInfo(driver.kind, driver.requested, library, driver.libraries)


def _startup(events: Sequence[dict[str, Any]], tree: _Tree, culprits: tuple[Culprit, ...]) -> StartupInfo:
    phase_times = {event["phase"]: event["t"] for event in events if event["e"] == "phase"}
    start, end = phase_times.get("startup"), phase_times.get("import")
    seconds = (end - start) if start is not None and end is not None else 0.0
    count = sum(1 for node in tree.nodes.values() if node.phase == "startup")
    initialized = any(c.phase == "startup" for c in culprits)
    return StartupInfo(cuda_initialized=initialized, modules=count, seconds=seconds)
