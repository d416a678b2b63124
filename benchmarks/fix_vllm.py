"""Where to cut on real vLLM 0.34: both seed cases with the pre-fix re-export restored, scanned, fixed and diffed.

Not run in CI (the environment is about 9.4 GB; build it with ``benchmarks/vllm_env.sh``).  For each seed case
an overlay (a symlink copy of the installed ``vllm`` package, first on ``--path``) restores the pre-fix state:

- ``common_ops`` (vLLM PR #50639): ``vllm/models/common/ops/__init__.py`` re-exports
  ``fused_allreduce_rms_norm`` again, and the three callers the PR changed import it from the package again;
- ``deepseek_v4``: ``vllm/models/deepseek_v4/nvidia/ops/__init__.py`` re-exports the kernels of its three
  CuTe DSL modules (one statement each), and the callers the fix changed import them from the package again.

Then, timed one after the other with the environment's interpreter and this checkout on ``PYTHONPATH``:

1. ``diagtools scan MODULE --path OVERLAY`` (the bare scan, which searches and verifies the cuts);
2. ``diagtools fix MODULE --path OVERLAY`` (the patch, checked on a temporary copy, the callers, the guard);
3. ``diagtools scan MODULE`` (the shipped package, the known-good state) and ``diagtools diff`` of the two.

Checks, per case: the bare scan's headline is the re-export line in the overlay's ``__init__.py``; the patch
verifies (rescan clean, every re-exported name resolves); the diff's headline is the same line.  Writes
``fix_vllm.json`` (every command, exit code, wall time, load, and the facts) and prints a Markdown summary.

Usage::

    cd benchmarks && PYTHONPATH=$PWD/.. python3 fix_vllm.py --venv /work/vllm-env --out /tmp/fix-vllm \\
        --save-path fix_vllm.json > fix_vllm.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from scan_overhead import machine
from vllm_runtime import COMMON_OPS, overlay

DEEPSEEK_V4_OPS = '''# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""NVIDIA-only (cutedsl/cutlass) kernels for DeepSeek V4 (before the fix: re-exported here)."""

from .dequant_gather_k_cutedsl import _DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL
from .fused_indexer_q_cutedsl import _INDEXER_Q_FP8_KERNEL, _INDEXER_Q_MXFP4_KERNEL
from .sparse_attn_compress_cutedsl import _SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL

__all__ = [
    "_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL",
    "_INDEXER_Q_FP8_KERNEL",
    "_INDEXER_Q_MXFP4_KERNEL",
    "_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL",
]
'''

LEAF = "from vllm.models.common.ops.fused_allreduce_rms_norm import fused_allreduce_rms_norm"
PACKAGE = "from vllm.models.common.ops import fused_allreduce_rms_norm"
V4 = "vllm.models.deepseek_v4.nvidia.ops"

# case -> (module, the __init__ the overlay restores, its text, {caller file: [(shipped text, pre-fix text)]})
CASES: dict[str, tuple[str, str, str, dict[str, list[tuple[str, str]]]]] = {
    "common_ops": (
        "vllm.models.common.ops",
        "models/common/ops/__init__.py",
        COMMON_OPS,
        {
            "models/deepseek_v32/amd/model.py": [(LEAF, PACKAGE)],
            "models/deepseek_v32/nvidia/model.py": [(LEAF, PACKAGE)],
            "models/kimi_k3/nvidia/dspark_mla.py": [(LEAF, PACKAGE)],
        },
    ),
    "deepseek_v4": (
        V4,
        "models/deepseek_v4/nvidia/ops/__init__.py",
        DEEPSEEK_V4_OPS,
        {
            "models/deepseek_v4/common/ops/cache_utils.py": [
                (f"from {V4}.dequant_gather_k_cutedsl import", f"from {V4} import")
            ],
            "models/deepseek_v4/common/ops/fused_indexer_q.py": [
                (f"from {V4}.fused_indexer_q_cutedsl import", f"from {V4} import")
            ],
            "models/deepseek_v4/compressor.py": [
                ("from .nvidia.ops.sparse_attn_compress_cutedsl import", "from .nvidia.ops import")
            ],
        },
    ),
}


def restore_callers(root: Path, site_vllm: Path, callers: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Replace each caller's link in the overlay by a copy whose imports are the pre-fix ones."""
    changed = []
    for relative, edits in callers.items():
        text = (site_vllm / relative).read_text(encoding="utf-8")
        for shipped, before in edits:
            if shipped not in text:
                raise SystemExit(f"{relative}: {shipped!r} not found; is this vLLM 0.34?")
            text = text.replace(shipped, before)
        target = root / "vllm" / relative
        target.unlink()
        target.write_text(text, encoding="utf-8")
        changed.append(relative)
    return changed


def command(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    load_before = os.getloadavg()
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800, check=False)
    return {
        "command": " ".join(args),
        "exitcode": done.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "stdout_tail": done.stdout[-4000:],
        "stderr_tail": done.stderr[-2000:],
    }


def relative(site: dict[str, Any] | None, root: Path) -> str | None:
    if not site:
        return None
    file = str(site["file"])
    return f"{os.path.relpath(file, root) if file.startswith(str(root)) else file}:{site['line']}"


def case_facts(case: str, out: Path, env: dict[str, str], python: str, site_vllm: Path) -> dict[str, Any]:
    module, init, text, callers = CASES[case]
    root = overlay(site_vllm, out / "overlays" / case, init, text)
    restored = restore_callers(root, site_vllm, callers)
    diagtools = [python, "-m", "diagtools.frontends.cli"]
    common = ["--driver", "simulated", "--timeout", "900"]
    files = {name: out / f"{case}_{name}.json" for name in ("overlay", "fix", "shipped", "diff")}
    at_root = ["--path", str(root), *common]
    runs = {
        "scan": command([*diagtools, "scan", module, *at_root, "--json", str(files["overlay"])], env),
        "fix": command([*diagtools, "fix", module, *at_root, "--json", str(files["fix"])], env),
        "shipped": command([*diagtools, "scan", module, *common, "--json", str(files["shipped"])], env),
    }
    runs["diff"] = command(
        [*diagtools, "diff", str(files["overlay"]), str(files["shipped"]), "--json", str(files["diff"])], env
    )
    scan, fixed, diff = (json.loads(files[k].read_text()) for k in ("overlay", "fix", "diff"))
    headline = scan["headline"]
    cuts = scan.get("cuts") or {}
    check = fixed.get("check") or {}
    expected = f"vllm/{init}"
    facts = {
        "module": module,
        "overlay_files": [f"vllm/{init}", *(f"vllm/{c}" for c in restored)],
        "verdict": scan["verdict"],
        "culprit": (scan["culprits"] or [{}])[0].get("module"),
        "initialized_at": relative((scan["culprits"] or [{}])[0].get("initialized_at"), root),
        "headline_rule": headline["rule"],
        "headline": relative(headline["line"], root),
        "headline_source": (headline["line"] or {}).get("source"),
        "nearest_cut": [relative(e["site"], root) for e in (cuts.get("nearest") or {}).get("edges", [])],
        "deepest_cut": [relative(e["site"], root) for e in (cuts.get("deepest") or {}).get("edges", [])],
        "tries": [(t["outcome"], [relative(e["site"], root) for e in t["edges"]]) for t in cuts.get("tries", [])],
        "verification_runs": sum(1 for t in cuts.get("tries", []) if t["outcome"] != "cannot-defer"),
        "patch_verified": fixed.get("verified"),
        "rescan_with_patch": check.get("rescan"),
        "names": [(n["name"], n["ok"]) for n in check.get("names", [])],
        "callers": [relative(c["site"], root) for c in fixed.get("callers", [])],
        "shipped_verdict": json.loads(files["shipped"].read_text())["verdict"],
        "diff_rule": diff["headline"]["rule"],
        "diff_headline": relative(diff["headline"]["line"], root),
    }
    facts["headline_is_the_reexport"] = bool(facts["headline"] and facts["headline"].startswith(expected + ":"))
    facts["diff_names_the_same_line"] = facts["diff_headline"] == facts["headline"]
    return {"facts": facts, "runs": runs}


def _machine(facts: dict[str, Any]) -> str:
    return f"{facts['cpus']} CPUs ({facts['processor']}), {facts['platform']}, no GPU; Python {facts['python']}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Where to cut on real vLLM 0.34 (`fix_vllm.py`)",
        "",
        f"Machine: {_machine(results['machine'])}. Environment: `benchmarks/vllm_env.sh` ({results['venv']}), "
        "this checkout on `PYTHONPATH`, `--driver simulated`, one run of each command, one after the other.",
        "",
        "| case | bare scan (with cuts) | fix (scan, cuts, patch, check) | load before (1 min) "
        "| headline (the nearest verified cut) | deepest first-party cut | patch verified "
        "| diff headline (regression edge) |",
        "| --- | ---: | ---: | ---: | --- | --- | --- | --- |",
    ]
    for case, entry in results["cases"].items():
        f, runs = entry["facts"], entry["runs"]
        lines.append(
            f"| {case} | {runs['scan']['wall_s']} s | {runs['fix']['wall_s']} s "
            f"| {runs['scan']['load_before'][0]}, {runs['fix']['load_before'][0]} | `{f['headline']}` "
            f"({len(f['nearest_cut'])} edge(s)) | `{', '.join(f['deepest_cut'])}` | {f['patch_verified']} "
            f"| `{f['diff_headline']}` |"
        )
    lines.append("")
    for case, entry in results["cases"].items():
        f = entry["facts"]
        lines += [
            f"## {case}: `{f['module']}`",
            "",
            f"- Overlay: {', '.join(f'`{p}`' for p in f['overlay_files'])} (pre-fix text).",
            f"- Culprit `{f['culprit']}`, CUDA initialized at `{f['initialized_at']}`.",
            f"- Line to change ({f['headline_rule']}): `{f['headline']}` `{f['headline_source']}`; the re-export: "
            f"{f['headline_is_the_reexport']}.",
            f"- Nearest cut: {', '.join(f'`{e}`' for e in f['nearest_cut'])}; deepest first-party cut: "
            f"{', '.join(f'`{e}`' for e in f['deepest_cut'])}; {f['verification_runs']} verification runs.",
            f"- Patch: verified {f['patch_verified']} (rescan {f['rescan_with_patch']}; names "
            f"{', '.join(f'`{n}` {ok}' for n, ok in f['names'])}).",
            f"- Callers that import the deferred names: {', '.join(f'`{c}`' for c in f['callers']) or 'none'}.",
            f"- Shipped package: {f['shipped_verdict']}; diff headline ({f['diff_rule']}): `{f['diff_headline']}` "
            f"(the same line: {f['diff_names_the_same_line']}).",
            "- Tries, in order: " + "; ".join(f"{o} {', '.join(e)}" for o, e in f["tries"]) + ".",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--venv", default="/work/vllm-env")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-path", required=True)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--report", action="store_true", help="only print the summary of --save-path again")
    args = parser.parse_args()
    if args.report:
        print(markdown(json.loads(Path(args.save_path).read_text(encoding="utf-8"))))
        return
    python = str(Path(args.venv) / "bin" / "python")
    site_vllm = Path(
        subprocess.check_output(
            [python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"], text=True
        ).strip()
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    results: dict[str, Any] = {"machine": machine(), "venv": args.venv, "cases": {}}
    for case in args.case or sorted(CASES):
        results["cases"][case] = case_facts(case, out, env, python, site_vllm)
    Path(args.save_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(markdown(results))


if __name__ == "__main__":
    main()
