"""The sweep zygote's watched aliases: modules a kept preload registered under a name not their own.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role.  A learned candidate may register a module under another name (vLLM
registers its vendored ``triton_kernels`` so, and ``import triton_kernels``
then finds it).  A fresh subkernel has that name only once its row imported
the candidate; a row whose own import looks the name up (an ``import``
statement, ``importlib.util.find_spec``) while the candidate is preloaded
might find what the fresh one would not.  So instead of passing the candidate
over, the zygote takes the name (and the modules below it) out of
``sys.modules`` and watches it with a finder first on ``sys.meta_path``: a
lookup gets the same module back, and marks the row that made it, whose
result is then thrown away and the module scanned in a fresh subkernel.  A
row forked from a package zygote whose own import made a lookup is marked as
well (that import is part of every row below it).  A later candidate whose
import makes a lookup is passed over: it was built on the alias.  Rows that
never look the name up are exactly as without the candidate's registration.

Standard library and the protocol only.
"""

import sys

z = sys.modules["__main__"]  # the zygote itself: its files

_hidden: dict = {}  # watched name -> the module registered under it, out of sys.modules until looked up
_state = {"looked_up": False, "index": None}  # a lookup happened in this process; the row it scans


class _HandBack:
    """The loader of a watched name: the module that was registered under it, as it was."""

    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


class _Watch:
    """The finder first on ``sys.meta_path``: a lookup of a watched name marks the row, then finds it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        module = _hidden.get(name)
        if module is None:
            return None
        _mark()
        return sys.modules["_frozen_importlib"].ModuleSpec(name, _HandBack(module))

    @staticmethod
    def invalidate_caches():
        pass


def _mark():
    _state["looked_up"] = True
    if _state["index"] is not None:
        z._write_own(_state["index"], "alias", "looked up")


def watch(names):
    """Take each of ``names`` (registered aliases) and the modules below it out of ``sys.modules`` and watch
    them; the names now watched."""
    for name in names:
        below = name + "."
        for key in [key for key in sys.modules if key == name or key.startswith(below)]:
            _hidden[key] = sys.modules.pop(key)
    if _hidden and not any(finder is _Watch for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watch)
    return sorted(name for name in names if name in _hidden)


def outermost(names):
    """``names`` in order, less each one below another of them (``a.b`` goes with ``a``)."""
    return sorted(name for name in names if not any(name.startswith(other + ".") for other in names))


def watched():
    """The names watched in this process (not those below them), in order."""
    return outermost(_hidden)


def looked_up():
    """Whether something in this process looked a watched name up (a candidate's import, in the zygote)."""
    return _state["looked_up"]


def arm(index):
    """In the child that scans row ``index``: mark it when a lookup happens, or at once when the import its
    row goes on from (a package zygote's) already made one."""
    _state["index"] = index
    if _state["looked_up"]:
        _mark()
