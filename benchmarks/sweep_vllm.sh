#!/usr/bin/env bash
# Sweep the real vLLM wheel with the preloading zygote and time it (not run in CI).
#
# Installs vllm with --no-deps (it pins a CUDA torch; the venv's CPU torch is used instead, and
# no other torch is ever downloaded) into a cache folder, then the dependencies its wheel names
# (Requires-Dist) that the venv lacks, as wheels only, leaving out torch and the CUDA kernel
# packages that pin their own torch (see vllm_deps.py).  Then runs `diagtools sweep vllm` on
# the cache folder with the simulated driver, preloading the heavy shared modules vLLM's
# modules import (torch's compiler, transformers' auto classes, aiohttp, fastapi; vllm.config
# cannot be preloaded: on the simulated driver vLLM picks its CUDA platform, whose kernels need
# a CUDA torch), and writes the journal (JSON Lines) and the table into the cache folder;
# sweep_vllm_summary.py turns the journal into the summary committed here.
#
# With VENV set to an environment where vllm is installed with the CUDA torch it pins (see
# vllm_env.sh), nothing is installed: the sweep runs on that vllm, with that environment's
# diagtools (DIAGTOOLS overrides it), and can preload vllm.config and the other heavy vLLM
# modules too, since the simulated runtime lets vLLM's CUDA platform load its kernels.
#
# Usage: benchmarks/sweep_vllm.sh [CACHE_DIR] [JOBS]      (defaults: ~/.cache/diagtools/vllm, 2)
# Environment: VENV (default the repository's .venv), DIAGTOOLS, VLLM_VERSION (default 0.34.*),
# PRELOAD (default below), JOURNAL, TIMEOUT (each child's --timeout, default 60).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VENV:-$here/../.venv}/bin"
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/diagtools/vllm}"
jobs="${2:-2}"
version="${VLLM_VERSION:-0.34.*}"
diagtools="${DIAGTOOLS:-$venv/diagtools}"
preload="torch,torch._dynamo,torch._inductor.compile_fx,torch.distributed.checkpoint,transformers,\
transformers.modeling_utils,transformers.models.auto.tokenization_auto,\
transformers.models.auto.image_processing_auto,aiohttp,fastapi,vllm"
mkdir -p "$cache"
journal="${JOURNAL:-$cache/sweep_vllm.jsonl}"
torch_version="$("$venv/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
installed="$("$venv/python" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])' 2>/dev/null || true)"

if [ -n "$installed" ]; then
    # vllm lives in the environment itself: sweep it there, with vLLM's heavy shared modules preloaded
    preload="${PRELOAD:-$preload,vllm.config,vllm.model_executor.layers.linear,vllm.v1.attention.backend}"
    vllm_dir="$installed"
    path_args=()
else
    preload="${PRELOAD:-$preload}"
    vllm_dir="$cache/vllm"
    path_args=(--path "$cache")
fi

if [ -z "$installed" ] && [ ! -f "$cache/.deps-installed" ]; then
    mkdir -p "$cache"
    "$venv/pip" install --quiet --target "$cache" --no-deps --only-binary :all: "vllm==$version"
    meta=$(ls -d "$cache"/vllm-*.dist-info)/METADATA
    "$venv/python" "$here/vllm_deps.py" requirements "$meta" > "$cache/.requirements.txt"
    echo "torch==$torch_version" > "$cache/.constraints.txt"  # resolve against the venv's torch
    "$venv/pip" install --quiet --dry-run --only-binary :all: --report "$cache/.report.json" \
        -r "$cache/.requirements.txt" -c "$cache/.constraints.txt"
    "$venv/python" "$here/vllm_deps.py" pins "$cache/.report.json" > "$cache/.pins.txt"
    "$venv/pip" install --quiet --target "$cache" --no-deps --only-binary :all: -r "$cache/.pins.txt"
    touch "$cache/.deps-installed"
fi
"$venv/python" -c "import torch; assert torch.__version__.startswith('$torch_version'), torch.__version__"

modules=$(find "$vllm_dir" -name '*.py' -not -path '*/__pycache__/*' | wc -l)
echo "sweeping vllm from $vllm_dir ($modules .py files) with --jobs $jobs, preload $preload" >&2
rm -f "$journal"  # a measurement, not a resumed run
start=$(date +%s.%N)
set +e
"$diagtools" sweep vllm "${path_args[@]}" --driver simulated --jobs "$jobs" --timeout "${TIMEOUT:-60}" \
    --preload "$preload" --json "$journal" > "${journal%.jsonl}.txt"
status=$?
set -e
end=$(date +%s.%N)
tail -n 3 "${journal%.jsonl}.txt"
printf 'wall: %.1f s, exit code %d, journal %s\n' "$(echo "$end - $start" | bc)" "$status" "$journal"
