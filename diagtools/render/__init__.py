"""Renderers: results as terminal text, HTML, graphviz graphs, charts and postmortems.

:func:`present` is the one door the data model knocks on when a result is
asked to show itself (see :mod:`diagtools.model._display`); each renderer
module is imported only when its presentation is first asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from diagtools.errors import UsageError

__all__ = ["present"]

_PRESENTATIONS = {
    "scan.text": ("diagtools.render.text", "render_scan"),
    "scan.html": ("diagtools.render.html", "scan_html"),
    "scan.graph": ("diagtools.render.graph", "scan_graph"),
    "scan.shareable": ("diagtools.render.paths", "shareable"),
    "diff.text": ("diagtools.render.text", "render_diff"),
    "diff.html": ("diagtools.render.html", "diff_html"),
    "diff.graph": ("diagtools.render.graph", "diff_graph"),
    "replay.text": ("diagtools.render.text", "render_replay"),
    "replay.html": ("diagtools.render.html", "replay_html"),
    "comparison.text": ("diagtools.render.text", "render_comparison"),
    "sweep.text": ("diagtools.render.text", "render_sweep"),
    "sweep.html": ("diagtools.render.html", "sweep_html"),
    "bisect.text": ("diagtools.render.text", "render_bisect"),
    "comparison.html": ("diagtools.render.html", "comparison_html"),
    "run.text": ("diagtools.render.run_text", "render_run"),
    "run.html": ("diagtools.render.run_html", "run_html"),
    "fix.text": ("diagtools.render.cuts_text", "render_fix"),
    "fix.html": ("diagtools.render.cuts_html", "fix_html"),
    "fix.shareable": ("diagtools.render.cuts_text", "shareable_fix_text"),
}


def present(kind: str, value: object, **options: Any) -> Any:
    """Render ``value`` as ``kind``; raises :class:`UsageError` for an unknown kind."""
    if kind not in _PRESENTATIONS:
        raise UsageError(f"no presentation {kind!r}; known: {', '.join(sorted(_PRESENTATIONS))}")
    module, function = _PRESENTATIONS[kind]
    return getattr(importlib.import_module(module), function)(value, **options)
