"""Launch layout of the CuTe DSL state kernels, measured on the CPU with the PTX interpreter.

Run: ``.venv/bin/python benchmarks/kernel_layout.py [--save-path DIR] [--before COMMIT]`` (writes
kernel_layout.json and kernel_layout.md; a few minutes on a busy 2-core machine).

For realistic batches (a prefill from position 0, where one token in R closes a group, and decode
steps of many requests at spread positions, where one request in R is on a boundary), the shipped
PTX runs in ``tests/kernels/ptxvm.py`` with the arguments ``plan_launch`` packs, and the
interpreter counts:

- CTAs that do work (write at least one byte) over CTAs launched, and warps that do work (store
  anything, global or shared) over warps launched;
- per warp-wide global load instruction: the distinct bytes it touched and whether they were one
  contiguous range (the 128-bit state, weight loads: 16 bytes a lane);
- the worst shared-memory bank conflict of any warp-wide shared access (C128's merge).

The interpreter is slow (about 0.4 s a C4 token and 4 s a C128 token here), so the batches are
the benchmark's, scaled down with their boundary density kept; the full sizes' CTA figures come
from the launch plan itself (no execution needed: every launched CTA holds a working token).
``--before COMMIT`` also runs that commit's shipped PTX (one CTA per token or per four tokens,
lanes owning 64 contiguous bytes) on the same batches, for comparison.  Nothing here is a time.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from kernels.ptxvm import Kernel, LaunchStats, Memory  # noqa: E402

from diagtools.kernels import state_cutedsl  # noqa: E402
from diagtools.kernels.state_cutedsl import StateLaunchConfig  # noqa: E402
from diagtools.kernels.state_reference import (  # noqa: E402
    BENCH_SIZES,
    boundary_tokens,
    decode_batch,
    make_state_inputs,
    request_tokens,
)

# The interpreter's batches: the benchmark's kinds, scaled down, boundary density kept.
INTERPRETED = {
    "C4 prefill 256": (4, ((0, 256),)),
    "C4 decode 128": (4, decode_batch(128, 4)),
    "C128 prefill 1024": (128, ((0, 1024),)),
    "C128 decode 256": (128, decode_batch(256, 128)),
}


def measure(name: str, ratio: int, requests, ptx: str, before: str | None) -> dict:
    inputs = make_state_inputs(ratio, requests, padding=0.0, seed=0)
    launch = state_cutedsl.plan_launch(*inputs.args(), ratio, 1e-6)
    row = {"batch": name, "tokens": inputs.positions.numel(), "working_tokens": int(inputs.working().sum())}
    started = time.perf_counter()
    row["now"] = _run(ptx, launch.grid, launch.block, launch.arguments, launch.keep_alive)
    row["now"]["seconds"] = round(time.perf_counter() - started, 1)
    if before is not None:  # the old kernel: no work list, one CTA per token (C128) or four (C4)
        old = make_state_inputs(ratio, requests, padding=0.0, seed=0)
        plan = state_cutedsl.plan_launch(*old.args(), ratio, 1e-6)
        arguments = (*plan.arguments[:8], plan.arguments[9], *plan.arguments[11:18], plan.arguments[18])
        tokens = plan.arguments[9]
        grid = (math.ceil(tokens / StateLaunchConfig(ratio).tokens_per_cta), 1, 1)
        row["before"] = _run(before, grid, plan.block, arguments, plan.keep_alive)
    return row


def _run(ptx: str, grid, block, arguments, tensors) -> dict:
    stats = LaunchStats()
    Kernel(ptx).run(grid, block, arguments, Memory(tensors), stats=stats)
    vectors = [a for a in stats.of("global", "ld") if a.lane_bytes == 16]
    shared = stats.of("shared", "ld") + stats.of("shared", "st")
    executed = sum(a.executed for a in vectors)
    return {
        "ctas": stats.ctas,
        "working_ctas": stats.working_ctas,
        "cta_efficiency": stats.working_ctas / stats.ctas,
        "warps": stats.warps,
        "working_warps": stats.working_warps,
        "warp_efficiency": stats.working_warps / stats.warps,
        "vector_loads": executed,
        "vector_loads_contiguous": sum(a.contiguous for a in vectors) / executed if executed else None,
        "bytes_per_vector_load": sum(a.bytes for a in vectors) / executed if executed else None,
        "span_per_vector_load": _span(vectors),
        "all_loads_contiguous": all(a.contiguous == a.executed for a in stats.of("global", "ld")),
        "worst_bank_conflict": max((a.worst_conflict for a in shared), default=None),
    }


def _span(vectors) -> str:
    kinds = sorted({"contiguous" if a.contiguous == a.executed else "scattered" for a in vectors})
    return "/".join(kinds) or "-"


def planned(name: str, ratio: int, requests) -> dict:
    """The full-size batch's CTA figures from the launch rule alone (now and before)."""
    _, positions = request_tokens(requests)
    config = StateLaunchConfig(ratio)
    working = boundary_tokens(positions, ratio)
    tokens = positions.numel()
    grid_now = config.grid(int(working.sum()))
    per_cta = config.tokens_per_cta
    old_grid = math.ceil(tokens / per_cta)
    padded = torch_pad(working, old_grid * per_cta)
    old_working = int(padded.view(old_grid, per_cta).any(dim=1).sum())
    return {
        "batch": name,
        "tokens": tokens,
        "working_tokens": int(working.sum()),
        "now": {
            "ctas": grid_now,
            "cta_efficiency": 1.0,
            "warp_efficiency": int(working.sum()) / (grid_now * per_cta),
        },
        "before": {
            "ctas": old_grid,
            "working_ctas": old_working,
            "cta_efficiency": old_working / old_grid,
            "warp_efficiency": int(working.sum()) / (old_grid * per_cta),
        },
    }


def torch_pad(mask, length: int):
    import torch

    return torch.cat((mask, mask.new_zeros(length - mask.numel())))


def markdown(document: dict) -> str:
    lines = [
        "# CuTe DSL state kernels: launch layout, measured with the PTX interpreter",
        "",
        f"Command: `{document['command']}`.  Machine: {document['machine']} (shared by several engineers, busy).",
        "No GPU: these are counts from executing the shipped sm_90a PTX on the CPU, not times.",
        "",
        "## Interpreted batches (realistic boundary density, scaled down)",
        "",
        "| batch | tokens | working | CTAs | working CTAs | CTA efficiency | warp efficiency | 16-B vector loads"
        " | contiguous | bytes per load | worst bank conflict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in document["interpreted"]:
        for when in ("before", "now"):
            if when not in row:
                continue
            m = row[when]
            lines.append(
                f"| {row['batch']} ({when}) | {row['tokens']} | {row['working_tokens']} | {m['ctas']} | "
                f"{m['working_ctas']} | {m['cta_efficiency']:.3f} | {m['warp_efficiency']:.3f} | {m['vector_loads']} | "
                f"{_fraction(m['vector_loads_contiguous'])} | {_number(m['bytes_per_vector_load'])} | "
                f"{m['worst_bank_conflict'] or '-'} |"
            )
    lines += [
        "",
        "## Full benchmark sizes (from the launch plan)",
        "",
        "| batch | tokens | working | CTAs now | CTA / warp efficiency now | CTAs before"
        " | CTA / warp efficiency before |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in document["planned"]:
        lines.append(
            f"| {row['batch']} | {row['tokens']} | {row['working_tokens']} | {row['now']['ctas']} | "
            f"{row['now']['cta_efficiency']:.3f} / {row['now']['warp_efficiency']:.3f} | {row['before']['ctas']} | "
            f"{row['before']['cta_efficiency']:.3f} / {row['before']['warp_efficiency']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _fraction(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def _number(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-path", type=Path, default=HERE)
    parser.add_argument("--before", help="a commit whose shipped state-kernel PTX to run for comparison")
    args = parser.parse_args()
    rows = []
    for name, (ratio, requests) in INTERPRETED.items():
        ptx = state_cutedsl.prebuilt_path(ratio).read_text()
        before = _old_ptx(args.before, ratio) if args.before else None
        rows.append(measure(name, ratio, requests, ptx, before))
        print(json.dumps(rows[-1]), flush=True)
    command = "benchmarks/kernel_layout.py" + (f" --before {args.before}" if args.before else "")
    document = {
        "command": f".venv/bin/python {command}",
        "machine": f"{platform.machine()} CPU, {platform.python_implementation()} {platform.python_version()}",
        "interpreted": rows,
        "planned": [planned(name, ratio, requests) for name, (ratio, requests) in BENCH_SIZES.items()],
    }
    args.save_path.mkdir(parents=True, exist_ok=True)
    (args.save_path / "kernel_layout.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (args.save_path / "kernel_layout.md").write_text(markdown(document))
    print(markdown(document))


def _old_ptx(commit: str, ratio: int) -> str:
    path = state_cutedsl.prebuilt_path(ratio).relative_to(HERE.parent)
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=HERE.parent, capture_output=True, text=True, check=True
    ).stdout


if __name__ == "__main__":
    main()
