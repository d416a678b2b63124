"""Defer import statements: the one rewrite behind a cut's verification and behind its patch.

A deferred statement no longer runs when its module is imported:

- a name that other code may import from the module (every name of a package
  ``__init__``, a name listed in ``__all__``, a name the module never uses
  itself) becomes a lazy attribute: PEP 562 ``__getattr__`` and ``__dir__``
  import it on first access, so ``from pkg import name`` keeps working; the
  statement itself moves under ``if TYPE_CHECKING:`` so type checkers still
  see the name;
- a name the module's own functions use is imported inside each of them.

A name the module needs while it is being imported (a base class, a
decorator, a default value, an annotation evaluated at definition, a module
constant) cannot wait: :class:`CannotDeferError` names it and its line, and the
caller looks for a cut deeper down.

The rewrite is made with libcst, a concrete syntax tree, so every comment,
blank line and format elsewhere in the file stays byte for byte as it was.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagtools.errors import CannotDeferError
from diagtools.usecases.defer_analysis import (
    _Analysis,
    _bound_name,
    _dotted,
    _small_statements,
    _Statement,
    public_names,
)

if TYPE_CHECKING:
    import libcst as cst

__all__ = ["CannotDeferError", "Deferred", "defer", "line_map", "public_names"]

LAZY_TABLE = "_LAZY_ATTRIBUTES"

_LAZY_FUNCTIONS = """

# Imported on first access (PEP 562), not when this module is imported: importing
# them initializes the CUDA driver, and every fork() after that fails.
{table} = {entries}


def __getattr__(name):
    if name not in {table}:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    import importlib

    module, attribute = {table}[name]
    value = importlib.import_module(module, __package__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set({table}))
"""


@dataclass(frozen=True)
class Deferred:
    """A source file with some of its module-level import statements deferred.

    ``lines`` are the first lines of the deferred statements (in ``before``'s
    numbering); ``lazy`` the names now resolved on first access, each with the
    module and attribute it comes from; ``moved`` the ``(name, function)``
    pairs now imported inside a function.
    """

    file: str
    before: str
    after: str
    lines: tuple[int, ...]
    lazy: tuple[tuple[str, str, str | None], ...] = ()
    moved: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The lazy names: those that must still resolve from the module after the change."""
        return tuple(name for name, _, _ in self.lazy)


def defer(file: str, source: str, lines: Iterable[int], *, package: bool, module: str) -> Deferred:
    """``source`` (the text of ``file``, the module ``module``) with the import statements at ``lines`` deferred.

    ``package``: the file is a package's ``__init__.py``.  Raises
    :class:`CannotDeferError` naming the line and the reason when a statement
    cannot wait (the caller tries a deeper cut).
    """
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider

    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        raise CannotDeferError(file, exc.raw_line, f"the file does not parse ({exc.message})") from None
    except (RecursionError, MemoryError):
        raise CannotDeferError(file, 0, "the file is too deeply nested to rewrite") from None
    positions = wrapper.resolve(PositionProvider)
    scopes = wrapper.resolve(ScopeProvider)
    tree = wrapper.module
    statements = _statements(file, tree, positions, sorted(set(lines)))
    analysis = _Analysis(file, tree, positions, scopes, package=package, module=module)
    for statement in statements:
        analysis.add(statement)
    after = _rewrite(tree, statements, analysis)
    return Deferred(
        file=file,
        before=source,
        after=after,
        lines=tuple(statement.line for statement in statements),
        lazy=tuple(analysis.lazy),
        moved=tuple((name, function.name.value) for function, names in analysis.moves.items() for name in names),
    )


def _statements(file: str, tree: cst.Module, positions: Any, lines: Sequence[int]) -> list[_Statement]:
    """The module-level import statement at each line, refused with the reason when there is none."""
    import libcst as cst

    found: dict[int, _Statement] = {}
    for line in lines:
        index, node = _top_level_at(tree, positions, line)
        if node is None:
            raise CannotDeferError(file, line, "no statement of the module starts there")
        if not isinstance(node, cst.SimpleStatementLine):
            kind = type(node).__name__.lower().replace("def", " definition")
            raise CannotDeferError(file, line, f"the import is inside a module-level `{kind}` block: move it by hand")
        imports = [small for small in node.body if isinstance(small, (cst.Import, cst.ImportFrom))]
        if len(node.body) != 1 or not imports:
            raise CannotDeferError(file, line, "the line is not a single import statement (a call there imports)")
        small = imports[0]
        if isinstance(small, cst.ImportFrom) and _dotted(small.module) == "__future__" and not small.relative:
            raise CannotDeferError(file, line, "a __future__ import cannot be deferred")
        found.setdefault(index, _Statement(index, node, small, positions[node].start.line, {}))
    return [found[index] for index in sorted(found)]


def _top_level_at(tree: cst.Module, positions: Any, line: int) -> tuple[int, Any]:
    for index, node in enumerate(tree.body):
        where = positions[node]
        if where.start.line <= line <= where.end.line:
            return index, node
    return -1, None


# ---- the rewrite -------------------------------------------------------------------------


def _rewrite(tree: cst.Module, statements: list[_Statement], analysis: _Analysis) -> str:
    import libcst as cst

    if analysis.lazy:
        clash = _defines(tree, ("__getattr__", "__dir__", LAZY_TABLE))
        if clash is not None:
            name, node = clash
            line = analysis._line(node)
            raise CannotDeferError(
                analysis.file, line, f"the module already defines {name} (line {line}): add the names by hand"
            )
    moved = tree.visit(_mover(statements, analysis.moves))
    body = list(moved.body)
    deferred = {statement.index for statement in statements}
    typed = [s for s in statements if analysis.lazy or s.index in analysis.typed]
    kept = _without(body, deferred)
    if typed:
        kept = _with_type_checking_block(kept, body, typed, deferred)
    if analysis.lazy:
        lazy = cst.parse_module(_lazy_code(analysis.lazy))
        first, *rest = lazy.body
        kept += [first.with_changes(leading_lines=[*lazy.header, *first.leading_lines]), *rest]
    return str(moved.with_changes(body=kept).code)


def _without(body: list[Any], removed: set[int]) -> list[Any]:
    """``body`` less the statements at ``removed``; the blank line above a removed statement goes to the next
    statement kept when it has none, so the file's spacing stays as it was."""
    kept: list[Any] = []
    carried: list[Any] = []
    for index, node in enumerate(body):
        if index in removed:
            carried = carried or [line for line in node.leading_lines if line.comment is None][:1]
            continue
        kept.append(node.with_changes(leading_lines=carried) if carried and not node.leading_lines else node)
        carried = []
    return kept


def _defines(tree: cst.Module, names: Sequence[str]) -> tuple[str, Any] | None:
    import libcst as cst

    for statement in tree.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value in names:
            return statement.name.value, statement
        for small in _small_statements([statement]):
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if isinstance(target.target, cst.Name) and target.target.value in names:
                        return target.target.value, statement
    return None


def _with_type_checking_block(
    kept: list[Any], body: list[Any], typed: list[_Statement], deferred: set[int]
) -> list[Any]:
    """``kept`` with ``if TYPE_CHECKING:`` holding the typed statements, after the module's leading imports
    (or where the first of them stood, when that was further down), and ``TYPE_CHECKING`` imported."""
    import libcst as cst

    inside = [s.node.with_changes(leading_lines=[line for line in s.node.leading_lines if line.comment]) for s in typed]
    block = cst.If(test=cst.Name("TYPE_CHECKING"), body=cst.IndentedBlock(body=inside), leading_lines=[cst.EmptyLine()])
    header = _header_end(body)
    first = min(s.index for s in typed)
    at = header if first < header else first
    position = sum(1 for index in range(at) if index not in deferred)
    kept = [*kept[:position], block, *kept[position:]]
    if not _binds_type_checking(body):
        start = _imports_start(kept)
        import_line = cst.parse_statement("from typing import TYPE_CHECKING\n")
        if start < len(kept):  # the new line takes the spacing above it; what follows is a group of its own
            following = kept[start]
            import_line = import_line.with_changes(leading_lines=following.leading_lines)
            kept[start] = following.with_changes(leading_lines=[cst.EmptyLine(), *_comments(following)])
        kept = [*kept[:start], import_line, *kept[start:]]
    return kept


def _comments(node: Any) -> list[Any]:
    return [line for line in node.leading_lines if line.comment is not None]


def _header_end(body: list[Any]) -> int:
    """The index after the module's leading docstring and import statements."""
    import libcst as cst

    end = 0
    for index, node in enumerate(body):
        if not isinstance(node, cst.SimpleStatementLine):
            break
        if all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in node.body):
            end = index + 1
        elif not (index == 0 and isinstance(node.body[0], cst.Expr)):
            break
    return end


def _imports_start(body: list[Any]) -> int:
    """Where a new import goes: after the docstring and ``from __future__`` imports."""
    import libcst as cst

    start = 0
    for index, node in enumerate(body):
        if not isinstance(node, cst.SimpleStatementLine):
            break
        small = node.body[0]
        docstring = index == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        future = isinstance(small, cst.ImportFrom) and _dotted(small.module) == "__future__"
        if not (docstring or future):
            break
        start = index + 1
    return start


def _binds_type_checking(body: list[Any]) -> bool:
    import libcst as cst

    for small in _small_statements(body):
        if isinstance(small, cst.ImportFrom) and _dotted(small.module) == "typing":
            names = small.names
            if not isinstance(names, cst.ImportStar) and any(
                _bound_name(alias) == "TYPE_CHECKING" and _dotted(alias.name) == "TYPE_CHECKING" for alias in names
            ):
                return True
    return False


def _lazy_code(lazy: Sequence[tuple[str, str, str | None]]) -> str:
    rows = "".join(f"    {name!r}: ({module!r}, {attribute!r}),\n" for name, module, attribute in lazy)
    entries = "{\n" + rows.replace("'", '"') + "}"
    return _LAZY_FUNCTIONS.format(table=LAZY_TABLE, entries=entries)


def _build_moved_import(small: Any, aliases: list[Any]) -> Any:
    import libcst as cst

    names = [alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in aliases]
    if isinstance(small, cst.Import):
        return cst.SimpleStatementLine(body=[cst.Import(names=names)])
    return cst.SimpleStatementLine(body=[cst.ImportFrom(module=small.module, relative=small.relative, names=names)])


def _mover(statements: list[_Statement], moves: dict[Any, list[str]]) -> Any:
    """A transformer that puts, at the top of each function using deferred names, the import of just those."""
    import libcst as cst

    def imports_for(names: list[str]) -> list[Any]:
        imports = []
        for statement in statements:
            aliases = [statement.bound[name] for name in names if statement.bound.get(name) is not None]
            if aliases:
                imports.append(_build_moved_import(statement.small, aliases))
        return imports

    class Mover(cst.CSTTransformer):
        def leave_FunctionDef(  # noqa: N802 - libcst's visitor naming
            self, original: cst.FunctionDef, updated: cst.FunctionDef
        ) -> cst.FunctionDef:
            names = moves.get(original)
            if not names:
                return updated
            body = updated.body
            if not isinstance(body, cst.IndentedBlock):  # ``def f(): return x``
                line = cst.SimpleStatementLine(body=list(body.body))  # type: ignore[arg-type]  # a suite's
                return updated.with_changes(body=cst.IndentedBlock(body=[*imports_for(names), line]))
            inner: list[Any] = list(body.body)
            at = 1 if inner and _is_docstring(inner[0]) else 0
            rest = inner[at:]
            if rest and not rest[0].leading_lines:  # a blank line between the imports and the code
                rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
            return updated.with_changes(body=body.with_changes(body=[*inner[:at], *imports_for(names), *rest]))

    return Mover()


def _is_docstring(node: Any) -> bool:
    import libcst as cst

    return (
        isinstance(node, cst.SimpleStatementLine)
        and isinstance(node.body[0], cst.Expr)
        and isinstance(node.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


# ---- lines before and after ------------------------------------------------------------------


def line_map(before: str, after: str) -> dict[int, int]:
    """``after``'s line numbers -> ``before``'s, for every line the rewrite left as it was."""
    old, new = before.splitlines(), after.splitlines()
    mapping: dict[int, int] = {}
    for block in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_matching_blocks():
        for offset in range(block.size):
            mapping[block.b + offset + 1] = block.a + offset + 1
    return mapping
