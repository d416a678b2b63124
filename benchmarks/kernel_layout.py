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
- the worst shared-memory bank conflict of any warp-wide shared access (C128's merge);
- bytes in flight: the global bytes a warp has loaded and not yet used, at the most (in PTX order: ptxas may
  schedule loads further apart, never closer), summed over a CTA's warps; per multiprocessor, that times the
  CTAs of the launch that share one of the GPU's 132 multiprocessors (an H100 or H200 SXM), at most as many
  as fit (occupancy from ptxas's register count, the threads and the shared memory of a CTA).

C128 batches run twice: one CTA a window, and the window split across 16 CTAs (a ``partial`` launch,
then a ``finish`` launch that merges the pieces), which ``plan_launch`` chooses when a batch has fewer
working tokens than the GPU has multiprocessors.

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
import re
import subprocess
import sys
import tempfile
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


MULTIPROCESSORS = 132  # an H100 or H200 SXM
SM_REGISTERS, SM_THREADS, SM_CTAS, SM_SHARED = 65536, 2048, 32, 228 * 1024  # sm_90 per multiprocessor


def measure(name: str, ratio: int, requests, before: str | None) -> dict:
    inputs = make_state_inputs(ratio, requests, padding=0.0, seed=0)
    row = {"batch": name, "tokens": inputs.positions.numel(), "working_tokens": int(inputs.working().sum())}
    layouts = {"now": None} if ratio == 4 else {"now": None, "split": MULTIPROCESSORS}
    for label, multiprocessors in layouts.items():
        fresh = make_state_inputs(ratio, requests, padding=0.0, seed=0)
        launch = state_cutedsl.plan_launch(*fresh.args(), ratio, 1e-6, multiprocessors=multiprocessors)
        started = time.perf_counter()
        row[label] = _run_plan(launch)
        row[label]["seconds"] = round(time.perf_counter() - started, 1)
    if before is not None:  # the old kernel: no work list, one CTA per token (C128) or four (C4)
        old = make_state_inputs(ratio, requests, padding=0.0, seed=0)
        plan = state_cutedsl.plan_launch(*old.args(), ratio, 1e-6)
        arguments = (*plan.arguments[:8], plan.arguments[10], *plan.arguments[12:19], plan.arguments[19])
        tokens = plan.arguments[10]
        grid = (math.ceil(tokens / StateLaunchConfig(ratio).tokens_per_cta), 1, 1)
        row["before"] = _run(before, grid, plan.block, arguments, Memory(plan.keep_alive))
    return row


def _run_plan(launch) -> dict:
    """Every stage of a plan in turn on one memory, as one stream runs them: the stages' figures, summed."""
    memory = Memory(launch.keep_alive)
    stages = []
    for stage in launch.stages():
        ptx = state_cutedsl.prebuilt_path(stage.config.ratio, stage.config.stage).read_text()
        stages.append({"stage": stage.config.stage, **_run(ptx, stage.grid, stage.block, stage.arguments, memory)})
        memory.next_launch()
    if len(stages) == 1:
        return stages[0]
    summed = {key: sum(s[key] for s in stages) for key in ("ctas", "working_ctas", "warps", "working_warps")}
    loads = sum(s["vector_loads"] for s in stages)
    return {
        **summed,
        "cta_efficiency": summed["working_ctas"] / summed["ctas"],
        "warp_efficiency": summed["working_warps"] / summed["warps"],
        "vector_loads": loads,
        "vector_loads_contiguous": sum(s["vector_loads_contiguous"] * s["vector_loads"] for s in stages) / loads,
        "bytes_per_vector_load": sum(s["bytes_per_vector_load"] * s["vector_loads"] for s in stages) / loads,
        "span_per_vector_load": "/".join(sorted({s["span_per_vector_load"] for s in stages})),
        "all_loads_contiguous": all(s["all_loads_contiguous"] for s in stages),
        "worst_bank_conflict": max((s["worst_bank_conflict"] or 0 for s in stages), default=None) or None,
        "stages": stages,
    }


def _run(ptx: str, grid, block, arguments, memory) -> dict:
    stats = LaunchStats()
    Kernel(ptx).run(grid, block, arguments, memory, stats=stats)
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
        "warp_bytes_in_flight": stats.warp_in_flight,
        "cta_bytes_in_flight": stats.cta_in_flight,
    }


def _span(vectors) -> str:
    kinds = sorted({"contiguous" if a.contiguous == a.executed else "scattered" for a in vectors})
    return "/".join(kinds) or "-"


def planned(name: str, ratio: int, requests, in_flight: dict, occupancy: dict) -> dict:
    """The full-size batch's CTA figures from the launch rule alone (now and before), and each stage's bytes in
    flight per multiprocessor from a CTA's (``in_flight``, interpreted) and the CTAs sharing one."""
    _, positions = request_tokens(requests)
    config = StateLaunchConfig(ratio)
    working = boundary_tokens(positions, ratio)
    count = int(working.sum())
    tokens = positions.numel()
    split = state_cutedsl.split_windows(ratio, count, MULTIPROCESSORS)
    stages = []
    for stage in ("partial", "finish") if split else ("whole",):
        stage_config = StateLaunchConfig(ratio, stage)
        ctas = stage_config.grid(count)
        sharing = min(occupancy[ratio, stage], math.ceil(ctas / MULTIPROCESSORS))
        per_sm = in_flight[ratio, stage] * sharing
        stages.append({
            "stage": stage,
            "ctas": ctas,
            "busy_multiprocessors": min(ctas, MULTIPROCESSORS),
            "ctas_per_multiprocessor": sharing,
            "ctas_that_fit": occupancy[ratio, stage],
            "bytes_in_flight_per_multiprocessor": per_sm,
            "bytes_in_flight": per_sm * min(ctas, MULTIPROCESSORS),
        })  # fmt: skip
    per_cta = config.tokens_per_cta
    old_grid = math.ceil(tokens / per_cta)
    padded = torch_pad(working, old_grid * per_cta)
    old_working = int(padded.view(old_grid, per_cta).any(dim=1).sum())
    unsplit = config.grid(count)
    return {
        "batch": name,
        "tokens": tokens,
        "working_tokens": count,
        "now": {
            "ctas": sum(s["ctas"] for s in stages),
            "cta_efficiency": 1.0,
            "stages": stages,
        },
        "one_cta_a_window": {
            "ctas": unsplit,
            "busy_multiprocessors": min(unsplit, MULTIPROCESSORS),
            "bytes_in_flight": in_flight[ratio, "whole"]
            * min(occupancy[ratio, "whole"], math.ceil(unsplit / MULTIPROCESSORS))
            * min(unsplit, MULTIPROCESSORS),
        },
        "before": {
            "ctas": old_grid,
            "working_ctas": old_working,
            "cta_efficiency": old_working / old_grid,
            "warp_efficiency": count / (old_grid * per_cta),
        },
    }


def fitting_ctas(ratio: int, stage: str) -> int:
    """CTAs of a stage that fit on one sm_90 multiprocessor: from ptxas's register and shared-memory counts for
    the shipped PTX (Triton's copy of ptxas), the CTA's threads, and the per-multiprocessor limits."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    path = state_cutedsl.prebuilt_path(ratio, stage)
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(path), "-o", f"{folder}/kernel.cubin"],
            capture_output=True,
            text=True,
            check=True,
        )
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    shared = int(m.group(1)) if (m := re.search(r"(\d+) bytes smem", done.stderr)) else 0
    config = StateLaunchConfig(ratio, stage)
    per_warp = math.ceil(registers * 32 / 256) * 256  # registers are allocated 256 a warp
    limits = (
        SM_REGISTERS // (per_warp * config.warps),
        SM_THREADS // config.threads,
        SM_SHARED // (shared + 1024) if shared else SM_CTAS,  # 1 KB a CTA reserved by the system
        SM_CTAS,
    )
    return min(limits)


def torch_pad(mask, length: int):
    import torch

    return torch.cat((mask, mask.new_zeros(length - mask.numel())))


def markdown(document: dict) -> str:
    lines = [
        "# CuTe DSL state kernels: launch layout, measured with the PTX interpreter",
        "",
        f"Command: `{document['command']}`.  Machine: {document['machine']}.",
        "No GPU: these are counts from executing the shipped sm_90a PTX on the CPU, not times.  A C128 batch runs"
        " twice: one CTA a window (`now`, as `plan_launch` gives it without a multiprocessor count), and `split`:"
        " each window across 16 CTAs (`partial`), then a `finish` launch that merges the pieces, as `plan_launch`"
        " gives it for a GPU of 132 multiprocessors when the batch has fewer working tokens than that.",
        "",
        "## Interpreted batches (realistic boundary density, scaled down)",
        "",
        "Bytes in flight: global bytes loaded and not yet used (PTX order), at the most, for one warp / for one"
        " CTA's warps together.",
        "",
        "| batch | tokens | working | CTAs | working CTAs | CTA efficiency | warp efficiency | 16-B vector loads"
        " | contiguous | bytes per load | worst bank conflict | bytes in flight: warp / CTA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in document["interpreted"]:
        for when in ("before", "now", "split"):
            if when not in row:
                continue
            for label, m in _with_stages(when, row[when]):
                lines.append(
                    f"| {row['batch']} ({label}) | {row['tokens']} | {row['working_tokens']} | {m['ctas']} | "
                    f"{m['working_ctas']} | {m['cta_efficiency']:.3f} | {m['warp_efficiency']:.3f} | "
                    f"{m['vector_loads']} | {_fraction(m['vector_loads_contiguous'])} | "
                    f"{_number(m['bytes_per_vector_load'])} | {m['worst_bank_conflict'] or '-'} | "
                    f"{_in_flight(m)} |"
                )
    lines += [
        "",
        "## Full benchmark sizes (from the launch plan, on a GPU of 132 multiprocessors)",
        "",
        "Per stage of the plan `plan_launch` makes now: CTAs, multiprocessors with work, CTAs sharing one (of the"
        " CTAs that fit, from ptxas's register and shared-memory counts), and the bytes in flight per busy"
        " multiprocessor and over the GPU (a CTA's, from the interpreted rows, times the CTAs sharing it).  Then"
        " the same batch with one CTA a window, and the kernel before its work list.",
        "",
        "| batch | tokens | working | stage | CTAs | busy SMs | CTAs per SM (fit) | in flight per SM"
        " | in flight, GPU | one CTA a window: CTAs / busy SMs / in flight | before: CTAs / CTA efficiency |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in document["planned"]:
        whole, old = row["one_cta_a_window"], row["before"]
        for stage in row["now"]["stages"]:
            lines.append(
                f"| {row['batch']} | {row['tokens']} | {row['working_tokens']} | {stage['stage']} | {stage['ctas']} | "
                f"{stage['busy_multiprocessors']} | {stage['ctas_per_multiprocessor']} ({stage['ctas_that_fit']}) | "
                f"{_kb(stage['bytes_in_flight_per_multiprocessor'])} | {_kb(stage['bytes_in_flight'])} | "
                f"{whole['ctas']} / {whole['busy_multiprocessors']} / {_kb(whole['bytes_in_flight'])} | "
                f"{old['ctas']} / {old['cta_efficiency']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def _with_stages(when: str, measured: dict):
    yield when, measured
    for stage in measured.get("stages", ()):
        yield f"{when}: {stage['stage']}", stage


def _in_flight(measured: dict) -> str:
    if "warp_bytes_in_flight" not in measured:
        return "-"
    return f"{_kb(measured['warp_bytes_in_flight'])} / {_kb(measured['cta_bytes_in_flight'])}"


def _kb(value: int) -> str:
    return f"{value / 1024:.0f} KB"


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
        before = _old_ptx(args.before, ratio) if args.before else None
        rows.append(measure(name, ratio, requests, before))
        print(json.dumps(rows[-1]), flush=True)
    in_flight = {}
    for row in rows:
        ratio = INTERPRETED[row["batch"]][0]
        for when in ("now", "split"):
            for stage in row[when].get("stages", [{"stage": "whole", **row[when]}]) if when in row else ():
                key = (ratio, stage["stage"])
                in_flight[key] = max(in_flight.get(key, 0), stage["cta_bytes_in_flight"])
    occupancy = {key: fitting_ctas(*key) for key in in_flight}
    command = "benchmarks/kernel_layout.py" + (f" --before {args.before}" if args.before else "")
    document = {
        "command": f".venv/bin/python {command}",
        "machine": f"{platform.machine()} CPU, {platform.python_implementation()} {platform.python_version()}",
        "interpreted": rows,
        "ctas_that_fit": {f"C{r} {s}": n for (r, s), n in occupancy.items()},
        "planned": [
            planned(name, ratio, requests, in_flight, occupancy) for name, (ratio, requests) in BENCH_SIZES.items()
        ],
    }
    args.save_path.mkdir(parents=True, exist_ok=True)
    (args.save_path / "kernel_layout.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (args.save_path / "kernel_layout.md").write_text(markdown(document))
    print(markdown(document))


def _old_ptx(commit: str, ratio: int) -> str:
    path = state_cutedsl.prebuilt_path(ratio).relative_to(HERE.parent)  # the whole kernel: no stages then
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=HERE.parent, capture_output=True, text=True, check=True
    ).stdout


if __name__ == "__main__":
    main()
