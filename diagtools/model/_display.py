"""How results present themselves (``str``, ``_repr_html_``, ``graph``) without depending on the renderers.

The renderers sit above the model: they import it, never the other way round.
A result that is asked to show itself names the presentation it wants and
:mod:`diagtools.render` is looked up by name at call time, so the model's
import graph stays acyclic and ``import diagtools.model`` loads no renderer.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["present"]

RENDER_PACKAGE = "diagtools.render"


def present(kind: str, value: object, **options: Any) -> Any:
    """Render ``value`` as ``kind`` (``"scan.text"``, ``"diff.html"``...) with the renderers' own function."""
    renderers = importlib.import_module(RENDER_PACKAGE)
    return renderers.present(kind, value, **options)
