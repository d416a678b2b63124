"""Turn the subkernel's raw events into a :class:`ScanResult`.

Pure functions: events in, frozen dataclasses out, so every rule here (who is
the culprit, what the chain is, which status a run gets) is testable without
a process.
"""

from __future__ import annotations

import linecache
import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtools import agents, protocol
from diagtools.model.common import iso_time
from diagtools.model.scan import AliveThread, Culprit, DriverInfo, ImportNode, RunError, ScanResult, Site, StartupInfo
from diagtools.model.verdict import ScanStatus
from diagtools.runner.subkernel import RawRun

__all__ = ["assemble", "pick_site", "source_line", "start_site", "subkernel_failure"]

_HIDDEN_FILES = (
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    str(agents.program("scan_probe")),
    str(agents.program("sweep_zygote")),
    str(Path(protocol.__file__).resolve()),
)
_EVIDENCE_ORDER = {"cuinit": "driver-hook", "refined": "trace", "transition": "state-probe"}
# A cuInit the simulated driver inferred from a real CUDA runtime's export-table request (simcuda.c)
INFERRED_EVIDENCE = "driver-hook, inferred from the CUDA runtime's export-table request (no cuInit call was seen)"
TEXT_LIMIT = 2000  # characters kept of a source line or a message
FRAME_LIMIT = 200  # frames kept of a stack (the innermost ones)


def capped(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` cut at ``limit`` characters, saying how many bytes it had in all."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [truncated: {len(text.encode('utf-8', 'backslashreplace'))} bytes]"


def source_line(file: str, line: int) -> str:
    """The stripped text of ``file:line`` (capped), or "" when the source is unavailable."""
    try:
        return capped(linecache.getline(file, line).strip()) if line > 0 else ""
    except (OSError, ValueError, UnicodeError, MemoryError):
        return ""


def _site(frame: Sequence[Any]) -> Site:
    file, line, function = str(frame[0]), int(frame[1] or 0), str(frame[2])
    return Site(file, line, function, source_line(file, line))


def _visible(frames: Iterable[Sequence[Any]]) -> list[Sequence[Any]]:
    return [frame for frame in frames if frame[0] not in _HIDDEN_FILES and frame[0] != "<string>"]


def pick_site(stack_innermost_first: Sequence[Sequence[Any]]) -> Site | None:
    """The innermost frame that belongs to the user's code, not to importlib or the probe."""
    visible = _visible(stack_innermost_first)
    return _site(visible[0]) if visible else None


@dataclass
class _Node:
    name: str
    parent: str | None
    file: str | None
    begin: float
    thread: int
    phase: str
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


def _culprit(event: dict[str, Any], tree: _Tree, main_thread: int) -> Culprit:
    stack = event.get("stack") or []
    module = event.get("m")
    chain = tree.chain(module)
    if module is not None and module not in tree.nodes:
        chain = (*tree.chain(event.get("importer")), module)  # executed without an import the tracer saw
    visible = _visible(stack)
    return Culprit(
        module=module,
        chain=chain,
        site=pick_site(stack),
        stack=tuple(_site(frame) for frame in reversed(visible[:FRAME_LIMIT])),
        phase=event.get("ph", "import"),
        thread=_thread_label(event, main_thread),
        evidence=INFERRED_EVIDENCE if event.get("inferred") else _EVIDENCE_ORDER[event["e"]],
        module_site=_module_site(stack, tree.file_of(module)),
        thread_started_at=start_site(event.get("started")),
        stack_dropped=max(0, len(visible) - FRAME_LIMIT),
    )


def _thread_label(event: dict[str, Any], main_thread: int) -> str:
    if event.get("th") == main_thread:
        return "MainThread"
    name = event.get("name")
    started_by = f"thread started by {event.get('origin') or 'start-up'}"
    return f"{name} ({started_by})" if isinstance(name, str) and name else started_by


def _module_site(stack: Sequence[Sequence[Any]], module_file: str | None) -> Site | None:
    """The innermost frame in the culprit module's own source: the line to change."""
    if module_file is None:
        return None
    mine = [frame for frame in _visible(stack) if frame[0] == module_file]
    return _site(mine[0]) if mine else None


_THREAD_MACHINERY = ("/threading.py",)


def start_site(stack: Sequence[Sequence[Any]] | None) -> Site | None:
    """The line that started a thread: the innermost frame outside ``threading`` itself."""
    frames = [frame for frame in _visible(stack or []) if not str(frame[0]).endswith(_THREAD_MACHINERY)]
    return _site(frames[0]) if frames else None


def _best_culprit_event(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The most precise account of the first cuInit: hook, then trace, then state."""
    for kind in _EVIDENCE_ORDER:
        for event in events:
            if event["e"] == kind:
                return event
    return None


_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)', re.MULTILINE)


def _fault_where(dump: str) -> str:
    """The innermost user frame of the first thread in a faulthandler dump."""
    current = dump.split("Current thread", 1)[-1] if "Current thread" in dump else dump
    for match in _FAULT_FRAME.finditer(current):
        if match["file"] not in _HIDDEN_FILES:
            return f"{match['file']}:{match['line']} in {match['function']}"
    return ""


def _format_traceback(frames: Sequence[Sequence[Any]], message: str) -> str:
    lines = ["Traceback (most recent call last):"]
    visible = _visible(frames)
    if len(visible) > FRAME_LIMIT:
        lines.append(f"  [... {len(visible) - FRAME_LIMIT} outer frames dropped]")
    for frame in visible[-FRAME_LIMIT:]:
        site = _site(frame)
        lines.append(f'  File "{site.file}", line {site.line}, in {site.function}')
        if site.source:
            lines.append(f"    {site.source}")
    lines.append(message)
    return "\n".join(lines)


def _import_error(event: dict[str, Any]) -> RunError:
    frames = event.get("tb") or []
    file, line = event.get("file"), event.get("line")
    if file is None:
        innermost = pick_site(list(reversed(frames)))
        file, line = (innermost.file, innermost.line) if innermost else (None, None)
    message = capped(f"{event['target']}: {event['msg']}")
    return RunError("import-error", message, _format_traceback(frames, capped(event["msg"])), file, line)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def subkernel_failure(raw: RawRun) -> tuple[ScanStatus, RunError] | None:
    """``timeout`` or ``crashed`` with the stack dump's innermost frame; ``None`` otherwise."""
    code = raw.returncode
    if raw.timed_out:
        where = _fault_where(raw.fault_dump)
        message = "the subkernel did not finish in time" + (f"; it was at {where}" if where else "")
        return ScanStatus.TIMEOUT, RunError("timeout", message, raw.fault_dump, where=where)
    if code is not None and code < 0:
        name = _signal_name(-code)
        where = _fault_where(raw.fault_dump)
        message = f"the subkernel was killed by {name}" + (f" at {where}" if where else "")
        return ScanStatus.CRASHED, RunError("crashed", message, raw.fault_dump, signal=-code, where=where)
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


def _status_and_error(raw: RawRun, events: Sequence[dict[str, Any]]) -> tuple[ScanStatus, RunError | None]:
    kinds = {event["e"] for event in events}
    errors = [event for event in events if event["e"] == "error"]
    code = raw.returncode
    failure = subkernel_failure(raw)
    if failure is not None:
        return failure
    if "done" not in kinds and channel_lost(raw, kinds):
        return ScanStatus.CHANNEL_LOST, RunError(
            "channel-lost", CHANNEL_LOST_MESSAGE, raw.stderr.text[-4000:], exitcode=code
        )
    if "done" not in kinds:
        exit_events = [event for event in events if event["e"] == "exit"]
        reason = "sys.exit" if exit_events else "os._exit or a closed interpreter"
        message = f"the target ended the subkernel ({reason}) with exit code {code}"
        return ScanStatus.EXITED, RunError("exited", message, raw.stderr.text[-4000:], exitcode=code)
    if errors:
        return ScanStatus.IMPORT_ERROR, _import_error(errors[0])
    return ScanStatus.OK, None


def assemble(raw: RawRun, targets: Sequence[str], driver: DriverInfo) -> ScanResult:
    """Build the scan result from one run's events, keeping whatever was recorded."""
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
    culprit_event = _best_culprit_event(events)
    culprits = (_culprit(culprit_event, tree, main_thread),) if culprit_event else ()
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
    )


_EXPORT_TABLE_REFUSED, _UNMODELLED_CALLED, _INIT_INFERRED = 1, 2, 4
_KERNEL_LAUNCH_REFUSED = 1  # the simulated runtime's bit for a refused launch (driver/simcudart.c)


def simulation_gaps(refusals: object) -> tuple[str, ...]:
    """Where the simulated driver or NVML could not play along, in words (see ``driver/simcuda.c``)."""
    if not isinstance(refusals, dict):
        return ()
    driver, nvml = refusals.get("driver"), refusals.get("nvml")
    first, nvml_first = refusals.get("first") or "?", refusals.get("nvml_first") or "?"
    gaps = []
    if isinstance(driver, int) and driver & _EXPORT_TABLE_REFUSED:
        gaps.append(f"the CUDA runtime asked for an undocumented export table ({first}); its calls fail after it")
    if isinstance(driver, int) and driver & _UNMODELLED_CALLED and not driver & _EXPORT_TABLE_REFUSED:
        gaps.append(f"an unmodelled driver function was called ({first}) and answered CUDA_ERROR_NOT_SUPPORTED")
    if isinstance(nvml, int) and nvml & _UNMODELLED_CALLED:
        gaps.append(f"an unmodelled NVML function was called ({nvml_first}) and answered NVML_ERROR_NOT_SUPPORTED")
    if isinstance(driver, int) and driver & _INIT_INFERRED:
        gaps.append("cuInit was inferred from the runtime's export-table request, not called by name")
    gaps += _runtime_gaps(refusals.get("runtime"), refusals.get("runtime_first") or "?")
    return tuple(gaps)


def _runtime_gaps(runtime: object, first: str) -> list[str]:
    """The simulated CUDA runtime's refusals: kernel launches (no GPU code runs) and unmodelled calls."""
    if not isinstance(runtime, int):
        return []
    gaps = []
    if runtime & _KERNEL_LAUNCH_REFUSED:
        gaps.append(f"a kernel launch was refused: no GPU code runs on the simulated GPU (first refusal: {first})")
    if runtime & _UNMODELLED_CALLED:
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
