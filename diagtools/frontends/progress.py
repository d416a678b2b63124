"""Progress for long calls: tqdm or an ipywidgets bar for sweeps, a stopwatch with phases for panels."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from diagtools.errors import MissingExtraError

__all__ = ["Stopwatch", "notebook_progress", "terminal_progress"]


def terminal_progress(description: str = "sweep") -> Callable[[int, int, Any], None]:
    """A tqdm bar on stderr; plain counter lines where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda done, total, row: print(f"[{done}/{total}] {row.module}", file=sys.stderr)
    bar: dict[str, Any] = {}

    def update(done: int, total: int, row: Any) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, initial=done - 1, desc=description, unit="module", file=sys.stderr)
        bar["bar"].set_postfix_str(row.module[-40:], refresh=False)
        bar["bar"].update(1)
        if done >= total:
            bar["bar"].close()

    return update


def notebook_progress(description: str = "sweep") -> Callable[[int, int, Any], None]:
    """An ipywidgets progress bar, displayed on the first update."""
    try:
        import ipywidgets
        from IPython.display import display
    except ImportError:
        raise MissingExtraError("ipywidgets", "notebook") from None
    bar = ipywidgets.IntProgress(value=0, min=0, max=1, description=description)
    label = ipywidgets.Label()
    shown: list[bool] = []

    def update(done: int, total: int, row: Any) -> None:
        if not shown:
            display(ipywidgets.HBox([bar, label]))
            shown.append(True)
        bar.max, bar.value = total, done
        label.value = f"{done}/{total} {row.module}"

    return update


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
