"""The command line's output files: checked before any work starts, written whole after it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from diagtools.errors import UsageError

__all__ = ["check_directory", "check_journal", "check_writable", "write_json"]


def check_writable(destination: str | None, option: str) -> None:
    """Fail before the run, in one line, when a file option cannot be written."""
    if not destination or destination == "-":
        return
    path = Path(destination)
    problem = ""
    if "\0" in destination:
        problem = "contains a NUL byte"
    elif path.is_dir():
        problem = "is a directory"
    elif path.exists():
        if not os.access(path, os.W_OK):
            problem = "is not writable"
    elif not path.parent.is_dir():
        problem = f"is in {str(path.parent)!r}, which is not a directory"
    else:
        problem = probe_create(path)
    if problem:
        raise UsageError(f"{option} {destination!r} {problem}; choose another file")


def check_journal(destination: str) -> None:
    """A journal that can be opened for appending; never created here.

    Creating a probe file (as :func:`check_writable` does) would race a sweep
    started at the same moment on the same new journal: the loser must meet
    that sweep's lock, not a file that appeared between its checks.
    """
    path = Path(destination)
    if "\0" in destination:
        raise UsageError(f"--json {destination!r} contains a NUL byte; choose another file")
    if path.is_dir() or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--json {destination!r} is not a writable journal file; choose another file")
    parent = path.parent
    if not path.exists() and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise UsageError(f"--json {destination!r} cannot be created in {str(parent)!r}; choose another file")


def probe_create(path: Path) -> str:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    path.unlink()
    return ""


def check_directory(destination: str, option: str) -> None:
    """Create the output directory now and make sure files can be written in it."""
    try:
        Path(destination).mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{option} {destination!r} cannot be created ({exc}); choose another directory") from None
    problem = probe_create(Path(destination, ".diagtools-write-check"))
    if problem:
        raise UsageError(f"{option} {destination!r}: a file in it {problem}; choose another directory")


def write_json(document: dict[str, Any], destination: str) -> None:
    from diagtools.model.serial import json_text
    from diagtools.render.paths import write_report

    text = json_text(document) + "\n"  # what json.dumps with indent=2 and sorted keys writes, faster
    if destination == "-":
        sys.stdout.write(text)
    else:
        write_report(destination, text)
