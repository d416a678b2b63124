"""The scan use case: import targets in a fresh subkernel and name the culprit."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools import agents, protocol
from diagtools.driver import build_probe_extension, resolve_driver
from diagtools.errors import UsageError
from diagtools.model.options import DEFAULT_SETTLE_S
from diagtools.model.verdict import Evidence, Verdict
from diagtools.runner.subkernel import RawRun, SubkernelRequest, run_subkernel
from diagtools.usecases.interpreter import validate_python

if TYPE_CHECKING:
    from pathlib import Path

    from diagtools.model.scan import Culprit, DriverInfo, ScanResult
    from diagtools.model.sweep import SweepRow

__all__ = [
    "DEFAULT_SETTLE_S",
    "SCAN_PROBE",
    "probe_request",
    "scan",
    "validate_own",
    "validate_paths",
    "validate_targets",
    "validate_timeout",
]

MAX_TIMEOUT_S = 7 * 24 * 3600.0

SCAN_PROBE = agents.program("scan_probe")

Runner = Callable[[SubkernelRequest], RawRun]


def validate_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """Dotted module names, checked before any process starts."""
    try:
        names = (targets,) if isinstance(targets, str) else tuple(targets)
    except TypeError:
        raise UsageError(f"targets must be a module name or a list of them, got {targets!r}") from None
    if not names:
        raise UsageError("no target given: name at least one module to scan")
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(f"{name!r} is not a module name (expected dotted identifiers such as pkg.sub)")
    return names


def validate_timeout(timeout: object) -> float:
    """Seconds as a finite, positive number (at most a week), checked before any process starts."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise UsageError(f"--timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT_S:  # also false for NaN
        raise UsageError(f"--timeout must be finite, positive and at most {MAX_TIMEOUT_S:.0f} s, got {timeout}")
    return float(timeout)


def validate_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """Import roots that exist, made absolute so the subkernel's cwd cannot matter."""
    try:
        items = (paths,) if isinstance(paths, (str, os.PathLike)) else tuple(paths)
    except TypeError:
        raise UsageError(f"path must be a directory or a list of them, got {paths!r}") from None
    resolved = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise UsageError(f"--path entries must be directory names, got {item!r}")
        text = os.fspath(item)
        if not isinstance(text, str) or "\n" in text or "\0" in text:
            raise UsageError(f"--path {text!r} contains a newline or NUL byte, which an import root cannot have")
        path = os.path.abspath(text)
        if not os.path.isdir(path):
            raise UsageError(f"--path {os.fspath(item)!r} is not a directory")
        resolved.append(path)
    return tuple(resolved)


def scan(
    targets: str | Iterable[str],
    *,
    path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
    driver: str = "auto",
    timeout: float = 120.0,
    settle: float = DEFAULT_SETTLE_S,
    refine: bool = True,
    runner: Runner = run_subkernel,
    own: str | Iterable[str] = (),
    python: str | os.PathLike[str] | None = None,
    cuts: bool = True,
    sweep: Iterable[SweepRow] = (),
) -> ScanResult:
    """Import ``targets`` in a fresh subkernel and report who initialized CUDA, and where to cut.

    Parameters
    ----------
    targets
        Module names, imported in order as ``import NAME`` would.
    path
        Directories put in front of ``sys.path`` in the subkernel.
    driver
        ``auto`` (the real driver when one loads, else the simulated one),
        ``real``, ``simulated`` or ``none``; the result says which was used.
    timeout
        Seconds before a hung subkernel is dumped and killed.
    settle
        After the imports, seconds to keep watching while threads the target
        started are still running (ends early when they finish); a cuInit they
        make is blamed on the module that started them.  Interpreter shutdown
        (atexit handlers, finalizers) is watched too.
    refine
        When only the driver's state (not its hook) caught the moment, rerun
        with line tracing inside the culprit module to find the exact line.
    runner
        The seam that starts subkernels; tests pass a fake.
    own
        The user's own packages (names such as ``vllm``, or globs on dotted
        names): the culprit's line to change is the last line on its chain in
        them.  Default: the targets' top-level packages.
    python
        The interpreter that runs the subkernel (the environment under test);
        default: this one.  CPython 3.10 or later.
    cuts
        When the targets initialize CUDA, search for the nearest and the
        deepest cut and verify each by running the targets again with those
        import statements deferred (``result.cuts``; the headline line to
        change is the nearest cut's first edge).  Each try is a subkernel run.
    sweep
        Rows of a sweep of the same code: each cut then says how many swept
        modules have one of its edges on their chain (``reach``).
    """
    names = validate_targets(targets)
    mine = validate_own(own)
    roots = validate_paths(path)
    timeout = validate_timeout(timeout)
    if not 0 <= settle < timeout:
        raise UsageError(f"--settle must be at least 0 and below the timeout ({timeout} s), got {settle}")
    interpreter = validate_python(python)
    setup = resolve_driver(driver)
    request = probe_request(names, roots, setup.env, timeout, settle, python=interpreter)
    result = _assemble(runner(request), names, setup.info, mine)
    if refine and _needs_refinement(result.culprit):
        result = _refine(result, request, runner, mine)
    if cuts and result.verdict == Verdict.INITIALIZES_CUDA:
        from diagtools.usecases.cuts import Verifier, search_cuts

        verifier = Verifier(request, targets=names, driver=setup.info, own=mine, runner=runner)
        result = result.with_cuts(search_cuts(result, verifier, sweep))
    return result


_GLOB = re.compile(r"\[!?[^\].]+\]|[*?]")
"""One glob element (``*``, ``?``, a ``[...]`` class): it stands for part of an identifier."""


def validate_own(own: str | Iterable[str]) -> tuple[str, ...]:
    """``--own`` patterns: dotted names, optionally with ``*``/``?``/``[]`` globs."""
    try:
        patterns = (own,) if isinstance(own, str) else tuple(own)
    except TypeError:
        raise UsageError(f"own must be a package name or a list of them, got {own!r}") from None
    for pattern in patterns:
        if not isinstance(pattern, str) or not all(part.isidentifier() for part in _GLOB.sub("x", pattern).split(".")):
            raise UsageError(f"--own {pattern!r} is not a package name or a glob on dotted names (such as vllm.*)")
    return patterns


def probe_request(
    targets: tuple[str, ...],
    roots: tuple[str, ...],
    env: dict[str, str],
    timeout: float,
    settle: float = 0.0,
    *,
    python: str = sys.executable,
    program: Path = SCAN_PROBE,
) -> SubkernelRequest:
    """A subkernel run of the import probe over ``targets`` (``program``: the sweep's zygote, which loads the
    probe and scans each module in a child)."""
    settings = {
        protocol.CUPROBE: str(build_probe_extension()),
        protocol.SCAN_TARGETS: "\n".join(targets),
        protocol.SCAN_PATH: "\n".join(roots),
        protocol.SCAN_REFINE: "",
        protocol.SCAN_SETTLE: repr(float(settle)),
    }
    return SubkernelRequest(program, settings, env, timeout, flags=("-S",), python=python)


def _assemble(raw: RawRun, targets: tuple[str, ...], driver: DriverInfo, own: tuple[str, ...]) -> ScanResult:
    """:func:`~diagtools.usecases.assemble.assemble`, imported only now: building the result's types is no
    reason to start the subkernel later (``diagtools scan`` imports them while it starts)."""
    from diagtools.usecases.assemble import assemble

    return assemble(raw, targets, driver, own)


def _needs_refinement(culprit: Culprit | None) -> bool:
    return culprit is not None and culprit.evidence is Evidence.STATE_PROBE and culprit.module is not None


def _refine(result: ScanResult, request: SubkernelRequest, runner: Runner, own: tuple[str, ...]) -> ScanResult:
    """Rerun with a line tracer inside the culprit's window to find the exact site."""
    assert result.culprit is not None
    assert result.culprit.module is not None
    targets = result.targets
    rerun = _assemble(
        runner(request.with_settings({protocol.SCAN_REFINE: result.culprit.module})), targets, result.driver, own
    )
    traced = rerun.culprit
    if traced is None or traced.evidence is not Evidence.TRACE or traced.module != result.culprit.module:
        return result
    first = result.culprit
    refined = replace(
        rerun.culprit,
        chain=first.chain,
        chain_imports=first.chain_imports,
        phase=first.phase,
        first_party=rerun.culprit.first_party or first.first_party,
    )
    return result.with_culprits((refined, *result.culprits[1:]))
