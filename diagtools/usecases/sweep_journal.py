"""The sweep's JSON Lines journal: resumable, fingerprinted, locked.

The first line is a header ``{schema, package, paths}``; each later line is
one finished row.  A row carries a fingerprint: a digest of the contents of
the files its verdict depends on inside the swept package (the module's own
file, its parent packages' ``__init__.py``, and every in-package module its
scan imported, preloaded ones included).  A rerun keeps a row only while that
fingerprint still matches, so after a fix the affected modules are scanned
again.  While a sweep runs it holds an exclusive ``flock`` on the journal; a
second sweep on the same file fails at once with :class:`JournalLockedError`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path
from typing import IO, Any

from diagtools.errors import JournalLockedError, SchemaError, UsageError
from diagtools.model.serial import json_line
from diagtools.model.sweep import SWEEP_SCHEMA, RootCause, SweepRow
from diagtools.usecases.sweep_discover import SweptTree

__all__ = ["Fingerprints", "Journal", "read_baseline", "read_sweep_rows"]


class Fingerprints:
    """Digests of the swept files, each file read once per sweep."""

    def __init__(self, tree: SweptTree) -> None:
        self.tree = tree
        self.cache: dict[str, str] = {}

    def _file(self, relative: str) -> str:
        if relative not in self.cache:
            try:
                self.cache[relative] = hashlib.sha256((self.tree.root / relative).read_bytes()).hexdigest()
            except OSError:
                self.cache[relative] = "missing"
        return self.cache[relative]

    def own_files(self, module: str) -> set[str]:
        """The module's file and its parent packages' ``__init__.py``, relative to the import root."""
        parts = module.split(".")
        names = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        found = {self.tree.relative(self.tree.files.get(name)) for name in names}
        return {f for f in found if f is not None}

    def of(self, row: SweepRow) -> str:
        """The digest over the row's own files and its recorded dependencies."""
        digest = hashlib.sha256()
        for relative in sorted(self.own_files(row.module) | set(row.deps)):
            digest.update(f"{relative}\0{self._file(relative)}\n".encode())
        return digest.hexdigest()[:32]


class Journal:
    """The JSON Lines file of one sweep, locked while the sweep runs."""

    def __init__(self, path: Path | None, package: str, paths: tuple[str, ...]) -> None:
        self.path = path
        self.header = {"schema": SWEEP_SCHEMA, "package": package, "paths": list(paths)}
        self.handle: IO[str] | None = None

    def __enter__(self) -> Journal:
        if self.path is not None:
            self.handle = self.path.open("a+", encoding="utf-8")
            try:
                fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.handle.close()
                raise JournalLockedError(str(self.path)) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock
            self.handle = None

    def valid_rows(self, fingerprints: Fingerprints) -> dict[str, SweepRow]:
        """Rows of earlier runs whose files are unchanged; writes the header into a new or empty journal."""
        if self.handle is None:
            return {}
        self.handle.seek(0)
        try:
            text = self.handle.read()
        except (OSError, UnicodeError) as exc:
            raise UsageError(f"cannot read the journal {self.path}: {exc}; choose another --json") from None
        lines = text.splitlines()
        if not lines:
            self._write(self.header)
            return {}
        self._check_header(_parse_line(lines[0]))
        if not text.endswith("\n"):
            self.handle.write("\n")  # end the row an interrupted run tore, so new rows start clean
        rows: dict[str, SweepRow] = {}
        for number, line in enumerate(lines[1:], start=2):
            record = _parse_line(line)
            if record is not None and "module" in record:
                row = self._row(record, number)
                if row.fingerprint and row.fingerprint == fingerprints.of(row):
                    rows[row.module] = row
                else:
                    rows.pop(row.module, None)
        return rows

    def _row(self, record: dict[str, Any], line: int) -> SweepRow:
        try:
            return SweepRow.from_json(record)
        except SchemaError as exc:
            raise UsageError(
                f"{self.path}:{line} is not a {SWEEP_SCHEMA} row: {exc.field} {exc.found}; fix or remove it"
            ) from None

    def _check_header(self, record: dict[str, Any] | None) -> None:
        expected = (self.header["schema"], self.header["package"])
        if record is None or (record.get("schema"), record.get("package")) != expected:
            raise UsageError(
                f"{self.path} is not a {SWEEP_SCHEMA} journal of {self.header['package']!r}; choose another --json"
            )
        if record.get("paths", self.header["paths"]) != self.header["paths"]:
            raise UsageError(
                f"{self.path} was written for --path {' '.join(record['paths']) or '(none)'}; "
                "use the same --path or another --json"
            )

    def append(self, row: SweepRow) -> None:
        if self.handle is not None:
            self._write(row.to_json())

    def _write(self, record: dict[str, Any]) -> None:
        assert self.handle is not None
        self.handle.write(json_line(record) + "\n")
        self.handle.flush()


def _parse_line(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a row torn by an interrupted run is scanned again
    return record if isinstance(record, dict) else None


def read_baseline(path: str | Path) -> frozenset[str]:
    """The root-cause keys of an earlier sweep: its journal (JSON Lines) or its summary (``--summary``).

    A summary lists its ``causes``; a journal's rows are grouped again, the
    last row of each module winning, as a resumed sweep would keep it.
    """
    text = _read(path, "the baseline")
    document = _parse_line(text)  # a summary is one JSON document; a journal is several lines
    if document is not None and document.get("schema") == SWEEP_SCHEMA and "causes" in document:
        return _summary_keys(document, path)
    return frozenset(cause.key for cause in RootCause.group(_journal_rows(text.splitlines(), path, "the baseline")))


def read_sweep_rows(path: str | Path) -> tuple[SweepRow, ...]:
    """The rows of an earlier sweep: its journal (the last row of each module) or its summary's ``rows``."""
    text = _read(path, "the sweep")
    document = _parse_line(text)
    if document is not None and document.get("schema") == SWEEP_SCHEMA and isinstance(document.get("rows"), list):
        return tuple(_rows(document["rows"]))
    return _journal_rows(text.splitlines(), path, "the sweep")


def _read(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _rows(records: list[Any]) -> list[SweepRow]:
    rows: dict[str, SweepRow] = {}
    for record in records:
        if isinstance(record, dict) and "module" in record:
            try:
                row = SweepRow.from_json(record)
            except SchemaError:
                continue  # a torn or foreign row says nothing
            rows[row.module] = row
    return list(rows.values())


def _summary_keys(document: dict[str, Any], path: str | Path) -> frozenset[str]:
    causes = document.get("causes")
    if not isinstance(causes, list) or not all(isinstance(c, dict) and isinstance(c.get("key"), str) for c in causes):
        raise UsageError(f"the baseline {path} has a malformed 'causes' list; pass a sweep journal or summary")
    return frozenset(cause["key"] for cause in causes)


def _journal_rows(lines: list[str], path: str | Path, what: str) -> tuple[SweepRow, ...]:
    header = _parse_line(lines[0]) if lines else None
    if header is None or header.get("schema") != SWEEP_SCHEMA:
        raise UsageError(f"{what} {path} is not a {SWEEP_SCHEMA} journal or summary")
    return tuple(_rows([_parse_line(line) for line in lines[1:]]))
