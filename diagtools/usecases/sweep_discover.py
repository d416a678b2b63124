"""Find a package's submodules from its files, never by importing it.

A directory is a subpackage when its name is an identifier (so never
``__pycache__``) and it holds an ``__init__.py`` or, as a namespace package,
Python source or extension modules somewhere beneath it; a directory of data
files is not.  Modules are ``.py`` files and compiled extensions (any of
``importlib.machinery.EXTENSION_SUFFIXES``) with identifier names.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib.machinery
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from diagtools.errors import UsageError
from diagtools.usecases.options import validate_paths, validate_targets

__all__ = ["SweptTree", "discover_modules", "locate_tree", "names_imported"]

_SUFFIXES = tuple(sorted([*importlib.machinery.EXTENSION_SUFFIXES, ".py"], key=len, reverse=True))


@dataclass(frozen=True)
class SweptTree:
    """The swept package on disk: its import root, and each module's file (``None``: namespace package)."""

    package: str
    root: Path
    files: dict[str, Path | None]

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(sorted(self.files))

    @functools.cached_property
    def imported_names(self) -> frozenset[str]:
        """:func:`names_imported`, read once per tree (every file of the package is read for it)."""
        return names_imported(self)

    def relative(self, file: str | os.PathLike[str] | None) -> str | None:
        """``file`` relative to the import root when it lies inside the swept package, else ``None``."""
        if file is None:
            return None
        try:
            relative = Path(os.path.abspath(file)).relative_to(self.root)
        except ValueError:
            return None
        top = self.package.split(".")
        return relative.as_posix() if list(relative.parts[: len(top)]) in (top, [*top[:-1], f"{top[-1]}.py"]) else None


_IMPORT_LINE = re.compile(rb"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)|import[ \t]+([^\n#;]+))", re.MULTILINE)
_IMPORT_CALL = re.compile(rb"(?:import_module|__import__)\(\s*[\"']([A-Za-z_]\w*)")


def names_imported(tree: SweptTree) -> frozenset[str]:
    """The top-level module names the package's sources import by name (import statements, ``import_module``
    and ``__import__`` with a literal): read from the files, never imported."""
    found: set[bytes] = set()
    for file in tree.files.values():
        if file is None or file.suffix != ".py":
            continue
        with contextlib.suppress(OSError):
            text = file.read_bytes()
            for origin, listed in _IMPORT_LINE.findall(text):
                found.update([origin] if origin else _listed_tops(listed))
            found.update(_IMPORT_CALL.findall(text))
    return frozenset(name.decode() for name in found if name)


def _listed_tops(listed: bytes) -> list[bytes]:
    """``a.b as c, d`` -> ``[a, d]``; a parenthesised or continued list gives its first names only."""
    tops = []
    for part in listed.replace(b"(", b" ").split(b","):
        words = part.split()
        if words and re.fullmatch(rb"[A-Za-z_][\w.]*", words[0]):
            tops.append(words[0].split(b".")[0])
    return tops


def _package_dir(package: str, roots: tuple[str, ...]) -> tuple[Path, Path]:
    parts = package.split(".")
    for root in (*roots, *[p for p in sys.path if p]):
        base = Path(os.path.abspath(root), *parts)
        if base.is_dir() or base.with_suffix(".py").is_file():
            return Path(os.path.abspath(root)), base
    raise UsageError(f"package {package!r} not found on --path or sys.path (looked for {'/'.join(parts)})")


def _module_stem(file: str) -> str | None:
    for suffix in _SUFFIXES:
        if file.endswith(suffix):
            stem = file[: -len(suffix)]
            return stem if stem.isidentifier() and stem not in ("__init__", "__main__") else None
    return None


def _holds_python(directory: Path) -> bool:
    return any(_module_stem(f) or f == "__init__.py" for _, _, files in os.walk(directory) for f in files)


def _is_package_dir(directory: Path) -> bool:
    if not directory.name.isidentifier() or directory.name == "__pycache__":
        return False
    return (directory / "__init__.py").is_file() or _holds_python(directory)


def _walk(name: str, base: Path) -> dict[str, Path | None]:
    found: dict[str, Path | None] = {}
    for directory, subdirs, files in os.walk(base):
        here = Path(directory)
        subdirs[:] = sorted(d for d in subdirs if _is_package_dir(here / d))
        prefix = ".".join([name, *here.relative_to(base).parts])
        init = here / "__init__.py"
        found[prefix] = init if init.is_file() else None
        for file in sorted(files):
            stem = _module_stem(file)
            if stem is not None:
                found.setdefault(f"{prefix}.{stem}", here / file)
    return found


def _excluded(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def locate_tree(package: str, roots: Iterable[str] = (), exclude: Iterable[str] = ()) -> SweptTree:
    """The modules of ``package`` found under ``roots`` (then ``sys.path``), minus the ``exclude`` globs."""
    (name,) = validate_targets(package)
    patterns = tuple(exclude)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip():
            raise UsageError(f"--exclude {pattern!r} is not a pattern (expected a glob such as {name}.tests.*)")
    root, base = _package_dir(name, validate_paths(tuple(roots)))
    files = _walk(name, base) if base.is_dir() else {name: base.with_suffix(".py")}
    kept = {module: file for module, file in files.items() if not _excluded(module, patterns)}
    return SweptTree(name, root, kept)


def discover_modules(package: str, roots: Iterable[str] = (), exclude: Iterable[str] = ()) -> tuple[str, ...]:
    """Every importable submodule of ``package``, from its files (``__main__`` skipped)."""
    return locate_tree(package, roots, exclude).modules
