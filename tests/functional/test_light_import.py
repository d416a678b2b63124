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


# What a command line loads: the parser needs none of the work, and a scan none of the other commands' code.
NOT_FOR_PARSING = ("diagtools.usecases", "diagtools.driver", "diagtools.runner", "diagtools.render", "diagtools.model.")
NOT_FOR_A_SCAN = (
    "diagtools.usecases.sweep",
    "diagtools.usecases.replay",
    "diagtools.usecases.bisect",
    "diagtools.usecases.run",
    "diagtools.model.replay",
    "diagtools.model.sweep",
    "diagtools.model.bisect",
    "diagtools.model.diff",
    "diagtools.model.run",
    "diagtools.driver._generate",  # the driver's cache is valid: its declarations are not read again
    "diagtools.driver._elf",
)


def _loaded(names: str) -> list[str]:
    return names.split()


def test_parsing_a_command_line_loads_no_use_case_driver_runner_renderer_or_result_type():
    code = (
        "import sys\n"
        "from diagtools.frontends import cli\n"
        "cli._build_parser().parse_args(['scan', 'colorsys', '--driver', 'simulated'])\n"
        "print(' '.join(sys.modules))\n"
    )
    loaded = _loaded(run_python(code))
    assert "diagtools.frontends.cli" in loaded
    assert [name for name in loaded if name.startswith(NOT_FOR_PARSING) and name != "diagtools.model.options"] == []


def test_a_scan_loads_only_the_scan_s_code_and_no_hashlib_once_the_driver_is_built():
    code = (
        "import os, sys\n"
        "at_start = set(sys.modules)\n"
        "from diagtools.frontends.cli import main\n"
        "argv = ['scan', 'colorsys', '--driver', 'simulated', '--json', os.devnull]\n"
        "assert main(argv) == 0\n"
        "print('RESULT', ' '.join(sorted(set(sys.modules) - at_start)))\n"
    )
    run_python(code)  # builds the simulated driver if this machine has none yet
    loaded = _loaded(run_python(code).split("RESULT", 1)[1])
    assert "diagtools.usecases.scan" in loaded
    assert "diagtools.render.text" in loaded
    assert [name for name in loaded if name.startswith(NOT_FOR_A_SCAN)] == []
    assert "hashlib" not in loaded  # a valid cache is found by its stamp, without OpenSSL
