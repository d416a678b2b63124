"""Compare two sweep journals row by row: what each row says, and the files it depends on.

A change to how the sweep shares work between modules (preloads, package
zygotes, rows that go on from their package's import) must leave every row
as it was.  This reads two journals of the same package (``diagtools sweep
--json``) and counts, over the modules both hold, the rows whose status,
verdict, CUDA source, culprit, import chain, line to change or first error
line differ, and the rows whose recorded dependencies lack a file the other
journal's row has (``missing``) or hold more (``more``: a larger preload's
files count as dependencies too).

Run: ``python benchmarks/sweep_vllm_compare.py NEW.jsonl OLD.jsonl [--save-path OUT.json]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a journal, by module (a later row of a module replaces an earlier one)."""
    rows: dict[str, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if "module" in record and "verdict" in record:
                rows[record["module"]] = record
    return rows


def what_it_says(row: dict[str, Any]) -> tuple[Any, ...]:
    culprit = row.get("culprit") or {}
    line = culprit.get("line_to_change")
    return (
        row.get("status"),
        row.get("verdict"),
        row.get("cuda_source"),
        row.get("cuda_initialized"),
        culprit.get("module"),
        tuple(culprit.get("chain") or ()),
        json.dumps(line, sort_keys=True) if line else None,
        (row.get("error") or "").split("\n")[0],
    )


def compare(new: dict[str, dict[str, Any]], old: dict[str, dict[str, Any]]) -> dict[str, Any]:
    common = sorted(set(new) & set(old))
    differ = [m for m in common if what_it_says(new[m]) != what_it_says(old[m])]
    missing = [m for m in common if set(old[m].get("deps", ())) - set(new[m].get("deps", ()))]
    more = [m for m in common if set(new[m].get("deps", ())) - set(old[m].get("deps", ()))]
    return {
        "compared": len(common),
        "only_new": len(set(new) - set(old)),
        "only_old": len(set(old) - set(new)),
        "rows_that_differ": len(differ),
        "differing": [
            {"module": m, "new": list(what_it_says(new[m])), "old": list(what_it_says(old[m]))} for m in differ[:20]
        ],
        "rows_missing_dependencies": len(missing),
        "missing_examples": missing[:20],
        "rows_with_more_dependencies": len(more),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("new", type=Path)
    parser.add_argument("old", type=Path)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    report = {"new": str(args.new), "old": str(args.old), **compare(load_rows(args.new), load_rows(args.old))}
    emit(report, args.save_path)


def emit(report: dict[str, Any], save_path: Path | None) -> None:
    """Print the report as JSON, and write it to ``save_path`` when one is given."""
    text = json.dumps(report, indent=2)
    print(text)
    if save_path is not None:
        save_path.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
