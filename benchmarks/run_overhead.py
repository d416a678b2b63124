"""How much does ``diagtools run`` cost over running the command bare?

Two measurements, written to ``--save-path`` as JSON (and printed), each as
paired runs (order alternating) with the median ratio:

* ``torch``: ``diagtools run --json /dev/null -- python -c "import torch"``
  against ``python -c "import torch"`` (default driver: ``auto``).
* ``forks``: a program that forks ``--forks`` children one after the other
  (each exits at once), watched against bare: the whole command's wall time,
  and the fork loop's own time per fork as the program measures it (the
  hooks' cost without the runner's start-up and report).

Run: ``.venv/bin/python benchmarks/run_overhead.py --save-path benchmarks/run_overhead.json``
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
FORKER = """
import os, sys, time
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print("LOOP", time.perf_counter() - start)
"""


def wall(command: list[str], loops: list[float] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(command)}: {done.stderr.decode()[-400:]}")
    if loops is not None:
        loops.append(float(done.stdout.decode().split("LOOP", 1)[1].split()[0]))
    return elapsed


def paired(plain: list[str], watched: list[str], runs: int, loops: dict[str, list[float]] | None = None) -> dict:
    """Alternate the two commands so drift on the machine hits both alike."""
    wall(plain)
    wall(watched)  # warm caches (page cache, driver and extension builds) before timing
    ratios, plain_s, watched_s = [], [], []
    for index in range(runs):
        pair = [(plain, plain_s, "plain"), (watched, watched_s, "watched")]
        for command, sink, name in pair if index % 2 == 0 else reversed(pair):
            sink.append(wall(command, loops[name] if loops is not None else None))
        ratios.append(watched_s[-1] / plain_s[-1])
    return {
        "runs": runs,
        "plain_median_s": statistics.median(plain_s),
        "watched_median_s": statistics.median(watched_s),
        "median_ratio": statistics.median(ratios),
        "ratios": [round(r, 4) for r in ratios],
    }


def bench_torch(runs: int, driver: str) -> dict:
    plain = [sys.executable, "-c", "import torch"]
    watched = [DIAGTOOLS, "run", "--driver", driver, "--json", os.devnull, "--", *plain]
    return {"command": "python -c 'import torch'", "driver": driver, **paired(plain, watched, runs)}


def bench_forks(runs: int, forks: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "forker.py"
        script.write_text(FORKER)
        plain = [sys.executable, str(script), str(forks)]
        watched = [DIAGTOOLS, "run", "--driver", "simulated", "--json", os.devnull, "--", *plain]
        loops: dict[str, list[float]] = {"plain": [], "watched": []}
        timing = paired(plain, watched, runs, loops)
    per_fork = {name: round(1000 * statistics.median(values) / forks, 3) for name, values in loops.items()}
    return {
        "forks": forks,
        "loop_ms_per_fork_plain": per_fork["plain"],
        "loop_ms_per_fork_watched": per_fork["watched"],
        **timing,
    }


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--forks", type=int, default=200)
    parser.add_argument("--driver", default="auto", help="driver for the torch measurement")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    results = {
        "machine": machine(),
        "torch": bench_torch(args.runs, args.driver),
        "forks": bench_forks(args.runs, args.forks),
    }
    text = json.dumps(results, indent=2, sort_keys=True)
    print(text)
    if args.save_path:
        args.save_path.write_text(text + "\n")


if __name__ == "__main__":
    main()
