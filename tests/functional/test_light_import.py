"""`import diagtools` stays light: no heavy or CUDA-capable package, and quick."""

from __future__ import annotations

import statistics
import subprocess
import sys

import diagtools

HEAVY = ("torch", "triton", "cutlass", "cuda", "ipywidgets", "graphviz", "jupyter_client", "ipykernel", "numpy")


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_diagtools_loads_no_heavy_package():
    loaded = run_python("import sys, diagtools\nprint('\\n'.join(sorted(sys.modules)))").split()
    offenders = [name for name in loaded if name.split(".")[0] in HEAVY]
    assert offenders == []
    assert "diagtools.usecases.scan" not in loaded  # public names resolve lazily


def test_public_names_resolve_lazily_and_still_stay_light():
    loaded = run_python("import sys, diagtools\ndiagtools.scan; diagtools.ScanResult\nprint(' '.join(sys.modules))")
    assert not [name for name in loaded.split() if name.split(".")[0] in HEAVY]
    assert sorted(diagtools.__all__) == sorted(dir(diagtools))


def test_import_takes_under_50_ms():
    code = "import time; t = time.perf_counter(); import diagtools; print(time.perf_counter() - t)"
    samples = [float(run_python(code)) for _ in range(5)]
    assert statistics.median(samples) < 0.050, samples
