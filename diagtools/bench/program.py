"""The kernel benchmark's subkernel: measures compress_norm_rope_store, streams rows.

Run by the runner in a fresh process (never in a notebook's kernel: on a GPU,
asking torch whether CUDA is there already initializes the driver).  On a GPU
it times every backend with ``triton.testing.do_bench`` over rotating input
sets and measures the device-to-device copy bandwidth; on a CPU it runs the
torch reference and the Triton interpreter at the requested (tiny) sizes and
says the times mean nothing.
"""

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


def _relative_error(inputs, kernel_output):
    import torch

    keep = inputs.slot_mapping >= 0
    rows = kernel_output.view(-1, inputs.kv.shape[1])[inputs.slot_mapping[keep].long()].double()
    expected = inputs.expected()[keep]
    if torch.isnan(rows).any():
        return float("nan")
    return float((rows - expected).norm() / expected.norm())


def _copy_bandwidth(torch, do_bench):
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    milliseconds = do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    return 2 * source.numel() / (milliseconds * 1e-3) / 1e9


def _measure_gpu(run, sets, do_bench):
    counter = [0]

    def call():
        inputs = sets[counter[0] % len(sets)]
        counter[0] += 1
        run(*inputs.args(), ratio=inputs.ratio)

    return do_bench(call, warmup=25, rep=100, return_mode="median")


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


def _row(size, backend, milliseconds, inputs, error, copy_gbps, note):  # noqa: PLR0917 - one flat record
    gbps = inputs.min_bytes() / (milliseconds * 1e-3) / 1e9 if milliseconds else None
    return {
        "size": f"G={size[0]} D={size[1]}",
        "G": size[0],
        "D": size[1],
        "backend": backend,
        "median_ms": milliseconds,
        "GB/s": gbps,
        "copy_fraction": gbps / copy_gbps if gbps and copy_gbps else None,
        "max_rel_error": error,
        "min_bytes": inputs.min_bytes(),
        "note": note,
    }


def _bench_size(size, backends, ratio, on_gpu, tools):
    from diagtools.kernels.reference import make_inputs

    device = "cuda" if on_gpu else "cpu"
    sets = [make_inputs(size[0], size[1], ratio=ratio, device=device) for _ in range(4 if on_gpu else 1)]
    for backend in backends:
        if backend == "cutedsl" and not on_gpu:
            _emit("row", **_cutedsl_compile_only(size, ratio, sets[0]))
            continue
        run = _backend(backend)
        check = make_inputs(size[0], size[1], ratio=ratio, device=device)
        run(*check.args(), ratio=ratio)
        error = _relative_error(check, check.kv_cache)
        if on_gpu:
            milliseconds = _measure_gpu(run, sets, tools["do_bench"])
            note = ""
        else:
            milliseconds = _measure_cpu(run, sets[0])
            note = "CPU: time not meaningful" + (" (Triton interpreter)" if backend == "triton" else "")
        _emit("row", **_row(size, backend, milliseconds, sets[0], error, tools.get("copy_gbps"), note))


def _cutedsl_compile_only(size, ratio, inputs):
    started = time.perf_counter()
    try:
        from diagtools.kernels.cutedsl_impl import compile_for

        compile_for(size[1], ratio)
        arch = os.environ.get("CUTE_DSL_ARCH", "sm_90a")
        note = f"CPU: compiled only (PTX for {arch}) in {time.perf_counter() - started:.2f} s"
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
        import_s=import_costs,
        versions={"python": sys.version.split()[0], "torch": torch.__version__},
    )
    for size in sizes:
        _bench_size(size, backends, ratio, on_gpu, tools)
    _emit("done")


main()
