"""Where a scan's fixed cost goes, and how a scan compares with a plain import.

Three measurements, written to ``--save-path`` as JSON (and printed):

* ``trivial``: ``diagtools scan colorsys --driver simulated --json /dev/null``
  against ``python -c "import colorsys"``, alternating pairs, medians of the
  wall time and of the CPU time (user+sys of the command and its children).
* ``breakdown``: the same scan split into phases, each a median over runs in
  fresh processes: the CLI's own imports (over a bare ``python -c pass``;
  since the parser loads no use case, nearly all of them are the scan's,
  under ``use_case_imports_s``), the driver check, the subkernel (keeper and
  interpreter start, start-up, the import, and from the probe's last event,
  written at exit, to the runner's return: the subkernel's interpreter
  teardown, the keeper's sweep and the runner's reaping), assembling, and
  the report (the text and the indented JSON, as ``--json`` writes it).  The
  command itself imports the assembly's and the report's modules while its
  subkernel starts; here they count under ``use_case_imports_s``.
* ``torch``: ``diagtools scan torch`` against ``python -c "import torch"``.

Run: ``env -u PYTHONDONTWRITEBYTECODE .venv/bin/python benchmarks/scan_fixed_cost.py --save-path
benchmarks/scan_fixed_cost.json`` (bytecode caches written, as on a user's machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DIAGTOOLS = str(Path(sys.executable).with_name("diagtools"))
PHASES = r"""
import json, sys, time
t0 = time.perf_counter()
import diagtools.frontends.cli
t1 = time.perf_counter()
from diagtools.driver import build_probe_extension, resolve_driver
from diagtools.render.text import render_scan
from diagtools.runner.subkernel import run_subkernel
from diagtools.usecases.assemble import assemble
from diagtools.usecases.scan import probe_request
from diagtools.model.serial import json_text
t2 = time.perf_counter()
setup = resolve_driver("simulated"); build_probe_extension()
t3 = time.perf_counter()
request = probe_request(("colorsys",), (), setup.env, 60.0, 1.0)
t4 = time.perf_counter(); raw = run_subkernel(request); t5 = time.perf_counter()
result = assemble(raw, ("colorsys",), setup.info)
t6 = time.perf_counter()
render_scan(result); json_text(result.to_json())
t7 = time.perf_counter()
phase = {e["phase"]: e["t"] for e in raw.events if e["e"] == "phase"}
last = max(e.get("t", 0.0) for e in raw.events)
print(json.dumps({
    "cli_imports_s": t1 - t0, "use_case_imports_s": t2 - t1, "driver_check_s": t3 - t2,
    "subkernel_s": t5 - t4, "subkernel_until_probe_runs_s": phase["startup"] - t4,
    "subkernel_startup_s": phase["import"] - phase["startup"],
    "subkernel_import_to_exit_s": t5 - phase["import"],
    "subkernel_import_to_last_event_s": last - phase["import"], "subkernel_last_event_to_return_s": t5 - last,
    "assemble_s": t6 - t5, "report_s": t7 - t6,
}))
"""


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user+sys, children included) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(command)}: {done.stderr.decode()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def paired(plain: list[str], scanned: list[str], runs: int) -> dict:
    """Alternate the two commands so the load of a shared machine hits both alike."""
    timed(plain), timed(scanned)  # warm the page cache and the driver build
    plain_w, plain_c, scan_w, scan_c, ratios = [], [], [], [], []
    for index in range(runs):
        pair = [(plain, plain_w, plain_c), (scanned, scan_w, scan_c)]
        for command, walls, cpus in pair if index % 2 == 0 else reversed(pair):
            wall, cpu = timed(command)
            walls.append(wall)
            cpus.append(cpu)
        ratios.append(scan_w[-1] / plain_w[-1])
    return {
        "runs": runs,
        "plain_wall_median_s": statistics.median(plain_w),
        "scan_wall_median_s": statistics.median(scan_w),
        "fixed_cost_wall_median_s": statistics.median(s - p for s, p in zip(scan_w, plain_w, strict=True)),
        "plain_cpu_median_s": statistics.median(plain_c),
        "scan_cpu_median_s": statistics.median(scan_c),
        "fixed_cost_cpu_median_s": statistics.median(s - p for s, p in zip(scan_c, plain_c, strict=True)),
        "median_ratio": statistics.median(ratios),
        "ratios": [round(r, 4) for r in ratios],
    }


def breakdown(runs: int) -> dict:
    """Each phase's median over ``runs`` fresh processes, and a bare interpreter's start for reference."""
    samples = []
    bare = []
    for _ in range(runs):
        bare.append(timed([sys.executable, "-c", "pass"])[0])
        done = subprocess.run([sys.executable, "-c", PHASES], capture_output=True, text=True, check=True)
        samples.append(json.loads(done.stdout))
    phases = {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
    return {"runs": runs, "python_c_pass_s": statistics.median(bare), **phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--torch-runs", type=int, default=6)
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        raise SystemExit("unset PYTHONDONTWRITEBYTECODE: a user's interpreter reads bytecode caches")
    scan = [DIAGTOOLS, "scan", "--driver", "simulated", "--json", os.devnull]
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(),
        },
        "trivial": paired([sys.executable, "-c", "import colorsys"], [*scan[:2], "colorsys", *scan[2:]], args.runs),
        "breakdown": breakdown(args.runs),
    }
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, check=False).returncode == 0:
        report["torch"] = paired(
            [sys.executable, "-c", "import torch"], [*scan[:2], "torch", *scan[2:]], args.torch_runs
        )
    report["machine"]["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text)
    if args.save_path:
        args.save_path.write_text(text + "\n")


if __name__ == "__main__":
    main()
