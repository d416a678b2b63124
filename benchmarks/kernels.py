"""compress_norm_rope_store: Triton against CuTe DSL, every size, results as JSON and Markdown.

Run: ``.venv/bin/python benchmarks/kernels.py`` (writes benchmarks/kernels.json and kernels.md).
On a GPU machine it times the full grid (G in 64, 4096, 65536, 262144 at D = 512 and 128)
with triton.testing.do_bench over four rotated input sets, against the measured
device-to-device copy bandwidth; elsewhere it records the CPU checks and says the times
mean nothing.  ``gpu_check.sh`` is the one prepared script for a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scan_overhead import machine

from diagtools.bench import COLUMNS, compare

HERE = Path(__file__).resolve().parent
TARGET_FRACTION = 0.8


def markdown(document: dict) -> str:
    meta, rows = document["meta"], document["rows"]
    lines = ["# compress_norm_rope_store: Triton vs CuTe DSL", ""]
    lines += [f"Device: {meta.get('device')}; machine: {document['machine']}.", ""]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    report = compare()
    document = {**report.to_json(), "machine": machine()}
    if report.error:
        raise SystemExit(report.error)
    (args.out / "kernels.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (args.out / "kernels.md").write_text(markdown(document))
    print(markdown(document))


if __name__ == "__main__":
    main()
