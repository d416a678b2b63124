"""The CuTe DSL kernels at small sizes, for ``compute-sanitizer --tool memcheck`` on a GPU machine.

Run by ``gpu_check.sh`` under the sanitizer (filtered to the CuTe DSL kernels), so any
out-of-bounds or misaligned global or shared access of either kernel is reported with its
address.  Each case is also checked against the float64 reference, every stored byte of the state
kernels against the reference quantizer; one line per case, and a
non-zero exit when any case fails.  Sizes are small: every memory access is instrumented.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch
from kernels.tolerances import (
    GPU_STORED_VALUE_ERROR,
    assert_matches_reference,
    assert_state_bytes_match_reference,
    assert_state_store_matches_reference,
    with_edge_tiles,
)

from diagtools.kernels import compress_norm_rope_store, compress_state_store
from diagtools.kernels.reference import make_inputs
from diagtools.kernels.state_reference import make_state_inputs

STATE_CASES = {
    "state C4": (4, ((0, 21), (5, 6), (30, 2), (6, 1))),
    "state C128": (128, ((0, 260), (255, 1), (300, 1))),
}
SIMPLIFIED_CASES = {"simplified D=512": 257, "simplified D=128": 257}


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 0
    failures = 0
    for name, (ratio, requests) in STATE_CASES.items():
        failures += _case(name, _state, ratio, requests)
    for name, groups in SIMPLIFIED_CASES.items():
        head_dim = int(name.rsplit("=", 1)[1])
        failures += _case(name, _simplified, groups, head_dim)
    return 1 if failures else 0


def _state(ratio, requests):
    inputs = with_edge_tiles(make_state_inputs(ratio, requests, padding=0.25, device="cuda"))
    compress_state_store(*inputs.args(), ratio=ratio, backend="cutedsl")
    torch.cuda.synchronize()
    assert_state_store_matches_reference(inputs)
    assert_state_bytes_match_reference(inputs, GPU_STORED_VALUE_ERROR)


def _simplified(groups, head_dim):
    inputs = make_inputs(groups, head_dim, device="cuda")
    compress_norm_rope_store(*inputs.args(), backend="cutedsl")
    torch.cuda.synchronize()
    assert_matches_reference(inputs)


def _case(name, check, *arguments) -> int:
    try:
        check(*arguments)
    except Exception as exc:  # one failing case must not hide the others
        print(f"{name}: FAILED: {''.join(traceback.format_exception_only(exc)).strip()[-1500:]}", flush=True)
        return 1
    print(f"{name}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
