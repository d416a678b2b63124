"""compress_state_store (the faithful variant): CuTe DSL, Triton and torch at the KERNEL-NOTES sizes.

Run: ``.venv/bin/python benchmarks/state_kernels.py [--save-path DIR]`` (writes state_kernels.json
and state_kernels.md).  On a GPU it times realistic batches: decode steps of 1024 requests (C4:
256 on a boundary; C128: 8) and 32768-token prefills (C4: 8192 boundaries; C128: 256), over four
rotated input sets (the small sizes fit in L2).

How the launch alone is timed: the host work (checking the inputs; for the CuTe DSL kernel, the
plan with its compacted working tokens) is done once per input set, outside the timing; the four
sets' launches are captured in one CUDA graph, and ``triton.testing.do_bench`` times the graph's
replays (median, twice); a call's time is the replay's over four.  ``ms`` is that; ``eager_ms``
is the plain Python call (host preparation and launch included), for comparison.  Reported: the
slower median of the two timings, their spread, GB/s over the bytes the operation must move,
the fraction of the measured device-to-device copy bandwidth, and the floor at 4.3 TB/s.  A row whose dequantized error
against the float64 reference is NaN or over the FP8 bound gets no time.  Elsewhere it runs
tiny sizes (Triton under its interpreter), says the times mean nothing, and lists the CuTe DSL
kernel as GPU-only.  A backend that fails gets a note instead of numbers.
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
TIMED_RUNS = 2
MAX_RELATIVE_ERROR = 0.04  # the FP8 bound of tests/kernels/tolerances.py
CPU_SIZES = {"C4 tiny": (4, ((0, 16), (7, 1))), "C128 tiny": (128, ((0, 128),))}
KEYS = ("ms", "runs_ms", "spread", "GB/s", "copy_fraction", "eager_ms", "timing")


def _time(run, sets) -> float:
    """Median ms per call over ``sets`` used in turn (do_bench on a GPU, wall clock elsewhere)."""
    turn = iter(range(10**9))

    def step():
        run(sets[next(turn) % len(sets)])

    if ON_GPU:
        import triton

        milliseconds = float(triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median"))
        torch.cuda.synchronize()  # a launch error during timing surfaces here
        return milliseconds
    started = time.perf_counter()
    step()
    return (time.perf_counter() - started) * 1e3


def copy_bandwidth() -> float | None:
    """Device-to-device copy bandwidth in GB/s (read + write) of a 1 GiB buffer; None off the GPU."""
    if not ON_GPU:
        return None
    import triton

    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    milliseconds = triton.testing.do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    return 2 * source.numel() / (milliseconds * 1e-3) / 1e9


def _launches(backend: str, sets) -> list:
    """One callable per input set that only launches: host work done here, once."""
    if backend != "cutedsl":
        return [
            lambda inputs=inputs: compress_state_store(*inputs.args(), ratio=inputs.ratio, backend=backend)
            for inputs in sets
        ]
    from diagtools.kernels.state_cutedsl import launch_planned, plan_launch

    plans = [plan_launch(*inputs.args(), inputs.ratio, 1e-6) for inputs in sets]
    device = torch.cuda.current_device()
    return [
        lambda plan=plan: launch_planned(plan, device, torch.cuda.current_stream().cuda_stream)
        for plan in plans
        if plan is not None
    ]


def _graph_ms(launches) -> list[float]:
    """Milliseconds per launch, twice: the launches captured once in a CUDA graph, its replays timed."""
    import triton

    for launch in launches:  # warm up: compile, load the module
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    runs = [triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median") for _ in range(TIMED_RUNS)]
    torch.cuda.synchronize()
    return [float(ms) / len(launches) for ms in runs]


def timed(backend: str, sets, moved: int, copy_gbps: float | None) -> dict:
    """The launch alone (CUDA graph replays) and the eager call; GB/s and the copy fraction from the former."""

    def run(inputs) -> None:
        compress_state_store(*inputs.args(), ratio=inputs.ratio, backend=backend)

    eager = [_time(run, sets) for _ in range(TIMED_RUNS if ON_GPU else 1)]
    runs, timing = eager, "eager call (host preparation included)"
    if ON_GPU:
        try:
            runs, timing = _graph_ms(_launches(backend, sets)), f"CUDA graph of {len(sets)} launches, replayed"
        except Exception as exc:  # a capture that fails leaves the eager figure, and says why
            timing = f"eager call (graph capture failed: {type(exc).__name__}: {exc})"[:200]
    ms = max(runs)
    gbps = moved / ms / 1e6
    return {
        "ms": ms,
        "runs_ms": runs,
        "spread": (max(runs) - min(runs)) / min(runs) if len(runs) > 1 else None,
        "GB/s": gbps,
        "copy_fraction": gbps / copy_gbps if copy_gbps else None,
        "eager_ms": max(eager),
        "timing": timing,
    }


def _error(inputs, backend: str) -> float:
    """Norm-wise relative error of the dequantized rows against the float64 reference (NaN if unwritten)."""
    compress_state_store(*inputs.args(), ratio=inputs.ratio, backend=backend)
    if ON_GPU:
        torch.cuda.synchronize()
    work = inputs.working()
    got = dequantized_cache_rows(inputs.kv_cache, inputs.slot_mapping[work]).double()
    expected = inputs.expected()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - expected).norm() / expected.norm())


def measure(copy_gbps: float | None) -> list[dict]:
    sizes = BENCH_SIZES if ON_GPU else CPU_SIZES
    device = "cuda" if ON_GPU else "cpu"
    rows = []
    for name, (ratio, requests) in sizes.items():
        sets = [make_state_inputs(ratio, requests, padding=0.0, device=device) for _ in range(ROTATE if ON_GPU else 1)]
        moved = sets[0].min_bytes()
        for backend in ("cutedsl", "triton", "torch"):
            row = {"size": name, "backend": backend, "min_bytes": moved, "floor_us": moved / H200_BYTES_PER_S * 1e6}
            row.update(dict.fromkeys(KEYS), max_rel_error=None, note="")
            if backend == "cutedsl" and not ON_GPU:
                row["note"] = "GPU only (its PTX and launch are checked on the CPU by the tests)"
                rows.append(row)
                continue
            try:
                error = _error(make_state_inputs(ratio, requests, padding=0.0, device=device), backend)
                row["max_rel_error"] = error
                if not error <= MAX_RELATIVE_ERROR:  # NaN fails this too
                    row["note"] = f"error {error:.3g} over the FP8 bound {MAX_RELATIVE_ERROR}: not timed"
                else:
                    row.update(timed(backend, sets, moved, copy_gbps))
                    interpreted = " (Triton interpreter)" * (backend == "triton")
                    row["note"] = "" if ON_GPU else "CPU: time not meaningful" + interpreted
            except Exception as exc:  # a failing backend degrades to a note; the other rows still come
                row["note"] = f"failed: {type(exc).__name__}: {exc}"[:300]
            rows.append(row)
    return rows


def markdown(document: dict) -> str:
    columns = [
        "size",
        "backend",
        "ms",
        "eager_ms",
        "spread",
        "GB/s",
        "copy_fraction",
        "floor_us",
        "max_rel_error",
        "note",
    ]
    lines = ["# compress_state_store: the faithful variant", "", f"Device: {document['device']}.", ""]
    lines += [f"Versions: {document.get('versions')}.", ""]
    lines += ["`ms`: the launch alone (CUDA graph replays, host work done once); `eager_ms`: the Python call.", ""]
    if document.get("copy_gbps"):
        lines += [f"Copy bandwidth (device to device, read + write): {document['copy_gbps']:.0f} GB/s.", ""]
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


def versions() -> dict:
    """The versions this run used (the device machine's image has its own, not the repository venv's)."""
    import platform

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name, module in (("triton", "triton"), ("nvidia-cutlass-dsl", "cutlass")):
        try:
            found[name] = getattr(__import__(module), "__version__", "present")
        except ImportError:
            found[name] = "absent"
    found["cuda"] = torch.version.cuda
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-path", type=Path, default=HERE)
    args = parser.parse_args()
    device = torch.cuda.get_device_name() if ON_GPU else "cpu"
    copy_gbps = copy_bandwidth()
    document = {
        "device": device,
        "versions": versions(),
        "timing_meaningful": ON_GPU,
        "copy_gbps": copy_gbps,
        "rows": measure(copy_gbps),
    }
    args.save_path.mkdir(parents=True, exist_ok=True)
    (args.save_path / "state_kernels.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (args.save_path / "state_kernels.md").write_text(markdown(document))
    print(markdown(document))


if __name__ == "__main__":
    main()
