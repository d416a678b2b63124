"""Sweep throughput on a package whose modules import torch: the zygote against fresh subkernels.

Generates a package of ``--modules`` modules that each ``import torch`` (two of
them also initialize CUDA, one through its parent package) and sweeps it with the
preloading zygote (``--repeats`` runs).  Fresh subkernels cost about two seconds a
module here, so fresh mode sweeps a package made the same way with only
``--fresh-modules`` modules (the same names and contents, fewer of them) and is
reported per module.  Both run ``--jobs`` at a time on the simulated driver; the
verdicts of the modules the two packages share must be identical.  ``--profile``
adds where a child's time goes, measured in a process that imported torch: the
fork, a bare child's exit, and the exit handlers a child would otherwise run.
The medians go to ``--save-path`` (JSON).

Run: ``.venv/bin/python benchmarks/sweep.py --modules 300 --fresh-modules 40 --profile
--save-path benchmarks/sweep.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scan_overhead import machine, save

from diagtools.usecases.sweep import sweep

CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
CULPRITS = {"swept.gpu_a", "swept.gpu", "swept.gpu.leaf"}


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


def phases(result, began: float) -> dict:
    """When the first child started (the preload before it), how long the children took, each child's median."""
    rows = [row for row in result.rows if not row.preloaded]
    first, last = min(row.started for row in rows), max(row.finished for row in rows)
    return {
        "before_first_child_s": first - began,
        "children_s": last - first,
        "children_per_s": len(rows) / (last - first),
        "child_median_s": statistics.median(row.finished - row.started for row in rows),
    }


def measure(modules: int, jobs: int, repeats: int, fresh: bool) -> tuple[dict, dict]:
    runs, seconds, rates = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        package = make_package(root, modules)
        for _ in range(repeats):
            began = time.time()
            result = sweep(package, path=[root], jobs=jobs, driver="simulated", fresh=fresh)
            assert {row.module for row in result.culprits} == CULPRITS
            assert result.mode == ("fresh" if fresh else "zygote"), result.fallback
            seconds.append(result.seconds)
            rates.append(len(result.rows) / result.seconds)
            runs.append(phases(result, began))
    middle = runs[seconds.index(statistics.median_low(seconds))]
    run = {
        "mode": result.mode,
        "preload": list(result.preload),
        "jobs": jobs,
        "modules": len(result.rows),
        "median_s": statistics.median(seconds),
        "modules_per_s": statistics.median(rates),
        "s_per_module": statistics.median(seconds) / len(result.rows),
        "runs_s": [round(s, 3) for s in seconds],
        "phases_of_median_run": {key: round(value, 4) for key, value in middle.items()},
    }
    return run, verdicts(result)


CHILD_COSTS = r"""
import gc, json, os, statistics, time, weakref
import torch

def forked(body):
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        body()
        os._exit(0)
    parent = time.perf_counter() - start
    os.waitpid(pid, 0)
    return parent, time.perf_counter() - start

def frozen(body):
    gc.freeze()
    try:
        return forked(body)
    finally:
        gc.unfreeze()

variants = {
    "fork_and_exit_s": lambda: forked(lambda: None),
    "fork_run_preloaded_finalizers_exit_s": lambda: forked(weakref.finalize._exitfunc),
    "fork_full_gc_exit_s": lambda: forked(gc.collect),
    "fork_full_gc_after_freeze_exit_s": lambda: frozen(gc.collect),
}
times = {name: [] for name in variants}
parent = []
for _ in range(20):  # round robin, so a change in the machine's load hits every variant alike
    for name, run in variants.items():
        in_parent, total = run()
        times[name].append(total)
        if name == "fork_and_exit_s":
            parent.append(in_parent)
found = {name: statistics.median(values) for name, values in times.items()}
found["fork_in_parent_s"] = statistics.median(parent)
found["torch_finalizers"] = len(weakref.finalize._registry)
print(json.dumps(found))
"""


def child_costs() -> dict:
    """Where a child's time goes, in a process that imported torch (medians of 20 forks of each kind)."""
    env = {"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD_COSTS], capture_output=True, text=True, check=True, env=env)
    return {key: round(value, 5) for key, value in json.loads(done.stdout).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=300)
    parser.add_argument("--fresh-modules", type=int, default=40, help="fresh mode is slow: a smaller package")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh-repeats", type=int, default=1, help="fresh mode is slow: one run by default")
    parser.add_argument("--profile", action="store_true", help="also time a child's fork, exit and exit handlers")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    zygote, zygote_verdicts = measure(args.modules, args.jobs, args.repeats, fresh=False)
    fresh, fresh_verdicts = measure(args.fresh_modules, args.jobs, args.fresh_repeats, fresh=True)
    shared = set(zygote_verdicts) & set(fresh_verdicts)
    results = {
        "machine": machine(),
        "runs": [zygote, fresh],
        "compared_modules": len(shared),
        "identical_verdicts": all(zygote_verdicts[m] == fresh_verdicts[m] for m in shared),
        "speedup_per_module": zygote["modules_per_s"] / fresh["modules_per_s"],
    }
    if args.profile:
        results["child_costs"] = child_costs()
    save(args.save_path, results)


if __name__ == "__main__":
    main()
