"""What a sweep zygote's fork costs each row, with its memory in 4 KiB pages and in huge pages.

Every row of a sweep is a child forked from a zygote that preloaded torch and more (for vLLM's no-flag
sweep, 1.2 GiB resident, 584 MiB of it private anonymous memory, in ``fork_cost.json``).  ``fork()``
copies one page-table entry per 4 KiB page of that memory and the child's exit drops them again; the
zygote now moves it into transparent huge pages first (``collapse_to_huge_pages`` in
``diagtools/driver/cuprobe.c``).  This measures, in the environment given (``vllm_env.sh``'s, with the
simulated driver), for a zygote that imports ``--preload`` (a ``sweep_vllm_noflag.py`` document's no-flag
preload, or a comma-separated list), with the memory as imported and after the collapse:

* ``fork_exit_ms``: median wall time of a fork whose child exits at once, reaped by the zygote;
* ``rows``: ``--rows`` modules of ``--package`` not preloaded, spread over the sorted list, each imported
  by a child as a row would be (no probe): the median wall per child, and the children's CPU seconds;
* ``descended``: the same fork, from a child that first imported ``--descend`` (a package the sweep
  imports once for the modules below it, in a zygote of its own), as the rows below it are forked.

Each mode runs in a fresh interpreter, one after the other, the machine otherwise quiet.  Run:
``VENV/bin/python benchmarks/fork_cost.py --preload OUT/f0.json --save-path benchmarks/fork_cost.json``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sweep_vllm_compare import emit

from diagtools import protocol

FORKS = 41
TRIES_PER_ROW = 2


def _fork_exit_ms() -> float:
    times = []
    for _ in range(FORKS):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def _memory() -> dict[str, int]:
    fields = {}
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Anonymous", "AnonHugePages"):
                fields[name.lower() + "_mib"] = int(rest.split()[0]) >> 10
    return fields


def _rows(modules: list[str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    walls = []
    for module in modules:
        for _ in range(TRIES_PER_ROW):
            started = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                try:
                    __import__(module)
                except BaseException:
                    os._exit(3)
                os._exit(0)
            os.waitpid(pid, 0)
            walls.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "children": len(walls),
        "median_wall_s": round(statistics.median(walls), 4),
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "system_s": round(after.ru_stime - before.ru_stime, 2),
    }


def _descended(package: str) -> float | None:
    """The fork cost measured in a child that imported ``package``, handed back through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            __import__(package)
            text = str(_fork_exit_ms())
        except BaseException:
            text = ""
        os.write(write_fd, text.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    return float(text) if text else None


def worker(args: argparse.Namespace) -> None:
    preload = [name for name in args.names.split(",") if name]
    failed = []
    started = time.perf_counter()
    for name in preload:
        try:
            __import__(name)
        except BaseException:
            failed.append(name)
    preloaded_s = time.perf_counter() - started
    gc.freeze()
    collapse: dict[str, Any] = {}
    if args.collapse:
        started = time.perf_counter()
        moved = protocol.load_cuprobe({protocol.CUPROBE: args.probe}).collapse_to_huge_pages()
        collapse = {"moved_mib": moved >> 20, "seconds": round(time.perf_counter() - started, 2)}
    print(
        json.dumps(
            {
                "preloaded": len(preload) - len(failed),
                "failed": failed,
                "preload_s": round(preloaded_s, 1),
                "collapse": collapse,
                "memory": _memory(),
                "fork_exit_ms": _fork_exit_ms(),
                "descended": {"package": args.descend, "fork_exit_ms": _descended(args.descend)},
                "rows": _rows(args.rows.split(",")),
            }
        )
    )


def _preload_names(given: str) -> list[str]:
    path = Path(given)
    if path.is_file():
        return list(json.loads(path.read_text())["preload"])
    return [name for name in given.split(",") if name]


def _spread_rows(package: str, preload: list[str], count: int) -> list[str]:
    from diagtools.usecases.options import ScanOptions
    from diagtools.usecases.sweep_discover import locate_tree
    from diagtools.usecases.sweep_learning import spread

    tree = locate_tree(package, ScanOptions.of(driver="simulated").roots, ())
    preloaded = set(preload)
    return spread([module for module in tree.modules if module not in preloaded], count)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from diagtools.driver import build_probe_extension, resolve_driver

    preload = _preload_names(args.preload)
    rows = _spread_rows(args.package, preload, args.rows)
    env = {**os.environ, **resolve_driver("simulated").env}
    command = [sys.executable, __file__, "--worker", "--names", ",".join(preload), "--rows", ",".join(rows)]
    command += ["--descend", args.descend, "--probe", str(build_probe_extension())]
    modes = {}
    for mode, extra in (("4 KiB pages", []), ("huge pages", ["--collapse"])):
        done = subprocess.run([*command, *extra], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"fork_cost: the {mode} worker failed: {done.stderr.strip()[-2000:]}")
        modes[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "transparent_hugepage": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip(),
            "load_before": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "preload_from": args.preload if Path(args.preload).is_file() else "the list given",
        "rows_sampled": rows,
        "modes": modes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preload", help="a sweep summary (its preload) or a comma-separated list")
    parser.add_argument("--package", default="vllm")
    parser.add_argument("--rows", default="40", help="how many rows to time (the worker: the modules)")
    parser.add_argument("--descend", default="vllm.model_executor.models")
    parser.add_argument("--save-path", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--names", default="", help=argparse.SUPPRESS)
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)
    parser.add_argument("--collapse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.rows = int(args.rows)
    emit(measure(args), args.save_path)


if __name__ == "__main__":
    main()
