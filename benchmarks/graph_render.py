"""How long the default (culprits) graph of `import torch` takes to render as SVG.

Scans torch once on the simulated driver, then renders the culprits view and the
full view ``--repeats`` times each; writes medians to ``--save-path`` (JSON).

Run: ``.venv/bin/python benchmarks/graph_render.py --save-path benchmarks/graph_render.json``
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scan_overhead import machine, save

import diagtools


def render_seconds(result, view: str, repeats: int) -> tuple[float, int]:
    times, nodes = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        svg = result.graph(view).pipe(format="svg")
        times.append(time.perf_counter() - started)
        nodes = svg.count(b'class="node')
    return statistics.median(times), nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="torch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    result = diagtools.scan(args.target, driver="simulated")
    culprits_s, culprits_nodes = render_seconds(result, "culprits", args.repeats)
    full_s, full_nodes = render_seconds(result, "full", max(1, args.repeats // 5))
    document = {
        "machine": machine(),
        "target": args.target,
        "modules": len(result.modules),
        "culprits_view": {"median_s": culprits_s, "nodes": culprits_nodes},
        "full_view": {"median_s": full_s, "nodes": full_nodes},
    }
    save(args.save_path, document)


if __name__ == "__main__":
    main()
