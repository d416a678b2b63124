"""compress_state_store (the faithful variant): CuTe DSL, Triton and torch at the KERNEL-NOTES sizes.

Run: ``.venv/bin/python benchmarks/state_kernels.py [--save-path DIR] [--rows FILE] [--require-gpu]``
(writes state_kernels.json and state_kernels.md).  On a GPU it times realistic batches: decode
steps of 1024 requests (C4: 256 on a boundary; C128: 8) and 32768-token prefills (C4: 8192
boundaries; C128: 256), over four rotated input sets (the small sizes fit in L2).

Two times per row, and which is which:

- ``end_to_end_ms``: the call as vLLM makes it, ``compress_state_store(...)`` from Python, host work
  included (for the CuTe DSL kernel: the plan, with the host-side ``nonzero`` that compacts the
  working tokens and its synchronisation, which the Triton path does not need);
- ``launch_ms``: the launch as a CUDA graph captures it: the host work done once per input set,
  outside the timing (for the CuTe DSL kernel the graph-safe plan, whose compaction of the working
  tokens runs on the device inside the graph); the four sets' launches captured in one CUDA graph,
  whose replays ``triton.testing.do_bench`` times (median, twice); a call's time is the replay's
  over four.  GB/s and the copy fraction are over it.

Each backend runs in its own process (a CUDA graph capture that fails, as the torch backend's does
when it synchronises, cannot disturb the rows after it), and every row is written as it is
measured: appended to ``--rows`` (JSON Lines, flushed) and the JSON and Markdown rewritten, so a
run that is killed leaves every row before it.  Reported: the slower median of the two timings,
their spread, GB/s over the bytes the operation must move, the fraction of the measured
device-to-device copy bandwidth, and the floor at 4.3 TB/s.  A row whose dequantized error against
the float64 reference is NaN or over the FP8 bound gets no time.  Elsewhere it runs tiny sizes
(Triton under its interpreter), says the times mean nothing, and lists the CuTe DSL kernel as
GPU-only; ``--require-gpu`` makes that an error instead (the GPU check passes it).  A backend that
fails gets a note instead of numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from rows import append_rows, read_rows, write_whole

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
KEYS = ("launch_ms", "runs_ms", "spread", "GB/s", "copy_fraction", "end_to_end_ms", "timing")
BACKENDS = ("cutedsl", "triton", "torch")


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
    from diagtools.kernels.state_cutedsl import launch_planned, plan_launch, working_bound

    multiprocessors = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    def graph_safe(inputs):  # as vLLM would capture it: the compaction on the device, the grid from the shapes
        bound = working_bound(inputs.positions.numel(), inputs.ratio, inputs.block_table.shape[0])
        return plan_launch(*inputs.args(), inputs.ratio, 1e-6, max_working=bound, multiprocessors=multiprocessors)

    plans = [graph_safe(inputs) for inputs in sets]
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
    """The launch alone (CUDA graph replays) and the call end to end; GB/s and the copy fraction from the
    former (off the GPU, or when the capture fails, both are the end-to-end call, and ``timing`` says so)."""

    def run(inputs) -> None:
        compress_state_store(*inputs.args(), ratio=inputs.ratio, backend=backend)

    eager = [_time(run, sets) for _ in range(TIMED_RUNS if ON_GPU else 1)]
    runs, timing, alone = eager, "end to end (host work included)", False
    if ON_GPU:
        try:
            runs, timing = _graph_ms(_launches(backend, sets)), f"launch alone: CUDA graph of {len(sets)} launches"
            alone = True
        except Exception as exc:  # a capture that fails leaves the end-to-end figure, and says why
            timing = f"end to end (graph capture failed: {type(exc).__name__}: {exc})"[:200]
    ms = max(runs)
    gbps = moved / ms / 1e6
    return {
        "launch_ms": ms if alone else None,  # not measured: GB/s is then over the end-to-end call
        "runs_ms": runs,
        "spread": (max(runs) - min(runs)) / min(runs) if len(runs) > 1 else None,
        "GB/s": gbps,
        "copy_fraction": gbps / copy_gbps if copy_gbps else None,
        "end_to_end_ms": max(eager),
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


def measure(backend: str, copy_gbps: float | None, said) -> None:
    """Every size for one backend; ``said(row)`` hears each row as soon as it is measured."""
    sizes = BENCH_SIZES if ON_GPU else CPU_SIZES
    device = "cuda" if ON_GPU else "cpu"
    for name, (ratio, requests) in sizes.items():
        sets = [make_state_inputs(ratio, requests, padding=0.0, device=device) for _ in range(ROTATE if ON_GPU else 1)]
        moved = sets[0].min_bytes()
        row = {"size": name, "backend": backend, "min_bytes": moved, "floor_us": moved / H200_BYTES_PER_S * 1e6}
        row.update(dict.fromkeys(KEYS), max_rel_error=None, note="")
        if backend == "cutedsl" and not ON_GPU:
            row["note"] = "GPU only (its PTX and launch are checked on the CPU by the tests)"
            said(row)
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
        said(row)


def ordered(rows: list[dict]) -> list[dict]:
    """Rows by size (in the order of the sizes), then backend (CuTe DSL, Triton, torch), for side by side."""
    sizes = list(BENCH_SIZES if ON_GPU else CPU_SIZES)
    return sorted(
        rows, key=lambda r: (sizes.index(r["size"]) if r["size"] in sizes else 99, BACKENDS.index(r["backend"]))
    )


def markdown(document: dict) -> str:
    columns = [
        "size",
        "backend",
        "end_to_end_ms",
        "launch_ms",
        "spread",
        "GB/s",
        "copy_fraction",
        "floor_us",
        "max_rel_error",
        "note",
    ]
    lines = ["# compress_state_store: the faithful variant", ""]
    lines += [f"Measured {document.get('measured', 'on an unrecorded date')}; device: {document['device']}.", ""]
    lines += [f"Versions: {document.get('versions')}.", ""]
    lines += [
        "`end_to_end_ms`: the call as vLLM makes it (host work included: for CuTe DSL the plan, its host-side "
        "`nonzero` and synchronisation); `launch_ms`: the launch alone (CUDA graph replays, host work done once), "
        "over which GB/s and the copy fraction are computed.",
        "",
    ]
    if not document.get("complete", True):
        lines += ["**Incomplete run**: the rows measured before it stopped.", ""]
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


class Rows:
    """Where rows go as they are measured: a JSON Lines file (appended, flushed) and, after each row, the JSON
    document and its Markdown rewritten from every row so far."""

    def __init__(self, save_path: Path, rows_file: Path, head: dict) -> None:
        self.save_path, self.rows_file, self.head = save_path, rows_file, head
        save_path.mkdir(parents=True, exist_ok=True)
        rows_file.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict]:
        return read_rows(self.rows_file)

    def add(self, row: dict) -> None:
        append_rows(self.rows_file, [row])

    def write(self, complete: bool) -> dict:
        document = {**self.head, "complete": complete, "rows": ordered(self.read())}
        write_whole(self.save_path / "state_kernels.json", json.dumps(document, indent=2, sort_keys=True) + "\n")
        write_whole(self.save_path / "state_kernels.md", markdown(document))
        return document


def _one_backend(backend: str, copy_gbps: float | None, rows_file: Path, save_path: Path) -> None:
    """The child: one backend's rows, appended to ``rows_file`` as they come, the document rewritten after each
    (its head as the parent wrote it)."""
    written = json.loads((save_path / "state_kernels.json").read_text())
    target = Rows(save_path, rows_file, {k: v for k, v in written.items() if k not in ("rows", "complete")})

    def said(row: dict) -> None:
        target.add(row)
        target.write(complete=False)
        print(f"{row['size']} {row['backend']}: {row.get('end_to_end_ms')} ms end to end, "
              f"{row.get('launch_ms')} ms launch alone {row['note']}".rstrip(), flush=True)  # fmt: skip

    measure(backend, copy_gbps, said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-path", type=Path, default=HERE)
    parser.add_argument("--rows", type=Path, help="JSON Lines file the rows are appended to (default: beside the JSON)")
    parser.add_argument("--require-gpu", action="store_true", help="exit 3 when torch sees no GPU")
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)  # the per-backend child
    parser.add_argument("--copy-gbps", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows_file = args.rows or args.save_path / "state_kernels.jsonl"
    if args.backend:
        _one_backend(args.backend, args.copy_gbps, rows_file, args.save_path)
        return
    if args.require_gpu and not ON_GPU:
        raise SystemExit("state_kernels.py: torch sees no GPU here, and --require-gpu was given")
    device = torch.cuda.get_device_name() if ON_GPU else "cpu"
    copy_gbps = copy_bandwidth()
    head = {"device": device, "versions": versions(), "timing_meaningful": ON_GPU, "copy_gbps": copy_gbps,
            "measured": time.strftime("%Y-%m-%d", time.gmtime())}  # fmt: skip
    rows = Rows(args.save_path, rows_file, head)
    rows_file.write_text("", encoding="utf-8")  # this run's rows only
    rows.write(complete=False)
    failures = []
    for backend in BACKENDS:  # each in its own process: a failed graph capture cannot touch the next backend
        child = [
            sys.executable,
            __file__,
            "--backend",
            backend,
            "--rows",
            str(rows_file),
            "--save-path",
            str(args.save_path),
        ]
        if copy_gbps is not None:
            child += ["--copy-gbps", repr(copy_gbps)]
        done = subprocess.run(child, check=False)
        if done.returncode != 0:
            failures.append(f"{backend} (exit {done.returncode})")
        rows.write(complete=False)
    document = rows.write(complete=not failures)
    print(markdown(document))
    if failures:
        raise SystemExit(f"state_kernels.py: a backend's process failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
