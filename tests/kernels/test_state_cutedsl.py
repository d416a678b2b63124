"""compress_state_store's CuTe DSL kernel without a GPU: its PTX for sm_90a, the assembler's
verdict on it, and the host side of its launch.

The PTX checks compile the kernel here (nvidia-cutlass-dsl, ``CUTE_DSL_ARCH=sm_90a``) and count
what the design promises: 128-bit loads of every state-row part, the weight and cos/sin, 128-bit
stores of the FP8 bytes and the bf16 tail, one reciprocal per feature instead of divides, the
shuffles of the sum of squares and of the tile maxima, the packed e4m3 conversions.  ptxas (the
copy Triton ships) assembles the shipped PTX for sm_90a: no spills, and few enough registers for
two C128 CTAs per multiprocessor.  The launch checks run the real host code on CPU tensors.
The values the PTX computes are checked on the CPU by ``test_ptx_execution.py`` (a PTX
interpreter) and on a GPU by ``tests/gpu/test_state_gpu.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

torch = require("torch", "kernels")

from diagtools.kernels import compress_state_store, cuda_launch, state_cutedsl  # noqa: E402
from diagtools.kernels.cuda_launch import LoadedKernel, entry_of, launch_kernel  # noqa: E402
from diagtools.kernels.state_cutedsl import (  # noqa: E402
    PARAM_TYPES,
    PREBUILT,
    StateLaunchConfig,
    plan_launch,
    prebuilt_path,
)
from diagtools.kernels.state_reference import make_state_inputs  # noqa: E402

from .cutedsl_support import FakeDriver, code_lines, compile_in_child  # noqa: E402

COMPILE = """
import json, sys
from diagtools.kernels.state_cutedsl import PREBUILT, compile_ptx
print(json.dumps({f"{r} {s}": compile_ptx(r, sys.argv[1], stage=s) for r, s in PREBUILT}))
"""
SM90_REGISTERS = 65536


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """PTX per ratio (the whole kernel) and per (ratio, stage), compiled in a fresh interpreter (CUTE_DSL_ARCH is
    read at import)."""
    compiled = {}
    for key, text in compile_in_child(COMPILE, tmp_path_factory.mktemp("ptx")).items():
        ratio, stage = key.split()
        compiled[int(ratio), stage] = text
        if stage == "whole":
            compiled[int(ratio)] = text
    return compiled


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, "\n".join(code_lines(text))))


@pytest.mark.parametrize("ratio", [4, 128])
def test_ptx_moves_128_bit_vectors(ptx, ratio):
    text = ptx[ratio]
    config = StateLaunchConfig(ratio)
    assert ".target sm_90a" in text
    assert f".reqntid {config.threads}, 1, 1" in text
    # per window row of the warp: 4 vectors of kv and 4 of scores; then the weight (4); cos/sin two 8-byte pairs
    assert _count(r"ld\.global\.v4\.b32", text) == config.rows_per_warp * 8 + 4
    assert _count(r"ld\.global\.v2\.b32", text) == 2
    assert _count(r"ld\.global(?:\.\w+)*\.(?:u16|b16|s16|f16|bf16)\b", text) == 0  # no 16-bit scalar loads
    assert _count(r"ld\.global(?:\.\w+)*\.f32\b", text) == 0  # no scalar loads of state values
    # 4 FP8 bytes a lane per quarter (a warp stores 128 contiguous bytes), the bf16 tail 8 bytes a lane
    assert _count(r"st\.global\.v2\.b16", text) == 4
    assert _count(r"st\.global\.v2\.b32", text) == 1
    assert _count(r"st\.global\.(?:u8|b8)", text) == 5  # four scale bytes from lanes 0 and 16, the padding byte
    assert _count(r"cvt\.rn\.satfinite\.e4m3x2\.f32", text) == 8  # 16 values a lane, two at a time
    assert ".local" not in text


@pytest.mark.parametrize("ratio", [4, 128])
def test_ptx_reductions_and_special_functions(ptx, ratio):
    text = ptx[ratio]
    config = StateLaunchConfig(ratio)
    steps = config.rows_per_warp // state_cutedsl.CHUNK
    merge = config.splits if config.splits > 1 else 0
    # online softmax: one rescale and CHUNK gates per step and feature; the merge: one factor per split
    assert _count(r"ex2\.approx", text) == 16 * (steps * (1 + state_cutedsl.CHUNK) + merge)
    assert _count(r"rcp\.approx", text) == 16  # c = total / denominator, once per feature
    assert _count(r"div\.(?:rn|full|approx)\.f32", text) == 0
    assert _count(r"rsqrt\.approx", text) == 1
    assert _count(r"shfl\.sync\.bfly", text) == 5 + 4 * 4  # sum of squares over 32 lanes, 4 tile maxima over 16
    assert _count(r"\bdiv\.s64|\brem\.s64", text) == 0  # index arithmetic in 32 bits
    if config.splits == 1:
        assert _count(r"bar\.sync", text) == 0
        assert ".shared" not in "\n".join(code_lines(text))
    else:
        assert _count(r"bar\.sync", text) == 1  # the one barrier before the merge
        assert _count(r"st\.shared\.v4\.f32|st\.shared\.v4\.b32", text) == 3 * 4


def test_the_split_stages_ptx_reads_its_piece_and_merges_the_pieces(ptx):
    """``partial``: each warp reads its 2 rows (8 vectors a row), the CTA's four warps merge through shared
    memory, and its first warp stores the piece's state (maximum, denominator, sum: 3 x 4 vectors) and nothing
    else.  ``finish``: no state row, the 16 pieces' states (3 x 4 vectors each) merged with one factor each,
    then the whole kernel's finish: weight, reciprocals, RMS, shuffles, FP8 and bf16 stores."""
    partial, finish = ptx[128, "partial"], ptx[128, "finish"]
    config = StateLaunchConfig(128, "partial")
    assert f".reqntid {config.threads}, 1, 1" in partial
    assert _count(r"ld\.global\.v4\.b32", partial) == config.rows_per_warp * 8
    assert _count(r"st\.global\.v4\.b32", partial) == 3 * 4 == _count(r"st\.global", partial)
    assert _count(r"ex2\.approx", partial) == 16 * ((1 + state_cutedsl.CHUNK) + config.splits)
    assert _count(r"bar\.sync", partial) == 1
    assert _count(r"rcp\.approx|rsqrt|shfl\.sync\.bfly|cvt\.rn\.satfinite", partial) == 0  # no finish
    assert _count(r"ld\.global\.v4\.b32", finish) == 3 * 4 * state_cutedsl.PIECES + 4
    assert _count(r"ex2\.approx", finish) == 16 * state_cutedsl.PIECES
    assert _count(r"rcp\.approx", finish) == 16
    assert _count(r"shfl\.sync\.bfly", finish) == 5 + 4 * 4
    assert _count(r"cvt\.rn\.satfinite\.e4m3x2\.f32", finish) == 8
    assert _count(r"bar\.sync", finish) == 0
    for text in (partial, finish):
        assert _count(r"\bdiv\.s64|\brem\.s64", text) == 0
        assert ".local" not in text


def test_shipped_ptx_is_a_fresh_compile(ptx):
    for ratio, stage in PREBUILT:
        assert code_lines(prebuilt_path(ratio, stage).read_text()) == code_lines(ptx[ratio, stage]), (
            "stale PTX: run CUTE_DSL_ARCH=sm_90a .venv/bin/python benchmarks/build_ptx.py"
        )


def _ptxas() -> Path | None:
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.is_file() else None


@pytest.mark.parametrize(
    ("path", "threads"),
    [(prebuilt_path(r, s), StateLaunchConfig(r, s).threads) for r, s in PREBUILT]
    + [(p, 128) for p in sorted(prebuilt_path(4).parent.glob("compress_norm_rope_store_*.ptx"))],
    ids=lambda value: value.name if isinstance(value, Path) else str(value),
)
def test_shipped_ptx_assembles_for_sm90a_without_spills(path, threads, tmp_path):
    """The real assembler for an H200, on this CPU: the PTX is valid, nothing spills, and the
    registers leave room for two CTAs per multiprocessor."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas (Triton's bundled copy) on this machine")
    done = subprocess.run(
        [str(ptxas), "-arch=sm_90a", "-v", str(path), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in done.stderr, done.stderr
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    assert registers * threads * 2 <= SM90_REGISTERS, (registers, threads)


@pytest.mark.parametrize(("ratio", "stage"), PREBUILT)
def test_entry_parameters_are_what_the_launcher_packs(ratio, stage):
    name, params = entry_of(prebuilt_path(ratio, stage).read_text())
    assert name.startswith("kernel_cutlass_kernel_")
    assert tuple(params) == PARAM_TYPES


# ----------------------------------------------------------------------------- the work split


def _visits(config: StateLaunchConfig, tokens: int) -> dict[int, list[int]]:
    """Window rows each token gets, from every warp of every CTA, by the kernel's index arithmetic."""
    rows: dict[int, list[int]] = {}
    for cta in range(config.grid(tokens)):
        for warp in range(config.warps):
            token, split = config.token_of(cta, warp)
            if token < tokens:
                start = split * config.rows_per_warp
                rows.setdefault(token, []).extend(range(start, start + config.rows_per_warp))
    return rows


@pytest.mark.parametrize(("ratio", "stage"), [(4, "whole"), (128, "whole"), (128, "partial")])
@pytest.mark.parametrize("tokens", [1, 3, 5, 1024, 32771])
def test_every_token_gets_its_whole_window_exactly_once(ratio, stage, tokens):
    config = StateLaunchConfig(ratio, stage)
    visits = _visits(config, tokens)
    assert sorted(visits) == list(range(tokens))
    window = list(range(config.layout.window))
    assert all(sorted(rows) == window for rows in visits.values())


def test_the_shapes_of_the_two_compressors():
    c4, c128 = StateLaunchConfig(4), StateLaunchConfig(128)
    assert (c4.splits, c4.threads, c4.tokens_per_cta, c4.rows_per_warp, c4.shared_floats) == (1, 128, 4, 8, 0)
    assert (c128.splits, c128.threads, c128.tokens_per_cta, c128.rows_per_warp) == (8, 256, 1, 16)
    assert c128.shared_floats * 4 == 48 * 1024  # the static shared-memory limit, not above it
    partial, finish = StateLaunchConfig(128, "partial"), StateLaunchConfig(128, "finish")
    assert (partial.pieces, partial.splits, partial.threads, partial.tokens_per_cta, partial.rows_per_warp) == (
        16, 4, 128, 1, 2,
    )  # fmt: skip
    assert partial.shared_floats * 4 == 24 * 1024
    assert (finish.pieces, finish.splits, finish.threads, finish.tokens_per_cta) == (1, 1, 128, 4)
    assert finish.rows_per_warp == 0
    assert (partial.grid(8), finish.grid(8)) == (128, 2)  # C128 decode 1024's 8 tokens: 128 CTAs, not 8
    with pytest.raises(ValueError, match="only a C128 window is split"):
        StateLaunchConfig(4, "partial")
    with pytest.raises(ValueError, match="stage must be one of"):
        StateLaunchConfig(128, "halves")


# ----------------------------------------------------------------------------- the host side


@pytest.mark.parametrize("ratio", [4, 128])
def test_the_plan_is_computed_from_the_real_tensors(ratio):
    requests = ((0, 300), (5, 6)) if ratio == 4 else ((0, 260), (255, 1))
    inputs = make_state_inputs(ratio, requests, state_block=8, seed=201)
    args = list(inputs.args())
    args[1] = args[1].long()  # an int64 block table is narrowed
    args[3] = args[3].int()  # int32 positions are widened
    launch = plan_launch(*args, ratio, 1e-5)
    assert launch is not None
    config = StateLaunchConfig(ratio)
    tokens = inputs.positions.numel()
    work = inputs.working().nonzero().flatten()
    assert launch.grid == (config.grid(work.numel()), 1, 1)
    assert launch.grid[0] == -(-work.numel() // config.tokens_per_cta)  # no CTA without a working token
    assert launch.block == (config.threads, 1, 1)
    pointers, sizes, eps = launch.arguments[:10], launch.arguments[10:19], launch.arguments[19]
    state, cache = inputs.state_cache, inputs.kv_cache
    block_size = cache.shape[1] if cache.dim() == 3 else cache.shape[1] // 584
    table = launch.keep_alive[1]
    assert table.dtype == torch.int32
    assert torch.equal(table.long(), inputs.block_table.long())
    assert sizes == (
        tokens,
        work.numel(),
        state.shape[0] * state.shape[1],
        table.numel(),
        table.stride(0),
        state.shape[1],
        inputs.cos_sin_cache.shape[0],
        cache.numel(),
        block_size,
    )
    assert eps == pytest.approx(1e-5)
    assert pointers[0] == state.data_ptr()  # read in place
    assert pointers[7] == cache.data_ptr()  # written in place, never a copy
    positions = launch.keep_alive[3]
    assert positions.dtype == torch.int64
    assert pointers[3] == positions.data_ptr()
    assert torch.equal(positions, inputs.positions.long())
    compacted = launch.keep_alive[8]
    assert compacted.dtype == torch.int32
    assert pointers[8] == compacted.data_ptr()
    assert torch.equal(compacted.long(), work)  # the working tokens, in token order
    assert all(p % 16 == 0 for p in pointers)


def test_few_c128_tokens_split_their_windows_across_ctas_and_many_do_not():
    """Fewer working tokens than multiprocessors: 16 CTAs a token, then a finish stage over the same arguments
    and a partial-state buffer of the plan's own.  As many tokens as multiprocessors, no multiprocessor count,
    or C4: one launch, as before."""
    inputs = make_state_inputs(128, ((0, 1024), (255, 1)), padding=0.0, seed=211)  # 9 working tokens
    launch = plan_launch(*inputs.args(), 128, 1e-6, multiprocessors=132)
    partial, finish = launch.stages()
    assert (partial.config, finish.config) == (StateLaunchConfig(128, "partial"), StateLaunchConfig(128, "finish"))
    assert (partial.grid, partial.block) == ((144, 1, 1), (128, 1, 1))
    assert (finish.grid, finish.block) == ((3, 1, 1), (128, 1, 1))
    assert (partial.arguments, partial.keep_alive) == (finish.arguments, finish.keep_alive)
    buffer = partial.keep_alive[9]
    assert (buffer.dtype, buffer.numel()) == (torch.float32, 9 * 3 * state_cutedsl.PIECES * 512)
    assert partial.arguments[9] == buffer.data_ptr()
    assert buffer.data_ptr() % 16 == 0
    assert (finish.then, finish.prepare) == (None, None)
    for multiprocessors in (9, None):
        (whole,) = plan_launch(*inputs.args(), 128, 1e-6, multiprocessors=multiprocessors).stages()
        assert (whole.config, whole.grid) == (StateLaunchConfig(128), (9, 1, 1))
        assert whole.keep_alive[9].numel() == 0  # no partial states
    c4 = make_state_inputs(4, ((0, 16),), padding=0.0, seed=212)
    assert len(plan_launch(*c4.args(), 4, 1e-6, multiprocessors=132).stages()) == 1
    bound = state_cutedsl.working_bound(1025, 128, 2)  # graph-safe: decided by the bound, not the batch
    safe = plan_launch(*inputs.args(), 128, 1e-6, max_working=bound, multiprocessors=132)
    assert [s.grid[0] for s in safe.stages()] == [bound * 16, -(-bound // 4)]
    assert safe.prepare is not None  # the compaction runs once, before the pieces
    assert safe.then.prepare is None


def test_a_split_plan_launches_both_stages_in_order_on_one_stream(monkeypatch):
    fake = FakeDriver(PARAM_TYPES)
    monkeypatch.setattr(cuda_launch, "cuda_driver", lambda: fake)
    functions = {"partial": 11, "finish": 12, "whole": 13}
    monkeypatch.setattr(state_cutedsl, "_load", lambda device, config: LoadedKernel(functions[config.stage], 1))
    inputs = make_state_inputs(128, ((0, 256), (300, 100)), padding=0.0, seed=213)
    launch = plan_launch(*inputs.args(), 128, 1e-6, multiprocessors=132)
    state_cutedsl.launch_planned(launch, 0, stream=99)
    assert [(c["function"], c["grid"], c["stream"]) for c in fake.calls] == [(11, (48, 1, 1), 99), (12, (1, 1, 1), 99)]
    assert fake.calls[0]["values"] == fake.calls[1]["values"]


def test_no_tokens_means_no_launch():
    inputs = make_state_inputs(4, ((0, 8),), seed=202)
    args = list(inputs.args())
    args[2], args[3], args[4] = (t[:0] for t in args[2:5])
    assert plan_launch(*args, 4, 1e-6) is None


def test_an_odd_block_size_or_a_misaligned_cache_is_refused():
    inputs = make_state_inputs(4, ((0, 8),), block_size=3, seed=203)
    with pytest.raises(ValueError, match="block_size must be even"):
        plan_launch(*inputs.args(), 4, 1e-6)
    inputs = make_state_inputs(4, ((0, 8),), seed=204)
    args = list(inputs.args())
    shifted = torch.empty(inputs.kv_cache.numel() + 1, dtype=torch.uint8)[1:]  # one byte past an aligned start
    args[7] = shifted.view(inputs.kv_cache.shape)
    with pytest.raises(ValueError, match="kv_cache must start on a 16-byte boundary"):
        plan_launch(*args, 4, 1e-6)


def test_a_misaligned_cache_is_refused_even_when_every_token_is_padded():
    """No launch is needed for this batch, but the cache can never be used: said now, not at a later batch."""
    inputs = make_state_inputs(4, ((0, 8),), padding=1.0, seed=209)
    args = list(inputs.args())
    assert plan_launch(*args, 4, 1e-6) is None  # aligned: nothing to launch
    shifted = torch.empty(inputs.kv_cache.numel() + 1, dtype=torch.uint8)[1:]
    args[7] = shifted.view(inputs.kv_cache.shape)
    with pytest.raises(ValueError, match="kv_cache must start on a 16-byte boundary"):
        plan_launch(*args, 4, 1e-6)


def test_the_driver_receives_the_real_sizes(monkeypatch):
    fake = FakeDriver(PARAM_TYPES)
    monkeypatch.setattr(cuda_launch, "cuda_driver", lambda: fake)
    inputs = make_state_inputs(128, ((0, 1024), (255, 1)), padding=0.0, seed=205)  # 9 working tokens of 1025
    launch = plan_launch(*inputs.args(), 128, 1e-6)
    launch_kernel(LoadedKernel(77, 1), launch, stream=1234)
    (call,) = fake.calls
    assert call["grid"] == (9, 1, 1)  # one CTA per working C128 token, none for the 1016 others
    assert call["block"] == (256, 1, 1)
    assert call["stream"] == 1234
    assert call["function"] == 77
    assert call["values"][:19] == list(launch.arguments[:19])
    assert call["values"][10:12] == [1025, 9]
    assert call["values"][19] == pytest.approx(1e-6)


def test_a_plan_is_launched_again_without_host_work(monkeypatch):
    """Plan once, launch twice (as a CUDA graph replays it): the same grid and arguments, and the
    inputs are not looked at again (a changed slot mapping does not move the launch)."""
    fake = FakeDriver(PARAM_TYPES)
    monkeypatch.setattr(cuda_launch, "cuda_driver", lambda: fake)
    monkeypatch.setattr(state_cutedsl, "_load", lambda device, ratio: LoadedKernel(5, 1))
    inputs = make_state_inputs(4, ((0, 64),), padding=0.0, seed=206)
    launch = plan_launch(*inputs.args(), 4, 1e-6)
    state_cutedsl.launch_planned(launch, 0, stream=7)
    inputs.slot_mapping.fill_(-1)
    state_cutedsl.launch_planned(launch, 0, stream=7)
    first, second = fake.calls
    assert first == second
    assert first["grid"] == (4, 1, 1)  # 16 working tokens, four a CTA


def test_a_graph_safe_plan_launches_the_same_and_compacts_on_the_device(monkeypatch):
    """The grid comes from the bound, never from the batch; each launch first refreshes the token tables and
    the compacted list from the tensors as they are then (as a captured graph replays it), with no host read."""
    fake = FakeDriver(PARAM_TYPES)
    monkeypatch.setattr(cuda_launch, "cuda_driver", lambda: fake)
    monkeypatch.setattr(state_cutedsl, "_load", lambda device, ratio: LoadedKernel(5, 1))
    inputs = make_state_inputs(4, ((0, 64),), padding=0.0, seed=210)
    bound = state_cutedsl.working_bound(64, 4, 1)
    assert bound == 17  # 16 boundaries in 64 consecutive positions, plus one
    launch = plan_launch(*inputs.args(), 4, 1e-6, max_working=bound)
    work = launch.keep_alive[8]
    assert work.tolist() == [*range(3, 64, 4), 64]  # the working tokens, then the inert one (index 64)
    assert launch.keep_alive[4][64] == -1  # the inert token has no slot
    state_cutedsl.launch_planned(launch, 0, stream=7)
    inputs.positions.add_(1)  # every boundary moves one token earlier
    inputs.slot_mapping[2] = -1  # and the first of them has no slot
    state_cutedsl.launch_planned(launch, 0, stream=7)
    first, second = fake.calls
    assert first == second  # the same grid and arguments: nothing read back on the host
    assert first["grid"] == (5, 1, 1)  # 17 tokens, four a CTA
    assert work.tolist() == [*range(6, 64, 4), 64, 64]
    assert torch.equal(launch.keep_alive[3][:64], inputs.positions.long())  # the tables follow the inputs
    assert not state_cutedsl.overflowed(launch)


def test_no_working_token_means_no_launch():
    inputs = make_state_inputs(128, ((0, 100),), seed=207)  # no position reaches 127
    assert plan_launch(*inputs.args(), 128, 1e-6) is None


def test_without_cutlass_the_shipped_ptx_is_used(monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlass", None)  # import cutlass now raises ImportError
    state_cutedsl.kernel_ptx.cache_clear()
    try:
        assert state_cutedsl.kernel_ptx(128) == prebuilt_path(128).read_text()
        assert state_cutedsl.kernel_ptx(128, "finish") == prebuilt_path(128, "finish").read_text()
        with pytest.raises(ValueError, match="ratio 8 is not a DeepSeek-V4 compressor"):
            state_cutedsl.kernel_ptx(8)
    finally:
        state_cutedsl.kernel_ptx.cache_clear()


def test_cpu_tensors_are_refused_with_a_clear_error():
    inputs = make_state_inputs(4, ((0, 8),), seed=208)
    with pytest.raises(ValueError, match="runs on CUDA tensors only"):
        compress_state_store(*inputs.args(), ratio=4, backend="cutedsl")
