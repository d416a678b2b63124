"""Adaptive preload on the 300-module sweep benchmark: with and without learning, same rows.

Two packages of ``--modules`` modules, swept ``--jobs`` at a time on the simulated
driver, with and without the adaptive preload (alternating, ``--repeats`` each):

* ``plain``: ``sweep.py``'s package (every module imports torch, which the zygote
  preloads anyway): nothing to learn, so this is the cost of the learning passes;
* ``shared``: the same modules, each also importing the package's own ``swept.common``,
  whose import costs about ``--shared-ms`` of work (as vLLM's modules import
  ``vllm.config``): what learning saves.

The rows of the two modes must be identical (status, CUDA, source, culprit module and line).

Run: ``.venv/bin/python benchmarks/sweep_adapt.py --save-path benchmarks/sweep_adapt.json``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scan_overhead import machine, save
from sweep import make_package

from diagtools.usecases.sweep import sweep

SHARED = "import time, torch\n_end = time.perf_counter() + {seconds}\nwhile time.perf_counter() < _end:\n    pass\n"


def add_shared_module(root: Path, seconds: float) -> None:
    """Make every ``swept.mN`` import ``swept.common`` first, which costs ``seconds`` of CPU."""
    package = root / "swept"
    (package / "common.py").write_text(SHARED.format(seconds=seconds))
    for module in package.glob("m*.py"):
        module.write_text("import swept.common\n" + module.read_text())


def rows(result) -> dict:
    return {
        row.module: (
            row.status,
            row.cuda_initialized,
            row.cuda_source,
            row.culprit.module if row.culprit else None,
            row.culprit.line_to_change.line if row.culprit and row.culprit.line_to_change else None,
        )
        for row in result.rows
        if not row.preloaded
    }


def measure(kind: str, modules: int, jobs: int, repeats: int, shared_s: float) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        package = make_package(root, modules)
        if kind == "shared":
            add_shared_module(root, shared_s)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        found: dict[bool, dict] = {}
        notes: tuple[str, ...] = ()
        for index in range(repeats):
            for adapt in (True, False) if index % 2 == 0 else (False, True):
                result = sweep(package, path=[root], jobs=jobs, driver="simulated", adapt=adapt)
                assert result.mode == "zygote", result.fallback
                seconds[adapt].append(result.seconds)
                found[adapt] = rows(result)
                notes = result.preload_notes if adapt else notes
    common = set(found[True]) & set(found[False])
    return {
        "package": kind,
        "modules": modules,
        "adapt_median_s": statistics.median(seconds[True]),
        "no_adapt_median_s": statistics.median(seconds[False]),
        "speedup": statistics.median(seconds[False]) / statistics.median(seconds[True]),
        "adapt_runs_s": [round(s, 3) for s in seconds[True]],
        "no_adapt_runs_s": [round(s, 3) for s in seconds[False]],
        "preload_notes": list(notes),
        "identical_rows": all(found[True][m] == found[False][m] for m in common) and len(common) >= modules - 2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shared-ms", type=float, default=150.0)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    results = {
        "machine": machine(),
        "runs": [
            measure(kind, args.modules, args.jobs, args.repeats, args.shared_ms / 1000) for kind in ("plain", "shared")
        ],
    }
    save(args.save_path, results)


if __name__ == "__main__":
    main()
