"""Sweep throughput: modules per second with --jobs 1 against --jobs 2.

Generates a package of ``--modules`` small modules (two of them initialize
CUDA), sweeps it ``--repeats`` times per job count through the Python API on
the simulated driver, and writes the medians to ``--save-path`` (JSON).

Run: ``.venv/bin/python benchmarks/sweep.py --save-path benchmarks/sweep.json``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scan_overhead import machine, save

from diagtools.usecases.sweep import sweep


def make_package(root: Path, modules: int) -> str:
    package = root / "swept"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for index in range(modules - 3):
        (package / f"m{index}.py").write_text(f"import json\nVALUE = {index}\n")
    (package / "gpu_a.py").write_text("import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n")
    (package / "gpu_b.py").write_text("from cuda.bindings import driver\ndriver.cuInit(0)\n")
    return "swept"


def measure(package: str, root: Path, jobs: int, repeats: int) -> dict:
    rates, seconds = [], []
    for _ in range(repeats):
        result = sweep(package, path=[root], jobs=jobs, driver="simulated")
        assert len(result.culprits) == 2, result.culprits
        seconds.append(result.seconds)
        rates.append(len(result.rows) / result.seconds)
    return {
        "jobs": jobs,
        "median_s": statistics.median(seconds),
        "modules_per_s": statistics.median(rates),
        "runs_s": [round(s, 3) for s in seconds],
        "modules": len(result.rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        package = make_package(root, args.modules)
        runs = [measure(package, root, jobs, args.repeats) for jobs in (1, 2)]
    results = {"machine": machine(), "runs": runs, "speedup_jobs2": runs[1]["modules_per_s"] / runs[0]["modules_per_s"]}
    save(args.save_path, results)


if __name__ == "__main__":
    main()
