"""Summarize sweep_vllm_noflag.sh's runs: times, loads, the learned preload, the incremental rerun's rows.

Reads OUT/results.txt (one line per run), the no-flag runs' summaries (``--summary``) and their journals,
and writes one JSON document: each run's wall time, exit code and load average; its stages (the bars' own
seconds) and what the stages before scanning cost beyond the rows they scanned; what the no-flag sweep
learned to preload; how many rows the incremental rerun reused and why it rescanned the others; and two
row-by-row comparisons (``sweep_vllm_compare.compare``): the incremental rerun against the full sweep of
the edited tree, and the no-flag sweep against the tuned one.

Run: ``python benchmarks/sweep_vllm_noflag.py OUT --save-path benchmarks/sweep_vllm_noflag.json`` (after a
``pair`` run, only the two sweeps and their rows against each other).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from sweep_vllm_compare import compare, emit, load_rows

_FIELD = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|$)")


def runs(out: Path) -> dict[str, dict[str, Any]]:
    """Each run's line of results.txt, as its fields (the last line of a name wins); a field of several
    words (the 1, 5 and 15 minute load averages) as the list of them."""
    found = {}
    for line in (out / "results.txt").read_text().splitlines():
        name, _, rest = line.strip().partition(" ")
        fields = {key: value.split() for key, value in _FIELD.findall(rest)}
        if fields:
            found[name] = {key: words[0] if len(words) == 1 else words for key, words in fields.items()}
    return found


_BAR = re.compile(r"^vllm \((?P<stage>.+?)\):\s+\d+%\|[^|]*\| (?P<done>\d+)/(?P<total>\d+) \[(?P<elapsed>[\d:]+)")


def stages(err: Path) -> list[dict[str, Any]]:
    """Each stage's bar as it last stood (tqdm's lines on stderr): rows done by its end, and its seconds."""
    last: dict[str, dict[str, Any]] = {}
    for line in re.split(r"[\r\n]", err.read_text(errors="replace")):
        match = _BAR.match(line.strip())
        if match:
            *minutes, secs = (int(part) for part in match["elapsed"].split(":"))
            seconds = secs + 60 * (minutes[-1] if minutes else 0) + 3600 * (minutes[-2] if len(minutes) > 1 else 0)
            last[match["stage"]] = {"stage": match["stage"], "rows_done_at_end": int(match["done"]), "bar_s": seconds}
    return list(last.values())


def before_scanning(journal: Path, bars: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """What learning and checking cost beyond the rows they scanned, in seconds of the run's wall time.

    The stages before scanning end when the journal's row numbered by the checking bar's end is written
    (rows are written as they end, in order); everything from the command's start until then (finding the
    modules, every zygote's start, the sampled children, the name searches, the rows) is ``seconds``.  The
    rows scanned in that time would cost ``rows * scanning_s_per_row`` at the scanning stage's own rate;
    what is left, ``cost_beyond_rows_s``, is what learning and checking added.  The command's start is its
    end (results.txt's ``at``, to the second) less its wall time, so each figure is good to about a second.
    """
    finished = [row["finished"] for row in map(json.loads, journal.read_text().splitlines()) if "finished" in row]
    before = [bar for bar in bars if bar["stage"] != "scanning"]
    if not before or not finished:
        return {}
    rows = before[-1]["rows_done_at_end"]
    ended = finished[rows - 1]
    end = datetime.fromisoformat(str(run["at"]).replace("Z", "+00:00")).timestamp()
    start = end - float(run["wall"])
    per_row = (finished[-1] - ended) / max(1, len(finished) - rows)
    return {
        "seconds": round(ended - start, 1),
        "rows": rows,
        "scanning_s_per_row": round(per_row, 4),
        "cost_beyond_rows_s": round(ended - start - rows * per_row, 1),
    }


def rows_written(journal: Path) -> dict[str, int]:
    """How many row lines the journal holds, and for how many modules: a row scanned twice shows as more lines."""
    modules = [json.loads(line).get("module") for line in journal.read_text().splitlines()[1:]]
    named = [m for m in modules if m]
    return {"row_lines": len(named), "modules": len(set(named))}


def summary(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    reasons = Counter(data.get("rescanned", {}).values())
    return {
        "modules": len(data["rows"]),
        "reused_from_journal": data.get("resumed", 0),
        "rescanned": len(data.get("rescanned", {})),
        "rescanned_because": dict(reasons.most_common()),
        "seconds_in_sweep": data["seconds"],
        "mode": data["mode"],
        "preload": data["preload"],
        "preload_notes": data["preload_notes"],
        "fallback": data["fallback"],
        "root_causes": len(data["causes"]),
        "initialize_cuda": sum(1 for row in data["rows"] if row.get("cuda_initialized")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    out = args.out
    found = runs(out)
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": found,
        "tuned_stages": stages(out / "tuned.err"),
        "tuned_before_scanning": before_scanning(out / "tuned.jsonl", stages(out / "tuned.err"), found["tuned"]),
        "no_flag": summary(out / "f0.json"),
        "no_flag_stages": stages(out / "f0.err"),
        "no_flag_before_scanning": before_scanning(out / "f0.jsonl", stages(out / "f0.err"), found["f0"]),
        "no_flag_rows_written": rows_written(out / "f0.jsonl"),
        "no_flag_against_tuned": compare(load_rows(out / "f0.jsonl"), load_rows(out / "tuned.jsonl")),
    }
    if (out / "inc.json").exists():  # not a "pair" run: the incremental rerun and the full sweep it must equal
        report.update(
            incremental=summary(out / "inc.json"),
            full_after_edit=summary(out / "f1.json"),
            incremental_against_full_after_edit=compare(load_rows(out / "inc.jsonl"), load_rows(out / "f1.jsonl")),
        )
    emit(report, args.save_path)


if __name__ == "__main__":
    main()
