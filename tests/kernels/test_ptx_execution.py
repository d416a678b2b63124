"""The shipped CuTe DSL kernels, executed on the CPU by a PTX interpreter (``ptxvm``).

The exact PTX a GPU loads runs here on CPU tensors, with the arguments the real host code packs,
and its output is checked against the float64 reference exactly as the GPU tests check it
(``tolerances.py``), poisoned bytes included, and the bytes each tensor gave or took are counted.
This is what the CPU can say about the kernels'
arithmetic, indexing and byte layout; speed, and the approximate instructions' last bits, are
the GPU check's (``benchmarks/gpu_check.sh``).  The interpreter's own semantics are pinned by
small hand-written programs, and mutations of the kernels' PTX show the checks can fail.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from tests.conftest import require

torch = require("torch", "kernels")

from diagtools.kernels import cutedsl_impl, state_cutedsl  # noqa: E402
from diagtools.kernels.reference import make_inputs  # noqa: E402
from diagtools.kernels.state import LAYOUTS  # noqa: E402
from diagtools.kernels.state_reference import StateInputs, make_state_inputs  # noqa: E402

from .ptxvm import Kernel, Memory, PtxError, run_launch  # noqa: E402
from .tolerances import assert_matches_reference, assert_state_store_matches_reference  # noqa: E402

C4_REQUESTS = ((0, 13), (5, 6), (30, 2), (6, 1), (10, 1))  # a first group, windows across blocks, decodes
C128_REQUESTS = ((0, 128), (129, 127), (255, 1), (300, 1))  # three boundaries, idle tokens around them


def _state_inputs(ratio: int, *, int32: bool = False, seed: int = 0, block_size: int = 64) -> StateInputs:
    requests = C4_REQUESTS if ratio == 4 else C128_REQUESTS
    padding = 0.2 if ratio == 4 else 0.0
    inputs = make_state_inputs(ratio, requests, padding=padding, seed=seed, block_size=block_size)
    if int32:
        args = [t.int() if t.dtype == torch.int64 else t for t in inputs.args()]
        inputs = StateInputs(*args, ratio=ratio)
    return inputs


def _run_state(inputs: StateInputs, ptx: str | None = None) -> Memory:
    launch = state_cutedsl.plan_launch(*inputs.args(), inputs.ratio, 1e-6)
    return run_launch(ptx or state_cutedsl.prebuilt_path(inputs.ratio).read_text(), launch)


# The grid: C4 with int64 and int32 indices, C4 with two-token cache blocks (a block's scales sit
# right after two tokens' data), and C128.
@pytest.mark.parametrize(
    ("ratio", "int32", "block_size"), [(4, False, 64), (4, True, 64), (4, False, 2), (128, False, 64)]
)
def test_the_state_kernel_ptx_computes_the_reference_bytes(ratio, int32, block_size):
    inputs = _state_inputs(ratio, int32=int32, seed=ratio + int32 + block_size, block_size=block_size)
    working = int(inputs.working().sum())
    assert working >= 3
    memory = _run_state(inputs)
    assert_state_store_matches_reference(inputs)
    # each working token reads the 512-wide kv and score parts of its window rows once, nothing
    # more of the state, and writes its 576 data bytes and 8 scale bytes once
    window = LAYOUTS[ratio].window
    assert memory.traffic(inputs.state_cache) == (working * window * 2 * 512 * 4, 0)
    assert memory.traffic(inputs.kv_cache) == (0, working * (576 + 8))


@pytest.mark.parametrize("head_dim", [512, 128])
def test_the_simplified_kernel_ptx_computes_the_reference_rows(head_dim):
    """Two CTAs for 37 groups: every warp walks several groups through its prefetching loop."""
    inputs = make_inputs(37, head_dim, seed=head_dim)
    launch = cutedsl_impl.plan_launch(*inputs.args(), 4, 1e-6, multiprocessors=1, ctas_per_sm=2)
    assert launch.grid == (2, 1, 1)
    memory = run_launch(cutedsl_impl.prebuilt_path(head_dim, 4).read_text(), launch)
    assert_matches_reference(inputs)
    kept = int((inputs.slot_mapping >= 0).sum())
    assert memory.traffic(inputs.kv) == (kept * 4 * head_dim * 2, 0)  # padded groups read no rows
    assert memory.traffic(inputs.kv_cache) == (0, kept * head_dim * 2)


# ----------------------------------------------------------------------------- the checks can fail


def _mutate(ptx: str, pattern: str, replacement: str) -> str:
    mutated, count = re.subn(pattern, replacement, ptx, count=1)
    assert count == 1, pattern
    return mutated


def test_swapped_fp8_bytes_are_caught():
    ptx = state_cutedsl.prebuilt_path(4).read_text()
    swapped = _mutate(ptx, r"(cvt\.rn\.satfinite\.e4m3x2\.f32\s+%rs\d+), (%r\d+), (%r\d+);", r"\1, \3, \2;")
    inputs = _state_inputs(4, seed=5)
    _run_state(inputs, swapped)
    with pytest.raises(AssertionError):
        assert_state_store_matches_reference(inputs)


def test_a_wrong_score_column_is_caught():
    ptx = state_cutedsl.prebuilt_path(4).read_text()
    shifted = _mutate(ptx, r"(ld\.global\.v4\.b32\s+\{[^}]*\}, \[%rd\d+)\+4096\]", r"\1+4112]")
    inputs = _state_inputs(4, seed=6)
    _run_state(inputs, shifted)
    with pytest.raises(AssertionError):
        assert_state_store_matches_reference(inputs)


def test_a_launch_past_the_tensors_is_refused():
    """Too many tokens: the kernel reads positions past the tensor, which the interpreter refuses."""
    inputs = _state_inputs(4, seed=7)
    launch = state_cutedsl.plan_launch(*inputs.args(), 4, 1e-6)
    arguments = list(launch.arguments)
    arguments[8] += 64  # tokens
    grid = (state_cutedsl.StateLaunchConfig(4).grid(arguments[8]), 1, 1)
    kernel = Kernel(state_cutedsl.prebuilt_path(4).read_text())
    with pytest.raises(PtxError, match="outside every tensor"):
        kernel.run(grid, launch.block, arguments, Memory(launch.keep_alive))


# ----------------------------------------------------------------------------- the interpreter itself

HEADER = ".version 8.8\n.target sm_90a\n.address_size 64\n"


def _program(body: str, params: str = ".param .u64 out_param") -> Kernel:
    return Kernel(HEADER + f".visible .entry probe(\n\t{params}\n)\n.reqntid 64, 1, 1\n{{\n{body}\n}}\n")


def _words(kernel: Kernel, lanes: int = 64, words: int = 1) -> np.ndarray:
    out = torch.zeros(lanes * words, dtype=torch.int32)
    kernel.run((1, 1, 1), (64, 1, 1), [out.data_ptr()], Memory([out]))
    return out.numpy().view(np.uint32).reshape(lanes, words)


STORE_PER_THREAD = """
\tld.param.b64 %rd1, [out_param];
\tmov.u32 %r1, %tid.x;
\tmul.wide.u32 %rd2, %r1, {stride};
\tadd.s64 %rd3, %rd1, %rd2;
"""


def test_packed_conversions_put_the_first_operand_high():
    body = STORE_PER_THREAD.format(stride=4) + (
        "\tcvt.rn.satfinite.e4m3x2.f32 %rs1, 0f3F800000, 0fC0000000;\n"  # a = 1.0 (0x38), b = -2.0 (0xC0)
        "\tcvt.rn.bf16x2.f32 %r2, 0f3F800000, 0fC0000000;\n"  # a = 1.0 (0x3F80), b = -2.0 (0xC000)
        "\tmov.b32 %r3, {%rs1, %rs1};\n"  # packing: the first element is the low half
        "\tsetp.lt.u32 %p1, %r1, 32;\n"
        "\tselp.b32 %r4, %r2, %r3, %p1;\n"
        "\tst.global.b32 [%rd3], %r4;\n\tret;"
    )
    words = _words(_program(body))
    assert (words[:32] == 0x3F80C000).all()
    assert (words[32:] == 0x38C038C0).all()


def test_shuffles_divisions_and_shifts():
    body = STORE_PER_THREAD.format(stride=16) + (
        "\tmov.u32 %r2, %laneid;\n"
        "\tshfl.sync.bfly.b32 %r3, %r2, 5, 31, -1;\n"
        "\tsub.s32 %r4, 0, %r1;\n"  # -tid
        "\tdiv.s32 %r5, %r4, 3;\n"  # truncates toward zero
        "\tshr.s32 %r6, %r4, 1;\n"  # arithmetic
        "\tshfl.sync.idx.b32 %r7, %r2, 7, 31, -1;\n"
        "\tst.global.v4.b32 [%rd3], {%r3, %r5, %r6, %r7};\n\tret;"
    )
    words = _words(_program(body), words=4).view(np.int32)
    tid = np.arange(64)
    assert (words[:, 0] == (tid % 32) ^ 5).all()
    assert (words[:, 1] == -(tid // 3)).all()
    assert (words[:, 2] == (-tid) >> 1).all()
    assert (words[:, 3] == 7).all()


def test_a_barrier_orders_shared_memory_between_warps():
    body = (
        "\t.shared .align 16 .b8 buffer[256];\n"
        + STORE_PER_THREAD.format(stride=4)
        + (
            "\tmov.b32 %r2, buffer;\n"
            "\tmul.lo.s32 %r3, %r1, 4;\n"
            "\tadd.s32 %r4, %r2, %r3;\n"
            "\tmul.lo.s32 %r5, %r1, 10;\n"
            "\tst.shared.b32 [%r4], %r5;\n"
            "\tbar.sync 0;\n"
            "\txor.b32 %r6, %r3, 128;\n"  # the other warp's slot
            "\tadd.s32 %r7, %r2, %r6;\n"
            "\tld.shared.b32 %r8, [%r7];\n"
            "\tst.global.b32 [%rd3], %r8;\n\tret;"
        )
    )
    words = _words(_program(body))[:, 0]
    assert (words == (np.arange(64) ^ 32) * 10).all()


def test_fma_rounds_once_and_fp32_overflows_to_infinity():
    body = STORE_PER_THREAD.format(stride=8) + (
        f"\tfma.rn.f32 %r2, 0f{_hex(1 + 2**-12)}, 0f{_hex(1 + 2**-12)}, 0f{_hex(-1.0)};\n"
        "\tmul.f32 %r3, 0fFF61B1E6, 0f3FB8AA3B;\n"  # -3e38 * log2(e)
        "\tst.global.v2.b32 [%rd3], {%r2, %r3};\n\tret;"
    )
    out = _words(_program(body), words=2)
    fused = out[:, 0].view(np.float32)
    assert (fused == np.float32(2**-11 + 2**-24)).all()  # unfused would lose the 2**-24
    assert np.isneginf(out[:, 1].view(np.float32)).all()


def test_misaligned_and_out_of_bounds_accesses_are_refused():
    misaligned = _program(STORE_PER_THREAD.format(stride=4) + "\tst.global.v4.b32 [%rd3+4], {%r1, %r1, %r1, %r1};")
    with pytest.raises(PtxError, match="misaligned 16-byte global store"):
        _words(misaligned)
    past = _program(STORE_PER_THREAD.format(stride=4) + "\tst.global.b32 [%rd3+256], %r1;\n\tret;")
    with pytest.raises(PtxError, match="outside every tensor"):
        _words(past)


def _hex(value: float) -> str:
    return struct.pack(">f", value).hex().upper()
