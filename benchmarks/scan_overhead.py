"""How much does a scan cost over a plain import?

Two measurements, both written to ``--save-path`` as JSON (and printed):

* ``torch``: wall time of ``diagtools scan torch`` against ``python -c "import
  torch"`` in the same venv, in paired runs (order alternating), median ratio.
* ``synthetic``: modules per second while scanning a generated tree of
  ``--modules`` modules, against a plain import of the same tree, plus the
  subkernel's peak RSS.

Run: ``.venv/bin/python benchmarks/scan_overhead.py --save-path benchmarks/scan_overhead.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIAGTOOLS = str(Path(sys.executable).with_name("diagtools"))


def wall(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(command)}: {done.stderr.decode()[-400:]}")
    return elapsed


def paired(plain: list[str], scanned: list[str], runs: int, env: dict[str, str] | None = None) -> dict:
    """Alternate the two commands so drift on the machine hits both alike."""
    wall(plain, env)
    wall(scanned, env)  # warm caches (page cache, the driver build) before timing
    ratios, plain_s, scan_s = [], [], []
    for index in range(runs):
        pair = [(plain, plain_s), (scanned, scan_s)]
        for command, sink in pair if index % 2 == 0 else reversed(pair):
            sink.append(wall(command, env))
        ratios.append(scan_s[-1] / plain_s[-1])
    return {
        "runs": runs,
        "plain_median_s": statistics.median(plain_s),
        "scan_median_s": statistics.median(scan_s),
        "median_ratio": statistics.median(ratios),
        "ratios": [round(r, 4) for r in ratios],
    }


def synthetic_tree(root: Path, modules: int, fanout: int = 100) -> str:
    """A package of ``modules`` modules: subpackages of ``fanout`` leaves each."""
    top = root / "synth"
    top.mkdir()
    packages = max(1, modules // fanout)
    (top / "__init__.py").write_text("".join(f"from . import p{i}\n" for i in range(packages)))
    for i in range(packages):
        sub = top / f"p{i}"
        sub.mkdir()
        (sub / "__init__.py").write_text("".join(f"from . import m{j}\n" for j in range(fanout - 1)))
        for j in range(fanout - 1):
            (sub / f"m{j}.py").write_text(f"VALUE = {j}\n")
    return "synth"


def bench_synthetic(modules: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        target = synthetic_tree(Path(scratch), modules)
        env = dict(os.environ, PYTHONPATH=scratch, PYTHONDONTWRITEBYTECODE="1")
        plain = [sys.executable, "-c", f"import {target}"]
        scanned = [DIAGTOOLS, "scan", target, "--driver", "simulated", "--json", os.devnull]
        timing = paired(plain, scanned, runs, env)
        count = sum(1 for _ in Path(scratch).rglob("*.py"))
    timing.update(
        modules=count,
        scan_modules_per_s=count / timing["scan_median_s"],
        plain_modules_per_s=count / timing["plain_median_s"],
    )
    return timing


PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], capture_output=True, check=True)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def scaling(counts: tuple[int, ...]) -> list[dict]:
    """Scan time and the peak RSS of the largest process involved, per tree size."""
    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory() as scratch:
            target = synthetic_tree(Path(scratch), count)
            env = dict(os.environ, PYTHONPATH=scratch, PYTHONDONTWRITEBYTECODE="1")
            command = [DIAGTOOLS, "scan", target, "--driver", "simulated", "--json", os.devnull]
            seconds = statistics.median(wall(command, env) for _ in range(3))
            done = subprocess.run(
                [sys.executable, "-c", PEAK_RSS, *command], env=env, capture_output=True, text=True, check=True
            )
            rows.append({"modules": count, "scan_median_s": seconds, "peak_rss_mib": int(done.stdout) / 1024})
    return rows


def save(path: Path | None, document: dict) -> None:
    """Print the results and, with ``--save-path``, write them as sorted JSON."""
    text = json.dumps(document, indent=2, sort_keys=True)
    print(text)
    if path:
        path.write_text(text + "\n")


def machine() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--modules", type=int, default=10000)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    results = {
        "machine": machine(),
        "torch": paired(
            [sys.executable, "-c", "import torch"],
            [DIAGTOOLS, "scan", "torch", "--driver", "simulated", "--json", os.devnull],
            args.runs,
        ),
        "synthetic": bench_synthetic(args.modules, max(3, args.runs // 2)),
        "scaling": scaling((1000, 2500, 5000, 10000)),
    }
    save(args.save_path, results)


if __name__ == "__main__":
    main()
