"""compress_norm_rope_store: Triton against CuTe DSL, every size, results as JSON and Markdown.

Run: ``.venv/bin/python benchmarks/kernels.py [--out DIR] [--rows FILE] [--require-gpu]`` (writes
benchmarks/kernels.json and kernels.md).  On a GPU machine it times the full grid (G in 64, 4096,
65536, 262144 at D = 512 and 128) with triton.testing.do_bench over four rotated input sets,
against the measured device-to-device copy bandwidth, each backend checked against the float64
reference before it is timed; elsewhere it records the CPU checks and says the times mean nothing
(``--require-gpu`` makes that an error).  Each size is measured in its own subkernel, and its rows
are written as they come: appended to ``--rows`` (JSON Lines, flushed), the JSON and Markdown
rewritten, so a run that is killed leaves every size before it.  ``gpu_check.sh`` is the one
prepared script for a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rows import append_rows, write_whole
from scan_overhead import machine

from diagtools.bench import COLUMNS, CPU_SIZES, GPU_SIZES, BenchReport, compare
from diagtools.driver import resolve_driver

HERE = Path(__file__).resolve().parent
TARGET_FRACTION = 0.8


def markdown(document: dict) -> str:
    meta, rows = document["meta"], document["rows"]
    lines = ["# compress_norm_rope_store: Triton vs CuTe DSL", ""]
    lines += [f"Measured {document.get('measured', 'on an unrecorded date')}.", ""]
    lines += [f"Device: {meta.get('device')}; machine: {document['machine']}.", ""]
    if not document.get("complete", True):
        lines += ["**Incomplete run**: the sizes measured before it stopped.", ""]
    if not meta.get("timing_meaningful"):
        lines += [
            "**No GPU in this run.** The rows below come from a CPU: the torch reference and the Triton",
            "interpreter at tiny sizes, with their error against the float64 reference, and the CuTe DSL",
            "kernel compiled to PTX for sm_90a, or its shipped PTX read where nvidia-cutlass-dsl is absent",
            "(each row's note says which). Their times are not meaningful: on a CPU this is correctness only.",
            "The timing side by side is `benchmarks/gpu_check.sh`, ready for a machine with a GPU.",
            "",
        ]
    else:
        lines += [f"Copy bandwidth (device to device, read + write): {meta.get('copy_gbps'):.0f} GB/s.", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |")
    faster = document.get("faster") or {}
    if faster:
        lines += ["", "Faster backend per size: " + "; ".join(f"{s}: {b}" for s, b in faster.items()), ""]
        misses = [
            r
            for r in rows
            if r["G"] >= 65536 and r["backend"] != "torch" and (r.get("copy_fraction") or 0) < TARGET_FRACTION
        ]
        lines.append(
            f"Target (>= {TARGET_FRACTION:.0%} of copy bandwidth at G >= 65536): "
            + ("met" if not misses else "missed by " + ", ".join(f"{r['backend']} {r['size']}" for r in misses))
        )
    lines += ["", f"First-call import cost (s): {meta.get('import_s')}", ""]
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _write(out: Path, reports: list[BenchReport], complete: bool) -> dict:
    """The document of every size so far (the last report's meta), and its Markdown."""
    rows = tuple(row for report in reports for row in report.rows)
    last = reports[-1] if reports else BenchReport(())
    merged = BenchReport(rows, last.meta, last.driver, "; ".join(r.error for r in reports if r.error))
    measured = time.strftime("%Y-%m-%d", time.gmtime())
    document = {**merged.to_json(), "machine": machine(), "measured": measured, "complete": complete}
    write_whole(out / "kernels.json", json.dumps(document, indent=2, sort_keys=True) + "\n")
    write_whole(out / "kernels.md", markdown(document))
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--rows", type=Path, help="JSON Lines file the rows are appended to (default: beside the JSON)")
    parser.add_argument("--require-gpu", action="store_true", help="exit 3 when no real driver and GPU are here")
    args = parser.parse_args()
    on_gpu = resolve_driver("auto").info.kind == "real"
    if args.require_gpu and not on_gpu:
        raise SystemExit("kernels.py: no real CUDA driver here, and --require-gpu was given")
    args.out.mkdir(parents=True, exist_ok=True)
    rows_file = args.rows or args.out / "kernels.jsonl"
    rows_file.write_text("", encoding="utf-8")  # this run's rows only
    reports: list[BenchReport] = []
    for size in GPU_SIZES if on_gpu else CPU_SIZES:  # one subkernel per size: a kill keeps the sizes before it
        report = compare([size])
        reports.append(report)
        append_rows(rows_file, report.rows)
        _write(args.out, reports, complete=False)
    document = _write(args.out, reports, complete=True)
    print(markdown(document))
    errors = [report.error for report in reports if report.error]
    if errors:
        raise SystemExit(errors[0])


if __name__ == "__main__":
    main()
