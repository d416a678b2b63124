"""The kernel benchmark's subkernel: measures compress_norm_rope_store, streams rows.

Run by the runner in a fresh process (never in a notebook's kernel: on a GPU,
asking torch whether CUDA is there already initializes the driver).  On a GPU
it checks every backend against the float64 reference on fresh inputs first
(synchronizing, so a launch error surfaces there), reports no time for a
backend whose error is over the tolerance or NaN, and times the others twice
with ``triton.testing.do_bench`` over input sets drawn on the GPU and rotated
so that together they are at least three times the L2 cache; the two medians
and their spread are reported.  Bandwidth is over the fewest bytes the
operation must move (``Inputs.min_bytes``).  On a CPU it runs the torch
reference and the Triton interpreter at the requested (tiny) sizes and says
the times mean nothing.
"""

import math
import os
import sys
import time

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

_channel = protocol.channel_from(os.environ)
_emit = _channel.emit


def _timed_import(name):
    started = time.perf_counter()
    __import__(name)
    return time.perf_counter() - started


def _settings():
    sizes = [tuple(int(x) for x in item.split("x")) for item in os.environ[protocol.BENCH_SIZES].split(",")]
    return sizes, os.environ[protocol.BENCH_BACKENDS].split(","), int(os.environ[protocol.BENCH_RATIO])


MAX_RELATIVE_ERROR = 8e-3  # the tests' bound for a bf16 output (tests/kernels/tolerances.py)
TIMED_RUNS = 2


def _relative_error(inputs, kernel_output):
    import torch

    keep = inputs.slot_mapping >= 0
    rows = kernel_output.view(-1, inputs.kv.shape[1])[inputs.slot_mapping[keep].long()].double()
    expected = inputs.expected()[keep]
    if torch.isnan(rows).any():
        return float("nan")
    return float((rows - expected).norm() / expected.norm())


def _error_is_acceptable(error):
    return error is not None and not math.isnan(error) and error <= MAX_RELATIVE_ERROR


def _copy_bandwidth(torch, do_bench):
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    milliseconds = do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    return 2 * source.numel() / (milliseconds * 1e-3) / 1e9


def _measure_gpu(run, sets, do_bench):
    """Milliseconds per call of ``TIMED_RUNS`` separate timings, rotating over ``sets``, and how
    they were taken: the launch alone (every set's call captured once in a CUDA graph, host work
    done at capture, the graph's replays timed and divided by the sets), or, where capture fails,
    the eager call (host preparation included)."""
    import torch

    def call_all():
        for inputs in sets:
            run(*inputs.args(), ratio=inputs.ratio)

    call_all()  # warm up: compile, load the module
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call_all()
        runs = [do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / len(sets) for _ in range(TIMED_RUNS)]
        how = f"launch alone: CUDA graph of {len(sets)} calls replayed"
    except Exception as exc:  # a capture that fails: the eager timing below still says something
        counter = [0]

        def call():
            inputs = sets[counter[0] % len(sets)]
            counter[0] += 1
            run(*inputs.args(), ratio=inputs.ratio)

        runs = [do_bench(call, warmup=25, rep=100, return_mode="median") for _ in range(TIMED_RUNS)]
        how = f"eager call, host preparation included (graph capture failed: {type(exc).__name__})"
    torch.cuda.synchronize()  # a launch error during timing surfaces here
    return runs, how


def _set_count(inputs, l2_bytes):
    """Input sets to rotate so that together they are at least three times the L2 cache."""
    per_set = sum(t.numel() * t.element_size() for t in inputs.args())
    return max(2, min(256, -(-3 * l2_bytes // per_set)))


def _measure_cpu(run, inputs, repeats=3):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(*inputs.args(), ratio=inputs.ratio)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1e3


def _backend(name):
    from diagtools.kernels import compress_norm_rope_store

    return lambda *args, **kwargs: compress_norm_rope_store(*args, backend=name, **kwargs)


def _row(size, backend, runs, inputs, error, copy_gbps, note):  # noqa: PLR0917 - one flat record
    milliseconds = max(runs) if runs else None  # the slower of the runs' medians; the spread says how far apart
    gbps = inputs.min_bytes() / (milliseconds * 1e-3) / 1e9 if milliseconds else None
    return {
        "size": f"G={size[0]} D={size[1]}",
        "G": size[0],
        "D": size[1],
        "backend": backend,
        "median_ms": milliseconds,
        "runs_ms": runs,
        "spread": (max(runs) - min(runs)) / min(runs) if runs and len(runs) > 1 else None,
        "GB/s": gbps,
        "copy_fraction": gbps / copy_gbps if gbps and copy_gbps else None,
        "max_rel_error": error,
        "min_bytes": inputs.min_bytes(),
        "note": note,
    }


def _bench_size(size, backends, ratio, on_gpu, tools):
    from diagtools.kernels.reference import make_inputs

    device = "cuda" if on_gpu else "cpu"
    first = make_inputs(size[0], size[1], ratio=ratio, device=device)
    count = _set_count(first, tools["l2_bytes"]) if on_gpu else 1
    sets = [first, *(make_inputs(size[0], size[1], ratio=ratio, device=device) for _ in range(count - 1))]
    for backend in backends:
        if backend == "cutedsl" and not on_gpu:
            _emit("row", **_cutedsl_compile_only(size, ratio, sets[0]))
            continue
        _emit("row", **_bench_backend(size, backend, ratio, on_gpu, tools, sets))


def _bench_backend(size, backend, ratio, on_gpu, tools, sets):  # noqa: PLR0917 - one row's inputs
    from diagtools.kernels.reference import make_inputs

    run = _backend(backend)
    check = make_inputs(size[0], size[1], ratio=ratio, device="cuda" if on_gpu else "cpu")
    try:
        run(*check.args(), ratio=ratio)
        if on_gpu:
            import torch

            torch.cuda.synchronize()  # a launch or run-time error surfaces here, not later
        error = _relative_error(check, check.kv_cache)
    except Exception as exc:
        return _row(size, backend, None, sets[0], None, tools.get("copy_gbps"), f"failed: {type(exc).__name__}: {exc}")
    if not _error_is_acceptable(error):
        note = f"not timed: error {error:.3g} over {MAX_RELATIVE_ERROR:g} or NaN"
        return _row(size, backend, None, sets[0], error, tools.get("copy_gbps"), note)
    if on_gpu:
        try:
            runs, how = _measure_gpu(run, sets, tools["do_bench"])
        except Exception as exc:
            note = f"timing failed: {type(exc).__name__}: {exc}"
            return _row(size, backend, None, sets[0], error, tools.get("copy_gbps"), note)
        note = f"{len(sets)} input sets rotated; {how}"
    else:
        runs = [_measure_cpu(run, sets[0])]
        note = "CPU: time not meaningful" + (" (Triton interpreter)" if backend == "triton" else "")
    return _row(size, backend, runs, sets[0], error, tools.get("copy_gbps"), note)


def _cutedsl_compile_only(size, ratio, inputs):
    started = time.perf_counter()
    try:
        from diagtools.kernels.cuda_launch import compiles_here
        from diagtools.kernels.cutedsl_impl import kernel_ptx

        kernel_ptx(size[1], ratio)
        if compiles_here():
            arch = os.environ.get("CUTE_DSL_ARCH", "sm_90a")
            note = f"CPU: compiled only (PTX for {arch}) in {time.perf_counter() - started:.2f} s"
        else:
            note = "CPU: not compiled here (no nvidia-cutlass-dsl): the shipped PTX for sm_90a was read, not run"
    except Exception as exc:
        note = f"CPU: compile failed: {type(exc).__name__}: {exc}"
    return _row(size, "cutedsl", None, inputs, None, None, note)


def main():
    sizes, backends, ratio = _settings()
    import_costs = {"diagtools.kernels": _timed_import("diagtools.kernels"), "torch": _timed_import("torch")}
    import torch

    real_driver = os.environ.get(protocol.DRIVER_KIND) == "real"
    on_gpu = real_driver and torch.version.cuda is not None and torch.cuda.is_available()
    tools = {}
    if on_gpu:
        from triton.testing import do_bench

        tools["do_bench"] = do_bench
        tools["copy_gbps"] = _copy_bandwidth(torch, do_bench)
        tools["l2_bytes"] = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    for module in ("diagtools.kernels.triton_impl", "diagtools.kernels.cutedsl_impl"):
        try:
            import_costs[module] = _timed_import(module)
        except ImportError as exc:
            import_costs[module] = f"unavailable: {exc}"
    _emit(
        "meta",
        device=torch.cuda.get_device_name(0) if on_gpu else "cpu",
        timing_meaningful=on_gpu,
        copy_gbps=tools.get("copy_gbps"),
        l2_bytes=tools.get("l2_bytes"),
        max_rel_error=MAX_RELATIVE_ERROR,
        import_s=import_costs,
        versions={"python": sys.version.split()[0], "torch": torch.__version__},
    )
    for size in sizes:
        _bench_size(size, backends, ratio, on_gpu, tools)
    _emit("done")


main()
