"""The sweep's JSON Lines journal: resumable, fingerprinted, locked.

The first line is a header ``{schema, package, paths}``; each later line is
one finished row, or a record of what the rows after it were scanned with:

- ``{"environment": ...}``: the interpreter, driver and installed
  distributions (:mod:`diagtools.usecases.sweep_environment`), written when
  a run's environment differs from the journal's last one;
- ``{"files": {path: digest}}``: the digest of each swept file that differs
  from the journal's earlier ``files`` lines, written as a run starts;
- ``{"preload": {"learned": [...], "libraries": [...]}}``: what an adaptive
  sweep learned to preload, so a rerun starts from it instead of learning again.

A row carries a fingerprint: a digest of the contents of the files its
verdict depends on inside the swept package (the module's own file, its
parent packages' ``__init__.py``, and every in-package module its scan
imported, preloaded ones included).  A rerun keeps a row only while that
fingerprint still matches and the environment is the one it was scanned in,
so after a fix, a pull request or an upgrade the affected modules are scanned
again, each with the reason (the files that changed, or what changed in the
environment).  While a sweep runs it holds an exclusive ``flock`` on the
journal; a second sweep on the same file fails at once with
:class:`JournalLockedError`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from diagtools.errors import JournalLockedError, SchemaError, UsageError
from diagtools.model.serial import json_line
from diagtools.model.sweep import SWEEP_SCHEMA, RootCause, SweepRow
from diagtools.usecases.sweep_discover import SweptTree
from diagtools.usecases.sweep_environment import Environment

__all__ = ["Fingerprints", "Journal", "Learned", "Reused", "read_baseline", "read_sweep_rows"]

_NAMED = 3  # changed files named in a reason before "and N more"


class Fingerprints:
    """Digests of the swept files, each file read once per sweep."""

    def __init__(self, tree: SweptTree) -> None:
        self.tree = tree
        self.cache: dict[str, str] = {}

    def digest(self, relative: str) -> str:
        """The digest of one file, relative to the import root (``missing`` when it cannot be read)."""
        if relative not in self.cache:
            try:
                self.cache[relative] = hashlib.sha256((self.tree.root / relative).read_bytes()).hexdigest()
            except OSError:
                self.cache[relative] = "missing"
        return self.cache[relative]

    def files_of(self, row: SweepRow) -> set[str]:
        """Every file the row's verdict depends on: its own files and its recorded dependencies."""
        return self.own_files(row.module) | set(row.deps)

    def swept(self, also: Iterable[str] = ()) -> dict[str, str]:
        """The digest of every module file of the package, and of ``also``."""
        files = {self.tree.relative(file) for file in self.tree.files.values()} | set(also)
        return {relative: self.digest(relative) for relative in sorted(f for f in files if f is not None)}

    def own_files(self, module: str) -> set[str]:
        """The module's file and its parent packages' ``__init__.py``, relative to the import root."""
        parts = module.split(".")
        names = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        found = {self.tree.relative(self.tree.files.get(name)) for name in names}
        return {f for f in found if f is not None}

    def of(self, row: SweepRow) -> str:
        """The digest over the row's own files and its recorded dependencies."""
        digest = hashlib.sha256()
        for relative in sorted(self.files_of(row)):
            digest.update(f"{relative}\0{self.digest(relative)}\n".encode())
        return digest.hexdigest()[:32]


@dataclass(frozen=True)
class Learned:
    """What an adaptive sweep learned to preload: libraries first, then the package's own modules."""

    learned: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"preload": {"learned": list(self.learned), "libraries": list(self.libraries)}}

    @classmethod
    def from_json(cls, data: object) -> Learned | None:
        if not isinstance(data, dict):
            return None
        learned, libraries = _names(data.get("learned")), _names(data.get("libraries", []))
        return cls(learned, libraries) if learned and libraries is not None else None


def _names(value: object) -> tuple[str, ...] | None:
    """``value`` as module names, when it is a list of them."""
    if isinstance(value, list) and all(isinstance(item, str) and item for item in value):
        return tuple(value)
    return None


@dataclass(frozen=True)
class Reused:
    """What a journal gives a rerun: the rows still valid, why each other row must be scanned again, and what
    the last adaptive run learned to preload."""

    rows: dict[str, SweepRow] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # module -> why its row is scanned again
    learned: Learned | None = None
    journaled: bool = False  # the journal held rows before this run


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

    def valid_rows(self, fingerprints: Fingerprints, environment: Environment | None = None) -> dict[str, SweepRow]:
        """Rows of earlier runs whose files (and environment, when given) are unchanged."""
        return self.reuse(fingerprints, environment).rows

    def reuse(self, fingerprints: Fingerprints, environment: Environment | None = None) -> Reused:
        """What the journal gives this run (:class:`Reused`); then records this run's environment and files,
        writing the header first into a new or empty journal."""
        if self.handle is None:
            return Reused()
        self.handle.seek(0)
        try:
            text = self.handle.read()
        except (OSError, UnicodeError) as exc:
            raise UsageError(f"cannot read the journal {self.path}: {exc}; choose another --json") from None
        lines = text.splitlines()
        if not lines:
            self._write(self.header)
            self._begin(fingerprints, environment, None, {}, ())
            return Reused()
        self._check_header(_parse_line(lines[0]))
        if not text.endswith("\n"):
            self.handle.write("\n")  # end the row an interrupted run tore, so new rows start clean
        reading = _Reading(fingerprints, environment)
        for number, line in enumerate(lines[1:], start=2):
            record = _parse_line(line)
            if record is not None:
                reading.take(record, self._row(record, number) if "module" in record else None)
        self._begin(fingerprints, environment, reading.environment, reading.files, reading.deps)
        return Reused(reading.rows, reading.stale, reading.learned, reading.journaled)

    def _begin(
        self,
        fingerprints: Fingerprints,
        environment: Environment | None,
        last: Environment | None,
        files: Mapping[str, str],
        deps: Iterable[str],
    ) -> None:
        """Record what this run's rows are scanned with: its environment when it differs from the journal's
        last, and the digests of the files that differ from those recorded."""
        if environment is not None and (last is None or last.digest != environment.digest):
            self._write({"environment": environment.to_json()})
        changed = {rel: d for rel, d in fingerprints.swept(deps).items() if files.get(rel) != d}
        if changed:
            self._write({"files": changed})

    def remember(self, learned: Learned) -> None:
        """Record what an adaptive run learned to preload, for the next run to start from."""
        if self.handle is not None and learned.learned:
            self._write(learned.to_json())

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


class _Reading:
    """The journal read line by line: the rows still valid, the stale ones with their reason, and the
    environment and file digests recorded so far (those a row was scanned with)."""

    def __init__(self, fingerprints: Fingerprints, environment: Environment | None) -> None:
        self.fingerprints, self.now = fingerprints, environment
        self.environment: Environment | None = None
        self.files: dict[str, str] = {}
        self.rows: dict[str, SweepRow] = {}
        self.stale: dict[str, str] = {}
        self.deps: set[str] = set()
        self.learned: Learned | None = None
        self.journaled = False

    def take(self, record: dict[str, Any], row: SweepRow | None) -> None:
        """Take one line's record; ``row``: the row a row record holds, read from it."""
        if row is not None:
            self.journaled = True
            self.deps.update(row.deps)
            why = self._why_stale(row)
            if why:
                self.rows.pop(row.module, None)
                self.stale[row.module] = why
            else:
                self.rows[row.module] = row
                self.stale.pop(row.module, None)
        elif "environment" in record:
            self.environment = Environment.from_json(record["environment"])
        elif "files" in record and isinstance(record["files"], dict):
            self.files.update({k: v for k, v in record["files"].items() if isinstance(v, str)})
        elif "preload" in record:
            self.learned = Learned.from_json(record["preload"]) or self.learned

    def _why_stale(self, row: SweepRow) -> str:
        """Why ``row`` cannot be kept (empty when it can): the environment or its files changed."""
        if self.now is not None:
            if self.environment is None:
                return "the journal did not record the environment it was scanned in"
            if self.environment.digest != self.now.digest:
                return self.now.change_since(self.environment) or "the environment changed"
        if row.fingerprint and row.fingerprint == self.fingerprints.of(row):
            return ""
        changed = [
            f"{rel} {'removed' if self.fingerprints.digest(rel) == 'missing' else 'changed'}"
            for rel in sorted(self.fingerprints.files_of(row))
            if rel in self.files and self.files[rel] != self.fingerprints.digest(rel)
        ]
        if not changed:
            return "its files changed"
        more = f" and {len(changed) - _NAMED} more" if len(changed) > _NAMED else ""
        return ", ".join(changed[:_NAMED]) + more


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
