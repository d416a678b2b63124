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
from diagtools.kernels.state_cutedsl import StateLaunchConfig  # noqa: E402
from diagtools.kernels.state_reference import StateInputs, make_state_inputs  # noqa: E402

from .edges import C4_REQUESTS, C128_EDGE_REQUESTS  # noqa: E402
from .ptxvm import (  # noqa: E402
    Kernel,
    LaunchStats,
    Memory,
    PtxError,
    bank_conflict,
    fma_f32,
    run_launch,
)
from .tolerances import (  # noqa: E402
    GPU_STORED_VALUE_ERROR,
    assert_bytes_match_reference,
    assert_matches_reference,
    assert_state_bytes_match_reference,
    assert_state_store_matches_reference,
    with_edge_tiles,
)

C128_REQUESTS = ((0, 128), (129, 127), (255, 1), (300, 1))  # three boundaries, idle tokens around them
ONE_C128_TOKEN = ((100, 28),)  # one boundary (position 127) among 28 tokens: one CTA, for the slower checks


def _state_inputs(
    ratio: int, *, int32: bool = False, seed: int = 0, block_size: int = 64, one_c128: bool = False
) -> StateInputs:
    requests = C4_REQUESTS if ratio == 4 else ONE_C128_TOKEN if one_c128 else C128_REQUESTS
    padding = 0.2 if ratio == 4 else 0.0
    inputs = make_state_inputs(ratio, requests, padding=padding, seed=seed, block_size=block_size)
    if int32:
        args = [t.int() if t.dtype == torch.int64 else t for t in inputs.args()]
        inputs = StateInputs(*args, ratio=ratio)
    return inputs


def _run_state(inputs: StateInputs, ptx: str | None = None, **options) -> Memory:
    launch = state_cutedsl.plan_launch(*inputs.args(), inputs.ratio, inputs.eps)
    return run_launch(ptx or state_cutedsl.prebuilt_path(inputs.ratio).read_text(), launch, **options)


def shipped_stage(config: StateLaunchConfig) -> str:
    """The shipped PTX of one stage of a plan."""
    return state_cutedsl.prebuilt_path(config.ratio, config.stage).read_text()


def _run_split(inputs: StateInputs, ptx=shipped_stage, **options) -> Memory:
    """The C128 plan with its windows split across CTAs (as on a GPU of 132 multiprocessors), both stages."""
    launch = state_cutedsl.plan_launch(*inputs.args(), inputs.ratio, inputs.eps, multiprocessors=132)
    assert len(launch.stages()) == 2
    return run_launch(ptx, launch, **options)


# The grid: C4 with int64 and int32 indices, C4 with two-token cache blocks (a block's scales sit
# right after two tokens' data), and C128.  The weight sends tiles 0-3 down the zero-tile,
# tiny-tile (below the amax floor), large-exponent and negative paths.
@pytest.mark.parametrize(
    ("ratio", "int32", "block_size"), [(4, False, 64), (4, True, 64), (4, False, 2), (128, False, 64)]
)
def test_the_state_kernel_ptx_stores_the_reference_bytes(ratio, int32, block_size):
    inputs = with_edge_tiles(_state_inputs(ratio, int32=int32, seed=ratio + int32 + block_size, block_size=block_size))
    working = int(inputs.working().sum())
    assert working >= 3
    stats = LaunchStats()
    memory = _run_state(inputs, stats=stats)
    assert_state_store_matches_reference(inputs)  # poison outside, padding bytes, FP8 precision
    checked = assert_state_bytes_match_reference(inputs)  # and every byte, against the quantizer
    assert checked.ambiguous_fraction < 0.01, checked
    # each working token reads the 512-wide kv and score parts of its window rows once, nothing
    # more of the state, and writes its 576 data bytes and 8 scale bytes once
    window = LAYOUTS[ratio].window
    assert memory.traffic(inputs.state_cache) == (working * window * 2 * 512 * 4, 0)
    assert memory.traffic(inputs.kv_cache) == (0, working * (576 + 8))
    # only working tokens are launched, and the layout's promises hold
    assert stats.working_ctas == stats.ctas == -(-working // StateLaunchConfig(ratio).tokens_per_cta)
    vectors = [a for a in stats.of("global", "ld") if a.lane_bytes == 16]
    assert vectors
    assert all(a.contiguous == a.executed and a.bytes == 512 * a.executed for a in vectors)
    assert all(a.worst_conflict == 1 for a in stats.of("shared", "ld") + stats.of("shared", "st"))


@pytest.mark.parametrize("ratio", [4, 128])
def test_the_state_kernel_ptx_stores_the_reference_bytes_with_the_edges_in_tiles_4_to_6(ratio):
    """The zero, tiny, large-exponent and negative tiles moved to tiles 4, 5, 6 and 0: each of the
    kernel's quarters meets every edge path (with the grid above, tiles 0-3 did)."""
    inputs = with_edge_tiles(_state_inputs(ratio, seed=31 + ratio), first=4)
    _run_state(inputs)
    assert_state_store_matches_reference(inputs)
    checked = assert_state_bytes_match_reference(inputs)
    assert checked.ambiguous_fraction < 0.01, checked


@pytest.mark.parametrize("schedule", ["reverse", "round robin"])
def test_the_c128_merge_is_right_whatever_order_the_warps_run_in(schedule):
    """The eight warps of a C128 token meet at one barrier; run them back to front, and one
    instruction each in turn, and the bytes are the same (the race detector watches each run)."""
    inputs = with_edge_tiles(_state_inputs(128, seed=21, one_c128=True))
    _run_state(inputs, schedule=schedule)
    assert_state_bytes_match_reference(inputs)


@pytest.mark.parametrize("schedule", ["in order", "reverse", "round robin"])
def test_a_c128_window_split_across_ctas_stores_the_reference_bytes(schedule):
    """Three working C128 tokens, 16 CTAs each: every piece's four warps merge at their barrier, the finish
    stage merges the 16 pieces; every stored byte as the quantizer's, in any warp order.  Each state row is
    read once, and each piece's partial state (maximum, denominator and sum of 512 features) written once and
    read once; every CTA of both stages works."""
    inputs = with_edge_tiles(_state_inputs(128, seed=23))
    stats = LaunchStats()
    memory = _run_split(inputs, schedule=schedule, stats=stats)
    assert_state_store_matches_reference(inputs)
    checked = assert_state_bytes_match_reference(inputs)
    assert checked.ambiguous_fraction < 0.01, checked
    working = int(inputs.working().sum())
    assert memory.traffic(inputs.state_cache) == (working * 128 * 2 * 512 * 4, 0)
    partials = working * state_cutedsl.PIECES * 3 * 512 * 4
    buffer = next(t for t in memory.buffers if t.data.size == partials)
    assert (buffer.read_bytes, buffer.written_bytes) == (partials, partials)
    assert stats.ctas == stats.working_ctas == working * state_cutedsl.PIECES + -(-working // 4)


def test_a_split_window_is_right_for_a_first_group_and_the_approximations_bounds():
    """One token, its pieces far apart in the state cache's blocks; the approximate instructions at either
    end of what the ISA allows."""
    for approximate in ("low", "high"):
        inputs = with_edge_tiles(_state_inputs(128, seed=24, one_c128=True))
        _run_split(inputs, approximate=approximate)
        assert_state_store_matches_reference(inputs)
        assert_state_bytes_match_reference(inputs, GPU_STORED_VALUE_ERROR)


@pytest.mark.parametrize("head_dim", [512, 128])
def test_the_simplified_kernel_ptx_computes_the_reference_rows(head_dim):
    """Two CTAs for 37 groups: every warp walks several groups through its prefetching loop."""
    inputs = make_inputs(37, head_dim, seed=head_dim)
    launch = cutedsl_impl.plan_launch(*inputs.args(), 4, 1e-6, multiprocessors=1, ctas_per_sm=2)
    assert launch.grid == (2, 1, 1)
    memory = run_launch(cutedsl_impl.prebuilt_path(head_dim, 4).read_text(), launch)
    assert_matches_reference(inputs)
    assert assert_bytes_match_reference(inputs) < 0.01  # every stored bf16 value, rounded once to nearest even
    kept = int((inputs.slot_mapping >= 0).sum())
    assert memory.traffic(inputs.kv) == (kept * 4 * head_dim * 2, 0)  # padded groups read no rows
    assert memory.traffic(inputs.kv_cache) == (0, kept * head_dim * 2)


# ----------------------------------------------------------------------------- the checks can fail


def _mutate(ptx: str, pattern: str, replacement: str) -> str:
    mutated, count = re.subn(pattern, replacement, ptx, count=1)
    assert count == 1, pattern
    return mutated


# The wrong kernels the checks above must catch (PTX mutated by instruction patterns) are in mutants.py,
# run by test_mutants.py; a removed barrier is a race, which only the interpreter's detector sees.


def test_a_removed_barrier_is_a_race():
    """Without the C128 merge's barrier the finishing warp reads what the others have not yet
    written: the race detector says so in every schedule, not only when warp 0 runs first."""
    ptx = _mutate(state_cutedsl.prebuilt_path(128).read_text(), r"\tbar\.sync \t0;\n", "")
    for schedule in ("in order", "reverse"):
        inputs = _state_inputs(128, seed=9, one_c128=True)
        with pytest.raises(PtxError, match="shared-memory race"):
            _run_state(inputs, ptx, schedule=schedule)


def test_a_removed_barrier_in_a_split_piece_is_a_race_and_a_lost_piece_is_wrong_bytes():
    """The partial stage's four warps meet at a barrier before its first warp merges them: without it, a race.
    A partial stage that leaves a quarter of every piece's maximum unwritten makes the finish stage merge the
    pieces with wrong weights: the stored values are off."""

    def without_barrier(config: StateLaunchConfig) -> str:
        text = shipped_stage(config)
        return _mutate(text, r"\tbar\.sync \t0;\n", "") if config.stage == "partial" else text

    with pytest.raises(PtxError, match="shared-memory race"):
        _run_split(_state_inputs(128, seed=10, one_c128=True), without_barrier, schedule="reverse")

    def piece_lost(config: StateLaunchConfig) -> str:
        text = shipped_stage(config)
        if config.stage != "partial":
            return text
        return _mutate(text, r"(?m)^\tst\.global\.v4\.b32 .*\n", "")  # the first quarter of the maximum: unwritten

    inputs = with_edge_tiles(_state_inputs(128, seed=11, one_c128=True))
    launch = state_cutedsl.plan_launch(*inputs.args(), 128, inputs.eps, multiprocessors=132)
    launch.keep_alive[9].zero_()  # what the finish stage reads where a piece wrote nothing: zeros, every run
    run_launch(piece_lost, launch)
    with pytest.raises(AssertionError):
        assert_state_store_matches_reference(inputs)


def test_a_launch_past_the_tensors_is_refused():
    """Too many working tokens: the kernel reads the compacted index past its tensor, which the
    interpreter refuses."""
    inputs = _state_inputs(4, seed=7)
    launch = state_cutedsl.plan_launch(*inputs.args(), 4, 1e-6)
    arguments = list(launch.arguments)
    arguments[11] += 64  # the working-token count
    grid = (state_cutedsl.StateLaunchConfig(4).grid(arguments[11]), 1, 1)
    kernel = Kernel(state_cutedsl.prebuilt_path(4).read_text())
    with pytest.raises(PtxError, match="outside the tensor its address came from"):
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
    with pytest.raises(PtxError, match="outside the tensor its address came from"):
        _words(past)


def test_an_access_past_its_tensor_into_the_next_one_is_refused():
    """Two tensors side by side in one allocation: a store past the first lands inside the second,
    which a check against "any tensor" would let through."""
    storage = torch.zeros(128, dtype=torch.int32)
    first, second = storage[:64], storage[64:]
    kernel = _program(
        STORE_PER_THREAD.format(stride=4) + "\tst.global.b32 [%rd3+4], %r1;\n\tret;",
        params=".param .u64 out_param,\n\t.param .u64 other_param",
    )
    with pytest.raises(PtxError, match="outside the tensor its address came from"):
        kernel.run((1, 1, 1), (64, 1, 1), [first.data_ptr(), second.data_ptr()], Memory([first, second]))


@pytest.mark.parametrize(
    "line",
    [
        "add.rz.f32 %r2, %r1, %r1;",  # a rounding mode other than nearest
        "cvt.rni.s32.f32 %r2, %r1;",  # float to integer
        "cvt.rm.bf16.f32 %rs1, %r1;",
        "mad.hi.s32 %r2, %r1, %r1, %r1;",
        "fma.rz.f32 %r2, %r1, %r1, %r1;",
        "shfl.bfly.b32 %r2, %r1, 1, 31;",  # the pre-sync shuffle, no member mask
        "ex2.f32 %r2, %r1;",
        "ld.global.volatile.b32 %r2, [%rd3];",
        "tanh.approx.f32 %r2, %r1;",
        "cvt.rz.satfinite.e4m3x2.f32 %rs1, %r1, %r1;",  # refused when parsed, not when reached
        "cvt.rn.f32.s32 %r2, %r1;",
    ],
)
def test_unmodelled_instructions_and_modifiers_are_refused(line):
    with pytest.raises(PtxError, match=r"modelled|not supported"):
        _program(STORE_PER_THREAD.format(stride=4) + f"\t{line}\n\tret;")


def test_round_toward_zero_and_flush_to_zero_are_modelled():
    x = 1 + 2**-8 + 2**-12  # bf16 to nearest: 1 + 2**-7; toward zero: 1
    body = STORE_PER_THREAD.format(stride=16) + (
        f"\tcvt.rn.bf16.f32 %rs1, 0f{_hex(x)};\n"
        f"\tcvt.rz.bf16.f32 %rs2, 0f{_hex(x)};\n"
        "\tmov.b32 %r2, {%rs1, %rs2};\n"
        f"\tmul.f32 %r3, 0f{_hex(2**-100)}, 0f{_hex(2**-30)};\n"  # 2**-130: an fp32 subnormal
        f"\tmul.ftz.f32 %r4, 0f{_hex(2**-100)}, 0f{_hex(2**-30)};\n"  # flushed to zero
        "\tmov.b32 %r5, 0f00400000;\n"  # a subnormal input (2**-127)
        "\tadd.ftz.f32 %r5, %r5, 0f00000000;\n"
        "\tst.global.v4.b32 [%rd3], {%r2, %r3, %r4, %r5};\n\tret;"
    )
    words = _words(_program(body), words=4)
    assert (words[:, 0] == 0x3F80_3F81).all()  # high half: .rz 0x3F80; low half: .rn 0x3F81
    assert (words[:, 1].view(np.float32) == np.float32(2**-130)).all()
    assert (words[:, 2] == 0).all()
    assert (words[:, 3] == 0).all()


def test_shuffle_clamp_segments_and_member_mask():
    body = STORE_PER_THREAD.format(stride=16) + (
        "\tmov.u32 %r2, %laneid;\n"
        "\tshfl.sync.down.b32 %r3, %r2, 4, 31, -1;\n"  # lanes 28-31 are past the clamp: they read themselves
        "\tshfl.sync.up.b32 %r4, %r2, 1, 0, -1;\n"  # lane 0 reads itself
        "\tshfl.sync.idx.b32 %r5, %r2, 3, 6175, -1;\n"  # c = 0x181f: segments of 8 lanes, lane 3 of each
        "\tshfl.sync.bfly.b32 %r6, %r2, 8, 6175, -1;\n"  # reaches earlier segments only (as __shfl_xor_sync)
        "\tst.global.v4.b32 [%rd3], {%r3, %r4, %r5, %r6};\n\tret;"
    )
    words = _words(_program(body), words=4)[:32].astype(np.int64)
    lane = np.arange(32)
    assert (words[:, 0] == np.where(lane + 4 <= 31, lane + 4, lane)).all()
    assert (words[:, 1] == np.maximum(lane - 1, 0)).all()
    assert (words[:, 2] == (lane & ~7) | 3).all()
    assert (words[:, 3] == np.where(lane ^ 8 <= (lane & 0x18) | 7, lane ^ 8, lane)).all()
    assert (words[8:16, 3] == lane[:8]).all()
    assert (words[:8, 3] == lane[:8]).all()
    half = STORE_PER_THREAD.format(stride=4) + "\tshfl.sync.bfly.b32 %r3, %r1, 1, 31, 65535;\n\tret;"
    with pytest.raises(PtxError, match="outside the member mask"):
        _words(_program(half))
    diverged = STORE_PER_THREAD.format(stride=4) + (
        "\tmov.u32 %r2, %laneid;\n\tsetp.lt.u32 %p1, %r2, 16;\n\t@%p1 shfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;\n\tret;"
    )
    with pytest.raises(PtxError, match="does not execute the shuffle"):
        _words(_program(diverged))


def test_mul_hi_and_ordered_float_compares():
    body = STORE_PER_THREAD.format(stride=16) + (
        "\tmul.hi.u32 %r2, -2147483648, 6;\n"  # 2**31 * 6 = 3 * 2**32: high half 3
        "\tmul.hi.s32 %r3, -1, 5;\n"  # -5: high half all ones
        "\tsetp.ne.f32 %p1, 0f7FC00000, 0f3F800000;\n"  # NaN != 1, ordered: false
        "\tsetp.neu.f32 %p2, 0f7FC00000, 0f3F800000;\n"  # unordered: true
        "\tselp.u32 %r4, 1, 0, %p1;\n\tselp.u32 %r5, 1, 0, %p2;\n"
        "\tst.global.v4.b32 [%rd3], {%r2, %r3, %r4, %r5};\n\tret;"
    )
    words = _words(_program(body), words=4)
    assert (words == np.array([3, 0xFFFFFFFF, 0, 1], dtype=np.uint32)).all()


def test_fma_rounds_once_where_fp64_would_round_twice():
    """(8 + 2**-20)(8 - 2**-20) + (2**30 + 128) is 2**30 + 192 - 2**-40: just under the midpoint of
    2**30 + 128 and 2**30 + 256.  Rounded to fp64 first it lands on the midpoint, which then rounds
    to even, 2**30 + 256; rounded once it is 2**30 + 128.  Random cases against exact rationals."""
    from fractions import Fraction

    a, b, c = np.float32(8 + 2**-20), np.float32(8 - 2**-20), np.float32(2**30 + 128)
    body = STORE_PER_THREAD.format(stride=4) + (
        f"\tfma.rn.f32 %r2, 0f{_hex(a)}, 0f{_hex(b)}, 0f{_hex(c)};\n\tst.global.b32 [%rd3], %r2;\n\tret;"
    )
    assert (_words(_program(body))[:, 0].view(np.float32) == np.float32(2**30 + 128)).all()
    assert np.float32(float(a) * float(b) + float(c)) == np.float32(2**30 + 256)  # what rounding twice gives
    generator = np.random.default_rng(3)
    x, y, z = (
        generator.standard_normal(2000).astype(np.float32) * 2.0 ** generator.integers(-20, 20, 2000) for _ in range(3)
    )
    want = [
        _round_f32(Fraction(float(i)) * Fraction(float(j)) + Fraction(float(k)))
        for i, j, k in zip(x, y, z, strict=True)
    ]
    assert (fma_f32(x, y, z) == np.array(want, dtype=np.float32)).all()


def test_races_and_bank_conflicts_are_seen():
    racy = (
        "\t.shared .align 16 .b8 buffer[256];\n"
        + STORE_PER_THREAD.format(stride=4)
        + (
            "\tmov.b32 %r2, buffer;\n\tmul.lo.s32 %r3, %r1, 4;\n\tadd.s32 %r4, %r2, %r3;\n"
            "\tst.shared.b32 [%r4], %r1;\n"
            "\txor.b32 %r6, %r3, 128;\n\tadd.s32 %r7, %r2, %r6;\n"
            "\tld.shared.b32 %r8, [%r7];\n\tst.global.b32 [%rd3], %r8;\n\tret;"
        )
    )
    out = torch.zeros(64, dtype=torch.int32)
    for schedule in ("in order", "reverse", "round robin"):
        with pytest.raises(PtxError, match="shared-memory race"):
            _program(racy).run((1, 1, 1), (64, 1, 1), [out.data_ptr()], Memory([out]), schedule=schedule)
    lanes = np.arange(32, dtype=np.uint64)
    assert bank_conflict(lanes * 16, 16) == 1  # 512 contiguous bytes: conflict-free
    assert bank_conflict(lanes * 64, 16) == 4  # 64 bytes a lane, as the old layout: 4-way
    assert bank_conflict(lanes * 64, 4) == 16  # scalar reads 64 bytes apart: 16-way
    assert bank_conflict(np.zeros(32, dtype=np.uint64), 4) == 1  # a broadcast


def _hex(value: float) -> str:
    return struct.pack(">f", value).hex().upper()


def _round_f32(value) -> float:
    """The fp32 nearest to an exact rational (ties to even), by bisection over the two neighbours."""
    from fractions import Fraction

    guess = np.float32(float(value))
    below = guess if Fraction(float(guess)) <= value else np.nextafter(guess, np.float32(-np.inf))
    above = np.nextafter(below, np.float32(np.inf))
    low, high = value - Fraction(float(below)), Fraction(float(above)) - value
    if low != high:
        return float(below if low < high else above)
    return float(below if (below.view(np.uint32) & 1) == 0 else above)


def test_a_compare_with_ftz_sees_a_subnormal_as_zero():
    body = STORE_PER_THREAD.format(stride=8) + (
        "\tmov.b32 %r2, 0f00400000;\n"  # 2**-127, a subnormal
        "\tsetp.gt.f32 %p1, %r2, 0f00000000;\n"
        "\tsetp.gt.ftz.f32 %p2, %r2, 0f00000000;\n"
        "\tselp.b32 %r3, 1, 0, %p1;\n\tselp.b32 %r4, 1, 0, %p2;\n"
        "\tst.global.v2.b32 [%rd3], {%r3, %r4};\n\tret;"
    )
    words = _words(_program(body), words=2)
    assert (words[:, 0] == 1).all()  # a subnormal is above zero
    assert (words[:, 1] == 0).all()  # flushed, it is zero


def test_approximate_instructions_are_off_by_at_most_what_the_isa_allows():
    """``low`` and ``high`` move each result by the PTX ISA's largest error, in ulps or relatively."""
    body = STORE_PER_THREAD.format(stride=16) + (
        f"\tex2.approx.f32 %r2, 0f{_hex(0.3)};\n"
        f"\trcp.approx.f32 %r3, 0f{_hex(3.0)};\n"
        f"\trsqrt.approx.f32 %r4, 0f{_hex(3.0)};\n"
        f"\trcp.rn.f32 %r5, 0f{_hex(3.0)};\n"  # not approximate: correctly rounded always
        "\tst.global.v4.b32 [%rd3], {%r2, %r3, %r4, %r5};\n\tret;"
    )
    results = {}
    for mode in ("exact", "low", "high"):
        out = torch.zeros(64 * 4, dtype=torch.int32)
        _program(body).run((1, 1, 1), (64, 1, 1), [out.data_ptr()], Memory([out]), approximate=mode)
        results[mode] = out.numpy().view(np.float32).reshape(64, 4)[0]
    exact, low, high = results["exact"], results["low"], results["high"]
    assert exact[0] == np.float32(2**0.3)
    assert exact[1] == exact[3] == np.float32(1 / 3)
    ulps = exact.view(np.int32).astype(np.int64)
    assert list(low.view(np.int32) - ulps) == [-2, -1, low.view(np.int32)[2] - ulps[2], 0]
    assert list(high.view(np.int32) - ulps) == [2, 1, high.view(np.int32)[2] - ulps[2], 0]
    for bound in (low[2], high[2]):  # rsqrt: within a relative 2**-22.9, and moved
        assert bound != exact[2]
        assert abs(float(bound) / float(exact[2]) - 1) <= 2**-22.9 + 2**-24


@pytest.mark.parametrize("approximate", ["low", "high"])
@pytest.mark.parametrize("ratio", [4, 128])
def test_the_stored_bytes_hold_wherever_the_approximations_land(ratio, approximate):
    """ex2, rcp and rsqrt off by the largest error the ISA allows, all in one direction: every byte is
    still one the reference quantizer gives within the GPU check's bracket."""
    inputs = with_edge_tiles(_state_inputs(ratio, seed=41 + ratio, one_c128=True))
    _run_state(inputs, approximate=approximate)
    assert_state_store_matches_reference(inputs)
    checked = assert_state_bytes_match_reference(inputs, GPU_STORED_VALUE_ERROR)
    assert checked.ambiguous_fraction < 0.05, checked


def test_a_race_between_ctas_on_global_memory_is_seen():
    """Two CTAs store to the same words: nothing orders them, so the bytes depend on the GPU's schedule."""
    same = _program(STORE_PER_THREAD.format(stride=4) + "\tst.global.b32 [%rd3], %r1;\n\tret;")
    out = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(PtxError, match="global-memory race between CTAs: CTA 1 writes"):
        same.run((2, 1, 1), (64, 1, 1), [out.data_ptr()], Memory([out]))
    apart = _program(
        STORE_PER_THREAD.format(stride=4)
        + "\tmov.u32 %r2, %ctaid.x;\n\tmul.wide.u32 %rd4, %r2, 256;\n\tadd.s64 %rd5, %rd3, %rd4;\n"
        "\tst.global.b32 [%rd5], %r1;\n\tret;"
    )
    wide = torch.zeros(128, dtype=torch.int32)
    apart.run((2, 1, 1), (64, 1, 1), [wide.data_ptr()], Memory([wide]))  # each CTA its own words: no race
    assert (wide.view(2, 64) == torch.arange(64)).all()
    read_back = _program(
        STORE_PER_THREAD.format(stride=4) + "\tld.global.b32 %r2, [%rd3];\n\tadd.s32 %r2, %r2, 1;\n"
        "\tst.global.b32 [%rd3], %r2;\n\tret;"
    )
    with pytest.raises(PtxError, match="global-memory race between CTAs"):  # CTA 1 reads what CTA 0 wrote
        read_back.run((2, 1, 1), (64, 1, 1), [out.data_ptr()], Memory([out]))


@pytest.mark.parametrize(("ratio", "multiprocessors"), [(4, 132), (128, None), (128, 132)])
def test_a_graph_safe_plan_replays_with_changed_inputs(ratio, multiprocessors):
    """Planned once with a bound (as a CUDA graph captures the launch), then replayed after every input
    changed in place: new positions, slots, state rows, weight and RoPE table.  Each replay runs the plan's
    device-side compaction and the same kernel with the same pointers and grid, and stores the new
    batch's bytes, poison elsewhere; the CTAs beyond the working tokens do nothing."""
    requests = C4_REQUESTS if ratio == 4 else C128_EDGE_REQUESTS
    first = make_state_inputs(ratio, requests, padding=0.4, seed=51)
    tokens, batch = first.positions.numel(), len(requests)
    bound = state_cutedsl.working_bound(tokens, ratio, batch)
    launch = state_cutedsl.plan_launch(*first.args(), ratio, 1e-6, max_working=bound, multiprocessors=multiprocessors)
    split = len(launch.stages()) == 2
    assert split == (ratio == 128 and multiprocessors is not None)
    stats = LaunchStats()
    memory = run_launch(shipped_stage, launch, stats=stats)
    assert_state_store_matches_reference(first)
    assert_state_bytes_match_reference(first)
    assert not state_cutedsl.overflowed(launch)
    working = int(first.working().sum())
    if split:  # each working token's 16 pieces, and the finish CTAs that hold working tokens
        finishing = len({i // 4 for i in range(working)})
        assert stats.working_ctas == working * state_cutedsl.PIECES + finishing < stats.ctas
    else:
        assert stats.working_ctas == -(-working // StateLaunchConfig(ratio).tokens_per_cta) < stats.ctas
    assert memory.traffic(first.state_cache)[0] == working * LAYOUTS[ratio].window * 2 * 512 * 4
    before = first.working().clone()
    second = make_state_inputs(ratio, requests, padding=0.4, seed=52)  # other slots: other working tokens
    for mine, theirs in zip(first.args(), second.args(), strict=True):
        assert mine.shape == theirs.shape  # a replay keeps every shape
        mine.copy_(theirs)
    assert not torch.equal(first.working(), before)
    run_launch(shipped_stage, launch)
    assert_state_store_matches_reference(first)  # the new batch's rows, poison everywhere else
    assert_state_bytes_match_reference(first)


def test_a_batch_over_its_bound_is_flagged_not_cut_silently():
    inputs = make_state_inputs(4, C4_REQUESTS, padding=0.0, seed=53)
    working = int(inputs.working().sum())
    launch = state_cutedsl.plan_launch(*inputs.args(), 4, 1e-6, max_working=working - 1)
    run_launch(state_cutedsl.prebuilt_path(4).read_text(), launch)
    assert state_cutedsl.overflowed(launch)
    with pytest.raises(AssertionError, match="not written"):
        assert_state_store_matches_reference(inputs)
