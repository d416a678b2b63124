"""One ``git bisect run`` step: does the target initialize CUDA at this commit?

Exit 0 (good: CUDA stays uninitialized), 1 (bad: it is initialized) or 125
(skip: the target cannot even be imported here, so this commit says nothing).
Each verdict is appended to the journal named by ``DIAGTOOLS_BISECT_LOG``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from diagtools import protocol
from diagtools.model.bisect import BisectStep
from diagtools.model.options import DEFAULT_TIMEOUT_S
from diagtools.model.scan import ScanResult
from diagtools.model.serial import json_line
from diagtools.usecases.scan import scan

GOOD, BAD, SKIP = 0, 1, 125


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def scan_at(target: str, path: str, driver: str, timeout: float) -> ScanResult:
    """The scan of ``target`` in the checkout at ``path`` (no cut search: a bisect only judges commits)."""
    return scan(target, path=[path] if os.path.isdir(path) else [], driver=driver, timeout=timeout, cuts=False)


def verdict(target: str, path: str, driver: str, timeout: float) -> tuple[int, dict]:
    """The exit code for this commit and what to journal about it."""
    result = scan_at(target, path, driver, timeout)
    if not result.ok:
        return SKIP, {
            "verdict": "skip",
            "status": str(result.status),
            "error": result.error.message if result.error else "",
        }
    if result.verdict == "unknown":  # nothing seen, but the scan could not have seen it: never "good"
        return SKIP, {"verdict": "skip", "status": str(result.status), "error": "; ".join(result.doubts())}
    code = BAD if result.cuda_initialized else GOOD
    return code, {"verdict": "bad" if code == BAD else "good", "status": str(result.status)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diagtools-bisect-step")
    parser.add_argument("target")
    parser.add_argument("--path", required=True)
    parser.add_argument("--driver", default="auto")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        code, record = verdict(args.target, args.path, args.driver, args.timeout)
    except Exception as exc:  # any failure to judge a commit must skip it, never misjudge it
        code, record = SKIP, {"verdict": "skip", "status": "error", "error": f"{type(exc).__name__}: {exc}"}
    log = os.environ.get(protocol.BISECT_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            step = BisectStep.from_json({"commit": _commit(), **record})
            handle.write(json_line(step.to_json()) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
