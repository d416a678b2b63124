"""The adaptive sweep's first learning stage alone, on vLLM: how long a sample of N children takes, and what it learns.

Runs, in the environment that has vllm installed (``vllm_env.sh``), exactly what ``diagtools sweep vllm`` does
before it checks its candidates: a zygote that preloads ``torch, vllm`` scans an evenly spread sample of N
modules, and the learner chooses the libraries and the package's modules to preload.  Nothing is checked or
preloaded.  Each size is run in turn, from a new zygote, and the candidate lists are compared with the
first size's.

Run (the machine otherwise quiet):
``VENV/bin/python benchmarks/sweep_vllm_learn.py 24 8 --save-path benchmarks/sweep_vllm_learn.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from diagtools.driver import resolve_driver
from diagtools.usecases import sweep_forked
from diagtools.usecases.options import ScanOptions
from diagtools.usecases.sweep import default_preload
from diagtools.usecases.sweep_discover import locate_tree


def learn(size: int, package: str) -> dict[str, Any]:
    """One learning stage with a sample of ``size``: its seconds and what it chose."""
    options = ScanOptions.of(driver="simulated")
    tree = locate_tree(package, options.roots, ())
    preload = default_preload(tree, options.roots)
    job = sweep_forked.ZygoteJob(tree, options, resolve_driver("simulated"), preload, 2, lambda row: None)
    started = time.perf_counter()
    sweep_forked.ADAPT_SAMPLE = size
    candidates = sweep_forked._learn_from_sample(job.sweep(), tree.modules, preload)
    seconds = time.perf_counter() - started
    learner = candidates.learner
    assert learner is not None
    return {
        "sample": size,
        "seconds": round(seconds, 1),
        "children": learner.children,
        "preload_given": list(preload),
        "libraries": list(candidates.libraries),
        "modules": [name for name in candidates.names if name not in candidates.libraries],
        "average_child_s_saved": round(learner.saving(candidates.names, 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="+", type=int)
    parser.add_argument("--package", default="vllm")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    runs = [learn(size, args.package) for size in args.sizes]
    first = set(runs[0]["libraries"] + runs[0]["modules"])
    for run in runs[1:]:
        chosen = set(run["libraries"] + run["modules"])
        run["against_first"] = {"only_here": sorted(chosen - first), "only_in_first": sorted(first - chosen)}
    document = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    text = json.dumps(document, indent=1) + "\n"
    if args.save_path:
        args.save_path.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
