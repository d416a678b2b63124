"""compress_state_store's Triton and CuTe DSL kernels on a real GPU against the float64 reference,
per backend and size.

One child process runs every case (this test process must not initialize CUDA): the benchmark's
four batches (C4 and C128, decode and prefill, real boundary density) and a mixed batch per
compressor with padding, int32 indices and windows across state blocks.  Each case draws fresh
inputs with the output poisoned and the RMSNorm weight sending tiles down the zero, tiny and
large-exponent paths, synchronizes after the launch, checks every stored byte against the
reference quantizer (a wider bracket than the CPU's, for the approximate instructions) and prints
one JSON line.
"""

from __future__ import annotations

import json

import pytest

from diagtools.driver import real_driver_path

from .children import child_timeout, run_check_child

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(real_driver_path() is None, reason="no real libcuda.so.1 loads on this machine (no GPU driver)"),
]

# The grid: the four benchmark batches (padding 0: every boundary token works), then one mixed
# batch per compressor (prefills and decodes, 25% padding) with int64 and with int32 indices.
SIZES = [
    "C4 decode 1024",
    "C4 prefill 32768",
    "C128 decode 1024",
    "C128 prefill 32768",
    "C4 mixed",
    "C128 mixed",
    "C4 mixed int32",
]
CASES = [f"{backend} {size}" for backend in ("triton", "cutedsl") for size in SIZES]

CHECK = """
import json, sys, traceback
sys.path.insert(0, "tests")
import torch
from diagtools.kernels import compress_state_store
from diagtools.kernels.state_reference import BENCH_SIZES, StateInputs, make_state_inputs
from kernels.tolerances import (
    GPU_STORED_VALUE_ERROR, assert_state_bytes_match_reference, assert_state_store_matches_reference, with_edge_tiles
)
MIXED = {"C4": (4, ((0, 301), (5, 6), (30, 2), (6, 1), (4095, 1))), "C128": (128, ((0, 700), (255, 1), (300, 1)))}
if not torch.cuda.is_available():
    print(json.dumps({"no_gpu": True})); sys.exit(0)
for case_name in json.loads(sys.argv[1]):
    case = {"case": case_name}
    backend, name = case_name.split(" ", 1)
    try:
        if name in BENCH_SIZES:
            ratio, requests = BENCH_SIZES[name]
            inputs = make_state_inputs(ratio, requests, padding=0.0, device="cuda", seed=ratio)
        else:
            ratio, requests = MIXED[name.split()[0]]
            inputs = make_state_inputs(ratio, requests, padding=0.25, state_block=16, device="cuda", seed=ratio + 1)
        with_edge_tiles(inputs)
        if name.endswith("int32"):
            args = [t.int() if t.dtype == torch.int64 else t for t in inputs.args()]
            inputs = StateInputs(*args, ratio=ratio)
        compress_state_store(*inputs.args(), ratio=ratio, backend=backend)
        torch.cuda.synchronize()
        assert_state_store_matches_reference(inputs)
        case["ambiguous"] = assert_state_bytes_match_reference(inputs, GPU_STORED_VALUE_ERROR).ambiguous_fraction
        case["ok"] = True
    except Exception as exc:
        case["ok"] = False
        case["error"] = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
    print(json.dumps(case), flush=True)
"""

_results: dict[str, dict[str, dict]] = {}


def _run(backend: str) -> dict[str, dict]:
    """Every case of one backend in one child (a faulting kernel cannot take the other backend's down)."""
    if backend not in _results:
        cases = [case for case in CASES if case.split(" ", 1)[0] == backend]
        _results[backend] = run_check_child(
            CHECK, [json.dumps(cases)], lambda record: record["case"], timeout=child_timeout(140)
        )
    return _results[backend]


@pytest.mark.parametrize("case", CASES)
def test_state_kernel_matches_the_reference_on_the_gpu(case):
    results = _run(case.split(" ", 1)[0])
    record = results.get(case)
    assert record is not None, f"the child ended before this case: {results['_child']}"
    assert record["ok"], record.get("error")


# A CUDA graph of the CuTe DSL launch, as vLLM captures a decode step: planned with a bound (the
# compaction on the device), captured once, replayed after the inputs changed in place; each replay's
# bytes against the reference.
GRAPH = """
import json, sys, traceback
sys.path.insert(0, "tests")
import torch
from diagtools.kernels import state_cutedsl
from diagtools.kernels.state_reference import make_state_inputs
from kernels.tolerances import (
    GPU_STORED_VALUE_ERROR, assert_state_bytes_match_reference, assert_state_store_matches_reference
)
if not torch.cuda.is_available():
    print(json.dumps({"no_gpu": True})); sys.exit(0)
multiprocessors = torch.cuda.get_device_properties(0).multi_processor_count
C4_BATCH, C128_BATCH = tuple((64 * k, 1 + k % 5) for k in range(64)), ((0, 256), (284, 100))
for name, ratio, requests, split in (("C4", 4, C4_BATCH, False), ("C128", 128, C128_BATCH, False),
                                     ("C128 split", 128, C128_BATCH, True)):
    case = {"case": name}
    try:
        inputs = make_state_inputs(ratio, requests, padding=0.4, device="cuda", seed=60 + ratio)
        bound = state_cutedsl.working_bound(inputs.positions.numel(), ratio, len(requests))
        launch = state_cutedsl.plan_launch(
            *inputs.args(), ratio, 1e-6, max_working=bound, multiprocessors=multiprocessors if split else None
        )
        assert len(launch.stages()) == (2 if split else 1), "the split plan was not chosen"
        device = torch.cuda.current_device()
        state_cutedsl.launch_planned(launch, device, torch.cuda.current_stream().cuda_stream)  # load, warm up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            state_cutedsl.launch_planned(launch, device, torch.cuda.current_stream().cuda_stream)
        for seed in (61, 62, 63):
            fresh = make_state_inputs(ratio, requests, padding=0.4, device="cuda", seed=seed + ratio)
            for mine, theirs in zip(inputs.args(), fresh.args()):
                mine.copy_(theirs)
            graph.replay()
            torch.cuda.synchronize()
            assert not state_cutedsl.overflowed(launch)
            assert_state_store_matches_reference(inputs)
            assert_state_bytes_match_reference(inputs, GPU_STORED_VALUE_ERROR)
        case["ok"] = True
    except Exception as exc:
        case["ok"] = False
        case["error"] = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
    print(json.dumps(case), flush=True)
"""


@pytest.mark.parametrize("case", ["C4", "C128", "C128 split"])
def test_the_cutedsl_launch_replays_in_a_cuda_graph_with_changing_inputs(case):
    if "graph" not in _results:
        _results["graph"] = run_check_child(GRAPH, [], lambda record: record["case"], timeout=child_timeout(140))
    results = _results["graph"]
    record = results.get(case)
    assert record is not None, f"the child ended before this case: {results['_child']}"
    assert record["ok"], record.get("error")
