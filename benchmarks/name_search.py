"""How long the search for the files that hold a name takes over a whole environment.

The sweep zygote searches every file a row could run for the name of an
environment variable a learned candidate's import set (``zygote_environ``).
A name no file holds is the slowest case (every file is read).  This times
``held_elsewhere`` for such a name in the Python it runs under, after
``--imports`` (the libraries a zygote holds, whose mapped native libraries are
searched too), with ``--search`` the search's file (this tree's, or an older
one taken with ``git show COMMIT:diagtools/agents/zygote_environ.py``):

* ``cold``: the page cache dropped first (needs root; skipped otherwise);
* ``warm``: run again at once, the files cached;
* ``loaded``: warm, with two busy processes per core beside it (as when a sweep's
  rows are scanned meanwhile).

Run: ``/work/vllm-env/bin/python benchmarks/name_search.py --imports torch vllm --first vllm
--save-path benchmarks/name_search.json`` (once per ``--search`` file; ``--label`` names each).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEARCH = HERE.parent / "diagtools" / "agents" / "zygote_environ.py"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("_benchmark_zygote_environ", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n", encoding="ascii")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _busy(count: int):
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _timed(search, first: list[str]) -> dict[str, float]:
    """One search, in a forked child as the zygote runs it (a fork has one thread, whatever this process
    started: torch starts one, and a process with threads searches alone)."""
    name = "NO_FILE_HOLDS_" + uuid.uuid4().hex.upper()  # built here: no file holds it
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        held = search.held_elsewhere([name], [], first=first)
        os.write(write_end, json.dumps(held).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        held = json.loads(answer.read() or b"null")
    os.waitpid(pid, 0)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(after, field) - getattr(before, field) for field in ("ru_utime", "ru_stime"))
    if held != {}:
        raise SystemExit(f"the search did not answer that no file holds a made-up name: {held}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", type=Path, default=SEARCH, help="the search's file to time")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--imports", nargs="*", default=[], help="modules imported first (a zygote's preload)")
    parser.add_argument("--first", nargs="*", default=[], help="packages whose folders are searched first")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # this file holds no name, but skip it
    for name in args.imports:
        importlib.import_module(name)
    first = [str(Path(importlib.import_module(name).__file__).parent) for name in args.first]
    search = _load(args.search)
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "loaded": []}
    for _ in range(args.repeat):
        if _drop_caches():
            runs["cold"].append(_timed(search, first))
        runs["warm"].append(_timed(search, first))
        with _busy(2 * (os.cpu_count() or 1)):
            runs["loaded"].append(_timed(search, first))
    result = {
        "label": args.label,
        "search": str(args.search),
        "imports": args.imports,
        "readers": getattr(search, "READERS", 1),
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result, indent=1))
    if args.save_path:
        saved = json.loads(args.save_path.read_text(encoding="utf-8")) if args.save_path.exists() else []
        saved = [entry for entry in saved if entry.get("label") != args.label] + [result]
        args.save_path.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
