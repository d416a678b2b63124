"""Notebook exports a reader opens anywhere, offline included: the kept static results, no live widgets.

A panel's live view needs the widget manager's scripts, which an exported page
loads from a public CDN; offline, or once the kernel is gone, that view is a
blank box.  Every panel also leaves a static copy of its result as a plain
output, so an export drops the saved widget state: each widget then reads as
the one line that names it, and the static copy carries the result.
``make lab`` registers :class:`StaticWidgets` for JupyterLab's own export
(File > Save and Export Notebook As > HTML); the demo exports through
:func:`notebook_html`.
"""

from __future__ import annotations

from typing import Any

from nbconvert.preprocessors import Preprocessor

__all__ = ["WIDGET_STATE", "StaticWidgets", "notebook_html"]

WIDGET_STATE = "widgets"  # the notebook metadata key holding the saved widget state


class StaticWidgets(Preprocessor):
    """Drop the saved widget state, so the exported page loads no widget script and shows the static results."""

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        nb.metadata.pop(WIDGET_STATE, None)
        return nb, resources


def notebook_html(notebook: Any) -> str:
    """The notebook as one HTML page, exported the way JupyterLab's export does under ``make lab``."""
    import copy

    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    exporter.register_preprocessor(StaticWidgets(), enabled=True)
    html, _ = exporter.from_notebook_node(copy.deepcopy(notebook))
    return html
