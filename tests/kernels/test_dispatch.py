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
        compress_norm_rope_store(*make_inputs(2, 128, seed=4).args(), backend="cuda-magic")


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


def test_the_cpu_note_says_compiled_only_when_it_compiled(tmp_path, monkeypatch):
    """Without nvidia-cutlass-dsl the benchmark reads the shipped PTX: its row must not say "compiled"."""
    require("torch", "kernels")
    from diagtools import bench

    # its .pth puts nvidia-cutlass-dsl first on sys.path: hide it after site ran, as if it were not installed
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['cutlass'] = None\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    report = bench.compare([(64, 512)], backends=("cutedsl",), driver="simulated", timeout=300)
    assert not report.error, report.error
    note = report.rows[0]["note"]
    assert "the shipped PTX for sm_90a was read" in note, note
    assert "compiled" not in note.replace("not compiled here", ""), note
