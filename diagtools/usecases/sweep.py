"""Sweep: every submodule of a package scanned alone, in parallel, resumably.

Modules are found by walking the package's files, never by importing it.
Each one gets its own fresh subkernel, so one culprit cannot hide another
(importing them together would blame only the first).  Results are appended
to a JSON Lines file as they finish; a rerun skips the modules already there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from diagtools.driver import resolve_driver
from diagtools.errors import DiagtoolsError, UsageError
from diagtools.model.sweep import SWEEP_SCHEMA, SweepResult, SweepRow
from diagtools.runner.subkernel import abort_runs
from diagtools.usecases.scan import scan, validate_paths, validate_targets, validate_timeout

__all__ = ["discover_modules", "sweep"]

Progress = Callable[[int, int, "SweepRow"], None]


def _package_dir(package: str, roots: tuple[str, ...]) -> Path:
    parts = package.split(".")
    for root in (*roots, *[p for p in sys.path if p]):
        base = Path(root, *parts)
        if base.is_dir() or base.with_suffix(".py").is_file():
            return base
    raise UsageError(f"package {package!r} not found on --path or sys.path (looked for {'/'.join(parts)})")


def discover_modules(package: str, roots: Iterable[str] = ()) -> tuple[str, ...]:
    """Every importable submodule of ``package``, from its files (``__main__`` skipped)."""
    (name,) = validate_targets(package)
    base = _package_dir(name, validate_paths(tuple(roots)))
    if not base.is_dir():
        return (name,)
    found = [name]
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = sorted(d for d in subdirs if d.isidentifier())
        prefix = ".".join([name, *Path(directory).relative_to(base).parts])
        if Path(directory) != base:
            found.append(prefix)
        for file in sorted(files):
            stem = file[:-3]
            if file.endswith(".py") and stem.isidentifier() and stem not in ("__init__", "__main__"):
                found.append(f"{prefix}.{stem}")
    return tuple(sorted(set(found)))


def _sweep_one(module: str, roots: tuple[str, ...], driver: str, timeout: float) -> dict[str, Any]:
    """Scan one module; module-level and JSON-returning so any executor can run it."""
    started = time.time()
    result = scan(module, path=roots, driver=driver, timeout=timeout)
    return SweepRow.from_scan(module, result, started, time.time()).to_json()


class _Journal:
    """The JSON Lines file: a header, then one row per finished module."""

    def __init__(self, path: Path | None, package: str) -> None:
        self.path = path
        self.package = package

    def done(self) -> dict[str, SweepRow]:
        if self.path is None or not self.path.exists():
            return {}
        rows: dict[str, SweepRow] = {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise UsageError(f"cannot read the journal {self.path}: {exc}; choose another --json") from None
        for number, line in enumerate(text.splitlines()):
            record = _parse_line(line)
            if number == 0:
                self._check_header(record)
            elif record is not None and "module" in record:
                rows[str(record["module"])] = self._row(record, number + 1)
        return rows

    def _row(self, record: dict[str, Any], line: int) -> SweepRow:
        try:
            return SweepRow.from_json(record)
        except (KeyError, TypeError, ValueError, AttributeError, DiagtoolsError) as exc:
            raise UsageError(f"{self.path}:{line} is not a {SWEEP_SCHEMA} row ({exc!r}); fix or remove it") from None

    def _check_header(self, record: dict[str, Any] | None) -> None:
        if record is None or record.get("schema") != SWEEP_SCHEMA or record.get("package") != self.package:
            raise UsageError(f"{self.path} is not a {SWEEP_SCHEMA} journal of {self.package!r}; choose another --json")

    def start(self) -> None:
        if self.path is None:
            return
        if not self.path.exists():
            self._write({"schema": SWEEP_SCHEMA, "package": self.package})
        elif not self.path.read_bytes().endswith(b"\n"):
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write("\n")  # end the row an interrupted run tore, so new rows start clean

    def append(self, row: SweepRow) -> None:
        if self.path is not None:
            self._write(row.to_json())

    def _write(self, record: dict[str, Any]) -> None:
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def _parse_line(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a row torn by an interrupted run is scanned again
    return record if isinstance(record, dict) else None


def _row_of(module: str, future: Future[dict[str, Any]]) -> SweepRow:
    """The finished module's row; a failure of diagtools itself becomes that row's error, not the sweep's."""
    try:
        return SweepRow.from_json(future.result())
    except Exception as exc:  # one bad module never stops the sweep
        return SweepRow(module, "error", False, None, 0.0, error=f"{type(exc).__name__}: {exc}")


def sweep(
    package: str,
    *,
    path: Iterable[str | os.PathLike[str]] = (),
    jobs: int | None = None,
    executor: Executor | None = None,
    driver: str = "auto",
    timeout: float = 120.0,
    json_path: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> SweepResult:
    """Scan every submodule of ``package`` alone, ``jobs`` at a time (or on ``executor``).

    ``json_path`` is a JSON Lines journal: rows are appended as they finish and
    a rerun with the same journal skips the modules already in it.
    ``progress(done, total, row)`` is called after each module.
    """
    roots = validate_paths(tuple(path))
    timeout = validate_timeout(timeout)
    modules = discover_modules(package, roots)
    resolve_driver(driver)  # build the driver once, before the workers start
    journal = _Journal(Path(json_path) if json_path is not None else None, package)
    rows = {m: r for m, r in journal.done().items() if m in modules}
    resumed = len(rows)
    journal.start()
    pending = [m for m in modules if m not in rows]
    started = time.perf_counter()
    pool = executor or ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)
    try:
        futures = {pool.submit(_sweep_one, m, roots, driver, timeout): m for m in pending}
        for future in as_completed(futures):
            row = _row_of(futures[future], future)
            rows[row.module] = row
            journal.append(row)
            if progress is not None:
                progress(len(rows), len(modules), row)
    except BaseException:
        abort_runs()  # an interrupt: the subkernels still running are killed, so the workers return now
        raise
    finally:
        if executor is None:
            pool.shutdown(cancel_futures=True)
    ordered = tuple(rows[m] for m in modules)
    return SweepResult(package, ordered, resumed, time.perf_counter() - started)
