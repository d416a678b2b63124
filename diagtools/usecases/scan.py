"""The scan use case: import targets in a fresh subkernel and name the culprit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from diagtools import agents, protocol
from diagtools.driver import build_probe_extension, resolve_driver
from diagtools.errors import UsageError
from diagtools.model.options import DEFAULT_SETTLE_S, DEFAULT_TIMEOUT_S
from diagtools.model.verdict import Evidence, Verdict
from diagtools.runner.subkernel import RawRun, SubkernelRequest, run_subkernel
from diagtools.usecases.options import (
    ScanOptions,
    validate_own,
    validate_paths,
    validate_targets,
    validate_timeout,
)

if TYPE_CHECKING:
    from pathlib import Path

    from diagtools.model.scan import Culprit, DriverInfo, ScanResult
    from diagtools.model.sweep import SweepRow

__all__ = [
    "DEFAULT_SETTLE_S",
    "SCAN_PROBE",
    "ScanOptions",
    "probe_request",
    "scan",
    "scan_with",
    "validate_own",
    "validate_paths",
    "validate_targets",
    "validate_timeout",
]

SCAN_PROBE = agents.program("scan_probe")

Runner = Callable[[SubkernelRequest], RawRun]


def scan(
    targets: str | Iterable[str],
    *,
    path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
    driver: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
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
    options = ScanOptions.of(path=path, driver=driver, timeout=timeout, own=own, python=python)
    return scan_with(names, options, settle=settle, refine=refine, runner=runner, cuts=cuts, sweep=sweep)


def scan_with(
    names: tuple[str, ...],
    options: ScanOptions,
    *,
    settle: float = DEFAULT_SETTLE_S,
    refine: bool = True,
    runner: Runner = run_subkernel,
    cuts: bool = True,
    sweep: Iterable[SweepRow] = (),
) -> ScanResult:
    """:func:`scan` with its targets and options already validated (a sweep's workers call it per module)."""
    if not 0 <= settle < options.timeout:
        raise UsageError(f"--settle must be at least 0 and below the timeout ({options.timeout} s), got {settle}")
    setup = resolve_driver(options.driver)
    request = probe_request(names, options.roots, setup.env, options.timeout, settle, python=options.python)
    result = _assemble(runner(request), names, setup.info, options.own)
    if refine and _needs_refinement(result.culprit):
        result = _refine(result, request, runner, options.own)
    if cuts and result.verdict == Verdict.INITIALIZES_CUDA:
        from diagtools.usecases.cuts import Verifier, search_cuts

        verifier = Verifier(request, targets=names, driver=setup.info, own=options.own, runner=runner)
        result = result.with_cuts(search_cuts(result, verifier, sweep))
    return result


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
        traced,
        chain=first.chain,
        chain_imports=first.chain_imports,
        phase=first.phase,
        first_party=traced.first_party or first.first_party,
    )
    return result.with_culprits((refined, *result.culprits[1:]))
