"""What a larger second sample would teach the no-flag vLLM sweep, counted as the rows would pay for it.

The no-flag sweep's second learner watches 16 children of the zygote that preloads what the first sample
taught, and preloads more only what a quarter of them (a costly module) or half of them import.  This
runs, in the environment that has vllm installed (``vllm_env.sh``), a zygote that preloads a no-flag
run's whole preload (``--summary``: a ``sweep_vllm_noflag.py`` document, or one pair of
``sweep_vllm_noflag_pairs.json`` with ``--pair``) and scans an evenly spread sample of N of the modules
it does not preload, for each N given.  For each module the children imported, it counts:

* ``children``: the sampled children that imported it;
* ``rows_pay``: those that imported it outside the import of one of their own packages.  A module
  below a package is scanned by the process that imported that package for its own row (the package
  descent), so what the package's ``__init__`` imports is paid once for all of them, not in every row;
* ``s_each``: the seconds each of those children spent importing it (with what it imports);
* ``saving_s``: what preloading it would save the ``--rows`` rows left, ``--jobs`` at a time, were the
  share of the sample that pays for it the share of those rows.

Nothing is preloaded or checked; the rows are thrown away.  Run (the machine otherwise quiet):
``VENV/bin/python benchmarks/sweep_vllm_more_sample.py 16 96 --summary OUT/summary.json
--save-path benchmarks/sweep_vllm_more_sample.json``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from sweep_vllm_compare import emit

from diagtools.driver import resolve_driver
from diagtools.model.scan import ScanResult
from diagtools.usecases import sweep_forked
from diagtools.usecases.options import ScanOptions
from diagtools.usecases.sweep_discover import locate_tree
from diagtools.usecases.sweep_learning import ADAPT_SHARE, Learned, Learner, spread


def paid_by_the_row(module: str, result: ScanResult) -> dict[str, float]:
    """The modules ``module``'s child imported outside its own packages' imports, with their seconds."""
    parts = module.split(".")
    packages = {".".join(parts[:depth]) for depth in range(1, len(parts))}
    importer = {node.name: node.parent for node in result.modules}

    def under_a_package(name: str) -> bool:
        seen, parent = set(), importer.get(name)
        while parent is not None and parent not in seen:
            if parent in packages:
                return True
            seen.add(parent)
            parent = importer.get(parent)
        return False

    return {
        node.name: node.cumulative_s
        for node in result.modules
        if node.complete and node.phase == "import" and node.name != module and node.name not in packages
        if not under_a_package(node.name)
    }


def sample(size: int, preload: list[str], rows: int, jobs: int) -> dict[str, Any]:
    """Scan ``size`` spread modules in a zygote that preloads ``preload``: what their children imported."""
    options = ScanOptions.of(driver="simulated")
    tree = locate_tree("vllm", options.roots, ())
    preloaded = set(preload)
    pool = [module for module in tree.modules if module not in preloaded]
    chosen = spread(pool, size)
    learner = Learner("vllm", chosen, ADAPT_SHARE, preload, jobs=jobs)
    seen: dict[str, ScanResult] = {}
    observe = learner.observe

    def observed(module: str, result: ScanResult | None) -> None:
        if result is not None and module in learner.waiting:
            seen[module] = result
        observe(module, result)

    learner.observe = observed  # type: ignore[method-assign]
    job = sweep_forked.ZygoteJob(tree, options, resolve_driver("simulated"), preload, jobs, lambda row: None)
    started = time.perf_counter()
    with contextlib.suppress(Learned):
        sweep_forked._pass(job.sweep(), chosen, list(preload), learner)
    seconds = time.perf_counter() - started
    counted: dict[str, dict[str, Any]] = {}
    for module, result in seen.items():
        paid = paid_by_the_row(module, result)
        for node in result.modules:
            if node.name == module or not node.complete or node.phase != "import":
                continue
            entry = counted.setdefault(node.name, {"children": 0, "rows_pay": 0, "seconds": 0.0})
            entry["children"] += 1
            if node.name in paid:
                entry["rows_pay"] += 1
                entry["seconds"] += paid[node.name]
    children = len(seen)
    modules = {
        name: {
            "children": entry["children"],
            "rows_pay": entry["rows_pay"],
            "s_each": round(entry["seconds"] / entry["rows_pay"], 3),
            "saving_s": round(entry["seconds"] / children * rows / jobs, 1),
        }
        for name, entry in counted.items()
        if entry["rows_pay"] >= 2
    }
    ranked = dict(sorted(modules.items(), key=lambda item: -item[1]["saving_s"])[:40])
    learned = learner.chosen() if learner.decided else ((), ())
    return {
        "sample": size,
        "children": children,
        "seconds": round(seconds, 1),
        "second_learner_would_choose": [*learned[0], *learned[1]],
        "modules_paid_by_two_or_more_rows": len(modules),
        "paid_by_two_or_more_rows": ranked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="+", type=int)
    parser.add_argument("--summary", type=Path, required=True)
    parser.add_argument("--pair", help="the key of one pair, when --summary is sweep_vllm_noflag_pairs.json")
    parser.add_argument("--rows", type=int, default=3000, help="rows left to scan when the second sample decides")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    document = json.loads(args.summary.read_text())
    run = document["pairs"][args.pair] if args.pair else document
    preload = list(run["no_flag"]["preload"])
    document = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "preload": {"from": f"{args.summary}{' ' + args.pair if args.pair else ''}", "modules": len(preload)},
        "runs": [sample(size, preload, args.rows, args.jobs) for size in args.sizes],
    }
    emit(document, args.save_path)


if __name__ == "__main__":
    main()
