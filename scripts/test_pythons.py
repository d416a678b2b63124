"""Run the core test suite on every supported CPython, each in its own venv with only the core's dependencies.

``make test`` calls this after the main suite: for each version (3.10 to 3.13) it finds an
interpreter (pyenv's versions, then PATH), keeps a venv ``.venv-pyX.Y`` with the project installed
editable with its ``cuda`` extra (cuda-python; no torch, no notebook stack) plus the pinned test
tools (``constraints.txt``), reinstalling only when
pyproject.toml, the constraints or the interpreter changed (a stamp, as for ``.venv``), runs the
given test paths there, and prints one line per interpreter with its pass counts.

A missing interpreter is a failure under CI (``CI`` set and not false) and a note elsewhere.
Standard library only: it runs before anything else is known to work.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
# pytest, its plugin, hypothesis (tests/unit/test_serialization.py), and tomllib's package for 3.10
# (tests/test_packaging.py reads pyproject.toml).
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", 'tomli; python_version < "3.11"')
OUT = ROOT / "build" / "pythons"
# The core's test venvs get the package with the cuda extra only (cuda-python, no torch): the scan's
# targets and the specimens call the driver through cuda.bindings, as real libraries do.
CORE_EXTRAS = "cuda"


@dataclass(frozen=True)
class Interpreter:
    """A CPython found for one supported version."""

    version: str
    path: str
    full_version: str


@dataclass(frozen=True)
class Outcome:
    """What the core suite did on one interpreter."""

    interpreter: Interpreter
    passed: int
    failed: int
    skipped: int
    seconds: float
    log: Path
    setup_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.setup_error is None and self.failed == 0 and self.passed > 0


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _candidates(version: str) -> list[str]:
    """pyenv's installs first (newest patch release first; a shim is only a redirect), then PATH."""
    found: list[str] = []
    roots = {os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv"), "/root/.pyenv"}
    for root in sorted(r for r in roots if r):
        found += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    found.append(shutil.which(f"python{version}") or "")
    return [path for path in dict.fromkeys(found) if path]


def find(version: str) -> Interpreter | None:
    """The first candidate that runs and really is CPython ``version`` (pyenv shims may not be)."""
    code = "import platform, sys; print(platform.python_implementation(), '%d.%d.%d' % sys.version_info[:3])"
    for path in _candidates(version):
        try:
            done = subprocess.run([path, "-c", code], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        words = done.stdout.split()
        if done.returncode == 0 and len(words) == 2 and words[0] == "CPython" and words[1].startswith(f"{version}."):
            return Interpreter(version, path, words[1])
    return None


def _stamp_text(interpreter: Interpreter) -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", CONSTRAINTS):
        digest.update(path.read_bytes())
    identity = f"{os.path.realpath(interpreter.path)} {interpreter.full_version} {CORE_EXTRAS} {TEST_TOOLS}"
    digest.update(identity.encode())
    return digest.hexdigest() + "\n"


def prepare_venv(interpreter: Interpreter, log: Path) -> Path:
    """The interpreter's venv, created and installed unless its stamp says nothing changed."""
    venv = ROOT / f".venv-py{interpreter.version}"
    stamp = venv / ".diagtools-core-installed"
    python = venv / "bin" / "python"
    wanted = _stamp_text(interpreter)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    # -c, not PIP_CONSTRAINT: the variable would replace a machine's own pip constraints, not add to them.
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [str(python), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS)]
    steps = (
        [interpreter.path, "-m", "venv", "--clear", str(venv)],
        [*pip, "--upgrade", "pip"],
        [*pip, "-e", f"{ROOT}[{CORE_EXTRAS}]", *TEST_TOOLS],
        [str(python), "-c", "import diagtools.driver as d; d.build_probe_extension()"],
    )
    with log.open("a") as out:
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"`{' '.join(step)}` failed (exit {done.returncode}); see {log}")
    stamp.write_text(wanted)
    return python


def counts(report: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a pytest JUnit XML report; failures include errors."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if suite is None:
        return 0, 0, 0
    total, failed, skipped = (int(suite.get(name, 0)) for name in ("tests", "failures", "skipped"))
    failed += int(suite.get("errors", 0))
    return total - failed - skipped, failed, skipped


def run_core(interpreter: Interpreter, tests: list[str]) -> Outcome:
    """Prepare the interpreter's venv and run ``tests`` there with the core's dependencies only."""
    log = OUT / f"py{interpreter.version}.log"
    report = OUT / f"py{interpreter.version}.xml"
    log.write_text("")
    report.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        python = prepare_venv(interpreter, log)
    except RuntimeError as exc:
        return Outcome(interpreter, 0, 0, 0, time.monotonic() - started, log, str(exc))
    env = dict(os.environ, DIAGTOOLS_TEST_EXTRAS=CORE_EXTRAS)
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    seconds = time.monotonic() - started
    if not report.exists():
        return Outcome(interpreter, 0, 0, 0, seconds, log, f"pytest wrote no report; see {log}")
    return Outcome(interpreter, *counts(report), seconds, log)


def _line(outcome: Outcome) -> str:
    where = f"CPython {outcome.interpreter.full_version:<8} {outcome.interpreter.path}"
    if outcome.setup_error:
        return f"  {outcome.interpreter.version:<5} {where}: SET-UP FAILED: {outcome.setup_error}"
    state = "ok" if outcome.ok else "FAILED"
    return (
        f"  {outcome.interpreter.version:<5} {where}: {outcome.passed} passed, {outcome.failed} failed,"
        f" {outcome.skipped} skipped in {outcome.seconds:.0f} s  [{state}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["3.10", "3.11", "3.12", "3.13"])
    parser.add_argument("--jobs", type=int, default=2, help="interpreters tested at once (default 2)")
    parser.add_argument("tests", nargs="+", help="test paths of the core suite")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    found = {version: find(version) for version in args.versions}
    present = [interpreter for interpreter in found.values() if interpreter is not None]
    missing = [version for version, interpreter in found.items() if interpreter is None]
    print(f"core suite on {len(present)} of {len(args.versions)} supported interpreters ({', '.join(args.tests)}):")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda interpreter: run_core(interpreter, args.tests), present))
    for outcome in outcomes:
        print(_line(outcome))
        if not outcome.ok:
            print("    " + "\n    ".join(outcome.log.read_text(errors="replace").splitlines()[-25:]))
    for version in missing:
        verdict = "FAILED (CI requires every supported interpreter)" if under_ci() else "skipped (not under CI)"
        print(f"  {version:<5} not found on PATH or under ~/.pyenv/versions: {verdict}")
    failed = any(not outcome.ok for outcome in outcomes) or (missing and under_ci())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
