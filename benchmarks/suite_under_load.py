"""The whole test suite, several times in a row, beside CPU-bound processes: CI must be green on a busy machine.

    python benchmarks/suite_under_load.py                 # 3 runs of `make test`, 2 hogs per core
    python benchmarks/suite_under_load.py --runs 1 --hogs-per-core 1

Each run is `make test` in a clean clone of the repository's HEAD (a fresh `.venv`
the first time, reused after), exactly as `.ci/run` runs it, with two busy loops
per core beside it for the whole time.  Not part of `make test`: it takes an hour
on two cores.  Writes `benchmarks/suite_under_load.json` and `.md` with the machine
described, each run's exit status, duration and pytest summaries; exits non-zero
when any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUMMARY = re.compile(rb"=+ (\d+ (?:passed|failed)[^=]*?) in [\d.]+s")
CORE = re.compile(  # scripts/test_pythons.py's line per interpreter
    rb"^\s+(3\.\d+)\s+CPython \S+\s+\S+: (\d+ passed, \d+ failed, \d+ skipped) in (\d+) s\s+\[(\w+)", re.M
)


def _machine() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        memory_kib = 0
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(memory_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def _start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def pytest_summaries(text: bytes) -> list[str]:
    """The main suite's pytest summary, then one line per interpreter of the core suite."""
    summaries = [m.group(1).decode() for m in SUMMARY.finditer(text)]
    return summaries + [f"{m[1].decode()}: {m[2].decode()} ({m[4].decode()})" for m in CORE.finditer(text)]


def _one_run(clone: Path, log: Path) -> dict[str, object]:
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(["make", "test"], cwd=clone, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    text = log.read_bytes()
    summaries = pytest_summaries(text)
    failed = sorted({line.decode().split()[1] for line in text.splitlines() if line.startswith(b"FAILED ")})
    result = {"exit": done.returncode, "seconds": round(seconds, 1), "pytest": summaries, "failed": failed}
    if done.returncode != 0:
        result["tail"] = text[-4000:].decode("utf-8", "backslashreplace")
    return result


def _markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        "# The whole suite under load",
        "",
        f"`python benchmarks/suite_under_load.py --runs {report['runs']} --hogs-per-core {report['hogs_per_core']}`"
        f" at commit `{report['commit']}`, {report['date']}.",
        "",
        f"Machine: {machine['cores']} cores ({machine['cpu'] or 'unknown CPU'}), {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}; {report['hogs']} CPU-bound loops beside every run.",
        "",
        "| run | exit | minutes | pytest (main suite; then the core suite per interpreter) |",
        "|---|---|---|---|",
    ]
    for number, run in enumerate(report["results"], start=1):
        summary = "; ".join(run["pytest"]) or "-"
        lines.append(f"| {number} | {run['exit']} | {run['seconds'] / 60:.1f} | {summary} |")
        if run["failed"]:
            lines.append(f"|  |  |  | failed: {', '.join(run['failed'])} |")
    return "\n".join(lines) + "\n"


def _write(report: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(_markdown(report), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs-per-core", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "suite_under_load")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    hogs = args.hogs_per_core * (os.cpu_count() or 1)
    report = {
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": args.runs,
        "hogs_per_core": args.hogs_per_core,
        "hogs": hogs,
        "machine": _machine(),
        "results": [],
    }
    with tempfile.TemporaryDirectory(prefix="diagtools-load-") as work:
        clone = Path(work) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        running = _start_hogs(hogs)
        try:
            for number in range(1, args.runs + 1):
                result = _one_run(clone, Path(work) / f"run{number}.log")
                report["results"].append(result)
                print(f"run {number}: exit {result['exit']}, {result['seconds'] / 60:.1f} min, {result['pytest']}")
                _write(report, args.out)  # after every run: a check stopped early keeps what it measured
        finally:
            for hog in running:
                hog.kill()
    return 0 if all(run["exit"] == 0 for run in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
