"""What a sweep's rows depend on outside the swept package: the interpreter, the driver, the installed distributions.

A journal row stays valid only while its in-package files are unchanged
(:class:`~diagtools.usecases.sweep_journal.Fingerprints`) *and* the
environment it was scanned in is the same.  The environment is read without
importing anything: a digest of the interpreter binary, of the driver's
libraries, and of each installed distribution's ``RECORD`` (which lists a
digest of every file it installed) in the site folders the subkernel sees.
The distribution that holds the swept package itself is left out: its files
are fingerprinted one by one, so a pull request that reinstalls it rescans
only the rows whose files changed.  An editable install of another package
records no digests of its sources: a change there is not seen.
"""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtools.driver import DriverSetup
from diagtools.model.serial import json_line

__all__ = ["Environment", "environment_of"]

_PATH_QUERY = "import sys; print(repr(sys.path))"
_SHOWN = 3  # distributions named in a change before "and N more"


@dataclass(frozen=True)
class Environment:
    """Digests of what the rows loaded from outside the package, each part kept so a change can be named."""

    python: str
    driver: str
    distributions: Mapping[str, str] = field(default_factory=dict)  # "name version" -> digest of its RECORD

    @property
    def digest(self) -> str:
        text = json_line([self.python, self.driver, sorted(self.distributions.items())])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "driver": self.driver, "distributions": dict(sorted(self.distributions.items()))}

    @classmethod
    def from_json(cls, data: object) -> Environment | None:
        """The environment a journal line recorded; ``None`` when the line is not one."""
        if not isinstance(data, dict):
            return None
        python, driver, dists = data.get("python"), data.get("driver"), data.get("distributions")
        if not isinstance(python, str) or not isinstance(driver, str) or not isinstance(dists, dict):
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dists.items()):
            return None
        return cls(python, driver, dict(dists))

    def change_since(self, before: Environment) -> str:
        """What changed from ``before`` to this environment, in words (empty when nothing did)."""
        changes = []
        if before.python != self.python:
            changes.append("the interpreter changed")
        if before.driver != self.driver:
            changes.append("the driver changed")
        changed = _distribution_changes(before.distributions, self.distributions)
        if changed:
            more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
            shown = ", ".join(changed[:_SHOWN]) + more
            changes.append(f"installed distributions changed: {shown}")
        return "; ".join(changes)


def _distribution_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    words = [f"{name} removed" for name in sorted(set(before) - set(after))]
    words += [f"{name} added" for name in sorted(set(after) - set(before))]
    words += [f"{name} reinstalled" for name in sorted(set(before) & set(after)) if before[name] != after[name]]
    return words


def environment_of(python: str, roots: Iterable[str], setup: DriverSetup, package: str) -> Environment:
    """The environment a sweep of ``package`` runs in: ``python``'s binary, the driver ``setup`` gives, and the
    distributions on the subkernel's path (``roots`` first, then ``python``'s own ``sys.path``)."""
    search = [*roots, *_sys_path(python)]
    top = package.split(".", 1)[0]
    return Environment(_python_digest(python), _driver_digest(setup), _distributions(search, top))


def _sys_path(python: str) -> list[str]:
    """``python``'s ``sys.path`` with its site folders, asked of it (empty when it cannot say)."""
    try:
        done = subprocess.run(
            [python, "-c", _PATH_QUERY], capture_output=True, text=True, timeout=60, check=True, cwd="/"
        )
        found = ast.literal_eval(done.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError):
        return []
    return [entry for entry in found if isinstance(entry, str) and entry] if isinstance(found, list) else []


def _file_digest(path: str | Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return "missing"
    return digest.hexdigest()[:32]


def _python_digest(python: str) -> str:
    real = os.path.realpath(python)
    return hashlib.sha256(f"{real}\0{_file_digest(real)}".encode()).hexdigest()[:32]


def _driver_digest(setup: DriverSetup) -> str:
    """The driver's kind and the contents of every library it loads (the driver itself, the preloads)."""
    files = {setup.info.library or ""}
    for value in setup.env.values():
        files.update(part for part in value.replace(" ", ":").split(":") if part.startswith("/"))
    digest = hashlib.sha256(setup.info.kind.encode())
    for path in sorted(f for f in files if f and os.path.isfile(f)):
        digest.update(f"\0{path}\0{_file_digest(path)}".encode())
    return digest.hexdigest()[:32]


def _distributions(search: Iterable[str], top: str) -> dict[str, str]:
    """Each distribution on the path, by name and version, with a digest of its ``RECORD``; the first of a
    name wins, as for an import.  The one that installs ``top`` (the swept package) is left out."""
    found: dict[str, str] = {}
    for folder in dict.fromkeys(search):
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            name = entry.name.rsplit(".", 1)[0].replace("-", " ", 1)
            if name in found:
                continue
            record = _record(Path(entry.path))
            if not _installs(record, top):
                found[name] = hashlib.sha256(record).hexdigest()[:16]
    return found


def _record(folder: Path) -> bytes:
    """What says which files a distribution installed: its ``RECORD`` (or an egg's ``SOURCES.txt``)."""
    for name in ("RECORD", "SOURCES.txt", "PKG-INFO", "METADATA"):
        try:
            return (folder / name).read_bytes()
        except OSError:
            continue
    return b""


def _installs(record: bytes, top: str) -> bool:
    prefix = f"{top}/".encode()
    return any(line.startswith(prefix) for line in record.splitlines())
