"""Summarize a vLLM sweep journal: throughput before and after the adaptive preload, and the root causes.

Reads the JSON Lines journal ``diagtools sweep vllm --json`` wrote (complete or
interrupted) and prints a JSON summary: rows, wall time, rows per second in the
learning pass (the first ``--sample`` rows, base preload) and after it (the
zygote with the learned preload), the projected time of the whole package at
that rate, and the root causes (each once, with its line to change, its
initializer and the modules that reach it).

Run: ``.venv/bin/python benchmarks/sweep_vllm_scale.py JOURNAL --modules 3629 [--wall S] --save-path OUT.json``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diagtools.model.sweep import RootCause, SweepRow


def read_rows(journal: Path) -> list[SweepRow]:
    rows: dict[str, SweepRow] = {}
    for line in journal.read_text(encoding="utf-8").splitlines()[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "module" in record:
            rows[record["module"]] = SweepRow.from_json(record)
    return list(rows.values())


def rate(rows: list[SweepRow]) -> float:
    scanned = [row for row in rows if not row.preloaded]
    if len(scanned) < 2:
        return 0.0
    span = max(r.finished for r in scanned) - min(r.started for r in scanned)
    return len(scanned) / span if span > 0 else 0.0


def summarize(rows: list[SweepRow], sample: int, modules: int, command_wall: float | None = None) -> dict:
    ordered = sorted(rows, key=lambda row: row.finished)
    learning, learned = ordered[:sample], ordered[sample:]
    wall = max(r.finished for r in rows) - min(r.started for r in rows if not r.preloaded)
    after = rate(learned)
    causes = RootCause.group(rows)
    return {
        "rows": len(rows),
        **({"command_wall_s": round(command_wall, 1)} if command_wall else {}),
        **({"command_rows_per_s": round(len(rows) / command_wall, 3)} if command_wall else {}),
        "wall_s": round(wall, 1),
        "rows_per_s": round(len(rows) / wall, 3),
        "learning_rows_per_s": round(rate(learning), 3),
        "learned_rows_per_s": round(after, 3),
        "projected_whole_package_min": round((modules - len(rows)) / after / 60 + wall / 60, 1) if after else None,
        "initialize_cuda": sum(1 for r in rows if r.cuda_initialized),
        "failed": sum(1 for r in rows if r.status != "ok"),
        "causes": [
            {
                "key": c.key,
                "modules": len(c.modules),
                "through_parent": len(c.through_parent),
                "line_to_change": f"{c.line_to_change.file}:{c.line_to_change.line}" if c.line_to_change else None,
                "initialized_in": f"{c.initialized_in.file}:{c.initialized_in.line}" if c.initialized_in else None,
            }
            for c in causes
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--sample", type=int, default=24)
    parser.add_argument("--modules", type=int, default=3629)
    parser.add_argument("--wall", type=float, help="the sweep command's wall time (s), zygote start included")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    summary = summarize(read_rows(args.journal), args.sample, args.modules, args.wall)
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.save_path:
        args.save_path.write_text(text + "\n")


if __name__ == "__main__":
    main()
