"""The torch child action against a real GPU: torch's own fork error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diagtools.driver import real_driver_path
from diagtools.usecases import replay


def torch_cuda_version() -> str:
    """torch's CUDA version, asked in a throwaway interpreter so this process stays CUDA-free."""
    code = "import torch; print(torch.version.cuda or '')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(real_driver_path() is None, reason="no real libcuda.so.1 loads on this machine (no GPU driver)"),
]


@pytest.fixture(autouse=True)
def _needs_cuda_torch():
    if not torch_cuda_version():
        pytest.skip("torch is missing or a CPU build")


def test_torch_child_after_a_torch_parent_init_fails_with_torchs_message(make_tree):
    root = make_tree({"torchinit.py": "import torch\ntorch.cuda.init()\n"})
    result = replay.replay_fork("torchinit", path=[root], child="torch", driver="real")
    assert result.driver.kind == "real"
    assert result.status == "failed"
    assert "Cannot re-initialize CUDA in forked subprocess" in result.child.error
    spawned = replay.replay_fork("torchinit", path=[root], child="torch", driver="real", start_method="spawn")
    assert spawned.status == "ok"
