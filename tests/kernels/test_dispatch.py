"""Dispatch follows vLLM's head-dim rule, and the kernel modules import without touching CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diagtools.kernels import choose_backend
from tests.conftest import require


def test_head_dim_rule():
    assert choose_backend(512, on_cuda=True) == "cutedsl"
    assert choose_backend(128, on_cuda=True) == "triton"
    assert choose_backend(512, on_cuda=False) == "torch"


def test_unknown_backend_is_a_value_error():
    require("torch", "kernels")
    from diagtools.kernels import compress_norm_rope_store
    from diagtools.kernels.reference import make_inputs

    with pytest.raises(ValueError, match="unknown backend 'cuda-magic'"):
        compress_norm_rope_store(*make_inputs(2, 128).args(), backend="cuda-magic")


def test_importing_the_package_imports_no_backend():
    code = "import sys, diagtools.kernels; print(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert not loaded & {
        "torch",
        "triton",
        "cutlass",
        "diagtools.kernels.triton_impl",
        "diagtools.kernels.cutedsl_impl",
        "diagtools.kernels.state",
        "diagtools.kernels.state_reference",
        "diagtools.kernels.state_triton",
    }


@pytest.mark.parametrize(
    ("module", "dsl"),
    [
        ("diagtools.kernels.triton_impl", "triton"),
        ("diagtools.kernels.cutedsl_impl", "cutlass"),
        ("diagtools.kernels.state_triton", "triton"),
    ],
)
def test_kernel_modules_import_without_initializing_cuda(sim_scan, module, dsl):
    require(dsl, "kernels", reason=f"{module} needs {dsl}")
    result = sim_scan(module, timeout=180.0)
    assert result.status == "ok", result.error
    assert not result.cuda_initialized, result.culprit
    assert module in result.module_names()
