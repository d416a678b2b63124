"""compress_state_store: the reference against an explicit loop, Triton under TRITON_INTERPRET=1
against the float64 reference (dequantized, FP8 and bf16 tolerances), boundary-only writes, both
cache shapes, the bit-exact FP8/bf16 encoders and scale exponent, the kernel's store against the
torch quantizer byte for byte, the sm_90 compile, and the bytes floor of the benchmark sizes.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import require

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated, so before the import
torch = require("torch", "kernels")

from diagtools.kernels import compress_state_store  # noqa: E402
from diagtools.kernels.reference import FP8_ROW_BYTES, quantize_fp8_ds_mla  # noqa: E402
from diagtools.kernels.state import DATA_BYTES, LAYOUTS  # noqa: E402
from diagtools.kernels.state_reference import (  # noqa: E402
    BENCH_SIZES,
    POISON,
    StateInputs,
    compressed_state_rows,
    dequantized_cache_rows,
    make_state_inputs,
    min_bytes,
    read_fp8_ds_mla_cache,
    request_tokens,
)

from .edges import C4_REQUESTS  # noqa: E402
from .test_fp8_ds_mla import fp8_ds_mla_cases  # noqa: E402
from .tolerances import (  # noqa: E402
    assert_state_bytes_match_reference,
    assert_state_store_matches_reference,
    with_edge_tiles,
)

try:  # the encoders' test kernel; the interpreter resolves its callees from this module's globals
    import triton
    import triton.language as tl

    from diagtools.kernels.state_triton import _bf16_bits, _e4m3_bits, _store_fp8_ds_mla, _ue8m0_exponent

    @triton.jit
    def encode(x_ptr, fp8_ptr, bf16_ptr, n, BLOCK: tl.constexpr):  # noqa: N803 - Triton's constexpr style
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
        tl.store(fp8_ptr + offsets, _e4m3_bits(x), mask=offsets < n)
        tl.store(bf16_ptr + offsets, _bf16_bits(x), mask=offsets < n)

    @triton.jit
    def exponents(amax_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        amax = tl.load(amax_ptr + offsets, mask=offsets < n, other=1.0)
        tl.store(out_ptr + offsets, _ue8m0_exponent(amax), mask=offsets < n)

    @triton.jit
    def store_rows(rows_ptr, out_ptr, out_half_ptr, D: tl.constexpr):  # noqa: N803
        """The kernel's store of row ``i`` of ``rows`` into a 584-byte record ``out[i]`` (data, then scales)."""
        row = tl.program_id(0).to(tl.int64)
        y = tl.load(rows_ptr + row * D + tl.arange(0, D))
        _store_fp8_ds_mla(y, out_ptr, out_half_ptr, row * 584, row * 584 + 576, D)
except ImportError:
    encode = exponents = store_rows = None

# The grid.  C4: a prefill from position 0 (its first group has no previous group), a prefill
# continuing a context, and decode tokens on and off boundaries.  C128: a prefill crossing two
# boundaries and two decode tokens, one on a boundary.  Small state blocks, so windows span blocks.
C128_REQUESTS = ((0, 260), (255, 1), (300, 1))
CASES = [(4, C4_REQUESTS, 16), (4, C4_REQUESTS, 4), (128, C128_REQUESTS, 32)]


def _loop_reference(inputs, token: int) -> torch.Tensor:
    """One token's unrounded row by plain loops over the window rows: the contract, read literally."""
    layout = LAYOUTS[inputs.ratio]
    p = int(inputs.positions[token])
    request = int(inputs.request_indices[token])
    state_block = inputs.state_cache.shape[1]
    group_start = p - inputs.ratio + 1
    kv_rows, score_rows = [], []
    for q in range(p - layout.window + 1, p + 1):
        if q < 0:
            continue
        row = inputs.state_cache[int(inputs.block_table[request, q // state_block]), q % state_block].double()
        kv, score = row[: layout.width], row[layout.width :]
        part = slice(layout.width - 512, layout.width) if q >= group_start else slice(0, 512)
        kv_rows.append(kv[part])
        score_rows.append(score[part])
    kv, score = torch.stack(kv_rows), torch.stack(score_rows)
    weights = torch.exp(score - score.max(dim=0).values)
    c = (weights * kv).sum(dim=0) / weights.sum(dim=0)
    y = c / torch.sqrt((c * c).mean() + 1e-6) * inputs.weight.double()
    angle_row = inputs.cos_sin_cache[p // inputs.ratio * inputs.ratio].double()
    for i in range(32):
        even, odd = y[448 + 2 * i].clone(), y[449 + 2 * i].clone()
        cos, sin = angle_row[i], angle_row[32 + i]
        y[448 + 2 * i], y[449 + 2 * i] = even * cos - odd * sin, even * sin + odd * cos
    return y


@pytest.mark.parametrize("ratio", [4, 128])
def test_reference_reads_the_window_as_the_contract_says(ratio):
    requests = C4_REQUESTS if ratio == 4 else ((0, 128), (255, 1))
    inputs = make_state_inputs(ratio, requests, padding=0.0, state_block=8, seed=101)
    work = inputs.working().nonzero().flatten()
    expected = inputs.expected()
    assert expected.shape == (len(work), 512)
    for row, token in enumerate(work.tolist()):
        torch.testing.assert_close(expected[row], _loop_reference(inputs, token), rtol=1e-12, atol=1e-12)


def test_c4_reads_the_previous_group_from_the_first_half():
    """Changing only the previous group's first-D parts moves the result; their last-D parts do not."""
    inputs = make_state_inputs(4, ((4, 4),), padding=0.0, seed=7)  # positions 4..7: one boundary, at 7
    table = (inputs.state_cache, inputs.block_table, inputs.request_indices[-1:], inputs.positions[-1:])
    before = compressed_state_rows(*table, inputs.weight, inputs.cos_sin_cache, ratio=4, dtype=torch.float64)
    blocks = inputs.block_table[0].long()
    previous = inputs.state_cache[blocks[0], :4]  # positions 0..3 (vLLM's C4 state block: 4 rows)
    previous[:, 512:1024] += 5.0  # kv_cur of the previous group: not in this window
    previous[:, 1536:2048] += 5.0  # score_cur of the previous group
    same = compressed_state_rows(*table, inputs.weight, inputs.cos_sin_cache, ratio=4, dtype=torch.float64)
    torch.testing.assert_close(same, before, rtol=0, atol=0)
    previous[:, 1024:1536] += 5.0  # score_prev: this window reads it
    moved = compressed_state_rows(*table, inputs.weight, inputs.cos_sin_cache, ratio=4, dtype=torch.float64)
    assert not torch.allclose(moved, before)


@pytest.mark.parametrize("ratio", [4, 128])
def test_torch_backend_matches_float64(ratio):
    requests = C4_REQUESTS if ratio == 4 else C128_REQUESTS
    inputs = make_state_inputs(ratio, requests, padding=0.25, seed=102)
    compress_state_store(*inputs.args(), ratio=ratio, backend="torch")
    assert_state_store_matches_reference(inputs)


@pytest.mark.parametrize(("ratio", "requests", "state_block"), CASES)
def test_triton_matches_float64_reference(ratio, requests, state_block):
    require("triton", "kernels")
    inputs = make_state_inputs(ratio, requests, padding=0.25, state_block=state_block, seed=103)
    assert inputs.working().any()
    compress_state_store(*inputs.args(), ratio=ratio, backend="triton")
    assert_state_store_matches_reference(inputs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_only_boundary_tokens_with_a_slot_write(backend):
    if backend == "triton":
        require("triton", "kernels")
    inputs = make_state_inputs(4, ((0, 12), (3, 1)), padding=0.0, seed=11)  # boundaries at 3, 7, 11 and 3
    boundary = (inputs.positions + 1) % 4 == 0
    inputs.slot_mapping[boundary.nonzero().flatten()[1]] = -1  # position 7: skipped
    compress_state_store(*inputs.args(), ratio=4, backend=backend)
    data, scales = read_fp8_ds_mla_cache(inputs.kv_cache, inputs.slot_mapping.clamp_min(0))
    idle = ~inputs.working()
    assert int((~idle).sum()) == 3
    assert (data[idle] == POISON).all()  # real slots, never written
    assert (scales[idle] == POISON).all()
    assert (data[~idle] != POISON).any(dim=1).all()
    assert (scales[~idle, :7] != POISON).all()
    assert (scales[~idle, 7] == 0).all()  # the padding byte, written as 0 as vLLM does
    assert_state_store_matches_reference(inputs)


def test_no_working_token_writes_nothing():
    require("triton", "kernels")
    inputs = make_state_inputs(128, ((0, 100),), seed=104)  # no position reaches 127
    compress_state_store(*inputs.args(), ratio=128, backend="triton")
    assert (inputs.kv_cache == POISON).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cache_layout_puts_scales_after_the_block_data(backend):
    if backend == "triton":
        require("triton", "kernels")
    inputs = make_state_inputs(4, ((0, 4),), padding=0.0, block_size=4, seed=3)
    assert inputs.kv_cache.shape[1:] == (4, 576 + 8)  # vLLM's [num_blocks, block_size, 584]
    compress_state_store(*inputs.args(), ratio=4, backend=backend)
    slot = int(inputs.slot_mapping[3])
    block, row = divmod(slot, 4)
    raw = inputs.kv_cache[block].flatten()  # the block is flat bytes, not 4 records of 584
    assert raw.numel() == 4 * (576 + 8)
    assert DATA_BYTES == FP8_ROW_BYTES == 576
    assert (raw[row * 576 : (row + 1) * 576] != POISON).any()
    scales = raw[4 * 576 + row * 8 : 4 * 576 + row * 8 + 8]
    assert (scales[:7] != POISON).all()
    assert scales[7] == 0
    others = torch.ones(raw.numel(), dtype=torch.bool)
    others[row * 576 : (row + 1) * 576] = False
    others[4 * 576 + row * 8 : 4 * 576 + row * 8 + 8] = False
    assert (raw[others] == POISON).all()
    values = dequantized_cache_rows(inputs.kv_cache, inputs.slot_mapping[3:])
    torch.testing.assert_close(values[:, 448:], inputs.expected()[:, 448:].float(), rtol=2**-8, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_flat_cache_shape_stores_the_same_bytes(backend):
    """The 2-D ``[num_blocks, block_size * 584]`` cache is accepted and gets the same bytes as vLLM's 3-D one."""
    if backend == "triton":
        require("triton", "kernels")
    paged = make_state_inputs(4, C4_REQUESTS, padding=0.25, seed=5)
    flat_cache = paged.kv_cache.view(paged.kv_cache.shape[0], -1).clone()
    flat = StateInputs(*paged.args()[:-1], flat_cache, ratio=4)
    compress_state_store(*paged.args(), ratio=4, backend=backend)
    compress_state_store(*flat.args(), ratio=4, backend=backend)
    assert torch.equal(flat.kv_cache, paged.kv_cache.view(flat_cache.shape))
    assert_state_store_matches_reference(flat)


@pytest.mark.parametrize("first", [0, 4], ids=["edges-in-tiles-0-3", "edges-in-tiles-4-6-0"])
@pytest.mark.parametrize(("ratio", "requests", "state_block"), CASES)
def test_triton_stores_the_reference_bytes(ratio, requests, state_block, first):
    """Every stored byte of the whole kernel (scale bytes, FP8 bytes, the bf16 tail) against the
    reference quantizer, with tiles sent down the zero, tiny (below the amax floor), large-exponent
    and negative paths: every one of the seven tiles meets each path in one of the two runs."""
    require("triton", "kernels")
    inputs = make_state_inputs(ratio, requests, padding=0.25, state_block=state_block, seed=105)
    inputs = with_edge_tiles(inputs, first)
    compress_state_store(*inputs.args(), ratio=ratio, backend="triton")
    assert_state_store_matches_reference(inputs)
    checked = assert_state_bytes_match_reference(inputs)
    assert checked.ambiguous_fraction < 0.01, checked


def test_triton_store_equals_the_torch_quantizer_bit_for_bit():
    """The kernel's fp8_ds_mla store of given fp32 rows writes exactly the bytes of
    ``quantize_fp8_ds_mla`` and a zero padding byte: bf16 rounding before the FP8 rounding, amax
    from the rounded values (one that rounds down onto 448 keeps the smaller scale), the 1e-4
    amax floor, an all-zero tile, exact power-of-two amax, and random tiles over 80 binades."""
    if store_rows is None:
        require("triton", "kernels")
    rows = fp8_ds_mla_cases()
    out = torch.full((rows.shape[0], 584), POISON, dtype=torch.uint8)
    store_rows[(rows.shape[0],)](rows, out, out.view(torch.int16), D=512)
    data, scales = quantize_fp8_ds_mla(rows)
    assert torch.equal(out[:, :576], data)
    assert torch.equal(out[:, 576:583], scales)
    assert (out[:, 583] == 0).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(state_cache=a["state_cache"][..., :1024].contiguous()), "state_cache must be fp32"),
        (lambda a: a.update(kv_cache=a["kv_cache"].view(torch.int8)), "kv_cache must be uint8"),
        (lambda a: a.update(kv_cache=a["kv_cache"][..., :-1].contiguous()), "kv_cache must be uint8"),
        (lambda a: a.update(kv_cache=a["kv_cache"].flatten(1)[:, :-1].contiguous()), "kv_cache must be uint8"),
        (lambda a: a.update(kv_cache=a["kv_cache"][:, :0]), "kv_cache must be uint8"),
        (lambda a: a.update(kv_cache=a["kv_cache"][:, ::2]), "kv_cache and state_cache must be contiguous"),
        (lambda a: a.update(positions=a["positions"].float()), "positions must be an int32/int64"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"][:-1]), "slot_mapping must be an int32/int64"),
        (lambda a: a.update(weight=a["weight"][:64]), "weight must be"),
    ],
)
def test_bad_inputs_raise_value_error(change, message):
    inputs = make_state_inputs(4, ((0, 8),), seed=106)
    names = ["state_cache", "block_table", "request_indices", "positions", "slot_mapping", "weight"]
    args = dict(zip([*names, "cos_sin_cache", "kv_cache"], inputs.args(), strict=True))
    change(args)
    with pytest.raises(ValueError, match=message):
        compress_state_store(*args.values(), ratio=4, backend="torch")


def test_other_ratios_and_backends_are_refused():
    inputs = make_state_inputs(4, ((0, 8),), seed=107)
    with pytest.raises(ValueError, match="ratio 8 is not a DeepSeek-V4 compressor"):
        compress_state_store(*inputs.args(), ratio=8, backend="torch")
    with pytest.raises(ValueError, match="unknown backend 'cuda' for compress_state_store"):
        compress_state_store(*inputs.args(), ratio=4, backend="cuda")


def test_encoders_are_bit_exact_against_torch():
    """The kernel's integer FP8 e4m3 and bf16 rounding equals torch's round-to-nearest-even, on
    every e4m3 value, every midpoint between neighbours (ties), subnormals, zero and random values."""
    if encode is None:
        require("triton", "kernels")
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()
    midpoints = (grid[1:] + grid[:-1]) / 2
    values = torch.cat((grid, midpoints, torch.randn(4096) * 100, torch.rand(1024) * 2**-6, torch.zeros(1)))
    values = torch.cat((values, -values)).clamp(-448, 448)
    fp8 = torch.empty(values.shape, dtype=torch.uint8)
    bf16 = torch.empty(values.shape, dtype=torch.int16)
    encode[(math.ceil(values.numel() / 1024),)](values, fp8, bf16, values.numel(), BLOCK=1024)
    assert torch.equal(fp8, values.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(bf16, values.to(torch.bfloat16).view(torch.int16))


def test_scale_exponent_is_exact():
    """The kernel's ``ceil(log2(amax / 448))`` from the bits equals the exact value for every positive
    normal bf16 amax (powers of two times 448 included) and for random fp32 ones."""
    if exponents is None:
        require("triton", "kernels")
    generator = torch.Generator().manual_seed(1)
    bf16 = torch.arange(0x0080, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    random = torch.rand(4096, generator=generator) * torch.exp2(torch.randint(-100, 100, (4096,), generator=generator))
    amax = torch.cat((bf16, 448 * torch.exp2(torch.arange(-140.0, 120.0)), random))
    amax = amax[(amax >= torch.finfo(torch.float32).tiny) & torch.isfinite(amax)]
    got = torch.empty(amax.shape, dtype=torch.int32)
    exponents[(math.ceil(amax.numel() / 1024),)](amax, got, amax.numel(), BLOCK=1024)
    mantissa, power = torch.frexp(amax.double() / 448)  # exact in float64: ceil(log2) is power, or power - 1 at 0.5
    assert torch.equal(got.long(), (power - (mantissa == 0.5).int()).long())


def test_triton_kernel_compiles_for_sm90_without_local_memory():
    """The real compile for an H200 (PTX for sm_90), on this CPU, in a child without the interpreter."""
    require("triton", "kernels")
    code = (
        "import json; from diagtools.kernels.state_triton import compile_ptx; "
        "print(json.dumps({r: compile_ptx(r) for r in (4, 128)}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for ratio, ptx in json.loads(done.stdout.strip().splitlines()[-1]).items():
        assert ".target sm_90" in ptx, ratio
        assert ".local" not in ptx, f"C{ratio} spills to local memory"
        # compiled with the alignment a real launch gets: the window rows' kv and score parts (and the
        # weight) move as 128-bit loads, the FP8 data as whole words, one byte store (the scale record)
        mix = collections.Counter(re.findall(r"\b((?:ld|st)\.global(?:\.\w+)*)", ptx))
        assert mix["ld.global.v4.b32"] >= 16, (ratio, mix)
        assert mix["ld.global.b32"] <= 12, (ratio, mix)
        assert mix["st.global.b8"] <= 1, (ratio, mix)


def test_bench_sizes_are_realistic_batches():
    """The prefills match the floors in the notes (C4 prefill 32768 ~276 MB, C128 with 256 boundary
    tokens ~134 MB); every batch has the real boundary density, one token in R."""
    floors = {"C4 prefill 32768": 276e6, "C128 prefill 32768": 134e6}
    for name, (ratio, requests) in BENCH_SIZES.items():
        _, positions = request_tokens(requests)
        boundaries = int(((positions + 1) % ratio == 0).sum())
        assert boundaries * ratio == positions.numel(), (name, boundaries)
        if name in floors:
            moved = min_bytes(ratio, positions, torch.zeros_like(positions), state_block=16)
            assert abs(moved / floors[name] - 1) < 0.02, (name, moved)


def test_min_bytes_counts_only_working_tokens():
    positions = torch.tensor([0, 1, 2, 3, 7])  # boundaries at 3 and 7; 7 has no slot
    slots = torch.tensor([5, 6, 7, 8, -1])
    per_token = 8 + 4 + 8 * 2 * 512 * 4 + 64 * 4 + 576 + 8  # request index, one table entry, rows, cos/sin, store
    assert min_bytes(4, positions, slots, state_block=16) == 5 * 8 + 2 * 8 + per_token + 512 * 4


# ---- inputs where a wrong kernel shows: eps that matters, extreme logits, the first and last slot ----


def _backend(name: str) -> str:
    if name == "triton":
        require("triton", "kernels")
    return name


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("eps", "kv_scale"), [(1e-6, 1e-3), (1e-3, 0.03), (0.1, 0.3)])
def test_eps_is_the_one_given_on_rows_small_enough_for_it_to_matter(backend, eps, kv_scale):
    """Rows whose mean square is about ``eps``: an eps ten times larger or smaller, or a constant in its
    place, moves the stored values far beyond FP8's precision."""
    inputs = make_state_inputs(4, C4_REQUESTS, padding=0.0, state_block=4, seed=111)
    inputs.state_cache[..., : LAYOUTS[4].width] *= kv_scale
    inputs = StateInputs(*inputs.args(), ratio=4, eps=eps)
    for other in (eps * 10, eps / 10):  # the check is sensitive: the reference itself moves by more than 10%
        assert _relative(StateInputs(*inputs.args(), ratio=4, eps=other).expected(), inputs.expected()) > 0.1
    compress_state_store(*inputs.args(), ratio=4, eps=eps, backend=_backend(backend))
    assert_state_store_matches_reference(inputs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("shift", [200.0, -200.0], ids=["logits-above-exp-overflow", "logits-far-below-zero"])
def test_the_window_softmax_holds_for_logits_that_overflow_or_underflow_exp(backend, shift):
    """Scores of +-200: exp overflows (or every term underflows to 0) in float32 unless the softmax
    subtracts its maximum first; the result is the same as for the unshifted scores."""
    inputs = make_state_inputs(4, C4_REQUESTS, padding=0.0, state_block=4, seed=112)
    width = LAYOUTS[4].width
    unshifted = inputs.expected()
    inputs.state_cache[..., width:] += shift
    assert _relative(inputs.expected(), unshifted) < 1e-2  # softmax is shift-free (float32 scores round at 200)
    compress_state_store(*inputs.args(), ratio=4, backend=_backend(backend))
    assert_state_store_matches_reference(inputs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_first_and_the_last_slot_of_the_cache_are_written(backend):
    inputs = make_state_inputs(4, ((0, 8),), padding=0.0, seed=113)  # boundaries at positions 3 and 7
    last = inputs.kv_cache.shape[0] * inputs.kv_cache.shape[1] - 1
    working = inputs.working().nonzero().flatten()
    inputs.slot_mapping[working[0]], inputs.slot_mapping[working[1]] = 0, last
    compress_state_store(*inputs.args(), ratio=4, backend=_backend(backend))
    assert_state_store_matches_reference(inputs)  # both rows written, nothing else
