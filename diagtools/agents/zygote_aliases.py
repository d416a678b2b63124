"""The sweep zygote's watched names: modules a kept preload loaded that a row must not simply find.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role.  Two kinds of module are watched, each guarded by the candidate
whose import loaded it.

*Aliases.*  A learned candidate may register a module under a name not its own
(vLLM's ``fused_moe`` registers its vendored ``triton_kernels`` so, and
``import triton_kernels`` then finds it).  A fresh subkernel has that name
only once its row imported the candidate.

*Modules that fail alone.*  A candidate may load a module that fails to
import on its own (``fused_moe`` loads ``flashinfer_utils``, whose circular
import fails when it is entered first), and some file a row could run names
it.  A fresh subkernel finds it loaded only when its row imported the
candidate first.

So the candidate (with the modules below it) is watched too, as their
*guard*: a lookup of the guard is noted, and a lookup of a module it guards
marks the row unless the guard was looked up before it in that row (a fresh
subkernel would then have imported the candidate, and found the module as the
candidate left it).

A watched module is taken out of ``sys.modules`` (and a guarded one out of
its package's attributes, reached through that package's ``__getattr__``
instead), and a finder first on ``sys.meta_path`` hands the same module back
when it is looked up, its own ``__spec__`` kept.  A marked row's result is
thrown away and the module scanned in a fresh subkernel.  A row forked from a
package zygote inherits what that package's own import looked up (that import
is part of every row below it).  A later candidate whose import makes a mark
is passed over: it was built on the watched module.  Rows that make no mark
are exactly as without the candidate.

Standard library and the protocol only.
"""

import sys

z = sys.modules["__main__"]  # the zygote itself: its files

_hidden: dict = {}  # watched name -> the module, out of sys.modules until looked up
_specs: dict = {}  # watched name -> the module's own __spec__, kept when it is handed back
_guard_of: dict = {}  # watched name -> the candidate that loaded it (its guard)
_aliases: set = set()  # the watched names that are aliases (the others fail to import on their own)
_guards: set = set()  # the guards: a lookup of one (or of a module below it) is noted, not marked
_hooks: list = []  # the packages' __getattr__ functions put in by this file


class _State:
    """What this process looked up: its mark, the row it scans, the guards it entered."""

    marked: tuple = ()  # (the watched name, why), once something marked this process
    index: object = None  # the row this process scans (a child), else None
    entered: frozenset = frozenset()  # guards looked up in this process (since the zygote was ready)


class _HandBack:
    """The loader of a watched name: the module it stands for, as it was."""

    def __init__(self, name, module):
        self.name, self.module = name, module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        if self.name in _specs:
            module.__spec__ = _specs[self.name]  # the import system set a spec of ours on it


class _Watch:
    """The finder first on ``sys.meta_path``: a lookup of a watched name is judged, then finds it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        module = _hidden.get(name)
        if module is None:
            return None
        _looked_up(name)
        return sys.modules["_frozen_importlib"].ModuleSpec(name, _HandBack(name, module))

    @staticmethod
    def invalidate_caches():
        pass


def _within(name, names):
    """The name of ``names`` that ``name`` is or lies below, or None."""
    parts = name.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        if prefix in names:
            return prefix
    return None


def _looked_up(name):
    """A lookup of watched ``name``: a guard is noted as entered; anything else marks the row unless its
    guard was entered first."""
    guard = _within(name, _guards)
    if guard is not None:
        _State.entered = _State.entered | {guard}
        return
    guarded = _within(name, _guard_of) or _within(name, _hidden)
    candidate = _guard_of.get(guarded)
    if candidate is not None and candidate in _State.entered:
        return  # a fresh subkernel had imported the candidate too, and found the module as loaded by it
    if guarded not in _aliases:
        _mark(guarded, f"its import looks up {guarded}, which fails to import on its own, before {candidate}")
    elif candidate:
        _mark(guarded, f"its import looks up {guarded} before {candidate}, which registered it")
    else:
        _mark(guarded, f"its import looks up {guarded}, which the preload registered")


def _mark(name, why):
    """Mark this process's row (in the zygote: the candidate being imported): it looked ``name`` up."""
    if not _State.marked:
        _State.marked = (name, why)
    if _State.index is not None:
        z._write_own(_State.index, "alias", _State.marked[0])


def _parent_getattr(parent, previous):
    """A package's ``__getattr__`` that reaches its guarded submodules (as a lookup), then ``previous``."""

    def reach(attribute):
        name = f"{parent}.{attribute}"
        if name in _hidden:
            _looked_up(name)
            return _hidden[name]
        if previous is not None:
            return previous(attribute)
        raise AttributeError(f"module {parent!r} has no attribute {attribute!r}")

    _hooks.append(reach)
    return reach


def _hide(name):
    """Take ``name`` and the modules below it out of ``sys.modules``; a guarded one out of its package too."""
    below = name + "."
    for key in [key for key in sys.modules if key == name or key.startswith(below)]:
        module = sys.modules.pop(key)
        _hidden[key] = module
        if hasattr(module, "__spec__"):
            _specs[key] = module.__spec__
    if name in _guard_of and name not in _aliases:
        _out_of_package(name)


def _out_of_package(name):
    parent_name, _, attribute = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    namespace = getattr(parent, "__dict__", None)
    if namespace is None or namespace.get(attribute) is not _hidden.get(name):
        return
    del namespace[attribute]
    previous = namespace.get("__getattr__")
    if not any(previous is hook for hook in _hooks):
        namespace["__getattr__"] = _parent_getattr(parent_name, previous)


def _install():
    if _hidden and not any(finder is _Watch for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watch)


def guard(names, candidate, alias=False):
    """Watch each of ``names`` (modules ``candidate`` loaded that fail to import on their own, or with
    ``alias`` the names it registered a module under) with ``candidate`` (and the modules below it) as
    their guard; the names now watched.  No ``candidate``: each lookup marks the row."""
    if candidate:
        _guards.add(candidate)
        _guard_of.update(dict.fromkeys(names, candidate))
    if alias:
        _aliases.update(names)
    for name in (candidate, *names) if candidate else names:
        _hide(name)
    _install()
    return sorted(name for name in names if name in _hidden)


def watch_lines(lines):
    """Watch what a preload checked elsewhere watched (``NAME<TAB>CANDIDATE[<TAB>alias]`` lines, from
    ``ZygoteOutcome.watched_lines``); ``{candidate: (aliases, modules that fail alone)}`` now watched."""
    found: dict = {}
    for line in lines:
        name, _, rest = line.partition("\t")
        candidate, _, kind = rest.partition("\t")
        found.setdefault(candidate, ([], []))[kind != "alias"].append(name)
    return {
        candidate: (guard(aliases, candidate, alias=True), guard(alone, candidate))
        for candidate, (aliases, alone) in found.items()
    }


def rewatch():
    """In the zygote, after a kept candidate's import (which may have looked watched names up, and so put
    them back) and before it forks rows: every watched module out of sight again, no guard entered."""
    for name in list(_hidden):
        if sys.modules.get(name) is _hidden[name]:
            del sys.modules[name]
    for name in _guard_of.keys() - _aliases:
        _out_of_package(name)
    _State.entered = frozenset()


def outermost(names):
    """``names`` in order, less each one below another of them (``a.b`` goes with ``a``)."""
    return sorted(name for name in names if not any(name.startswith(other + ".") for other in names))


def hidden():
    """Every module watched in this process, by name (still loaded: the preload's files count for each row)."""
    return dict(_hidden)


def marked():
    """Why this process was marked (a candidate's import, in the zygote), or ``""``."""
    return _State.marked[1] if _State.marked else ""


def arm(index):
    """In the child that scans row ``index``: mark it when a lookup calls for it, or at once when the import
    its row goes on from (a package zygote's) already made a mark."""
    _State.index = index
    if _State.marked:
        _mark(*_State.marked)
