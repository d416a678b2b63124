"""Real vLLM 0.34 with its CUDA torch on the simulated GPU: torch, scans, overlays, replay and run.

Not run in CI (the environment is about 9.4 GB; build it with ``benchmarks/vllm_env.sh``).
Runs, with the environment's own ``diagtools`` on the simulated driver (its CUDA runtime
included):

1. torch's view of the simulated GPU: ``is_available``, capability, name, an allocation, a
   copy there and back, and an op (a kernel launch, refused);
2. scans of both seed cases, as shipped and with the pre-fix re-export restored in an overlay
   (a symlink copy of the installed ``vllm`` package with one file replaced, put first on
   ``--path``): ``vllm.models.common.ops`` (vLLM PR #50639) and
   ``vllm.models.deepseek_v4.nvidia.ops`` (its CuTe DSL modules);
3. ``replay`` of both overlays under fork and spawn, with the default child (cuInit through
   cuda-python) and with ``--child torch``;
4. ``run`` of a program that imports the DeepSeek-V4 overlay and forks a torch worker.

Writes ``vllm_runtime.json`` (every command, exit code, wall time and the key facts) and a
Markdown summary.  Usage::

    VENV=/work/vllm-env python3 benchmarks/vllm_runtime.py --out DIR --save-path benchmarks/vllm_runtime.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from scan_overhead import machine, save

COMMON_OPS = '''# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Ops shared across model implementations (before vLLM PR #50639: with the re-export)."""

from .fused_allreduce_rms_norm import fused_allreduce_rms_norm
from .fused_qk_rmsnorm import _FUSED_Q_KV_RMSNORM_KERNEL, fused_q_kv_rmsnorm

__all__ = ["_FUSED_Q_KV_RMSNORM_KERNEL", "fused_allreduce_rms_norm", "fused_q_kv_rmsnorm"]
'''

DEEPSEEK_V4_OPS = '''# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""NVIDIA-only (cutedsl/cutlass) kernels for DeepSeek V4 (before the fix: re-exporting the cutedsl modules)."""

from . import dequant_gather_k_cutedsl, fused_indexer_q_cutedsl, sparse_attn_compress_cutedsl

__all__ = ["dequant_gather_k_cutedsl", "fused_indexer_q_cutedsl", "sparse_attn_compress_cutedsl"]
'''

CASES = {
    "common_ops": ("vllm.models.common.ops", "models/common/ops/__init__.py", COMMON_OPS),
    "deepseek_v4": ("vllm.models.deepseek_v4.nvidia.ops", "models/deepseek_v4/nvidia/ops/__init__.py", DEEPSEEK_V4_OPS),
}

TORCH_FACTS = """
import json, torch
facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
facts["capability"] = list(torch.cuda.get_device_capability())
facts["name"] = torch.cuda.get_device_name()
facts["empty"] = str(torch.empty(4, device="cuda").device)
facts["round_trip"] = torch.tensor([1.0, 2.0, 3.0]).cuda().cpu().tolist()
facts["mem_get_info"] = list(torch.cuda.mem_get_info())
try:
    (torch.ones(4, device="cuda") * 2).sum().item()
    facts["op"] = "ran"
except RuntimeError as exc:
    facts["op"] = str(exc).splitlines()[0]
print(json.dumps(facts))
"""

WORKER_APP = """
import multiprocessing as mp

import vllm.models.deepseek_v4.nvidia.ops  # the pre-fix re-export initializes CUDA


def work():
    import torch
    torch.cuda.init()


if __name__ == "__main__":
    import sys  # here: something in the import above leaves __main__ without its earlier imports

    worker = mp.get_context(sys.argv[1]).Process(target=work)
    worker.start()
    worker.join()
    print("worker exit", worker.exitcode)
"""


def overlay(site_vllm: Path, root: Path, relative: str, text: str) -> Path:
    """A symlink copy of the installed ``vllm`` package under ``root``, with ``relative`` replaced by ``text``."""
    target = root / "vllm"
    if not target.exists():
        for directory, names, files in os.walk(site_vllm):
            names[:] = [n for n in names if n != "__pycache__"]
            here = target / Path(directory).relative_to(site_vllm)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                (here / name).symlink_to(Path(directory) / name)
    changed = target / relative
    changed.unlink()
    changed.write_text(text, encoding="utf-8")
    return root


def command(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 1200) -> dict[str, Any]:
    """Run one command; its exit code, wall time and output."""
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    return {
        "command": " ".join(args),
        "exitcode": done.returncode,
        "wall_s": round(time.perf_counter() - start, 2),
        "stdout": done.stdout[-6000:],
        "stderr": done.stderr[-3000:],
    }


def json_of(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def scan_facts(document: dict[str, Any] | None) -> dict[str, Any]:
    if document is None:
        return {}
    culprit = (document.get("culprits") or [{}])[0]
    return {
        "status": document.get("status"),
        "verdict": "initializes-cuda" if document.get("cuda_initialized") else "no",
        "module": culprit.get("module"),
        "line": culprit.get("module_site"),
        "chain": culprit.get("chain"),
        "evidence": culprit.get("evidence"),
        "simulation_gaps": document.get("simulation_gaps"),
    }


def replay_facts(document: dict[str, Any] | None) -> dict[str, Any]:
    if document is None:
        return {}
    child = document.get("child") or {}
    return {
        "status": document.get("status"),
        "verdict": document.get("verdict"),
        "reproduced": document.get("reproduced"),
        "child": {k: child.get(k) for k in ("status", "exitcode", "error_type", "error", "detail")},
    }


def run_all(venv: Path, out: Path) -> dict[str, Any]:
    python = str(venv / "bin" / "python")
    diagtools = [python, "-m", "diagtools.frontends.cli"]  # the environment's, or PYTHONPATH's
    site_vllm = Path(
        subprocess.check_output(
            [python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"], text=True
        ).strip()
    )
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(), "venv": str(venv)}
    facts_env = json.loads(
        subprocess.check_output(
            [
                python,
                "-c",
                "import json; from diagtools.driver import resolve_driver as r; print(json.dumps(r('simulated').env))",
            ],
            text=True,
        )
    )
    torch_run = command([python, "-c", TORCH_FACTS], env=dict(os.environ, **facts_env))
    results["torch"] = {**torch_run, "facts": json.loads(torch_run["stdout"].splitlines()[-1])}
    for case, (module, relative, text) in CASES.items():
        root = overlay(site_vllm, out / "overlays" / case, relative, text)
        entry: dict[str, Any] = {"module": module, "overlay": str(root)}
        for label, path in (("shipped", []), ("overlay", ["--path", str(root)])):
            report = out / f"scan_{case}_{label}.json"
            ran = command(
                [*diagtools, "scan", module, *path, "--driver", "simulated", "--timeout", "600", "--json", str(report)]
            )
            entry[f"scan_{label}"] = {**ran, "facts": scan_facts(json_of(report))}
        for child in ("cuinit", "torch"):
            for method in ("fork", "spawn"):
                report = out / f"replay_{case}_{child}_{method}.json"
                ran = command(
                    [
                        *diagtools,
                        "replay",
                        module,
                        "--path",
                        str(root),
                        "--child",
                        child,
                        "--start-method",
                        method,
                        "--driver",
                        "simulated",
                        "--timeout",
                        "600",  # a busy 2-core machine: the default 60 s is not enough
                        "--json",
                        str(report),
                    ]
                )
                entry[f"replay_{child}_{method}"] = {**ran, "facts": replay_facts(json_of(report))}
        results[case] = entry
    app = out / "worker_app.py"
    app.write_text(WORKER_APP, encoding="utf-8")
    paths = [str(out / "overlays" / "deepseek_v4"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=":".join(p for p in paths if p))
    for method in ("fork", "spawn"):
        report = out / f"run_{method}.json"
        ran = command(
            [
                *diagtools,
                "run",
                "--driver",
                "simulated",
                "--timeout",
                "900",
                "--json",
                str(report),
                "--",
                python,
                str(app),
                method,
            ],
            env=env,
        )
        document = json_of(report) or {}
        results[f"run_{method}"] = {**ran, "findings": [f.get("kind") for f in document.get("findings", [])]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("VENV", "/work/vllm-env")))
    parser.add_argument("--out", type=Path, default=Path("/tmp/diagtools-vllm-runtime"))
    parser.add_argument("--save-path", type=Path)
    args = parser.parse_args()
    results = run_all(args.venv, args.out)
    save(args.save_path, results)


if __name__ == "__main__":
    main()
