"""How a scan's subkernels run, validated once: the options a scan, a fix and a sweep share.

The command line, the API (:func:`diagtools.scan`, :func:`diagtools.sweep`,
:func:`diagtools.fix`), the magics and the sweep's workers all make a
:class:`ScanOptions` with :meth:`ScanOptions.of` and pass it on whole, so every
default and every check is written once.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from diagtools.errors import UsageError
from diagtools.model.options import DEFAULT_TIMEOUT_S, DRIVER_CHOICES, timeout_problem
from diagtools.usecases.interpreter import validate_python

__all__ = [
    "ScanOptions",
    "validate_driver",
    "validate_own",
    "validate_paths",
    "validate_python",
    "validate_targets",
    "validate_timeout",
]


@dataclass(frozen=True)
class ScanOptions:
    """Where imports are found, which driver, how long a subkernel may take, whose code is the user's, and
    which interpreter runs it.  Picklable: a sweep's workers receive it whole."""

    roots: tuple[str, ...] = ()
    driver: str = "auto"
    timeout: float = DEFAULT_TIMEOUT_S
    own: tuple[str, ...] = ()
    python: str = sys.executable

    @classmethod
    def of(
        cls,
        *,
        path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        driver: str = "auto",
        timeout: object = DEFAULT_TIMEOUT_S,
        own: str | Iterable[str] = (),
        python: str | os.PathLike[str] | None = None,
    ) -> ScanOptions:
        """The options, each checked before any process starts (:class:`UsageError` says what is wrong)."""
        return cls(
            validate_paths(path), validate_driver(driver), validate_timeout(timeout), validate_own(own),
            validate_python(python),
        )  # fmt: skip


def validate_driver(driver: object) -> str:
    if driver not in DRIVER_CHOICES:
        raise UsageError(f"unknown driver {driver!r}: choose one of {', '.join(DRIVER_CHOICES)}")
    return str(driver)


def validate_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """Dotted module names, checked before any process starts."""
    try:
        names = (targets,) if isinstance(targets, str) else tuple(targets)
    except TypeError:
        raise UsageError(f"targets must be a module name or a list of them, got {targets!r}") from None
    if not names:
        raise UsageError("no target given: name at least one module to scan")
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(f"{name!r} is not a module name (expected dotted identifiers such as pkg.sub)")
    return names


def modules_of_files(files: Iterable[str | os.PathLike[str]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The module each Python file of a package is, and the import roots they need: ``(modules, roots)``.

    A file counts when its folder is a package (holds ``__init__.py``): a module, not a script, whose import
    runs no more than a library's would; ``__main__.py`` and files outside any package are left out (so a
    pre-commit hook handed every changed file imports only library code).  The root is the folder above the
    outermost package folder.
    """
    modules: list[str] = []
    roots: list[str] = []
    for file in files:
        path = Path(file).resolve()
        if path.suffix != ".py" or path.name == "__main__.py" or not (path.parent / "__init__.py").is_file():
            continue
        parts = [] if path.name == "__init__.py" else [path.stem]
        folder = path.parent
        while (folder / "__init__.py").is_file() and folder.name.isidentifier():
            parts.insert(0, folder.name)
            folder = folder.parent
        if not parts or not all(part.isidentifier() for part in parts):
            continue
        name = ".".join(parts)
        if name not in modules:
            modules.append(name)
        if str(folder) not in roots:
            roots.append(str(folder))
    return tuple(modules), tuple(roots)


def targets_and_files(targets: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Targets given as module names or as files of a package (``pkg/ops/__init__.py``): the module names,
    and the import roots the files need (:func:`modules_of_files`; files that are not package modules are
    left out)."""
    items = tuple(targets)
    files = [t for t in items if t.endswith(".py") or os.sep in t or os.path.isfile(t)]
    modules, roots = modules_of_files(files)
    names = [t for t in items if t not in files]
    return (*names, *(m for m in modules if m not in names)), roots


def validate_timeout(timeout: object) -> float:
    """Seconds as a finite, positive number (at most a week), checked before any process starts."""
    problem = timeout_problem(timeout)
    if problem:
        raise UsageError(problem)
    return float(timeout)  # type: ignore[arg-type] # a number: timeout_problem said so


def validate_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """Import roots that exist, made absolute so the subkernel's cwd cannot matter."""
    try:
        items = (paths,) if isinstance(paths, (str, os.PathLike)) else tuple(paths)
    except TypeError:
        raise UsageError(f"path must be a directory or a list of them, got {paths!r}") from None
    resolved = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise UsageError(f"--path entries must be directory names, got {item!r}")
        text = os.fspath(item)
        if not isinstance(text, str) or "\n" in text or "\0" in text:
            raise UsageError(f"--path {text!r} contains a newline or NUL byte, which an import root cannot have")
        path = os.path.abspath(text)
        if not os.path.isdir(path):
            raise UsageError(f"--path {os.fspath(item)!r} is not a directory")
        resolved.append(path)
    return tuple(resolved)


_GLOB = re.compile(r"\[!?[^\].]+\]|[*?]")
"""One glob element (``*``, ``?``, a ``[...]`` class): it stands for part of an identifier."""


def validate_own(own: str | Iterable[str]) -> tuple[str, ...]:
    """``--own`` patterns: dotted names, optionally with ``*``/``?``/``[]`` globs."""
    try:
        patterns = (own,) if isinstance(own, str) else tuple(own)
    except TypeError:
        raise UsageError(f"own must be a package name or a list of them, got {own!r}") from None
    for pattern in patterns:
        if not isinstance(pattern, str) or not all(part.isidentifier() for part in _GLOB.sub("x", pattern).split(".")):
            raise UsageError(f"--own {pattern!r} is not a package name or a glob on dotted names (such as vllm.*)")
    return patterns
