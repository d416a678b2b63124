#!/usr/bin/env bash
# Sweep the real vLLM wheel with the preloading zygote and time it (not run in CI).
#
# Installs vllm (no dependencies: it pins a CUDA torch; the venv's CPU torch 2.13.0 is used
# instead, and no other torch is ever downloaded) plus a few pure-Python dependencies into a
# cache folder, then runs `diagtools sweep vllm` on it with the simulated driver and writes the
# journal and the table beside this script.  Modules whose binary dependencies are not
# installed (tokenizers, pydantic-core, the CUDA kernels in vllm/_C...) are reported as
# import errors, which is a verdict too: the sweep's time is what this measures.
#
# Usage: benchmarks/sweep_vllm.sh [CACHE_DIR] [JOBS]      (defaults: ~/.cache/diagtools/vllm, 2)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/../.venv/bin"
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/diagtools/vllm}"
jobs="${2:-2}"
version="${VLLM_VERSION:-0.34.*}"
pure=(transformers huggingface_hub cachetools einops partial-json-parser lark python-json-logger
      py-cpuinfo prometheus_client typing_extensions blake3 cbor2 ijson pybase64)

if [ ! -d "$cache/vllm" ]; then
    "$venv/pip" install --quiet --target "$cache" --no-deps "vllm==$version"
    # best effort, one by one: a dependency the registries do not have is left out
    for dist in "${pure[@]}"; do
        "$venv/pip" install --quiet --target "$cache" --no-deps "$dist" || echo "not installed: $dist" >&2
    done
fi
"$venv/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"

modules=$(find "$cache/vllm" -name '*.py' -not -path '*/__pycache__/*' | wc -l)
echo "sweeping vllm from $cache ($modules .py files) with --jobs $jobs" >&2
rm -f "$here/sweep_vllm.jsonl"  # a measurement, not a resumed run
start=$(date +%s.%N)
set +e
"$venv/diagtools" sweep vllm --path "$cache" --driver simulated --jobs "$jobs" --timeout 60 \
    --json "$here/sweep_vllm.jsonl" > "$here/sweep_vllm.txt"
status=$?
set -e
end=$(date +%s.%N)
tail -n 3 "$here/sweep_vllm.txt"
printf 'wall: %.1f s, exit code %d\n' "$(echo "$end - $start" | bc)" "$status"
