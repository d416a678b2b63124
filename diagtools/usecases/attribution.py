"""Who initialized CUDA: the one attribution rule of the scan and of ``diagtools run``.

Both programs (the scan probe in a subkernel, the run agent in every process
of a watched command) send the same event for the first cuInit: ``cuinit``
(the driver's hook, with the calling stack), ``refined`` (a line-traced rerun)
or ``transition`` (only the driver's state changed), carrying ``m`` (the
module whose top-level code was running, or for a thread the module that
started it), ``stack`` (innermost first), ``th``, ``ph`` and, for a thread,
``origin``, ``name`` and ``started``.  :func:`attribute` turns one such event
into a :class:`~diagtools.model.scan.Culprit`; the only thing that differs is
where the import chain comes from (:class:`Modules`): the scan's import tree,
or the module bodies the run agent saw on the stack (:class:`StackChain`).
"""

from __future__ import annotations

import linecache
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from diagtools import agents, protocol
from diagtools.model.scan import Culprit, Site
from diagtools.model.site import is_own, own_patterns
from diagtools.model.verdict import Evidence

__all__ = [
    "EVIDENCE",
    "FRAME_LIMIT",
    "INFERRED_EVIDENCE",
    "TEXT_LIMIT",
    "Modules",
    "StackChain",
    "attribute",
    "best_event",
    "capped",
    "frame_site",
    "is_own",
    "own_patterns",
    "pick_site",
    "source_line",
    "stack_sites",
    "start_site",
    "visible",
]

_HIDDEN_FILES = frozenset(
    {
        "<frozen importlib._bootstrap>",
        "<frozen importlib._bootstrap_external>",
        "<string>",
        str(agents.program("scan_probe")),
        str(agents.program("sweep_zygote")),
        str(Path(protocol.__file__).resolve()),
    }
)
_HIDDEN_FOLDERS = (str(Path(agents.__file__).resolve().parent / "run_hook") + "/",)
#: the event kinds that report the first cuInit, most precise first, and the evidence each is
EVIDENCE = {"cuinit": Evidence.DRIVER_HOOK, "refined": Evidence.TRACE, "transition": Evidence.STATE_PROBE}
#: a cuInit the simulated driver inferred from a real CUDA runtime's export-table request (simcuda.c)
INFERRED_EVIDENCE = Evidence.INFERRED
TEXT_LIMIT = 2000  # characters kept of a source line or a message
FRAME_LIMIT = 200  # frames kept of a stack (the innermost ones)
_THREAD_MACHINERY = ("/threading.py",)


class Modules(Protocol):
    """Where a module's import chain and file come from."""

    def chain(self, module: str | None) -> tuple[str, ...]:
        """The modules from the outermost importer down to ``module``."""
        ...

    def file_of(self, module: str | None) -> str | None:
        """The module's source file, when known."""
        ...

    def import_line(self, module: str) -> Site | None:
        """The statement that imported ``module``, when known."""
        ...


class StackChain:
    """The chain the run agent saw: the module bodies running on the stack, ``[[name, file], ...]``.

    With the event's stack (``[file, line, function]`` rows, innermost first), each edge's import
    statement is the innermost frame of the importing module's file outside the imported module's
    body: ``import reg`` in a script or a notebook cell that started the chain.
    """

    def __init__(self, chain: Sequence[Sequence[Any]] | None, stack: Sequence[Sequence[Any]] | None = None) -> None:
        self.entries = [(str(item[0]), item[1] if isinstance(item[1], str) else None) for item in chain or ()]
        self.lines = _import_lines(self.entries, list(reversed(stack or ())))

    def chain(self, module: str | None) -> tuple[str, ...]:
        names = [name for name, _ in self.entries]
        if module in names:
            return tuple(names[: len(names) - names[::-1].index(module)])
        return (*names, module) if module is not None else tuple(names)

    def file_of(self, module: str | None) -> str | None:
        return next((file for name, file in reversed(self.entries) if name == module), None)

    def import_line(self, module: str) -> Site | None:
        names = [name for name, _ in self.entries]
        if module not in names:
            return None
        return self.lines[len(names) - 1 - names[::-1].index(module)]


def _import_lines(entries: Sequence[tuple[str, str | None]], outermost_first: Sequence[Sequence[Any]]) -> list:
    """Beside each chain entry, the statement of the entry before it that imported it (``None`` when unseen)."""
    lines: list[Site | None] = [None] * len(entries)
    bodies = []  # the stack position of each entry's module body, in chain order
    start = 0
    for _name, file in entries:
        found = next(
            (k for k in range(start, len(outermost_first)) if _is_body(outermost_first[k], file)),
            None,
        )
        if found is None:
            break
        bodies.append(found)
        start = found + 1
    for i in range(1, len(bodies)):
        importer = entries[i - 1][1]
        frames = [k for k in range(bodies[i - 1], bodies[i]) if outermost_first[k][0] == importer]
        if frames:
            lines[i] = frame_site(outermost_first[frames[-1]])
    return lines


def _is_body(frame: Sequence[Any], file: str | None) -> bool:
    return len(frame) >= 3 and file is not None and frame[0] == file and frame[2] == "<module>"


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


def frame_site(frame: Sequence[Any]) -> Site:
    """A ``[file, line, function]`` row as a site with its source line."""
    file, line, function = str(frame[0]), int(frame[1] or 0), str(frame[2])
    return Site(file, line, function, source_line(file, line))


def _hidden(file: object) -> bool:
    return file in _HIDDEN_FILES or str(file).startswith(_HIDDEN_FOLDERS)


def visible(frames: Iterable[Sequence[Any]]) -> list[Sequence[Any]]:
    """The frames that are the program's: not importlib's, nor diagtools' own programs'."""
    return [frame for frame in frames if not _hidden(frame[0])]


def stack_sites(stack_innermost_first: Sequence[Sequence[Any]] | None) -> tuple[Site, ...]:
    """A stack's visible frames as sites, outermost first (the innermost :data:`FRAME_LIMIT`)."""
    return tuple(frame_site(frame) for frame in reversed(visible(stack_innermost_first or ())[:FRAME_LIMIT]))


def pick_site(stack_innermost_first: Sequence[Sequence[Any]]) -> Site | None:
    """The innermost frame that belongs to the user's code, not to importlib or the probe."""
    frames = visible(stack_innermost_first)
    return frame_site(frames[0]) if frames else None


def start_site(stack: Sequence[Sequence[Any]] | None) -> Site | None:
    """The line that started a thread: the innermost frame outside ``threading`` itself."""
    frames = [frame for frame in visible(stack or []) if not str(frame[0]).endswith(_THREAD_MACHINERY)]
    return frame_site(frames[0]) if frames else None


def _own_files(chain: tuple[str, ...], modules: Modules, own: Sequence[str] | None) -> set[str]:
    """The files of the chain's modules that are the user's: by ``own`` patterns, or (``None``) by location."""
    files = {module: modules.file_of(module) for module in chain}
    if own is None:
        return {file for file in files.values() if file is not None and protocol.file_kind(file) == "user"}
    return {file for module, file in files.items() if file is not None and is_own(module, own)}


def _first_party(
    stack: Sequence[Sequence[Any]], imports: tuple[Site | None, ...], started_at: Site | None, files: set[str]
) -> Site | None:
    """The last frame on the chain in the user's own code: the stack first, then the chain's import lines."""
    if not files:
        return None
    frame = next((frame for frame in visible(stack) if frame[0] in files), None)
    if frame is not None:
        return frame_site(frame)
    candidates = [started_at, *reversed(imports)]
    return next((site for site in candidates if site is not None and site.file in files), None)


def attribute(
    event: dict[str, Any],
    modules: Modules,
    main_thread: int,
    context: str | None = None,
    *,
    own: Sequence[str] | None = None,
) -> Culprit:
    """The culprit one first-cuInit event names, with its chain from ``modules``.

    ``own`` names the user's packages, where ``first_party`` (the line to
    change) is looked for; ``None`` (``diagtools run``, which has no target):
    the chain's modules outside installed packages and the standard library.
    """
    stack = event.get("stack") or []
    module = event.get("m")
    chain = modules.chain(module)
    if module is not None and chain[-1:] != (module,):
        chain = (*modules.chain(event.get("importer")), module)  # executed without an import the tracer saw
    shown = visible(stack)
    imports = tuple(modules.import_line(name) for name in chain)
    started_at = start_site(event.get("started"))
    return Culprit(
        module=module,
        chain=chain,
        site=pick_site(stack),
        stack=stack_sites(stack),
        phase=event.get("ph", "import"),
        thread=_thread_name(event, main_thread),
        thread_started_by=None if event.get("th") == main_thread else (event.get("origin") or "start-up"),
        evidence=INFERRED_EVIDENCE if event.get("inferred") else EVIDENCE[event["e"]],
        module_site=_module_site(stack, modules.file_of(module)),
        thread_started_at=started_at,
        stack_dropped=max(0, len(shown) - FRAME_LIMIT),
        context=context,
        chain_imports=imports,
        first_party=_first_party(stack, imports, started_at, _own_files(chain, modules, own)),
    )


def _thread_name(event: dict[str, Any], main_thread: int) -> str:
    """The thread's own name (``""`` when the driver call came from a thread Python never named)."""
    if event.get("th") == main_thread:
        return "MainThread"
    name = event.get("name")
    return name if isinstance(name, str) else ""


def _module_site(stack: Sequence[Sequence[Any]], module_file: str | None) -> Site | None:
    """The innermost frame in the culprit module's own source: the line to change."""
    if module_file is None:
        return None
    mine = [frame for frame in visible(stack) if frame[0] == module_file]
    return frame_site(mine[0]) if mine else None


def best_event(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The most precise account of the first cuInit: hook, then trace, then state."""
    for kind in EVIDENCE:
        for event in events:
            if event["e"] == kind:
                return event
    return None
