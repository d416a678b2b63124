"""Charts as PNG bytes (matplotlib, Agg): the kernel benchmark's bandwidth bars."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import Any

from diagtools.errors import MissingExtraError

__all__ = ["bandwidth_chart_png"]


def bandwidth_chart_png(
    rows: Sequence[dict[str, Any]], title: str = "compress_norm_rope_store", *, note: str = ""
) -> bytes:
    """Bars of achieved GB/s per size, one colour per backend, labelled; log scale when they span 100x.

    The title and ``note`` (say, that CPU times are not GPU timings) are wrapped
    to the figure's width, so neither is ever cut at its ends.
    """
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("matplotlib", "notebook") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    sizes = list(dict.fromkeys(str(row["size"]) for row in rows))
    backends = sorted({str(row["backend"]) for row in rows})
    heading = "\n".join(textwrap.wrap(title, 70) + textwrap.wrap(note, 80))
    figure, axis = plt.subplots(figsize=(7.4, 3.2 + 0.2 * heading.count("\n")))
    width = 0.8 / max(1, len(backends))
    measured = [v for backend in backends for size in sizes if (v := _gbps(rows, size, backend)) > 0]
    for index, backend in enumerate(backends):
        values = [_gbps(rows, size, backend) for size in sizes]
        label = backend if any(values) else f"{backend} (not timed here)"
        bars = axis.bar([i + index * width for i in range(len(sizes))], values, width, label=label)
        axis.bar_label(bars, labels=[f"{v:.3g}" if v else "n/a" for v in values], fontsize=8)
    axis.set_xticks([i + width * (len(backends) - 1) / 2 for i in range(len(sizes))], sizes, rotation=20)
    if measured and max(measured) / min(measured) > 100:  # interpreter vs compiled: only a log scale shows both
        axis.set_yscale("log")
    axis.set_ylabel("GB/s (minimal bytes)")
    axis.set_title(heading, fontsize=10, color="#a15c00" if note else "black")
    axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def _gbps(rows: Sequence[dict[str, Any]], size: str, backend: str) -> float:
    for row in rows:
        if str(row["size"]) == size and row["backend"] == backend:
            return float(row.get("GB/s") or 0.0)
    return 0.0
