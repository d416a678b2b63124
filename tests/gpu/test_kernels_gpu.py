"""Both kernels on a real GPU against the float64 reference: one test case per (backend, size).

Each backend runs in its own child process (this test process must not initialize CUDA, and a
kernel that faults poisons its CUDA context: the other backend's cases still run).  The child
checks every size on fresh inputs, with the output cache poisoned, synchronizing after each
launch so a launch error belongs to its case, and prints one JSON line per case.
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

# The grid: G from one group to 65536, both head dims, plus int32 indices.  (G = 262144 is checked against the
# float64 reference by the benchmark before it is timed: here its CPU reference would take most of the step.)
SIZES = [(groups, head_dim) for head_dim in (512, 128) for groups in (1, 64, 4096, 65536)]
BACKENDS = ("triton", "cutedsl")

CHECK = """
import json, sys, traceback
sys.path.insert(0, "tests")
import torch
from diagtools.kernels import compress_norm_rope_store
from diagtools.kernels.reference import make_inputs
from kernels.tolerances import assert_matches_reference
backend, sizes = sys.argv[1], json.loads(sys.argv[2])
if not torch.cuda.is_available():
    print(json.dumps({"no_gpu": True})); sys.exit(0)
for groups, head_dim, index_dtype in sizes:
    case = {"groups": groups, "head_dim": head_dim, "index": index_dtype}
    try:
        inputs = make_inputs(groups, head_dim, device="cuda", seed=groups + head_dim)
        args = list(inputs.args())
        if index_dtype == "int32":
            args[4], args[5] = args[4].int(), args[5].int()
        compress_norm_rope_store(*args, backend=backend)
        torch.cuda.synchronize()
        assert_matches_reference(inputs)
        case["ok"] = True
    except Exception as exc:
        case["ok"] = False
        case["error"] = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
    print(json.dumps(case), flush=True)
"""

_results: dict[str, dict[tuple, dict]] = {}


def _cases() -> list[tuple[int, int, str]]:
    return [(g, d, "int64") for g, d in SIZES] + [(4096, 512, "int32"), (4096, 128, "int32")]


def _run_backend(backend: str) -> dict[tuple, dict]:
    if backend not in _results:
        _results[backend] = run_check_child(
            CHECK,
            [backend, json.dumps(_cases())],
            lambda record: (record["groups"], record["head_dim"], record["index"]),
            timeout=child_timeout(600),
        )
    return _results[backend]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("groups", "head_dim", "index"), _cases())
def test_kernel_matches_the_reference_on_the_gpu(backend, groups, head_dim, index):
    cases = _run_backend(backend)
    case = cases.get((groups, head_dim, index))
    assert case is not None, f"the {backend} child ended before this case: {cases['_child']}"
    assert case["ok"], case.get("error")
