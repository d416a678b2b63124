"""Sweep throughput on a package whose modules import torch: the zygote against fresh subkernels.

Generates a package of ``--modules`` modules that each ``import torch`` (two of
them also initialize CUDA, one through its parent package), sweeps it with the
preloading zygote and with a fresh subkernel per module (``--jobs`` each, on the
simulated driver), checks that both give identical verdicts, and writes the
medians to ``--save-path`` (JSON).

Run: ``.venv/bin/python benchmarks/sweep.py --save-path benchmarks/sweep.json``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scan_overhead import machine, save

from diagtools.usecases.sweep import sweep

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"


def make_package(root: Path, modules: int) -> str:
    package = root / "swept"
    (package / "gpu").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for index in range(modules - 4):
        (package / f"m{index}.py").write_text(f"import torch\nVALUE = torch.tensor([{index}])\n")
    (package / "gpu_a.py").write_text("import torch\n" + CUINIT)
    (package / "gpu" / "__init__.py").write_text(CUINIT)
    (package / "gpu" / "leaf.py").write_text("import torch\n")
    return "swept"


def verdicts(result) -> dict:
    return {
        row.module: (row.status, row.cuda_initialized, row.cuda_source, row.culprit.module if row.culprit else None)
        for row in result.rows
    }


def measure(package: str, root: Path, jobs: int, repeats: int, fresh: bool) -> tuple[dict, dict]:
    rates, seconds = [], []
    for _ in range(repeats):
        result = sweep(package, path=[root], jobs=jobs, driver="simulated", fresh=fresh)
        assert {row.module for row in result.culprits} == {"swept.gpu_a", "swept.gpu", "swept.gpu.leaf"}
        assert result.mode == ("fresh" if fresh else "zygote"), result.fallback
        seconds.append(result.seconds)
        rates.append(len(result.rows) / result.seconds)
    run = {
        "mode": result.mode,
        "preload": list(result.preload),
        "jobs": jobs,
        "modules": len(result.rows),
        "median_s": statistics.median(seconds),
        "modules_per_s": statistics.median(rates),
        "runs_s": [round(s, 3) for s in seconds],
    }
    return run, verdicts(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh-repeats", type=int, default=1, help="fresh mode is slow: one run by default")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        package = make_package(root, args.modules)
        zygote, zygote_verdicts = measure(package, root, args.jobs, args.repeats, fresh=False)
        fresh, fresh_verdicts = measure(package, root, args.jobs, args.fresh_repeats, fresh=True)
    results = {
        "machine": machine(),
        "runs": [zygote, fresh],
        "identical_verdicts": zygote_verdicts == fresh_verdicts,
        "speedup": zygote["modules_per_s"] / fresh["modules_per_s"],
    }
    save(args.save_path, results)


if __name__ == "__main__":
    main()
