"""The CuTe DSL kernel compiled for sm_90a on this CPU, with its PTX checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("cutlass")

COMPILE = """
import json, sys
from diagtools.kernels.cutedsl_impl import ptx_for
print(json.dumps({d: ptx_for(d, 4, sys.argv[1]) for d in (128, 512)}))
"""


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """PTX per head dim, compiled in a fresh interpreter (CUTE_DSL_ARCH is read at import)."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(tmp_path_factory.mktemp("ptx"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("head_dim", [128, 512])
def test_ptx_is_the_expected_kernel_for_sm_90a(ptx, head_dim):
    text = ptx[head_dim]
    assert ".target sm_90a" in text
    entries = re.findall(r"\.visible \.entry (\S+)\(", text)
    assert len(entries) == 1
    assert entries[0].startswith("kernel_cutlass__kernel_")
    assert ".reqntid 64, 1, 1" in text  # one CTA of 64 threads per group
    assert text.count("shfl.sync.bfly") == 5  # the butterfly sum of squares inside a warp
    assert "bar.sync" in text  # and shared memory across the two warps
    assert "rsqrt.approx.f32" in text
    assert text.count("ex2.approx") == 4  # the gate softmax over ratio = 4 logits
    elements = head_dim // 64
    assert text.count("st.global.b16") == 2 * elements  # bf16 stores: rotated and plain branch per pair
    assert text.count("cvt.rn.bf16.f32") == 2 * elements


@pytest.mark.parametrize("head_dim", [128, 512])
def test_rope_lanes_start_where_the_last_64_channels_do(ptx, head_dim):
    first_rope_lane = (head_dim - 64) // (head_dim // 64)
    assert re.search(rf"setp\.lt\.u32\s+%p\d+, %r\d+, {first_rope_lane};", ptx[head_dim])


def test_cpu_tensors_are_refused_with_a_clear_error():
    torch = pytest.importorskip("torch")
    from diagtools.kernels import compress_norm_rope_store
    from diagtools.kernels.reference import make_inputs

    inputs = make_inputs(4, 512)
    with pytest.raises(ValueError, match="runs on CUDA tensors only"):
        compress_norm_rope_store(*inputs.args(), backend="cutedsl")
    del torch
