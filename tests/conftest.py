"""Shared fixtures: throwaway packages in tmp_path and a scan on the simulated driver."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import diagtools
from diagtools import protocol
from diagtools.model.scan import ScanResult
from diagtools.runner.subkernel import RawRun, SubkernelRequest, run_subkernel

pytest_plugins = ["pytester"]
MARK = "# <- here"
DIAGTOOLS = str(Path(sys.executable).with_name("diagtools"))

# A module whose import initializes CUDA at the marked line: what `diagtools run` programs import.
RUN_REGISTRY = f"""
    import ctypes

    def _detect_platform():
        lib = ctypes.CDLL("libcuda.so.1")
        return lib.cuInit(0)  {MARK}

    PLATFORM = _detect_platform()
"""


# The extras `make test` installed for this run (DIAGTOOLS_TEST_EXTRAS, comma-separated; the main venv
# has them all, the per-interpreter core venvs none).  Under CI a module of one of them that is
# missing fails the run instead of skipping: a broken install must not pass as a row of skips.
_ALL_EXTRAS = "notebook,cuda,kernels,dev"
INSTALLED_EXTRAS = frozenset(filter(None, os.environ.get("DIAGTOOLS_TEST_EXTRAS", _ALL_EXTRAS).split(",")))
UNDER_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(module: str, extra: str, reason: str | None) -> None:
    if UNDER_CI and extra in INSTALLED_EXTRAS:
        pytest.fail(
            f"{module} is missing, yet `make test` installed diagtools[{extra}] for this run: the install is broken",
            pytrace=False,
        )
    pytest.skip(reason or f"{module} is not installed (pip install 'diagtools[{extra}]')", allow_module_level=True)


def require(module: str, extra: str, reason: str | None = None) -> ModuleType:
    """Import ``module`` for a test, or skip with the reason; under CI a module `make test` installed must import."""
    try:
        return importlib.import_module(module)
    except ImportError:
        _missing(module, extra, reason)
        raise  # unreachable: _missing always raises


def require_installed(module: str, extra: str, reason: str | None = None) -> None:
    """As ``require``, without importing ``module`` (torch stays out of the test process, which stays CUDA-free)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        _missing(module, extra, reason)


def unwrapped(text: str) -> str:
    """``text`` with each labelled site the report put on its own line (``label:`` then ``path:N in f``) joined
    back to its label, so a test reads the same line however wide the path made it."""
    import re

    return re.sub(r":\n +(\S+:\d+(?: in \S+)?)\n", r": \1\n", text)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed ``diagtools`` command, as a user would, and capture what it printed."""
    return subprocess.run([DIAGTOOLS, *args], capture_output=True, text=True, timeout=timeout, check=False)


def sweep_verdicts(result: Any) -> dict[str, tuple[Any, ...]]:
    """What each row of a sweep says about CUDA, to compare two sweeps (zygote and fresh) row by row."""
    return {
        row.module: (
            row.status,
            row.cuda_initialized,
            row.cuda_source,
            row.culprit.module if row.culprit else None,
            row.culprit.chain if row.culprit else None,
            row.culprit.site.line if row.culprit and row.culprit.site else None,
            row.culprit.evidence if row.culprit else None,
        )
        for row in result.rows
    }


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> source, dedented) under ``root``."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
    return root


def marked_line(path: Path, mark: str = MARK) -> int:
    """The 1-based number of the line carrying ``mark``."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if mark in line:
            return number
    raise AssertionError(f"no {mark!r} in {path}")


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[[dict[str, str]], Path]:
    root = tmp_path / "src"
    root.mkdir()
    return lambda files: write_tree(root, files)


class RecordingRunner:
    """The real runner, remembering each run's marker so tests can hunt orphans."""

    def __init__(self) -> None:
        self.runs: list[RawRun] = []

    def __call__(self, request: SubkernelRequest) -> RawRun:
        raw = run_subkernel(request)
        self.runs.append(raw)
        return raw


def survivors(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries the subkernel ``marker``."""
    needle = f"DIAGTOOLS_SUBKERNEL={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if needle in environ and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture
def runner() -> RecordingRunner:
    recording = RecordingRunner()
    yield recording
    for raw in recording.runs:
        assert survivors(raw.marker) == [], "a subkernel process outlived its scan"


@pytest.fixture
def sim_scan(runner: RecordingRunner) -> Callable[..., ScanResult]:
    """``diagtools.scan`` on the simulated driver, checking for orphans afterwards."""

    def run(targets, path=(), **kwargs) -> ScanResult:
        kwargs.setdefault("timeout", 60.0)
        return diagtools.scan(targets, path=path, driver="simulated", runner=runner, **kwargs)

    return run


# A module that floods its subkernel's result channel with 80 MB of junk lines on import.
_JUNK_LINE = b"x" * 4095 + b"\n"
CHANNEL_FLOOD = (
    f"import os\nfd = int(os.environ[{protocol.CHANNEL_FD!r}])\n"
    f"for _ in range(20 * 1024):\n    os.write(fd, {_JUNK_LINE!r})\n"
)


def huge_pages_available() -> bool:
    """Whether this kernel has transparent huge pages and they are not turned off."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(encoding="ascii")
    except OSError:
        return False
    return "[never]" not in mode
