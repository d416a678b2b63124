"""compress_state_store (the faithful variant): Triton and torch at the KERNEL-NOTES sizes, as JSON and Markdown.

Run: ``.venv/bin/python benchmarks/state_kernels.py [--save-path DIR]`` (writes state_kernels.json
and state_kernels.md).  On a GPU it times C4 decode (1024 boundary tokens), C4 prefill (32768
tokens, 8192 boundaries) and C128 (256 boundary tokens) with triton.testing.do_bench over four
rotated input sets (the small sizes fit in L2), and reports GB/s over the bytes the operation
must move and the floor at 4.3 TB/s.  Elsewhere it runs tiny sizes under the Triton interpreter
and says the times mean nothing.  Each runner returns ``{"ms", "GB/s"}``; a backend that fails
gets a note instead.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the Triton kernel is imported

from diagtools.kernels import compress_state_store  # noqa: E402
from diagtools.kernels.state_reference import BENCH_SIZES, dequantized_cache_rows, make_state_inputs  # noqa: E402

H200_BYTES_PER_S = 4.3e12
ROTATE = 4
CPU_SIZES = {"C4 tiny": (4, ((0, 16), (7, 1))), "C128 tiny": (128, ((0, 128),))}
KEYS = ("ms", "GB/s")


def _time(run, sets) -> float:
    """Median ms per call over ``sets`` used in turn (do_bench on a GPU, wall clock elsewhere)."""
    turn = iter(range(10**9))

    def step():
        run(sets[next(turn) % len(sets)])

    if ON_GPU:
        import triton

        return float(triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median"))
    started = time.perf_counter()
    step()
    return (time.perf_counter() - started) * 1e3


def runner(backend: str):
    def run(sets, moved: int) -> dict[str, float]:
        ms = _time(lambda s: compress_state_store(*s.args(), ratio=s.ratio, backend=backend), sets)
        return {"ms": ms, "GB/s": moved / ms / 1e6}

    return run


def _error(inputs, backend: str) -> float:
    """Norm-wise relative error of the dequantized rows against the float64 reference."""
    compress_state_store(*inputs.args(), ratio=inputs.ratio, backend=backend)
    work = inputs.working()
    got = dequantized_cache_rows(inputs.kv_cache, inputs.slot_mapping[work]).double()
    expected = inputs.expected()
    return float((got - expected).norm() / expected.norm())


def measure() -> list[dict]:
    sizes = BENCH_SIZES if ON_GPU else CPU_SIZES
    device = "cuda" if ON_GPU else "cpu"
    rows = []
    for name, (ratio, requests) in sizes.items():
        sets = [make_state_inputs(ratio, requests, padding=0.0, device=device) for _ in range(ROTATE if ON_GPU else 1)]
        moved = sets[0].min_bytes()
        for backend in ("triton", "torch"):
            row = {"size": name, "backend": backend, "min_bytes": moved, "floor_us": moved / H200_BYTES_PER_S * 1e6}
            try:
                row["max_rel_error"] = _error(make_state_inputs(ratio, requests, padding=0.0, device=device), backend)
                row.update(runner(backend)(sets, moved))
                row["note"] = (
                    "" if ON_GPU else "CPU: time not meaningful" + (" (Triton interpreter)" * (backend == "triton"))
                )
            except Exception as exc:  # a failing backend degrades to a note; the other rows still come
                row.update(dict.fromkeys(KEYS), note=f"failed: {type(exc).__name__}: {exc}"[:300])
            rows.append(row)
    missing = [r for r in rows if not set(KEYS) <= set(r)]
    if missing:
        raise SystemExit(f"runners reported different keys: {missing}")
    return rows


def markdown(document: dict) -> str:
    columns = ["size", "backend", "ms", "GB/s", "min_bytes", "floor_us", "max_rel_error", "note"]
    lines = ["# compress_state_store: the faithful variant", "", f"Device: {document['device']}.", ""]
    if not document["timing_meaningful"]:
        lines += ["**No GPU in this run**: tiny sizes, Triton under its interpreter; times are not meaningful.", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in document["rows"]:
        cells = [row.get(c) for c in columns]
        lines.append(
            "| "
            + " | ".join("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-path", type=Path, default=HERE)
    args = parser.parse_args()
    device = torch.cuda.get_device_name() if ON_GPU else "cpu"
    document = {"device": device, "timing_meaningful": ON_GPU, "rows": measure()}
    args.save_path.mkdir(parents=True, exist_ok=True)
    (args.save_path / "state_kernels.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (args.save_path / "state_kernels.md").write_text(markdown(document))
    print(markdown(document))


if __name__ == "__main__":
    main()
