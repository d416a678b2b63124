"""Progress bars for sweeps: tqdm in a terminal, an ipywidgets bar in a notebook."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from diagtools.errors import MissingExtraError

__all__ = ["notebook_progress", "terminal_progress"]


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
