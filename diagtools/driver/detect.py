"""The real driver, when one loads here, told apart from the simulated one.

The check runs in a throwaway interpreter without the simulated world on its
paths, so the caller's process never loads the driver library, and a
simulated ``libcuda`` (it says so in its own bytes) is never taken for a real one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["find_real_driver", "preloaded", "without_simulated_paths"]


def find_real_driver() -> str | None:
    env = without_simulated_paths(dict(os.environ))
    code = (
        "import ctypes\n"
        "lib = ctypes.CDLL('libcuda.so.1')\n"
        "lib.cuInit\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(next(l.split()[-1] for l in maps.splitlines() if 'libcuda.so' in l))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = done.stdout.strip()
    if done.returncode != 0 or not path or _is_simulated(path):
        return None
    return path


def _is_simulated(path: str) -> bool:
    try:
        return b"diagtools simulated GPU" in Path(path).read_bytes()
    except OSError:
        return False


def _is_simulated_world(directory: str) -> bool:
    return bool(directory) and _is_simulated(f"{directory}/libcuda.so.1")


def preloaded(env: Mapping[str, str]) -> list[str]:
    """The libraries ``env`` has the loader preload, in order (``LD_PRELOAD`` separates them by colons or blanks)."""
    return [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]


def without_simulated_paths(env: dict[str, str]) -> dict[str, str]:
    entries = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and not _is_simulated_world(p)]
    env["LD_LIBRARY_PATH"] = ":".join(entries)
    kept = [p for p in preloaded(env) if not _is_simulated_world(os.path.dirname(p))]
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env
