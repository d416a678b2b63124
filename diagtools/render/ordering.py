"""Which modules a reader sees first: the culprit chain, then the target's own package, then the rest.

Lists of module names (a diff's removed modules, a panel's module picker) are
ordered and grouped here, once, so the terminal, the HTML and the widgets
agree: the chain in chain order, the target's own package in import order,
other packages collapsed to one entry each, the standard library to one line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from diagtools.model.scan import ScanResult

__all__ = ["ModuleGroups", "group_modules", "picker_options"]

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def is_stdlib(name: str) -> bool:
    """True for the standard library's modules (``sys.stdlib_module_names``), ``_ast`` and ``os.path`` alike."""
    top = _top(name)
    return top in _STDLIB or top.startswith("_sysconfigdata_")


@dataclass(frozen=True)
class ModuleGroups:
    """Module names split for display; every name lands in exactly one group."""

    chain: tuple[str, ...]
    own: tuple[str, ...]
    others: tuple[tuple[str, tuple[str, ...]], ...]  # (top-level package, its modules), biggest first
    stdlib: tuple[str, ...]

    @property
    def total(self) -> int:
        return len(self.chain) + len(self.own) + sum(len(m) for _, m in self.others) + len(self.stdlib)

    def shown(self, limit: int) -> list[GroupLine]:
        """What a list of these groups shows, line by line: the chain, the target's package (up to ``limit``),
        one line per other package (up to ``limit``), then the standard library in one line."""
        lines = [GroupLine(name, "(culprit chain)") for name in self.chain]
        lines += [GroupLine(name) for name in self.own[:limit]]
        if len(self.own) > limit:
            lines.append(GroupLine(None, f"... {len(self.own) - limit} more of the target's package"))
        for package, modules in self.others[:limit]:
            count = f"{len(modules)} module{'s' if len(modules) != 1 else ''}"
            lines.append(GroupLine(f"{package}.*", f": {count}", ", ".join(modules)))
        hidden = self.others[limit:]
        if hidden:
            lines.append(GroupLine(None, f"... {len(hidden)} more packages, {sum(len(m) for _, m in hidden)} modules"))
        if self.stdlib:
            preview = ", ".join(self.stdlib[:4]) + (", ..." if len(self.stdlib) > 4 else "")
            lines.append(GroupLine(None, f"standard library: {len(self.stdlib)} modules ({preview})"))
        return lines


@dataclass(frozen=True)
class GroupLine:
    """One line of a grouped module list: a ``name`` shown as code (``title``: the modules it stands for), then
    ``words`` (a count after a package, a note after a module, or the whole line when there is no name)."""

    name: str | None
    words: str = ""
    title: str = ""


def group_modules(names: Iterable[str], *, targets: Sequence[str], chain: Sequence[str] = ()) -> ModuleGroups:
    """Split ``names`` (kept in their given order) into chain, own package, other packages and stdlib."""
    ordered = list(dict.fromkeys(names))
    present = set(ordered)
    on_chain = tuple(m for m in chain if m in present)
    own_packages = {_top(t) for t in targets}
    rest = [m for m in ordered if m not in set(on_chain)]
    own = tuple(m for m in rest if _top(m) in own_packages)
    stdlib = tuple(sorted(m for m in rest if _top(m) not in own_packages and is_stdlib(m)))
    packages: dict[str, list[str]] = {}
    for name in rest:
        if _top(name) not in own_packages and not is_stdlib(name):
            packages.setdefault(_top(name), []).append(name)
    others = tuple(sorted(((p, tuple(m)) for p, m in packages.items()), key=lambda item: (-len(item[1]), item[0])))
    return ModuleGroups(on_chain, own, others, stdlib)


def picker_options(result: ScanResult, *, everything: bool = False) -> list[str]:
    """A module picker's entries: the culprits, their chains, then the target's own package in import order.

    With ``everything`` the other packages follow, then the standard library.
    """
    culprits = [c.module for c in result.culprits if c.module]
    chain = culprits + [m for culprit in result.culprits for m in culprit.chain]
    groups = group_modules(result.module_names(), targets=result.targets, chain=list(dict.fromkeys(chain)))
    options = [*groups.chain, *groups.own]
    if everything:
        options += [m for _, modules in groups.others for m in modules] + list(groups.stdlib)
    return options
