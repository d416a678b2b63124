"""The CuTe DSL kernel without a GPU: its PTX for sm_90a, and the host side of its launch.

The PTX checks compile the kernel here (nvidia-cutlass-dsl, ``CUTE_DSL_ARCH=sm_90a``).  The
launch checks run the real host code on CPU tensors: the grid and the arguments come from the
tensors' real sizes, and the driver call is intercepted and decoded.  A launch whose sizes were
baked in at compile time (the old bug: a grid of ``cute.size`` over a layout that read 0) fails
``test_every_group_is_visited_exactly_once`` and ``test_the_driver_receives_the_real_sizes``.
"""

from __future__ import annotations

import math
import re
import sys

import pytest

from tests.conftest import require

torch = require("torch", "kernels")

from diagtools.kernels import cuda_launch, cutedsl_impl  # noqa: E402
from diagtools.kernels.cuda_launch import CudaDriver, LoadedKernel, entry_of, launch_kernel  # noqa: E402
from diagtools.kernels.cutedsl_impl import (  # noqa: E402
    PARAM_TYPES,
    PREBUILT,
    THREADS,
    WARPS,
    LaunchConfig,
    plan_launch,
    prebuilt_path,
)
from diagtools.kernels.reference import make_inputs  # noqa: E402

from .cutedsl_support import FakeDriver, code_lines, compile_in_child  # noqa: E402

COMPILE = """
import json, sys
from diagtools.kernels.cutedsl_impl import compile_ptx
print(json.dumps({f"{d}x{r}": compile_ptx(d, r, sys.argv[1]) for d, r in ((512, 4), (128, 4), (512, 8))}))
"""
H200_MULTIPROCESSORS = 132


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """PTX per (head dim, ratio), compiled in a fresh interpreter (CUTE_DSL_ARCH is read at import)."""
    compiled = compile_in_child(COMPILE, tmp_path_factory.mktemp("ptx"))
    return {tuple(map(int, k.split("x"))): v for k, v in compiled.items()}


# The grid: both head dims at the shipped ratio 4, and ratio 8 at D=512 (more rows per group).
@pytest.mark.parametrize(("head_dim", "ratio"), [(512, 4), (128, 4), (512, 8)])
def test_ptx_moves_128_bit_vectors(ptx, head_dim, ratio):
    text = ptx[head_dim, ratio]
    config = LaunchConfig(head_dim, ratio)
    vectors_per_lane = config.elements // 8  # bf16 vectors of 16 bytes
    assert ".target sm_90a" in text
    assert f".reqntid {THREADS}, 1, 1" in text
    # weight once per warp, then per group (in the prologue and in the loop): rows, logits, cos and sin
    per_group = ratio * vectors_per_lane + math.ceil(ratio / 4) + 2 * (config.elements // 2 // 4)
    assert len(re.findall(r"ld\.global\.v4\.(?:b32|f32|u32)", text)) == config.elements // 4 + 2 * per_group
    assert not re.search(r"ld\.global(?:\.\w+)*\.(?:u16|b16|s16|f16|bf16)\b", text)  # no 16-bit scalar loads
    assert len(re.findall(r"st\.global\.v4\.b32", text)) == vectors_per_lane
    assert "st.global.b16" not in text
    assert ".local" not in text  # nothing spilled to local memory


@pytest.mark.parametrize(("head_dim", "ratio"), [(512, 4), (128, 4)])
def test_ptx_reductions_and_special_functions(ptx, head_dim, ratio):
    text = ptx[head_dim, ratio]
    lanes = LaunchConfig(head_dim, ratio).lanes
    assert text.count("shfl.sync.bfly") == int(math.log2(lanes))  # sum of squares inside one team
    assert "bar.sync" not in text  # a team never spans warps: no shared memory, no barrier
    assert text.count("ex2.approx") == ratio  # the gate softmax
    assert text.count("rcp.approx") == 1  # one reciprocal instead of a divide per channel
    assert "div.rn.f32" not in text
    assert text.count("rsqrt.approx") == 1


def test_shipped_ptx_is_a_fresh_compile(ptx):
    for head_dim, ratio in PREBUILT:
        assert code_lines(prebuilt_path(head_dim, ratio).read_text()) == code_lines(ptx[head_dim, ratio]), (
            "stale PTX: run CUTE_DSL_ARCH=sm_90a .venv/bin/python benchmarks/build_ptx.py"
        )


@pytest.mark.parametrize(("head_dim", "ratio"), PREBUILT)
def test_entry_parameters_are_what_the_launcher_packs(head_dim, ratio):
    name, params = entry_of(prebuilt_path(head_dim, ratio).read_text())
    assert name.startswith("kernel_cutlass_kernel_")
    assert tuple(params) == PARAM_TYPES


def _walk(config: LaunchConfig, groups: int, grid: int) -> list[int]:
    """The groups the kernel's warps visit, by the kernel's own index arithmetic."""
    per_warp, warps = config.groups_per_warp, grid * WARPS
    units = (groups + per_warp - 1) // per_warp
    visited = []
    for warp in range(warps):
        trips = (units - warp + warps - 1) // warps
        for trip in range(max(trips, 0)):
            for team in range(per_warp):
                group = (warp + trip * warps) * per_warp + team
                if group < groups:
                    visited.append(group)
    return visited


# The grid: one group, an odd count (D=128 packs two groups per warp), and sizes where the
# persistent grid is capped so each warp walks many groups.
@pytest.mark.parametrize(("groups", "head_dim"), [(1, 512), (7, 128), (4096, 512), (65537, 128), (262144, 512)])
def test_every_group_is_visited_exactly_once(groups, head_dim):
    config = LaunchConfig(head_dim, 4)
    grid = config.grid(groups, H200_MULTIPROCESSORS, ctas_per_sm=3)
    assert 1 <= grid <= H200_MULTIPROCESSORS * 3
    assert sorted(_walk(config, groups, grid)) == list(range(groups))


@pytest.mark.parametrize(("groups", "head_dim", "ratio"), [(37, 128, 4), (300, 512, 4), (9, 512, 8)])
def test_the_plan_is_computed_from_the_real_tensors(groups, head_dim, ratio):
    inputs = make_inputs(groups, head_dim, ratio=ratio, seed=groups + head_dim + ratio)
    inputs = type(inputs)(*(t.int() if t is inputs.positions else t for t in inputs.args()), ratio=ratio)
    launch = plan_launch(*inputs.args(), ratio, 1e-5, multiprocessors=H200_MULTIPROCESSORS)
    assert launch is not None
    config = LaunchConfig(head_dim, ratio)
    assert launch.grid == (config.grid(groups, H200_MULTIPROCESSORS), 1, 1)
    assert launch.block == (THREADS, 1, 1)
    pointers, sizes, eps = launch.arguments[:7], launch.arguments[7:10], launch.arguments[10]
    assert sizes == (groups, inputs.kv_cache.numel() // head_dim, inputs.cos_sin_cache.shape[0])
    assert eps == pytest.approx(1e-5)
    assert pointers[0] == inputs.kv.data_ptr()
    assert pointers[6] == inputs.kv_cache.data_ptr()  # written in place, never a copy
    positions = launch.keep_alive[4]
    assert positions.dtype == torch.int64  # int32 widened
    assert pointers[4] == positions.data_ptr()
    assert torch.equal(positions, inputs.positions.long())
    assert all(p % 16 == 0 for p in pointers)


def test_no_groups_means_no_launch():
    inputs = make_inputs(0, 512, seed=1)
    assert plan_launch(*inputs.args(), 4, 1e-6, multiprocessors=H200_MULTIPROCESSORS) is None


def test_the_driver_receives_the_real_sizes(monkeypatch):
    fake = FakeDriver(PARAM_TYPES)
    monkeypatch.setattr(cuda_launch, "cuda_driver", lambda: fake)
    inputs = make_inputs(1000, 512, ratio=4, seed=2)
    launch = plan_launch(*inputs.args(), 4, 1e-6, multiprocessors=H200_MULTIPROCESSORS, ctas_per_sm=3)
    launch_kernel(LoadedKernel(77, 3), launch, stream=1234)
    (call,) = fake.calls
    assert call["grid"] == (math.ceil(1000 / WARPS), 1, 1)  # 250 CTAs of 4 groups: under the cap of 396
    assert call["block"] == (THREADS, 1, 1)
    assert call["stream"] == 1234
    assert call["function"] == 77
    assert call["values"][:10] == list(launch.arguments[:10])
    assert call["values"][7] == 1000
    assert call["values"][10] == pytest.approx(1e-6)


def test_without_cutlass_the_shipped_ptx_is_used(monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlass", None)  # import cutlass now raises ImportError
    cutedsl_impl.kernel_ptx.cache_clear()
    try:
        assert cutedsl_impl.kernel_ptx(512, 4) == prebuilt_path(512, 4).read_text()
        with pytest.raises(ValueError, match="no compiled kernel for head dim 128, ratio 2"):
            cutedsl_impl.kernel_ptx(128, 2)
    finally:
        cutedsl_impl.kernel_ptx.cache_clear()


def test_cpu_tensors_are_refused_with_a_clear_error():
    from diagtools.kernels import compress_norm_rope_store

    inputs = make_inputs(4, 512, seed=3)
    with pytest.raises(ValueError, match="runs on CUDA tensors only"):
        compress_norm_rope_store(*inputs.args(), backend="cutedsl")


def test_the_ctypes_launch_passes_the_driver_signature_in_order():
    recorded = []

    class Lib:
        def cuLaunchKernel(self, *arguments):  # noqa: N802 - the driver's name
            recorded.append(arguments)
            return 0

    driver = CudaDriver.__new__(CudaDriver)
    driver.lib = Lib()
    driver.launch(77, (250, 1, 1), (THREADS, 1, 1), 1234, 5678)
    assert recorded == [(77, 250, 1, 1, THREADS, 1, 1, 0, 1234, 5678, None)]
