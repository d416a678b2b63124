"""Bisect: the first commit at which importing a target initializes CUDA.

Drives ``git bisect run`` with "the scan says CUDA got initialized" as the
predicate, in a throwaway clone (``--shared``: no copy of the objects), so the
user's checkout, HEAD, index and ``.git`` are never touched.  Commits where the
target cannot be imported are skipped, not judged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.errors import UsageError
from diagtools.model.bisect import BisectResult, BisectStep
from diagtools.model.cuts import Edge, regression
from diagtools.model.options import DEFAULT_TIMEOUT_S
from diagtools.model.scan import Culprit, ScanResult, Site
from diagtools.usecases.bisect_step import BAD, GOOD, scan_at, verdict
from diagtools.usecases.options import validate_targets, validate_timeout

__all__ = ["bisect"]


def _git(repo: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} failed in {repo}: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def _resolve(repo: Path, rev: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise UsageError(f"{rev!r} is not a commit in {repo}")
    return done.stdout.strip()


def _check_repo(repo: Path) -> Path:
    if shutil.which("git") is None:
        raise UsageError("git is not installed")
    if (
        not repo.is_dir()
        or subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--git-dir"], capture_output=True, check=False
        ).returncode
        != 0
    ):
        raise UsageError(f"--repo {str(repo)!r} is not a git repository")
    return repo.resolve()


@dataclass(frozen=True)
class _Job:
    """A bisect in its throwaway clone: what to scan there, and how."""

    work: Path
    target: str
    subdir: str
    driver: str
    timeout: float

    def verdict_at(self, rev: str) -> tuple[int, dict[str, Any]]:
        _git(self.work, "checkout", "--quiet", "--detach", rev)
        return verdict(self.target, str(self.work / self.subdir), self.driver, self.timeout)

    def scan_at(self, rev: str) -> ScanResult:
        _git(self.work, "checkout", "--quiet", "--detach", rev)
        return scan_at(self.target, str(self.work / self.subdir), self.driver, self.timeout)

    def step_args(self) -> list[str]:
        return [
            self.target,
            "--path",
            str(self.work / self.subdir),
            "--driver",
            self.driver,
            "--timeout",
            str(self.timeout),
        ]


def _judge_endpoint(job: _Job, rev: str, expected: int) -> None:
    code, record = job.verdict_at(rev)
    if code != expected:
        wanted = "initialize" if expected == BAD else "leave uninitialized"
        found = record.get("error") or f"it {'did' if code == BAD else 'did not'}"
        raise UsageError(f"{job.target} at {rev[:12]} should {wanted} CUDA for a bisect, but {found}")


def _run_bisect(work: Path, good: str, bad: str, step_args: list[str], log: Path) -> str:
    _git(work, "bisect", "start", bad, good)
    env = dict(os.environ, **{protocol.BISECT_LOG: str(log)})
    command = ["git", "-C", str(work), "bisect", "run", sys.executable, "-m", "diagtools.usecases.bisect_step"]
    with subprocess.Popen(
        [*command, *step_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate()
        except BaseException:  # an interrupt: the step running now dies, and its keeper ends its scan's tree
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
    return output


_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.MULTILINE)
_CANDIDATES = re.compile(r"could be any of:\n((?:[0-9a-f]{40}\n?)+)")


def _steps(log: Path) -> tuple[BisectStep, ...]:
    if not log.exists():
        return ()
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    return tuple(BisectStep.from_json(json.loads(line)) for line in lines)


def bisect(
    repo: str | os.PathLike[str],
    good: str,
    bad: str,
    target: str,
    *,
    path_in_repo: str = "",
    driver: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> BisectResult:
    """Find the first commit between ``good`` and ``bad`` where importing ``target`` initializes CUDA."""
    (name,) = validate_targets(target)
    timeout = validate_timeout(timeout)
    source = _check_repo(Path(repo))
    good_sha, bad_sha = _resolve(source, good), _resolve(source, bad)
    with tempfile.TemporaryDirectory(prefix="diagtools-bisect-") as scratch:
        work = Path(scratch) / "work"
        subprocess.run(
            ["git", "clone", "--quiet", "--shared", "--no-checkout", str(source), str(work)],
            capture_output=True,
            check=True,
        )
        job = _Job(work, name, path_in_repo, driver, timeout)
        _judge_endpoint(job, bad_sha, BAD)
        _judge_endpoint(job, good_sha, GOOD)
        log = Path(scratch) / "steps.jsonl"
        output = _run_bisect(work, good_sha, bad_sha, job.step_args(), log)
        first = _FIRST_BAD.search(output)
        if first is None:
            listed = _CANDIDATES.search(output)
            candidates = tuple(listed.group(1).split()) if listed else ()
            return BisectResult(name, good_sha, bad_sha, None, "", (), None, _steps(log), candidates)
        return _describe(job, good_sha, bad_sha, first.group(1), _steps(log))


def _describe(job: _Job, good: str, bad: str, first: str, steps: tuple[BisectStep, ...]) -> BisectResult:
    subject = _git(job.work, "show", "--no-patch", "--format=%s", first).strip()
    files = tuple(_git(job.work, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", first).split())
    _git(job.work, "bisect", "reset", "--quiet", check=False)
    bad_scan = job.scan_at(first)
    parent = _git(job.work, "rev-parse", "--verify", "--quiet", f"{first}^", check=False).strip() or None
    found = regression(bad_scan, job.scan_at(parent), f"commit {parent[:12]}") if parent else None
    culprit = _relative(bad_scan.culprit, job.work)
    if found is not None:
        found = replace(found, line=_strip(found.line, job.work), edge=_relative_edge(found.edge, job.work))
    return BisectResult(job.target, good, bad, first, subject, files, culprit, steps, parent=parent, regression=found)


def _strip(site: Site, work: Path) -> Site:
    return replace(site, file=site.file.removeprefix(str(work) + os.sep))


def _relative_edge(edge: Edge | None, work: Path) -> Edge | None:
    return None if edge is None else replace(edge, site=_strip(edge.site, work))


def _relative(culprit: Culprit | None, work: Path) -> Culprit | None:
    """Site paths inside the throwaway clone, made relative to the repository."""
    return None if culprit is None else culprit.with_sites(lambda site: _strip(site, work))
