"""What deferring import statements needs to know: which names must stay importable, which functions use them.

The rewrite itself is :mod:`diagtools.usecases.defer`; this module reads the
module's syntax tree and scopes (libcst) and decides, for every name a
deferred statement binds, whether it becomes a lazy attribute, moves into
the functions that use it, or cannot wait (:class:`CannotDeferError`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagtools.errors import CannotDeferError

if TYPE_CHECKING:
    import libcst as cst

__all__ = ["public_names"]


@dataclass
class _Statement:
    """One deferred statement and what its names need."""

    index: int  # in the module's body
    node: Any  # the SimpleStatementLine
    small: Any  # its Import or ImportFrom
    line: int
    bound: dict[str, Any]  # bound name -> its ImportAlias (None for a star import's names)
    star_names: tuple[str, ...] = ()


def _dotted(node: Any) -> str:
    """``a.b.c`` of a Name or Attribute node ("" for None)."""
    import libcst as cst

    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class _Analysis:
    """Which deferred names must stay importable (lazy) and which functions must import them."""

    def __init__(self, file: str, tree: cst.Module, positions: Any, scopes: Any, *, package: bool, module: str):
        self.file, self.tree, self.positions, self.scopes = file, tree, positions, scopes
        self.package, self.module = package, module
        self.global_scope = scopes[tree]
        self.exported = _all_names(tree)
        self.future_annotations = _has_future_annotations(tree)
        self.lazy: list[tuple[str, str, str | None]] = []
        self.moves: dict[Any, list[str]] = {}
        self.typed: set[int] = set()  # statements kept under TYPE_CHECKING for annotations

    def add(self, statement: _Statement) -> None:
        import libcst as cst

        small = statement.small
        if isinstance(small.names, cst.ImportStar):
            self._add_star(statement)
            return
        for alias in small.names:
            name = _bound_name(alias)
            statement.bound[name] = alias
            functions, annotated = self._uses(statement, name)
            for function in functions:
                self.moves.setdefault(function, [])
                if name not in self.moves[function]:
                    self.moves[function].append(name)
            if annotated:
                self.typed.add(statement.index)
            if self.package or name in self.exported or not (functions or annotated):
                self.lazy.append((name, *self._source_of(statement, alias, name)))

    def _uses(self, statement: _Statement, name: str) -> tuple[list[Any], bool]:
        """The functions that use ``name``, and whether an annotation (not evaluated) does; refuses a module-level
        use, a second binding of the name and a use no import can be moved to."""
        import libcst as cst

        functions: list[Any] = []
        annotated = False
        for assignment in self.global_scope.assignments[name]:
            if getattr(assignment, "node", None) is not statement.small:
                where = self._line(getattr(assignment, "node", None)) or statement.line
                raise CannotDeferError(self.file, where, f"`{name}` is also bound at line {where}, so it cannot wait")
            for access in assignment.references:
                if isinstance(access.node, (cst.SimpleString, cst.ConcatenatedString)) or (
                    access.is_annotation and self.future_annotations
                ):
                    annotated = True
                    continue
                function = self._owner(access, name)
                if function not in functions:
                    functions.append(function)
        return functions, annotated

    def _owner(self, access: Any, name: str) -> Any:
        """The innermost ``def`` whose body holds ``access``; refuses a use while the module is imported."""
        import libcst as cst
        from libcst.metadata import FunctionScope, GlobalScope

        scope = access.scope
        lambda_seen = False
        while not isinstance(scope, GlobalScope):
            if isinstance(scope, FunctionScope):
                if isinstance(scope.node, cst.FunctionDef):
                    return scope.node
                lambda_seen = True
            scope = scope.parent
        line = self._line(access.node)
        if lambda_seen:
            raise CannotDeferError(self.file, line, f"`{name}` is used in a module-level lambda at line {line}")
        how = "in an annotation evaluated at definition" if access.is_annotation else "while the module is imported"
        raise CannotDeferError(self.file, line, f"`{name}` is used at line {line} {how}")

    def _line(self, node: Any) -> int:
        try:
            return int(self.positions[node].start.line)
        except KeyError:
            return 0

    def _source_of(self, statement: _Statement, alias: Any, name: str) -> tuple[str, str | None]:
        """``(module, attribute)`` that ``importlib`` resolves ``name`` from; refuses what it cannot express."""
        import libcst as cst

        small = statement.small
        if isinstance(small, cst.Import):
            if alias.asname is None and "." in _dotted(alias.name):
                raise CannotDeferError(
                    self.file,
                    statement.line,
                    f"`import {_dotted(alias.name)}` binds `{name}` and imports a submodule: write "
                    f"`import {_dotted(alias.name)} as ...` first",
                )
            return _dotted(alias.name), None
        base = "." * len(small.relative) + _dotted(small.module)
        imported = _dotted(alias.name)
        if self._is_submodule(base, imported):
            return (base + imported if base.endswith(".") else f"{base}.{imported}"), None
        if not _dotted(small.module):
            raise CannotDeferError(
                self.file, statement.line, f"`{imported}` is not a module of this package: move the import by hand"
            )
        return base, imported

    def _is_submodule(self, base: str, name: str) -> bool:
        """``base.name`` is a module file beside this one (relative imports and this package's own)."""
        folder = self._folder_of(base)
        if folder is None:
            return False
        return os.path.isfile(os.path.join(folder, name + ".py")) or os.path.isdir(os.path.join(folder, name))

    def _folder_of(self, base: str) -> str | None:
        dots = len(base) - len(base.lstrip("."))
        if not dots:
            return None
        folder = os.path.dirname(os.path.abspath(self.file))
        for _ in range(dots - 1):
            folder = os.path.dirname(folder)
        rest = base[dots:]
        return os.path.join(folder, *rest.split(".")) if rest else folder

    def _add_star(self, statement: _Statement) -> None:
        base = "." * len(statement.small.relative) + _dotted(statement.small.module)
        names = self._star_names(statement, base)
        used = _loaded_names(self.tree) & set(names)
        if used:
            raise CannotDeferError(
                self.file,
                statement.line,
                f"this module uses {', '.join(sorted(used))} from the star import itself: import them by name first",
            )
        statement.star_names = names
        self.lazy += [(name, base, name) for name in names]

    def _star_names(self, statement: _Statement, base: str) -> tuple[str, ...]:
        folder = self._folder_of(base)
        candidates = [] if folder is None else [folder + ".py", os.path.join(folder, "__init__.py")]
        for candidate in candidates:
            try:
                with open(candidate, encoding="utf-8") as handle:
                    text = handle.read()
            except (OSError, UnicodeDecodeError):
                continue
            names = public_names(text)
            if names is not None:
                return names
        raise CannotDeferError(
            self.file, statement.line, f"the names of `from {base} import *` cannot be read statically: list them"
        )


def _bound_name(alias: Any) -> str:
    if alias.asname is not None:
        return _dotted(alias.asname.name)
    return _dotted(alias.name).split(".", 1)[0]


def _all_names(tree: cst.Module) -> set[str]:
    """The strings of a module-level ``__all__ = [...]`` (or tuple); empty when there is none."""
    import libcst as cst

    found: set[str] = set()
    for statement in tree.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else []
            if isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets = [small.target]
            value = getattr(small, "value", None)
            if any(isinstance(t, cst.Name) and t.value == "__all__" for t in targets) and isinstance(
                value, (cst.List, cst.Tuple)
            ):
                for element in value.elements:
                    if isinstance(element.value, cst.SimpleString):
                        found.add(str(element.value.evaluated_value))
    return found


def _has_future_annotations(tree: cst.Module) -> bool:
    import libcst as cst

    for small in _small_statements(tree.body):
        if isinstance(small, cst.ImportFrom) and _dotted(small.module) == "__future__" and not small.relative:
            names = small.names
            if not isinstance(names, cst.ImportStar) and any(_dotted(a.name) == "annotations" for a in names):
                return True
    return False


def _small_statements(body: Iterable[Any]) -> list[Any]:
    """The small statements (imports, assignments, expressions) directly in ``body``."""
    import libcst as cst

    return [small for node in body if isinstance(node, cst.SimpleStatementLine) for small in node.body]


def _loaded_names(tree: cst.Module) -> set[str]:
    import libcst as cst

    names: set[str] = set()

    class Collect(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:  # noqa: N802 - libcst's visitor naming
            names.add(node.value)

    tree.visit(Collect())
    return names


def public_names(source: str) -> tuple[str, ...] | None:
    """What ``from module import *`` binds, read statically: ``__all__`` when it is a literal list of
    strings, else the module-level names without a leading underscore; ``None`` when it does not parse."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = node.value
            if isinstance(value, (ast.List, ast.Tuple)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
            ):
                return tuple(str(e.value) for e in value.elts)  # type: ignore[attr-defined]
            return None
        names += _bound_by(node)
    return tuple(dict.fromkeys(name for name in names if not name.startswith("_")))


def _bound_by(node: Any) -> list[str]:
    import ast

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name != "*"]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]
