"""The fix: the nearest verified cut as a patch, checked on a copy, with the callers it keeps working and a guard.

Nothing here writes into the user's tree.  The patch is a unified diff
relative to the checkout that holds the changed files (its git top level, or
the import root), made from the same rewrite the cut was verified with.  It
is checked on a temporary copy of the changed package (directories copied,
files linked, the changed files written): the target is scanned there, and in
a separate subkernel every name the patch made lazy is resolved as
``from MODULE import NAME``.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tempfile
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from diagtools import agents, protocol
from diagtools.model.cuts import Outcome
from diagtools.model.fix import Caller, FileChange, FixResult, NameCheck, PatchCheck
from diagtools.model.options import DEFAULT_TIMEOUT_S
from diagtools.model.site import Site, is_own, own_patterns
from diagtools.model.verdict import ScanStatus, Verdict
from diagtools.runner.subkernel import RawRun, SubkernelRequest, run_subkernel
from diagtools.usecases.cuts import encoding_of, rewrite
from diagtools.usecases.options import ScanOptions, validate_targets

if TYPE_CHECKING:
    from collections.abc import Callable

    from diagtools.model.cuts import Edge
    from diagtools.model.scan import ScanResult
    from diagtools.model.sweep import SweepRow
    from diagtools.usecases.defer import Deferred

__all__ = ["fix", "guard_test", "unified_diff"]

RESOLVE_PROGRAM = agents.program("resolve_names")
_CALLER_FILES = 20_000  # source files searched for callers, at most


def fix(
    target: str,
    *,
    path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
    driver: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
    own: str | Iterable[str] = (),
    python: str | os.PathLike[str] | None = None,
    sweep: Iterable[SweepRow] = (),
    runner: Callable[[SubkernelRequest], RawRun] = run_subkernel,
) -> FixResult:
    """Scan ``target``, find its nearest verified cut, and turn it into a checked patch and a guard test.

    The arguments are :func:`diagtools.scan`'s.  The result renders in a
    notebook; ``result.patch`` applies with ``git apply`` in ``result.root``.
    """
    from diagtools.usecases.scan import scan_with

    options = ScanOptions.of(path=path, driver=driver, timeout=timeout, own=own, python=python)
    result = scan_with(validate_targets(target), options, sweep=sweep, runner=runner)
    if result.verdict != Verdict.INITIALIZES_CUDA:
        why = "nothing to fix: importing it leaves CUDA uninitialized"
        if result.verdict == Verdict.UNKNOWN:
            why = "nothing can be fixed yet: the scan could not see (" + "; ".join(result.doubts()) + ")"
        return FixResult(result, reason=why)
    cut = result.cuts.nearest if result.cuts is not None else None
    if cut is None:
        return FixResult(result, reason=result.cuts.reason if result.cuts else "no cut was searched")
    made = rewrite(cut.edges)
    if made.refused is not None:  # the files changed since the cut was verified
        return FixResult(result, cut=cut, reason=f"the patch cannot be written: {made.refused}")
    modules = _modules_of(cut.edges)
    base = patch_root([(change.file, modules[change.file]) for change in made.deferred])
    changes = tuple(FileChange(c.file, os.path.relpath(c.file, base), c.names, c.moved) for c in made.deferred)
    check = check_patch(result, made.deferred, modules, options, runner=runner)
    return FixResult(
        scan=result,
        cut=cut,
        root=base,
        patch=unified_diff(made.deferred, base),
        changes=changes,
        check=check,
        callers=find_callers(made.deferred, modules),
        guard=guard_test(target),
        guard_file=f"test_{target.replace('.', '_')}_cuda_free.py",
    )


def _modules_of(edges: Sequence[Edge]) -> dict[str, str]:
    return {edge.site.file: edge.importer for edge in edges}


# ---- the patch --------------------------------------------------------------------------------


def import_root(file: str, module: str) -> Path:
    """The directory on ``sys.path`` that ``module`` (whose source is ``file``) was imported from."""
    depth = len(module.split("."))
    parents = Path(file).parents
    index = depth if os.path.basename(file) == "__init__.py" else depth - 1
    return parents[min(index, len(parents) - 1)]


def patch_root(files: Sequence[tuple[str, str]]) -> str:
    """Where the patch applies: the git top level above the changed files' import roots, else those roots'
    common directory."""
    roots = [import_root(file, module) for file, module in files]
    common = Path(os.path.commonpath([str(root) for root in roots]))
    for folder in (common, *common.parents):
        if (folder / ".git").exists():
            return str(folder)
    return str(common)


def unified_diff(deferred: Sequence[Deferred], base: str) -> str:
    """The changes as one unified diff, ``a/PATH`` and ``b/PATH`` relative to ``base`` (``git apply``,
    ``patch -p1``), a missing final newline marked as diff marks it."""
    chunks = []
    for change in deferred:
        name = os.path.relpath(change.file, base)
        lines = difflib.unified_diff(_lines(change.before), _lines(change.after), f"a/{name}", f"b/{name}", n=3)
        chunks.append("".join(_marked(line) for line in lines))
    return "".join(chunks)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _marked(line: str) -> str:
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def changed_files(before: ScanResult, after: ScanResult) -> str:
    """The unified diff of the user's own files on either scan's import path that differ between the two trees
    (paths relative to each tree's import root): the actual change a before/after comparison shows."""
    own = own_patterns(before.targets, before.own)
    files = {tree: _own_files(scan, own) for tree, scan in (("a", before), ("b", after))}
    roots = {tree: _common_root(found) for tree, found in files.items()}
    relative = {
        os.path.relpath(file, roots[tree]) for tree, found in files.items() for file in found.values() if roots[tree]
    }
    chunks = []
    for name in sorted(relative):
        old = _text_or_none(os.path.join(roots["a"], name)) if roots["a"] else None
        new = _text_or_none(os.path.join(roots["b"], name)) if roots["b"] else None
        if old == new:
            continue
        lines = difflib.unified_diff(
            _lines(old or ""),
            _lines(new or ""),
            f"a/{name}" if old is not None else "/dev/null",
            f"b/{name}" if new is not None else "/dev/null",
        )
        chunks.append("".join(_marked(line) for line in lines))
    return "".join(chunks)


def _own_files(scan: ScanResult, own: Sequence[str]) -> dict[str, str]:
    return {
        node.name: node.file
        for node in scan.modules
        if node.file and node.file.endswith(".py") and is_own(node.name, own)
    }


def _common_root(files: dict[str, str]) -> str:
    roots = {str(import_root(file, name)) for name, file in files.items()}
    return os.path.commonpath(sorted(roots)) if roots else ""


def _text_or_none(path: str) -> str | None:
    try:
        with tokenize.open(path) as handle:
            return handle.read()
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


# ---- the check on a copy ----------------------------------------------------------------------


def check_patch(
    result: ScanResult,
    deferred: Sequence[Deferred],
    modules: dict[str, str],
    options: ScanOptions,
    *,
    runner: Callable[[SubkernelRequest], RawRun],
) -> PatchCheck:
    """Apply the changes to a temporary copy, rescan the target there, and resolve every lazy name."""
    from diagtools.usecases.scan import scan_with

    with tempfile.TemporaryDirectory(prefix="diagtools-fix-") as copy:
        try:
            written = _copy_with_changes(copy, deferred, modules)
        except OSError as exc:
            return PatchCheck(Outcome.UNKNOWN, reason=f"the temporary copy could not be made: {exc}")
        search = (copy, *options.roots)
        on_copy = replace(options, roots=search, driver=result.driver.requested, own=result.own)
        rescan = scan_with(result.targets, on_copy, cuts=False, refine=False, runner=runner)
        outcome, reason = _rescan_outcome(rescan, written)
        names = [(modules[change.file], name) for change in deferred for name in change.names]
        checks = _resolve(names, on_copy, result=result, runner=runner) if names else ()
    return PatchCheck(outcome, checks, reason, copy)


def _copy_with_changes(copy: str, deferred: Sequence[Deferred], modules: dict[str, str]) -> dict[str, str]:
    """Mirror each changed file's top-level package into ``copy`` (folders made, files linked, no
    ``__pycache__``) and write the changed files there; the original file -> its copy."""
    written: dict[str, str] = {}
    for change in deferred:
        module = modules[change.file]
        root = import_root(change.file, module)
        top = module.split(".", 1)[0]
        source, mirror = root / top, Path(copy) / top
        if not mirror.exists():
            _mirror(source, mirror)
        target = Path(copy) / os.path.relpath(change.file, root)
        target.unlink(missing_ok=True)
        target.write_bytes(change.after.encode(encoding_of(change.file), "surrogateescape"))
        written[change.file] = str(target)
    return written


def _mirror(source: Path, mirror: Path) -> None:
    if source.is_file() or not source.is_dir():  # a single-file top-level module: link it
        mirror.parent.mkdir(parents=True, exist_ok=True)
        mirror.symlink_to(source)
        return
    for folder, names, files in os.walk(source):
        names[:] = [n for n in names if n != "__pycache__"]
        here = mirror / os.path.relpath(folder, source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            (here / name).symlink_to(os.path.join(folder, name))


def _rescan_outcome(rescan: ScanResult, written: dict[str, str]) -> tuple[Outcome, str]:
    files = {node.name: node.file for node in rescan.modules}
    stray = [f for original, f in written.items() if original in files.values()]
    if stray:
        return Outcome.UNKNOWN, f"the rescan imported {stray[0]} from the original tree, not the patched copy"
    if rescan.status == ScanStatus.IMPORT_ERROR:
        return Outcome.BREAKS, rescan.error.message if rescan.error else "the import failed"
    if rescan.cuda_initialized:
        culprit = rescan.culprit.module if rescan.culprit else "?"
        return Outcome.STILL_INITIALIZES, f"with the patch applied, {culprit} still initializes CUDA"
    if rescan.verdict != Verdict.CLEAN:
        return Outcome.UNKNOWN, "; ".join(rescan.doubts())
    return Outcome.CLEAN, ""


def _resolve(
    names: Sequence[tuple[str, str]],
    options: ScanOptions,
    *,
    result: ScanResult,
    runner: Callable[[SubkernelRequest], RawRun],
) -> tuple[NameCheck, ...]:
    """``from module import name`` for each pair, in a fresh subkernel with the copy first on the path."""
    from diagtools.driver import resolve_driver

    settings = {
        protocol.RESOLVE_NAMES: "\n".join(f"{module} {name}" for module, name in names),
        protocol.RESOLVE_PATH: "\n".join(options.roots),
    }
    setup = resolve_driver(result.driver.requested)
    raw = runner(SubkernelRequest(RESOLVE_PROGRAM, settings, setup.env, options.timeout, python=options.python))
    seen = {(e["module"], e["name"]): e for e in raw.events if e.get("e") == "resolved"}
    checks = []
    for module, name in names:
        event = seen.get((module, name))
        if event is None:
            why = "the check did not run (the subkernel ended first)" if not raw.timed_out else "the check timed out"
            checks.append(NameCheck(module, name, False, why))
        else:
            checks.append(NameCheck(module, name, bool(event["ok"]), str(event.get("error") or "")))
    return tuple(checks)


# ---- callers ----------------------------------------------------------------------------------


def find_callers(deferred: Sequence[Deferred], modules: dict[str, str]) -> tuple[Caller, ...]:
    """The ``from MODULE import NAME`` statements in the changed packages' source trees that import a name
    the patch defers (read statically with :mod:`ast`; relative imports resolved)."""
    wanted: dict[str, set[str]] = {}
    trees: dict[Path, str] = {}
    for change in deferred:
        module = modules[change.file]
        names = set(change.names) | {name for name, _ in change.moved}
        if names:
            wanted.setdefault(module, set()).update(names)
            trees[import_root(change.file, module)] = module.split(".", 1)[0]
    if not wanted:
        return ()
    pattern = re.compile("|".join(sorted(re.escape(n) for names in wanted.values() for n in names)))
    found: list[Caller] = []
    for root, top in trees.items():
        for file in _sources(root / top):
            found += _callers_in(file, _module_name(file, root), wanted, pattern)
    return tuple(sorted(found, key=lambda c: (c.site.file, c.site.line)))


def _sources(folder: Path) -> list[Path]:
    files: list[Path] = []
    for here, names, found in os.walk(folder):
        names[:] = sorted(n for n in names if n != "__pycache__")
        files += [Path(here) / name for name in sorted(found) if name.endswith(".py")]
        if len(files) > _CALLER_FILES:
            break
    return files[:_CALLER_FILES]


def _module_name(file: Path, root: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _callers_in(file: Path, module: str, wanted: dict[str, set[str]], pattern: re.Pattern[str]) -> list[Caller]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if not pattern.search(text):
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _absolute(node, package)
        names = tuple(a.name for a in node.names if a.name in wanted.get(source, ()))
        if names and source != module:
            text_line = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
            found.append(Caller(Site(str(file), node.lineno, "", text_line), source, names))
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join([*base, node.module] if node.module else base)


# ---- the guard --------------------------------------------------------------------------------


def guard_test(target: str) -> str:
    """A pytest test that fails, naming the chain and the line, if importing ``target`` initializes CUDA again."""
    slug = re.sub(r"\W", "_", target)
    return (
        f'"""Importing {target} must leave the CUDA driver uninitialized, so that a fork() after it works.\n'
        "\n"
        "Each check imports the module in a fresh subprocess (never in the test process) with the\n"
        "diagtools pytest plugin; on failure it names the import chain and the line.  Run it where\n"
        f"`import {target}` works.\n"
        '"""\n'
        "\n"
        "from diagtools.pytest_plugin import assert_import_cuda_free\n"
        "\n"
        "\n"
        f"def test_importing_{slug}_leaves_cuda_uninitialized():\n"
        f"    assert_import_cuda_free({target!r})\n"
    )
