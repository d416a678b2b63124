"""Summarise a ``diagtools sweep`` journal (JSON Lines) into a small JSON file.

Counts by status, verdict, ``cuda_source`` and mode; the culprits; the import errors grouped by
their reason (the missing module, or the exception's first line); the slowest modules; and the
rate over the given wall time.

Run: ``.venv/bin/python benchmarks/sweep_vllm_summary.py JOURNAL --wall SECONDS --save-path
benchmarks/sweep_vllm.json`` (the wall time is the one ``sweep_vllm.sh`` prints).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from scan_overhead import machine, save

_MISSING = re.compile(r"No module named '([^']+)'")


def reason(error: str) -> str:
    """One error's group: the top-level module it missed, or its exception and first line."""
    text = error.split(": ", 1)[1] if ": " in error else error  # drop the "module: " prefix
    missing = _MISSING.search(text)
    if missing:
        return f"No module named '{missing.group(1).split('.')[0]}'"
    return text.splitlines()[0][:160] if text else ""


def summarise(rows: list[dict[str, Any]], wall: float | None, top: int) -> dict[str, Any]:
    scanned = [r for r in rows if not r.get("preloaded")]
    culprits = Counter(
        (r["culprit"] or {}).get("module") for r in rows if r.get("cuda_initialized") and r.get("culprit")
    )
    errors = Counter(reason(r.get("error") or "") for r in rows if r["status"] == "import-error")
    slowest = sorted(scanned, key=lambda r: r.get("import_s") or 0.0, reverse=True)[:top]
    return {
        "modules": len(rows),
        "preloaded": len(rows) - len(scanned),
        "wall_s": wall,
        "modules_per_s": len(rows) / wall if wall else None,
        "status": dict(Counter(r["status"] for r in rows).most_common()),
        "verdict": dict(Counter(r.get("verdict") for r in rows).most_common()),
        "cuda_initialized": sum(bool(r.get("cuda_initialized")) for r in rows),
        "cuda_source": dict(Counter(r.get("cuda_source") for r in rows).most_common()),
        "mode": dict(Counter(r.get("mode") for r in rows).most_common()),
        "culprits": [{"module": m, "rows": n} for m, n in culprits.most_common(top)],
        "import_errors": [{"reason": e, "rows": n} for e, n in errors.most_common(top)],
        "slowest": [{"module": r["module"], "import_s": r.get("import_s"), "status": r["status"]} for r in slowest],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--wall", type=float, help="the sweep's wall time in seconds")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--preload", default="", help="the --preload the sweep ran with, recorded as given")
    parser.add_argument("--jobs", type=int, help="the --jobs the sweep ran with, recorded as given")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    lines = args.journal.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines[1:] if line.strip()]
    run = {"machine": machine(), "preload": [p for p in args.preload.split(",") if p], "jobs": args.jobs}
    save(args.save_path, {**run, **summarise(rows, args.wall, args.top)})


if __name__ == "__main__":
    main()
