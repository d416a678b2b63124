"""How results present themselves (``str``, ``_repr_html_``, ``graph``) without depending on the renderers.

The renderers sit above the model: they import it, never the other way round.
A result that is asked to show itself names the presentation it wants and
:mod:`diagtools.render` is looked up by name at call time, so the model's
import graph stays acyclic and ``import diagtools.model`` loads no renderer.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TextReport", "present"]

RENDER_PACKAGE = "diagtools.render"


def present(kind: str, value: object, **options: Any) -> Any:
    """Render ``value`` as ``kind`` (``"scan.text"``, ``"diff.html"``...) with the renderers' own function."""
    renderers = importlib.import_module(RENDER_PACKAGE)
    return renderers.present(kind, value, **options)


class TextReport:
    """Mixin: in a terminal IPython (and any ``text/plain`` display) a result shows its text report.

    IPython prefers a class's own ``__repr__`` (which ``@dataclass`` writes) to an
    inherited ``_repr_pretty_``, so every subclass gets the method in its own namespace.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_repr_pretty_" not in vars(cls):  # a type's own (a scan's, with shareable paths) is kept
            cls._repr_pretty_ = TextReport._repr_pretty_  # type: ignore[method-assign]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The text report when the type has one (its ``__str__``), else the usual repr."""
        printer.text(str(self) if type(self).__str__ is not object.__str__ else repr(self))
