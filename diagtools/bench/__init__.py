"""Kernel benchmark: compress_norm_rope_store per backend and size, side by side.

:func:`compare` runs the measurements in a fresh subkernel, so the caller
(a notebook's kernel) never initializes CUDA.  Each row reports the median
time (the slower of two timed runs, and their spread), the achieved bandwidth
over the fewest bytes the operation must move, that bandwidth as a fraction of
the measured device-to-device copy, and the relative error against a float64
reference on fresh inputs.  A backend whose error is over the tolerance (or
NaN), or that fails, gets no time and a note saying why.  On a CPU the
sizes shrink to what the Triton interpreter can run, and the rows say the
times mean nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.driver import resolve_driver
from diagtools.errors import UsageError
from diagtools.model.scan import DriverInfo
from diagtools.runner.subkernel import SubkernelRequest, run_subkernel

__all__ = ["GPU_SIZES", "BenchReport", "compare"]

PROGRAM = Path(__file__).resolve().parent / "program.py"
GPU_SIZES = tuple((groups, head_dim) for head_dim in (512, 128) for groups in (64, 4096, 65536, 262144))
CPU_SIZES = ((64, 512), (64, 128))
CPU_NOTE = "Measured on a CPU: times are not meaningful (torch reference vs Triton interpreter; not GPU timings)"
COLUMNS = ["size", "backend", "median_ms", "spread", "GB/s", "copy_fraction", "max_rel_error", "note"]


@dataclass(frozen=True)
class BenchReport:
    """All rows, what they were measured on, and whether the times mean anything."""

    rows: tuple[dict[str, Any], ...]
    meta: dict[str, Any] = field(default_factory=dict)
    driver: DriverInfo | None = None
    error: str = ""

    @property
    def timing_meaningful(self) -> bool:
        return bool(self.meta.get("timing_meaningful"))

    @property
    def note(self) -> str:
        """What every table and chart of these times must say: empty on a GPU, the CPU disclaimer elsewhere."""
        return "" if self.timing_meaningful else CPU_NOTE

    def faster_by_size(self) -> dict[str, str]:
        """For each size, the backend with the lowest time (torch excluded), or ``"tie"`` when the gap
        is within the spread of the two timed runs; empty off a GPU."""
        if not self.timing_meaningful:
            return {}
        timed: dict[str, list[dict[str, Any]]] = {}
        for row in self.rows:
            if row["backend"] != "torch" and row.get("median_ms"):
                timed.setdefault(row["size"], []).append(row)
        faster = {}
        for size, rows in timed.items():
            ranked = sorted(rows, key=lambda r: r["median_ms"])
            best = ranked[0]
            if len(ranked) > 1:
                noise = max(r.get("spread") or 0.0 for r in ranked[:2])
                if ranked[1]["median_ms"] / best["median_ms"] - 1 <= noise:
                    faster[size] = "tie (within the run-to-run spread)"
                    continue
            faster[size] = best["backend"]
        return faster

    def to_json(self) -> dict[str, Any]:
        note = self.note
        return {
            "schema": "diagtools.bench/1",
            "meta": self.meta,
            "rows": list(self.rows),
            "note": note,
            "driver": self.driver.to_json() if self.driver else None,
            "error": self.error,
            "faster": self.faster_by_size(),
        }

    def table(self) -> str:
        """A text table with the columns in :data:`COLUMNS`."""
        from diagtools.render.text import text_table

        lines = text_table(COLUMNS, [[row.get(c) for c in COLUMNS] for row in self.rows])
        return "\n".join([self.note, *lines] if self.note else lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view: the table (with its CPU note), not the dataclass fields."""
        printer.text(self.table())

    def _repr_html_(self) -> str:
        from diagtools.render.html import bench_table_html

        return bench_table_html(list(self.rows), COLUMNS, caption=self.note)

    def chart(self, path: str | os.PathLike[str]) -> Path:
        """A bar chart of GB/s per size and backend, written as PNG."""
        from diagtools.render.chart import bandwidth_chart_png

        target = Path(path)
        target.write_bytes(bandwidth_chart_png(self.rows, note=self.note))
        return target


def compare(
    sizes: Sequence[tuple[int, int]] | None = None,
    backends: Sequence[str] = ("torch", "triton", "cutedsl"),
    *,
    ratio: int = 4,
    driver: str = "auto",
    timeout: float = 1800.0,
) -> BenchReport:
    """Measure every backend at every ``(G, D)`` size in a fresh subkernel.

    ``sizes`` defaults to the full grid on a real GPU and to two tiny sizes elsewhere.
    """
    setup = resolve_driver(driver)
    if sizes is None:
        sizes = GPU_SIZES if setup.info.kind == "real" else CPU_SIZES
    for groups, head_dim in sizes:
        if groups < 1 or head_dim not in (128, 512):
            raise UsageError(f"bad size G={groups} D={head_dim}: G must be positive, D 128 or 512")
    env = {**setup.env, "CUTE_DSL_ARCH": os.environ.get("CUTE_DSL_ARCH", "sm_90a")}
    if setup.info.kind != "real":
        env["TRITON_INTERPRET"] = "1"
    settings = {
        protocol.BENCH_SIZES: ",".join(f"{g}x{d}" for g, d in sizes),
        protocol.BENCH_BACKENDS: ",".join(backends),
        protocol.BENCH_RATIO: str(ratio),
    }
    raw = run_subkernel(SubkernelRequest(PROGRAM, settings, env, timeout))
    rows = tuple({k: v for k, v in e.items() if k != "e"} for e in raw.events if e.get("e") == "row")
    meta = next(({k: v for k, v in e.items() if k != "e"} for e in raw.events if e.get("e") == "meta"), {})
    finished = any(e.get("e") == "done" for e in raw.events)
    error = "" if finished else f"the benchmark subkernel ended early (exit {raw.returncode}): {raw.stderr.text[-600:]}"
    return BenchReport(rows, meta, setup.info, error)
