"""Notebook panels (ipywidgets): inputs wired to core calls, results shown as HTML.

The panels hold no logic of their own: a button calls :func:`diagtools.scan`
or :func:`diagtools.compare_replays`, and the result's own renderers fill the
view.  Every call runs in a fresh subkernel, never in the notebook's kernel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from diagtools.driver import DRIVER_CHOICES
from diagtools.errors import DiagtoolsError, MissingExtraError
from diagtools.model.replay import CHILD_ACTIONS
from diagtools.model.scan import ScanResult
from diagtools.render.chart import bandwidth_chart_png
from diagtools.render.html import bench_table_html, comparison_html, module_html, scan_html
from diagtools.usecases.replay import compare_replays
from diagtools.usecases.scan import scan

try:
    import ipywidgets as w
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a subprocess
    raise MissingExtraError("ipywidgets", "notebook") from None

__all__ = ["BenchPanel", "ReplayPanel", "ScanPanel"]


def _split_paths(text: str) -> list[str]:
    return [part.strip() for part in text.replace(",", ":").split(":") if part.strip()]


class _Panel:
    """Shared plumbing: a status line, a busy bar, and running work off the kernel's thread."""

    widget: Any

    def __init__(self, background: bool) -> None:
        self.background = background
        self.status = w.HTML()
        self.busy = w.IntProgress(value=0, min=0, max=1, bar_style="info", layout=w.Layout(visibility="hidden"))
        self.worker: threading.Thread | None = None

    def _run(self, work: Callable[[], None], message: str) -> None:
        self.status.value = message
        self.busy.layout.visibility = "visible"

        def guarded() -> None:
            try:
                work()
            except DiagtoolsError as exc:
                self.status.value = f'<span style="color:#b00020">{type(exc).__name__}: {escape(str(exc))}</span>'
            except Exception as exc:  # a widget callback's traceback would only reach the kernel log
                self.status.value = f'<span style="color:#b00020">internal error: {escape(repr(exc))}</span>'
                raise
            finally:
                self.busy.layout.visibility = "hidden"

        if self.background:
            self.worker = threading.Thread(target=guarded, daemon=True)
            self.worker.start()
        else:
            guarded()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the last background run finished (for scripts and tests)."""
        if self.worker is not None:
            self.worker.join(timeout)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


class ScanPanel(_Panel):
    """Target and path inputs, a driver choice, a Scan button, the result and module details."""

    def __init__(
        self,
        target: str = "",
        path: str | Sequence[str] = "",
        driver: str = "auto",
        *,
        background: bool = True,
        scanner: Callable[..., ScanResult] = scan,
    ) -> None:
        super().__init__(background)
        self.scanner = scanner
        self.result: ScanResult | None = None
        self.target = w.Text(value=target, description="target", placeholder="pkg.module")
        self.path = w.Text(value=path if isinstance(path, str) else ":".join(map(str, path)), description="path")
        self.driver = w.Dropdown(options=list(DRIVER_CHOICES), value=driver, description="driver")
        self.scan_button = w.Button(description="Scan", button_style="primary", icon="search")
        self.view = w.HTML()
        self.module_picker = w.Dropdown(options=[], description="module")
        self.details = w.HTML()
        self.scan_button.on_click(lambda _: self.run_scan())
        self.module_picker.observe(lambda change: self.show_module(change["new"]), names="value")
        controls = w.HBox([self.target, self.path, self.driver, self.scan_button])
        self.widget = w.VBox([controls, w.HBox([self.busy, self.status]), self.view, self.module_picker, self.details])

    def run_scan(self) -> None:
        """Scan the target in a fresh subkernel and show the result."""
        target, paths, driver = self.target.value.strip(), _split_paths(self.path.value), self.driver.value
        self._run(
            lambda: self.show(self.scanner(target, path=paths, driver=driver)),
            f"scanning <code>{target}</code> in a fresh subkernel&hellip;",
        )

    def show(self, result: ScanResult) -> None:
        self.result = result
        self.view.value = scan_html(result, graph=True)
        culprits = [c.module for c in result.culprits if c.module]
        self.module_picker.options = culprits + sorted(set(result.module_names()) - set(culprits))
        self.status.value = f"done: {result.status}, driver {result.driver.kind}"

    def show_module(self, name: str | None) -> None:
        if self.result is not None and name:
            self.details.value = module_html(self.result, name)


class ReplayPanel(_Panel):
    """Before/after trees under fork and spawn, side by side."""

    def __init__(
        self,
        target: str = "",
        before: str = "",
        after: str = "",
        driver: str = "auto",
        *,
        child: str = "cuinit",
        background: bool = True,
    ) -> None:
        super().__init__(background)
        self.target = w.Text(value=target, description="target")
        self.before = w.Text(value=str(before), description="before/")
        self.after = w.Text(value=str(after), description="after/")
        self.child = w.Dropdown(options=list(CHILD_ACTIONS), value=child, description="child")
        self.driver = w.Dropdown(options=list(DRIVER_CHOICES), value=driver, description="driver")
        self.compare_button = w.Button(description="Replay", button_style="warning", icon="play")
        self.view = w.HTML()
        self.comparison: Any = None
        self.compare_button.on_click(lambda _: self.run_compare())
        inputs = w.VBox([self.target, self.before, self.after, w.HBox([self.child, self.driver, self.compare_button])])
        self.widget = w.VBox([inputs, w.HBox([self.busy, self.status]), self.view])

    def run_compare(self) -> None:
        def work() -> None:
            self.comparison = compare_replays(
                self.target.value.strip(),
                before=self.before.value,
                after=self.after.value,
                child=self.child.value,
                driver=self.driver.value,
            )
            self.view.value = comparison_html(self.comparison)
            self.status.value = "done"

        self._run(work, "replaying before/after under fork and spawn&hellip;")


class BenchPanel:
    """Kernel timings: the table, and a bar chart of achieved bandwidth per size and backend."""

    columns = ("size", "backend", "median_ms", "GB/s", "copy_fraction", "max_rel_error")

    def __init__(self, rows: Sequence[dict[str, Any]], *, title: str = "compress_norm_rope_store") -> None:
        self.rows = list(rows)
        self.table = w.HTML(bench_table_html(self.rows, list(self.columns)))
        self.chart = w.Image(value=self.chart_png(title), format="png")
        self.widget = w.VBox([self.table, self.chart])

    def chart_png(self, title: str) -> bytes:
        return bandwidth_chart_png(self.rows, title)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
