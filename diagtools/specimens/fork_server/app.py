"""A server: it imports its registry, then starts an EngineCore-like worker with fork.

    .venv/bin/diagtools run --driver simulated -- python diagtools/specimens/fork_server/app.py
"""

import ctypes
import multiprocessing as mp

import registry


def engine_core():
    status = ctypes.CDLL("libcuda.so.1").cuInit(0)
    raise SystemExit(0 if status == 0 else 1)


if __name__ == "__main__":
    print("platform:", registry.PLATFORM)
    worker = mp.get_context("fork").Process(target=engine_core)
    worker.start()
    worker.join()
    print("worker exit code", worker.exitcode)
