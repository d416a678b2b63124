"""Time the vLLM sweep on a dask LocalCluster, as ``diagtools.sweep(executor=...)`` runs it across machines.

A LocalCluster of ``--workers`` worker processes (one thread each) gets the sweep's chunks; before any is
sent, the preload is learned from a sample and checked on this machine (the rows its candidates load are
scanned here), and each chunk is a zygote of its own that imports the checked list; the rows go to a new
journal as they come.  Stopped after ``--limit-s`` seconds (SIGALRM, as Ctrl-C would), it still
reports the rows done by then.  Compare with ``diagtools sweep vllm --jobs 2`` timed in the same session
(sweep_vllm_noflag.sh).

Run with the interpreter of the vLLM environment (``distributed`` installed in it):
``/work/vllm-env/bin/python benchmarks/sweep_vllm_dask.py --json OUT.jsonl --save-path OUT.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--limit-s", type=float, default=1800.0)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()

    from distributed import Client, LocalCluster
    from sweep_vllm_compare import emit

    from diagtools.errors import SweepInterrupted
    from diagtools.usecases.sweep import sweep

    args.json.unlink(missing_ok=True)
    seen: list[float] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)
    with cluster, Client(cluster) as client:
        ready = time.perf_counter()

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, args.limit_s)
        try:
            result = sweep(
                "vllm",
                executor=client.get_executor(),
                driver="simulated",
                json_path=args.json,
                progress=lambda done, total, row: seen.append(time.perf_counter() - ready),
            )
            finished = True
        except SweepInterrupted as stopped:
            result, finished = stopped.result, False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        ended = time.perf_counter()
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "workers": args.workers,
        "finished": finished,
        "limit_s": args.limit_s,
        "cluster_start_s": round(ready - started, 1),
        "sweep_wall_s": round(ended - ready, 1),
        "rows": len(result.rows),
        "modules": len(result.rows) + result.interrupted,
        "mode": result.mode,
        "preload": list(result.preload),
        "preload_notes": list(result.preload_notes),
        "fallback": result.fallback,
        "initialize_cuda": len(result.culprits),
        "failed_to_import": len(result.failures),
        "rows_by_minute": [sum(1 for t in seen if t <= 60 * m) for m in range(1, int((ended - ready) // 60) + 2)],
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    emit(report, args.save_path)


if __name__ == "__main__":
    main()
