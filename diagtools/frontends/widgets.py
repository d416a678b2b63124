"""Notebook panels (ipywidgets): inputs wired to core calls, results shown as HTML.

The panels hold no logic of their own: a button calls :func:`diagtools.scan`
or :func:`diagtools.compare_replays`, and the result's own renderers fill the
view.  Every call runs in a fresh subkernel, never in the notebook's kernel.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from diagtools.driver import DRIVER_CHOICES
from diagtools.errors import DiagtoolsError, MissingExtraError
from diagtools.frontends.progress import Stopwatch, named_runs
from diagtools.model.fix import FixResult
from diagtools.model.replay import CHILD_ACTIONS
from diagtools.model.scan import ScanResult
from diagtools.model.verdict import Tone
from diagtools.render.chart import bandwidth_chart_png
from diagtools.render.cuts_html import fix_html
from diagtools.render.html import bench_table_html, comparison_html, module_html, scan_html
from diagtools.render.ordering import picker_options
from diagtools.render.style import HTML_COLOURS
from diagtools.runner.subkernel import run_subkernel
from diagtools.usecases.fix import fix
from diagtools.usecases.replay import compare_replays
from diagtools.usecases.scan import scan

try:
    import ipywidgets as w
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a subprocess
    raise MissingExtraError("ipywidgets", "notebook") from None

__all__ = ["BenchPanel", "ReplayPanel", "ScanPanel"]


def _split_paths(text: str) -> list[str]:
    return [part.strip() for part in text.replace(",", ":").split(":") if part.strip()]


_BUSY_STYLE = (
    "<style>.dt-busy{display:inline-flex;align-items:center;gap:8px;font:13px system-ui,sans-serif}"
    ".dt-busy i{width:14px;height:14px;border:2px solid #9ecae1;border-top-color:#1f77b4;border-radius:50%;"
    "animation:dt-spin .8s linear infinite}@keyframes dt-spin{to{transform:rotate(360deg)}}</style>"
)
_WAITING = (
    '<p class="dt-waiting"><i>No result yet. In a running notebook the panel above fills this in; '
    "its last result stays here, saved and exported with the notebook.</i></p>"
)
REOPEN_HINT = (
    "The buttons answer while this notebook's kernel runs the cell; after reopening the notebook, run it again "
    "(Run &gt; Run All Cells)."
)
_RUNNING = '<p class="dt-waiting"><i>Running&hellip; the result appears here when it is done.</i></p>'


def done_status(what: str, seconds: float) -> str:
    """A panel's status line once its work ended: what ran, in neutral words; the verdict is said once, in the
    result below it, in its colour."""
    return f"done in {seconds:.1f} s: {what}; the answer is below"


def stopped_status(exc: BaseException, seconds: float) -> str:
    """A panel's status line when its work raised: the error's kind; its message is in the result below."""
    return f"stopped by {escape(type(exc).__name__)} after {seconds:.1f} s; the message is below"


def _targets(result: ScanResult) -> str:
    return ", ".join(f"<code>{escape(target)}</code>" for target in result.targets)


def _problem_html(message: str) -> str:
    """Why the work stopped, in the amber of "no answer" (red and green are kept for verdicts)."""
    return f'<p style="color:{HTML_COLOURS[Tone.UNKNOWN]};font-weight:600">{escape(message)}</p>'


def _widget_bundle(widget: Any, text: str) -> dict[str, Any]:
    """The widget's display data with ``text`` as the plain fallback instead of its ``VBox(children=...)`` repr.

    An exported notebook (nbconvert) and a notebook reopened without widget
    state fall back to ``text/plain``: it should say what the panel is.
    """
    bundle = dict(widget._repr_mimebundle_() or {})
    bundle["text/plain"] = text
    return bundle


class _StaticView:
    """The panel's last result as plain HTML output of the cell: saved with the notebook and exported.

    Widgets need the live kernel and saved widget state; this copy does not,
    so a reopened or exported notebook still shows the result (and its graph
    view's script runs wherever the page is trusted).
    """

    def __init__(self) -> None:
        self.value = ""
        self.handle: Any = None

    def attach(self) -> None:
        from IPython.display import HTML, display

        self.handle = display(HTML(self.value or _WAITING), display_id=True)

    def show(self, html: str) -> None:
        self.value = html
        if self.handle is not None:
            from IPython.display import HTML

            self.handle.update(HTML(html))


class _Panel:
    """Shared plumbing: a status line, a live busy line (phase and elapsed time), work off the kernel's thread."""

    widget: Any

    def __init__(self, background: bool) -> None:
        self.background = background
        self.status = w.HTML(layout=w.Layout(max_width="100%"))
        self.busy = w.HTML(layout=w.Layout(display="none"))
        # saved with the widget state: a reopened panel, whose buttons reach no kernel, says what to run
        self.hint = w.HTML(f"<small style='color:#555'>{REOPEN_HINT}</small>")
        self.stopwatch = Stopwatch()
        self.view = _StaticView()
        self.worker: threading.Thread | None = None

    def _tick(self) -> None:
        self.busy.value = f'{_BUSY_STYLE}<span class="dt-busy"><i></i>{escape(self.stopwatch.line())}</span>'

    def _ticker(self) -> None:
        while self.stopwatch.running:
            self._tick()
            time.sleep(0.25)

    def _run(self, work: Callable[[], str], message: str, phase: str) -> None:
        self.status.value = message
        self.view.show(_RUNNING)
        self.stopwatch.start(phase)
        self._tick()
        self.busy.layout.display = ""

        def guarded() -> None:
            try:
                ran = work()  # what ran, in neutral words
                self.status.value = done_status(ran, self.stopwatch.stop())
            except DiagtoolsError as exc:
                self.status.value = stopped_status(exc, self.stopwatch.stop())
                self.view.show(_problem_html(f"{type(exc).__name__}: {exc}"))
            except Exception as exc:  # a widget callback's traceback would only reach the kernel log
                self.status.value = stopped_status(exc, self.stopwatch.stop())
                self.view.show(_problem_html(f"internal error: {exc!r}"))
                raise
            finally:
                self.stopwatch.stop()  # whatever ended the work, the live line stops
                self.busy.layout.display = "none"

        if self.background:
            threading.Thread(target=self._ticker, daemon=True).start()
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

        name = type(self).__name__
        display(
            _widget_bundle(self.widget, f"{name}: interactive in a running notebook; its last result follows."),
            raw=True,
        )
        self.view.attach()


def _wrapping_row(children: list[Any]) -> Any:
    return w.HBox(children, layout=w.Layout(flex_flow="row wrap", width="100%", align_items="center"))


def _field(widget: Any, basis: str) -> Any:
    widget.layout = w.Layout(flex=f"1 1 {basis}", min_width="160px", width="auto")
    widget.style = {"description_width": "56px"}
    return widget


class ScanPanel(_Panel):
    """Target and path inputs, a driver choice, a Scan button, the result with its graph, and module details."""

    def __init__(
        self,
        target: str = "",
        path: str | Sequence[str] = "",
        driver: str = "auto",
        *,
        background: bool = True,
        scanner: Callable[..., ScanResult] = scan,
        fixer: Callable[..., FixResult] = fix,
    ) -> None:
        super().__init__(background)
        self.scanner, self.fixer = scanner, fixer
        self.result: ScanResult | None = None
        self.fix_result: FixResult | None = None
        self.target = _field(w.Text(value=target, description="target", placeholder="pkg.module"), "200px")
        path_text = path if isinstance(path, str) else ":".join(map(str, path))
        self.path = _field(w.Text(value=path_text, description="path", placeholder="DIR[:DIR]"), "260px")
        self.driver = _field(w.Dropdown(options=list(DRIVER_CHOICES), value=driver, description="driver"), "140px")
        # no icons: a font a reopened or exported page may not load would show as broken glyphs
        self.scan_button = w.Button(description="Scan", button_style="primary")
        self.fix_button = w.Button(
            description="Suggest fix", tooltip="the nearest verified cut as a checked patch, and a guard"
        )
        self.module_picker = _field(w.Dropdown(options=[], description="module"), "300px")
        self.all_modules = w.Checkbox(value=False, description="all modules", indent=False)
        self.scan_button.on_click(lambda _: self.run_scan())
        self.fix_button.on_click(lambda _: self.run_fix())
        self.module_picker.observe(lambda change: self.show_module(change["new"]), names="value")
        self.all_modules.observe(lambda _: self._fill_picker(), names="value")
        controls = _wrapping_row([self.target, self.path, self.driver, self.scan_button, self.fix_button])
        picker = _wrapping_row([self.module_picker, self.all_modules])
        self.widget = w.VBox(
            [controls, _wrapping_row([self.busy, self.status]), picker, self.hint],
            layout=w.Layout(width="100%", max_width="100%", overflow="hidden"),
        )

    def run_scan(self) -> None:
        """Scan the target in a fresh subkernel and show the result."""
        self._call(self.scanner, self.show, "scanning {} in a fresh subkernel&hellip;")

    def run_fix(self) -> None:
        """Find the nearest verified cut, write it as a patch checked on a copy, and show it with its guard."""
        self._call(self.fixer, self.show_fix, "looking for the fix of {}&hellip;")

    def _call(self, call: Callable[..., Any], show: Callable[[Any], str], message: str) -> None:
        """``show(call(target, path=..., driver=..., runner=...))`` off the kernel's thread, each run named by
        what it is for (:func:`~diagtools.frontends.progress.scan_phase`)."""
        target, paths, driver = self.target.value.strip(), _split_paths(self.path.value), self.driver.value
        runner = named_runs(run_subkernel, self.stopwatch.phase)
        self._run(
            lambda: show(call(target, path=paths, driver=driver, runner=runner)),
            message.format(f"<code>{escape(target)}</code>"),
            SCAN_PHASES[0],
        )

    def show_fix(self, result: FixResult) -> str:
        """Show the fix; return what ran, for the status line."""
        self.fix_result = result
        self.view.show(fix_html(result))
        return (
            f"searched a verified cut for {_targets(result.scan)} and checked its patch on a copy"
            f" (driver {escape(result.scan.driver.kind)})"
        )

    def show(self, result: ScanResult) -> str:
        """Show the scan with its graph; return what ran, for the status line."""
        self.result = result
        self.stopwatch.phase("drawing the graph")
        self._fill_picker()
        if self.module_picker.options and self.module_picker.value is None:
            self.module_picker.value = self.module_picker.options[0]  # the culprit, when there is one
        self._render()
        return f"imported {_targets(result)} in a fresh subkernel (driver {escape(result.driver.kind)})"

    def _fill_picker(self) -> None:
        if self.result is not None:
            self.module_picker.options = picker_options(self.result, everything=self.all_modules.value)

    def _render(self) -> None:
        if self.result is None:
            return
        selected = self.module_picker.value
        html = scan_html(self.result, graph=True, selected=selected)
        if selected and 'class="dtg"' not in html:  # no graph view to show the module's details in
            html += module_html(self.result, selected)
        self.view.show(html)

    def show_module(self, name: str | None) -> None:
        """Select the module in the graph below, which shows its details (once)."""
        if self.result is not None and name:
            self._render()


SCAN_PHASES = ("importing the target in a fresh subkernel",)
REPLAY_PHASES = tuple(
    f"replay {variant}/{method}: parent imports the target, child calls CUDA"
    for variant in ("before", "after")
    for method in ("fork", "spawn")
)


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
        self.target = _field(w.Text(value=target, description="target"), "200px")
        self.before = _field(w.Text(value=str(before), description="before/"), "300px")
        self.after = _field(w.Text(value=str(after), description="after/"), "300px")
        self.child = _field(w.Dropdown(options=list(CHILD_ACTIONS), value=child, description="child"), "140px")
        self.driver = _field(w.Dropdown(options=list(DRIVER_CHOICES), value=driver, description="driver"), "140px")
        self.compare_button = w.Button(description="Replay", button_style="warning")
        self.comparison: Any = None
        self.compare_button.on_click(lambda _: self.run_compare())
        inputs = w.VBox(
            [
                _wrapping_row([self.target]),
                _wrapping_row([self.before, self.after]),
                _wrapping_row([self.child, self.driver, self.compare_button]),
            ],
            layout=w.Layout(width="100%"),
        )
        self.widget = w.VBox(
            [inputs, _wrapping_row([self.busy, self.status]), self.hint],
            layout=w.Layout(width="100%", max_width="100%", overflow="hidden"),
        )

    def run_compare(self) -> None:
        runner = self.stopwatch.phased(run_subkernel, REPLAY_PHASES)

        def work() -> str:
            self.comparison = compare_replays(
                self.target.value.strip(),
                before=self.before.value,
                after=self.after.value,
                child=self.child.value,
                driver=self.driver.value,
                runner=runner,
            )
            self.view.show(comparison_html(self.comparison))
            return f"{len(self.comparison.runs)} replays in fresh subkernels"

        self._run(work, "replaying before/after under fork and spawn&hellip;", REPLAY_PHASES[0])


class BenchPanel:
    """Kernel timings: the table, and a bar chart of achieved bandwidth per size and backend.

    Nothing here is interactive, so the panel is plain HTML (the table and the
    chart as an inline PNG): it survives saving, reopening and exporting as is.
    ``note`` (say, that CPU times mean nothing) heads the table and the chart.
    """

    columns = ("size", "backend", "median_ms", "GB/s", "copy_fraction", "max_rel_error")

    def __init__(
        self, rows: Sequence[dict[str, Any]], *, title: str = "compress_norm_rope_store", note: str = ""
    ) -> None:
        self.rows = list(rows)
        self.title, self.note = title, note
        self.png = self.chart_png(title)

    def chart_png(self, title: str) -> bytes:
        return bandwidth_chart_png(self.rows, title, note=self.note)

    def _repr_html_(self) -> str:
        table = bench_table_html(self.rows, list(self.columns), caption=self.note)
        image = base64.b64encode(self.png).decode("ascii")
        chart = (
            f'<img alt="{escape(self.title)}" style="max-width:100%;height:auto" src="data:image/png;base64,{image}">'
        )
        return f"{table}<div>{chart}</div>"
