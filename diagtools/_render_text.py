"""Terminal rendering of scan results: the culprit, its chain and its line."""

from __future__ import annotations

from diagtools._model import Culprit, ScanResult

__all__ = ["render_scan"]


def render_scan(result: ScanResult, *, stack: bool = False) -> str:
    """A short report a person can act on; ``stack`` adds the whole Python stack."""
    lines = [
        f"diagtools scan {' '.join(result.targets)}",
        f"  driver: {result.driver.describe()}",
        f"  status: {result.status}  ({len(result.modules)} modules imported in {result.duration_s:.2f} s)",
    ]
    lines += _error_lines(result)
    lines += _cuda_lines(result)
    for culprit in result.culprits:
        lines += _culprit_lines(culprit, stack=stack)
    return "\n".join(lines)


def _error_lines(result: ScanResult) -> list[str]:
    if result.error is None:
        return []
    lines = [f"  error: {result.error.message}"]
    if result.error.file:
        lines.append(f"    at {result.error.file}:{result.error.line}")
    return lines


def _cuda_lines(result: ScanResult) -> list[str]:
    if not result.cuda_initialized:
        return ["  CUDA initialized: no"]
    phase = result.culprit.phase if result.culprit else "unknown"
    return [f"  CUDA initialized: YES (during {phase})"]


def _culprit_lines(culprit: Culprit, *, stack: bool) -> list[str]:
    lines = [f"  culprit: {culprit.module or '(no module was executing)'}"]
    if culprit.chain:
        lines.append(f"    chain: {' -> '.join(culprit.chain)}")
    if culprit.phase == "thread":
        lines.append(f"    thread: {culprit.thread}")
    if culprit.site is not None:
        lines.append(f"    site:  {culprit.site.file}:{culprit.site.line} in {culprit.site.function}")
        if culprit.site.source:
            lines.append(f"    {culprit.site.line:>5} | {culprit.site.source}")
    lines.append(f"    evidence: {culprit.evidence}")
    if stack and culprit.stack:
        lines.append("    stack (outermost first):")
        lines += [f"      {frame.file}:{frame.line} in {frame.function}" for frame in culprit.stack]
    return lines
