"""Progress for long calls: tqdm or an ipywidgets bar for sweeps, a stopwatch with phases for panels."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from diagtools.errors import MissingExtraError

__all__ = [
    "PhaseLine",
    "Stopwatch",
    "SweepProgress",
    "named_runs",
    "notebook_progress",
    "phase_line",
    "scan_phase",
    "terminal_progress",
    "working",
]


class SweepProgress:
    """A sweep on a terminal: the live phase line (finding modules, the preload) until its first row, then the
    bar, which names the stage the rows come from (learning, checking candidates, scanning); a phase after the
    last row (the cut searches) gets a phase line again.  Cleared by :meth:`close`."""

    def __init__(self, description: str, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._line: contextlib.ExitStack | None = None
        self._live: PhaseLine | _Quiet | None = None
        self._rows = terminal_progress(description)

    def phase(self, text: str) -> None:
        """What the sweep does before its first row or after its last, on a live line."""
        if self._live is None:
            self._line = contextlib.ExitStack()
            self._live = self._line.enter_context(phase_line(self.stream))
        self._live.phase(text)

    def stage(self, text: str) -> None:
        """Which stage of the sweep the next rows come from, named on the bar."""
        self._rows.stage(text)

    def update(self, done: int, total: int, row: Any) -> None:
        self._end_line()
        self._rows(done, total, row)

    def close(self) -> None:
        self._end_line()

    def _end_line(self) -> None:
        if self._line is not None:
            self._line.close()
        self._line, self._live = None, None


class _RowBar:
    """A sweep's rows as a tqdm bar on stderr (counter lines without tqdm), labelled with their stage.

    A new stage starts a new bar from the rows done so far, so its time left is measured on that stage's
    rows only, at their average rate; a stage whose rows do not come at the rate of the rest (learning,
    checking candidates: :func:`~diagtools.model.sweep.rate_holds`) shows no time left, as none would hold.
    After the first row, a new stage's bar is shown as soon as the stage begins, so the seconds before its
    first row (a zygote's start) are seen under its name and counted in its rate.
    """

    def __init__(self, description: str) -> None:
        self.description = description
        self.label, self.current = description, ""
        self.bar: Any = None
        self.tqdm: Any
        try:
            from tqdm import tqdm
        except ImportError:
            self.tqdm = None
        else:
            self.tqdm = tqdm

    def stage(self, text: str) -> None:
        self.label, self.current = f"{self.description} ({text})", text
        if self.bar is not None:
            done, total = self.bar.n, self.bar.total
            self.bar.close()  # its line stays: the stage before, with its own rate
            self.bar = None
            if done < total and self.tqdm is not None:
                self.bar = self._open(done, total)

    def _open(self, done: int, total: int) -> Any:
        from diagtools.model.sweep import rate_holds  # here: a scan's phase lines need none of the sweep's model

        shape = _WITH_TIME_LEFT if rate_holds(self.current) else _WITHOUT_TIME_LEFT
        return self.tqdm(
            total=total, initial=done, desc=self.label, unit="module", file=sys.stderr, smoothing=0, bar_format=shape
        )

    def __call__(self, done: int, total: int, row: Any) -> None:
        if self.tqdm is None:
            print(f"[{done}/{total}] {self.label}: {row.module}", file=sys.stderr)
            return
        if self.bar is None:
            self.bar = self._open(done - 1, total)
        self.bar.set_postfix_str(row.module[-40:], refresh=False)
        self.bar.update(1)
        if done >= total:
            self.bar.close()


_WITH_TIME_LEFT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_WITHOUT_TIME_LEFT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, time left once scanning{postfix}]"


def terminal_progress(description: str = "sweep") -> _RowBar:
    """A tqdm bar on stderr, called as ``progress(done, total, row)``; ``.stage(text)`` names the rows' stage."""
    return _RowBar(description)


class _NotebookBar:
    """An ipywidgets progress bar and a label with the stage, the count, the time left and the last module.

    The time left is measured as on a terminal: on the current stage's rows, at their average rate, and
    only for a stage whose rate holds for the rest (:func:`~diagtools.model.sweep.rate_holds`).
    """

    def __init__(self, description: str) -> None:
        try:
            import ipywidgets
            from IPython.display import display
        except ImportError:
            raise MissingExtraError("ipywidgets", "notebook") from None
        self.bar = ipywidgets.IntProgress(value=0, min=0, max=1, description=description)
        self.label = ipywidgets.Label()
        self.box, self.display, self.shown, self.current = ipywidgets.HBox([self.bar, self.label]), display, False, ""
        self.clock: Callable[[], float] = time.monotonic
        self.began = (0.0, 0)  # when the current stage began, and the rows done then

    def stage(self, text: str) -> None:
        self.current = text
        self.began = (self.clock(), self.bar.value)
        if self.shown:  # named at once, not at the stage's first row
            self.label.value = f"{text}: {self.bar.value}/{self.bar.max}"

    def __call__(self, done: int, total: int, row: Any) -> None:
        if not self.shown:
            self.display(self.box)
            self.shown = True
            if not self.current:
                self.began = (self.clock(), done)
        self.bar.max, self.bar.value = total, done
        left = self._time_left(done, total)
        stage = f"{self.current}: " if self.current else ""
        self.label.value = f"{stage}{done}/{total}{', ' + left if left else ''} {row.module}"

    def _time_left(self, done: int, total: int) -> str:
        from diagtools.model.sweep import rate_holds

        since, done_then = self.began
        if not rate_holds(self.current) or done <= done_then:
            return ""
        seconds = (total - done) * (self.clock() - since) / (done - done_then)
        return "under a minute left" if seconds < 60 else f"about {round(seconds / 60)} min left"


def notebook_progress(description: str = "sweep") -> _NotebookBar:
    """An ipywidgets progress bar, displayed on the first update: pass it as a sweep's ``progress`` and its
    ``.stage`` as the sweep's ``stage``."""
    return _NotebookBar(description)


class Stopwatch:
    """Elapsed time and the current phase of a long call, for a live "busy" line.

    The work calls :meth:`phase` as it goes (or runs through :meth:`phased`);
    a display reads :meth:`line` as often as it likes.  ``clock`` is the seam
    tests replace.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.current = ""
        self.running = False

    def start(self, phase: str) -> None:
        self.started, self.current, self.running = self.clock(), phase, True

    def phase(self, text: str) -> None:
        self.current = text

    def stop(self) -> float:
        self.running = False
        return self.clock() - self.started

    def line(self) -> str:
        return f"{self.current} ({self.clock() - self.started:.1f} s)"

    def phased(
        self, runner: Callable[[Any], Any], labels: Sequence[str], *, later: str = "subkernel {n}"
    ) -> Callable[[Any], Any]:
        """``runner`` that names its n-th call ``labels[n]`` as the phase, then ``later`` (``{n}``: the call's
        number, from 1)."""
        calls = [0]

        def run(request: Any) -> Any:
            index = calls[0]
            calls[0] += 1
            self.phase(labels[index] if index < len(labels) else later.format(n=index + 1))
            return runner(request)

        return run


def scan_phase(request: Any) -> str:
    """What one subkernel run of a scan or a fix is for, read from its request: the phase a live display names."""
    from diagtools import protocol

    settings = request.settings
    if settings.get(protocol.RESOLVE_NAMES):
        return "checking that the patch keeps every deferred name importable"
    if settings.get(protocol.SCAN_SOURCES):
        return "verifying a cut: importing again with its statements deferred"
    if settings.get(protocol.SCAN_REFINE):
        return f"tracing the lines of {settings[protocol.SCAN_REFINE]} in a second subkernel"
    if settings.get(protocol.REPLAY_TARGET):
        method = settings.get(protocol.REPLAY_START_METHOD, "fork")
        return f"replaying {settings[protocol.REPLAY_TARGET]} with a {method} child in a fresh subkernel"
    targets = " ".join(settings.get(protocol.SCAN_TARGETS, "").split())
    return f"importing {targets} in a fresh subkernel" if targets else "running a fresh subkernel"


def named_runs(runner: Callable[[Any], Any], phase: Callable[[str], object]) -> Callable[[Any], Any]:
    """``runner`` that first tells ``phase`` what each run is for (:func:`scan_phase`)."""

    def run(request: Any) -> Any:
        phase(scan_phase(request))
        return runner(request)

    return run


class PhaseLine:
    """A live line on a terminal: what a long command is doing now and for how long, redrawn in place.

    The work names each phase (:meth:`phase`); a ticker redraws the line a few
    times a second, so a 20-second import shows its seconds passing instead
    of nothing; :meth:`close` clears it before the report is printed.  Only
    on a terminal: a pipe or a file gets no line at all.
    """

    def __init__(self, stream: Any, stopwatch: Stopwatch | None = None, interval: float = 0.25) -> None:
        self.stream, self.watch, self.interval = stream, stopwatch or Stopwatch(), interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def phase(self, text: str) -> None:
        if not self.watch.running:
            self.watch.start(text)
        self.watch.phase(text)
        self._draw()
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="diagtools-phase-line", daemon=True)
            self._ticker.start()

    def above(self, write: Callable[[], object]) -> None:
        """Let ``write`` print lines while the line is live: the line is cleared first and drawn again below."""
        with self._lock:
            if self.watch.running:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            write()
        self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.watch.running:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            self.watch.stop()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self.watch.running and not self._stop.is_set():
                self.stream.write(f"\r\x1b[K{self.watch.line()}")
                self.stream.flush()


class _Quiet:
    """A phase line for a stream that is not a terminal: says nothing."""

    def phase(self, text: str) -> None:
        pass

    def above(self, write: Callable[[], object]) -> None:
        write()


class NotebookLine:
    """A live line in a notebook cell's output: shown at once, its seconds and phase redrawn in place, and left
    as one plain sentence (what ran, how long) when the block ends, so a saved or exported notebook reads it."""

    def __init__(self, label: str, interval: float = 0.5) -> None:
        from IPython.display import display

        self.label, self.watch, self.interval = label, Stopwatch(), interval
        self.watch.start(label)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.handle = display(self._bundle(f"{self.watch.line()}"), raw=True, display_id=True)
        context = contextvars.copy_context()  # the kernel routes a display by the cell that started it
        self._ticker = threading.Thread(target=context.run, args=(self._tick,), name="diagtools-live", daemon=True)
        self._ticker.start()

    def phase(self, text: str) -> None:
        self.watch.phase(f"{self.label}: {text}")
        self._draw()

    def close(self, failed: bool = False) -> None:
        self._stop.set()
        self._ticker.join()
        seconds = self.watch.stop()
        ending = "stopped" if failed else "done"
        with self._lock:
            if self.handle is not None:
                self.handle.update(self._bundle(f"{self.label}: {ending} in {seconds:.1f} s", busy=False), raw=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self.handle is not None and not self._stop.is_set():
                self.handle.update(self._bundle(self.watch.line()), raw=True)

    @staticmethod
    def _bundle(text: str, busy: bool = True) -> dict[str, str]:
        from html import escape

        mark = "&#8987; " if busy else ""
        return {"text/plain": text, "text/html": f"<div style='color:#555'>{mark}{escape(text)}</div>"}


def _in_a_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and getattr(shell, "kernel", None) is not None


@contextlib.contextmanager
def working(label: str) -> Iterator[Callable[[str], None]]:
    """Say what a long call does while it runs: in a notebook cell a live line (shown at once, with its seconds
    and the subkernel run in progress, left as "LABEL: done in N s"), on a terminal's stderr the phase line.

    ``with diagtools.working("scanning the specimens"): ...``; every subkernel run in the block names itself
    (:func:`scan_phase`), and the yielded ``phase(text)`` names any other step.
    """
    from diagtools.runner.subkernel import starting_runs

    if _in_a_notebook():
        line = NotebookLine(label)
        failed = True
        try:
            with starting_runs(lambda request: line.phase(scan_phase(request))):
                yield line.phase
            failed = False
        finally:
            line.close(failed)
        return
    with phase_line() as live:
        live.phase(label)
        with starting_runs(lambda request: live.phase(f"{label}: {scan_phase(request)}")):
            yield live.phase


@contextlib.contextmanager
def phase_line(stream: Any = None) -> Iterator[PhaseLine | _Quiet]:
    """A :class:`PhaseLine` on ``stream`` (default: stderr) when it is a terminal, else one that says nothing;
    cleared on leaving, however the block ends."""
    stream = stream if stream is not None else sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        yield _Quiet()
        return
    line = PhaseLine(stream)
    try:
        yield line
    finally:
        line.close()
