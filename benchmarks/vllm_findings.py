"""The import-time CUDA initializers of a vLLM sweep, grouped by root cause, as a Markdown table.

Reads a ``diagtools sweep`` journal (JSON Lines, from ``sweep_vllm.sh``).  A row that
initialized CUDA is grouped by its root cause: the line that initialized it (the culprit's
``module_site``, the line to change in the module whose code was running).  For each group
the first-party line is where a vLLM developer acts: that line itself when it is in vLLM, else
the innermost vLLM frame on the culprit's stack (the import or call in vLLM that led there).  Also counts the
statuses, the import errors by reason, and the rows that failed with error 801 (a call the
simulation refused).

Run: ``python3 benchmarks/vllm_findings.py JOURNAL --total N --wall S --save-path
benchmarks/vllm_findings.json > benchmarks/vllm_findings.md``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from sweep_vllm_summary import reason

_SITE = "/site-packages/"


def short(site: dict[str, Any] | None) -> str:
    """``package/path.py:line`` of a site, relative to site-packages."""
    if not site:
        return "?"
    file = str(site.get("file") or "?")
    file = file.split(_SITE, 1)[1] if _SITE in file else file
    return f"{file}:{site.get('line')}"


def first_party(culprit: dict[str, Any]) -> dict[str, Any] | None:
    """The vLLM line to act on: the culprit's own line when it is vLLM's, else the innermost vLLM frame."""
    own = culprit.get("module_site") or {}
    if f"{_SITE}vllm/" in str(own.get("file") or ""):
        return own
    for frame in reversed(culprit.get("stack") or []):  # outermost first
        if f"{_SITE}vllm/" in str(frame.get("file") or ""):
            return frame
    return None


def findings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    lines: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        culprit = row.get("culprit")
        if not row.get("cuda_initialized") or not culprit:
            continue
        cause = short(culprit.get("module_site") or culprit.get("site"))
        group = groups.setdefault(cause, {"cause": cause, "modules": [], "source": ""})
        group["modules"].append(row["module"])
        group["source"] = (culprit.get("module_site") or culprit.get("site") or {}).get("source", "")
        own = first_party(culprit)
        if own is not None:
            lines[cause][f"{short(own)} `{(own.get('source') or '').strip()}`"] += 1
    ordered = sorted(groups.values(), key=lambda g: (-len(g["modules"]), g["cause"]))
    for group in ordered:
        group["first_party"] = lines[group["cause"]].most_common()
    return ordered


def summary(rows: list[dict[str, Any]], total: int | None, wall: float | None) -> dict[str, Any]:
    errors = Counter(reason(r.get("error") or "") for r in rows if r["status"] == "import-error")
    refused = [
        r["module"] for r in rows if "801" in (r.get("error") or "") or "not supported" in (r.get("error") or "")
    ]
    return {
        "rows": len(rows),
        "discovered": total,
        "coverage": round(len(rows) / total, 3) if total else None,
        "wall_s": wall,
        "status": dict(Counter(r["status"] for r in rows).most_common()),
        "cuda_initialized": sum(bool(r.get("cuda_initialized")) for r in rows),
        "errors_801": refused,
        "import_errors": errors.most_common(),
        "findings": findings(rows),
    }


def markdown(result: dict[str, Any]) -> str:
    coverage = f"{result['rows']} of {result['discovered']}" if result["discovered"] else str(result["rows"])
    out = [
        f"Modules swept: {coverage}; {result['cuda_initialized']} initialize CUDA at import; "
        f"{len(result['errors_801'])} failed with error 801 (a call the simulation refused).",
        "",
        "| root cause (the line that initializes CUDA) | modules | first-party (vLLM) line leading there | example |",
        "| --- | --- | --- | --- |",
    ]
    for group in result["findings"]:
        lines = "<br>".join(f"{line} ({count})" for line, count in group["first_party"][:4]) or "(none: not via vLLM)"
        more = len(group["first_party"]) - 4
        if more > 0:
            lines += f"<br>... {more} more"
        source = group["source"].strip().replace("|", "\\|")
        out.append(f"| `{group['cause']}` `{source}` | {len(group['modules'])} | {lines} | `{group['modules'][0]}` |")
    out += ["", "| status | modules |", "| --- | --- |"]
    out += [f"| {status} | {count} |" for status, count in result["status"].items()]
    out += ["", "| import error (grouped) | modules |", "| --- | --- |"]
    out += [f"| {text.replace('|', '/')} | {count} |" for text, count in result["import_errors"]]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--total", type=int, help="modules the sweep discovered (for the coverage)")
    parser.add_argument("--wall", type=float, help="the sweep's wall time in seconds")
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.journal.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [row for row in rows if "module" in row]  # the first line is the journal's header
    result = summary(rows, args.total, args.wall)
    if args.save_path:
        args.save_path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
