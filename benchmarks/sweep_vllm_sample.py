"""Check a sweep journal's rows against fresh subkernels, on a random sample of its modules.

A sweep's zygote (its preload, the package zygotes, the adaptive preload)
must give every module the row a fresh subkernel would.  This picks a seeded
random sample of the journal's rows (at least ``--initializing`` of them rows
that initialize CUDA, at least ``--inherited`` of those through a parent
package), scans each module again with ``diagtools.usecases.scan.scan`` in a
fresh subkernel, and compares what a row says: status, verdict, whether and
where CUDA was initialized (the culprit, its import chain, the line to
change), and the error's first line.  The zygote's recorded dependencies must
contain every in-package file the fresh scan imported (they may hold more:
the preload's).

Run it with the interpreter of the environment that was swept, e.g.
``/work/vllm-env/bin/python benchmarks/sweep_vllm_sample.py JOURNAL --save-path OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

from diagtools.model.sweep import SweepRow
from diagtools.usecases.scan import scan
from diagtools.usecases.sweep_discover import locate_tree
from diagtools.usecases.sweep_forked import in_package_deps
from diagtools.usecases.sweep_journal import read_sweep_rows


def read_rows(journal: Path) -> dict[str, SweepRow]:
    """The journal's rows by module, the last of each winning (its environment and file records skipped)."""
    return {row.module: row for row in read_sweep_rows(journal)}


def what_a_row_says(row: SweepRow) -> dict:
    culprit = row.culprit
    change = culprit.own_line if culprit else None
    return {
        "status": row.status,
        "verdict": str(row.verdict),
        "cuda_initialized": row.cuda_initialized,
        "cuda_source": row.cuda_source,
        "culprit": culprit.module if culprit else None,
        "chain": list(culprit.chain) if culprit else None,
        "line_to_change": f"{change.file}:{change.line}" if change else None,
        "error": row.error.splitlines()[0] if row.error else "",
    }


def pick(rows: dict[str, SweepRow], count: int, initializing: int, inherited: int, seed: int) -> list[str]:
    chance = random.Random(seed)
    through_parent = sorted(m for m, r in rows.items() if r.cuda_source == "parent")
    own = sorted(m for m, r in rows.items() if r.cuda_initialized and r.cuda_source != "parent")
    chosen = chance.sample(through_parent, min(inherited, len(through_parent)))
    chosen += chance.sample(own, min(initializing - len(chosen), len(own)))
    rest = sorted(set(rows) - set(chosen))
    chosen += chance.sample(rest, min(count - len(chosen), len(rest)))
    return sorted(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--initializing", type=int, default=6)
    parser.add_argument("--inherited", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    rows = read_rows(args.journal)
    package = json.loads(args.journal.read_text(encoding="utf-8").splitlines()[0])["package"]
    tree = locate_tree(package, ())
    checked = []
    for module in pick(rows, args.count, args.initializing, args.inherited, args.seed):
        started = time.time()
        fresh_result = scan(module, driver="simulated", timeout=args.timeout)
        fresh = SweepRow.from_scan(module, fresh_result, started, time.time())
        fresh_deps = set(in_package_deps(tree, [node.file for node in fresh_result.modules]))
        swept, again = what_a_row_says(rows[module]), what_a_row_says(fresh)
        missing = sorted(fresh_deps - set(rows[module].deps))
        checked.append(
            {
                "module": module,
                "same": swept == again,
                "deps_cover_fresh": not missing,
                "swept": swept,
                "fresh": again if swept != again else "same",
                "deps_missing": missing[:10],
                "fresh_s": round(time.time() - started, 2),
            }
        )
        print(f"{module}: {'same' if swept == again else 'DIFFERENT'}, deps {'cover' if not missing else 'MISS'}")
    report = {
        "journal": str(args.journal),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "sampled": len(checked),
        "identical": sum(c["same"] for c in checked),
        "deps_cover_fresh": sum(c["deps_cover_fresh"] for c in checked),
        "rows": checked,
    }
    text = json.dumps(report, indent=2)
    if args.save_path:
        args.save_path.write_text(text + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
