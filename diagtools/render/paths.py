"""Paths as a reader should see them: relative to the repository or import root, never /tmp or a cache.

A report is pasted into a ticket read on another machine, so an absolute
path there says nothing and may leak a home directory.  One rule, for every
report, page and shared document (:func:`display_path`): the interpreter's
own library folders (``<stdlib>/``, ``<site-packages>/``), else relative to
the working directory, else to the git repository holding the file, else to
one of the import roots the scan saw (the package root), else ``~`` for home;
only a path outside all of them stays absolute.
"""

from __future__ import annotations

import functools
import os
import shutil
import sysconfig
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from diagtools.model.cuts import Cut, CutSearch, Edge, Headline
from diagtools.model.scan import ScanResult, Site

__all__ = [
    "PATH_CHARS",
    "display_path",
    "import_roots",
    "readable",
    "roots_of",
    "shareable",
    "short_path",
    "shorten_paths",
    "shown_headline",
    "shown_site",
    "write_report",
]

PATH_CHARS = 56  # a longer path is shown with a middle ellipsis (in HTML with the whole path on hover)


@functools.lru_cache(maxsize=256)
def _repository_of(folder: str) -> str | None:
    """The nearest folder at or above ``folder`` holding a ``.git`` (a worktree's ``.git`` is a file)."""
    current = Path(folder)
    for candidate in (current, *current.parents):
        if (candidate / ".git").exists():
            return str(candidate)
    return None


def _library_roots() -> list[tuple[str, str]]:
    names = (("stdlib", "<stdlib>"), ("purelib", "<site-packages>"), ("platlib", "<site-packages>"))
    paths = sysconfig.get_paths()
    return [(paths[key], label) for key, label in names if key in paths]


def import_roots(result: ScanResult) -> tuple[str, ...]:
    """The ``sys.path`` entries the scan's modules came from, deduced from each module's name and file."""
    return roots_of((node.name, node.file) for node in result.modules)


def roots_of(modules: Iterable[tuple[str, str | None]]) -> tuple[str, ...]:
    """The ``sys.path`` entries that ``(module name, file)`` pairs came from, longest first."""
    roots: set[str] = set()
    for name, file in modules:
        if not file:
            continue
        parts = name.split(".")
        for tail in ([*parts[:-1], parts[-1] + ".py"], [*parts, "__init__.py"]):
            suffix = os.sep + os.sep.join(tail)
            if file.endswith(suffix):
                roots.add(file[: -len(suffix)])
    return tuple(sorted(roots, key=len, reverse=True))


def _working_directory() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed under the process: no path is shown relative to it
        return ""


def _under(path: str, root: str) -> str | None:
    root = root.rstrip(os.sep)
    if root and path.startswith(root + os.sep):
        return path[len(root) + 1 :]
    return None


def display_path(path: str | None, roots: Iterable[str] = ()) -> str:
    """``path`` by the one rule: the library's label, else relative to the working directory, the repository or
    an import root; ``~`` for home as a last resort."""
    if not path or not os.path.isabs(path):
        return path or ""
    repository = _repository_of(os.path.dirname(path))
    ordered = [
        *((root, f"{label}/") for root, label in _library_roots()),
        (_working_directory(), ""),
        *([(repository, "")] if repository is not None else []),
        *((root, "") for root in roots),
        (os.path.expanduser("~"), "~/"),
    ]
    for root, label in ordered:
        relative = _under(path, root)
        if relative is not None:
            return f"{label}{relative}"
    return path


def shown_site(site: Site, roots: Iterable[str] = ()) -> Site:
    """``site`` with its file written by the one rule (:func:`display_path`)."""
    return replace(site, file=display_path(site.file, roots))


def shown_headline(chosen: Headline, roots: tuple[str, ...] = ()) -> Headline:
    """A line to change with its line's and edges' files written by the one rule."""
    return replace(
        chosen,
        line=_site(chosen.line, roots),
        edge=None if chosen.edge is None else _edge(chosen.edge, roots),
        deepest=None if chosen.deepest is None else _edge(chosen.deepest, roots),
    )


def _site(site: Site | None, roots: tuple[str, ...]) -> Site | None:
    return None if site is None else shown_site(site, roots)


def _edge(edge: Edge, roots: tuple[str, ...]) -> Edge:
    return replace(edge, site=_site(edge.site, roots) or edge.site)


def _cut(cut: Cut | None, roots: tuple[str, ...]) -> Cut | None:
    return None if cut is None else replace(cut, edges=tuple(_edge(e, roots) for e in cut.edges))


def _cuts(search: CutSearch | None, roots: tuple[str, ...]) -> CutSearch | None:
    if search is None:
        return None
    tries = tuple(
        replace(t, edges=tuple(_edge(e, roots) for e in t.edges), at=_site(t.at, roots)) for t in search.tries
    )
    return replace(search, nearest=_cut(search.nearest, roots), deepest=_cut(search.deepest, roots), tries=tries)


def shareable(result: ScanResult, *, library: bool = False) -> ScanResult:
    """A copy of ``result`` fit to paste into a ticket: every path shown by the one rule, and no driver cache path
    unless ``library`` (a report read on this machine names the driver it loaded, ``~``-relative)."""
    roots = import_roots(result)
    culprits = tuple(c.with_sites(lambda site: _site(site, roots) or site) for c in result.culprits)
    threads = tuple(replace(t, started_at=_site(t.started_at, roots)) for t in result.threads_alive)
    modules = tuple(replace(n, file=display_path(n.file, roots) or None) for n in result.modules)
    error = result.error
    if error is not None and error.file:
        error = replace(error, file=display_path(error.file, roots))
    shown_library = display_path(result.driver.library) if library and result.driver.library else None
    driver = replace(result.driver, library=shown_library)
    return replace(
        result,
        culprits=culprits,
        modules=modules,
        error=error,
        driver=driver,
        threads_alive=threads,
        cuts=_cuts(result.cuts, roots),
    )


def shorten_paths(text: str, roots: Iterable[str]) -> str:
    """``text`` with its paths written by the one rule, for reports whose paths sit inside sentences (a command's
    scripts in a temporary folder, say) where :func:`display_path` cannot reach them: the library folders by
    their labels, the working directory's and each root's prefix removed, the home directory written ``~``."""
    prefixes = [(root, f"{label}/") for root, label in _library_roots()]
    prefixes += [(root, "") for root in (_working_directory(), *roots)]
    for root, label in sorted(
        {(r.rstrip(os.sep), label) for r, label in prefixes if r and os.path.isabs(r) and r.rstrip(os.sep)},
        key=lambda pair: len(pair[0]),
        reverse=True,
    ):
        text = text.replace(root + os.sep, label)
    home = os.path.expanduser("~")
    return text.replace(home + os.sep, "~" + os.sep) if home not in ("", os.sep) else text


def short_path(path: str, limit: int = PATH_CHARS) -> str:
    """``path`` cut in the middle to about ``limit`` characters, at folder boundaries when it can be.

    The first folder and as many trailing parts as fit stay (``diagtools/…/before/vmodels/platforms.py``),
    so the file name and any ``:line`` after it are never cut.
    """
    if len(path) <= limit:
        return path
    parts = path.split("/")
    head, tail = parts[0], [parts[-1]]
    for part in reversed(parts[1:-1]):
        if len(head) + len("/\u2026/") + len("/".join([part, *tail])) > limit:
            break
        tail.insert(0, part)
    folders = f"{head}/\u2026/{'/'.join(tail)}"
    if len(parts) > 2 and len(folders) <= limit:
        return folders
    keep = limit // 2 + limit // 4
    return f"{path[: limit - keep - 1]}\u2026{path[-keep:]}"


def readable(text: str) -> str:
    """``text`` with every lone surrogate written as an escape, so it can be encoded as UTF-8.

    Linux paths are bytes: a folder named with byte 0xff reaches Python as ``\\udcff`` (surrogateescape), and a
    document can hold any lone surrogate.  The original byte is shown as ``\\xff``; other surrogates as
    ``\\udXXX``.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def write_report(path: str | Path, content: str | bytes) -> Path:
    """Write a report file whole or not at all: a failure (disk full, a rendering error) leaves no empty or
    half-written file where the report was expected, and a name no codec can encode is escaped.

    Only a regular file is replaced whole: a device, a pipe or a socket named as the report (``/dev/null``,
    ``/dev/stdout``, a FIFO a reader waits on) is written in place and stays what it was, a symbolic link stays a
    link to the file it names, and a replaced file keeps its permission bits.
    """
    target = Path(path)
    data = content if isinstance(content, bytes) else readable(content).encode("utf-8")
    real = Path(os.path.realpath(target))
    if real.exists() and not real.is_file():
        _write_in_place(real, data)
        return target
    partial = real.with_name(f".{real.name}.{os.getpid()}.partial")
    try:
        try:
            partial.write_bytes(data)
        except PermissionError:  # a folder the user cannot add to, holding a file the user may write
            _write_in_place(real, data)
            return target
        if real.exists():
            shutil.copymode(real, partial)
        os.replace(partial, real)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _write_in_place(path: Path, data: bytes) -> None:
    with open(path, "wb") as stream:
        stream.write(data)
