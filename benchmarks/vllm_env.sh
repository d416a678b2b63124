#!/usr/bin/env bash
# Build a real vLLM environment with the CUDA build of torch it pins (not run in CI: about 9.4 GB).
#
# The environment vLLM users have: vllm 0.34.0, its Requires-Dist dependencies, torch 2.14.0+cu130
# with its nvidia-* CUDA 13 libraries (libcudart.so.13 among them), and this repository's base
# package (no extras) installed from a clean copy of the committed tree (a build inside the source
# tree would write build/ and *.egg-info there).  The simulated driver and runtime build with cc on
# first use.
#
# Deviation from `pip install vllm==0.34.0`: vLLM's Requires-Dist pins flashinfer-python==0.7.3,
# which the package index does not serve (0.7.2.post1 and 0.7.4 are there).  vllm is installed
# with --no-deps and its Requires-Dist lines (markers honoured) with flashinfer-python==0.7.4 in
# place of 0.7.3 (0.7.2.post1 has the same import-time code in flashinfer/jit/env.py); `pip check`
# reports that pin afterwards.  The machine's local wheel folder holds only a CPU torch 2.13, so
# pip takes the index's torch 2.14.0+cu130 for vLLM's torch==2.14.0 pin.
#
# Usage: benchmarks/vllm_env.sh [ENV_DIR]      (default /work/vllm-env)
# Environment: VLLM_VERSION (default 0.34.0), FLASHINFER (default 0.7.4), PYTHON (default python3).
# Writes ENV_DIR/READY when done; reruns reinstall only this repository's package.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
env="${1:-/work/vllm-env}"
version="${VLLM_VERSION:-0.34.0}"
flashinfer="${FLASHINFER:-0.7.4}"
python="${PYTHON:-python3}"
start=$(date +%s)

if [ ! -f "$env/.vllm-installed" ]; then
    "$python" -m venv "$env"
    "$env/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
    wheels="$env/.wheels"
    mkdir -p "$wheels"
    "$env/bin/pip" download --quiet --no-deps --only-binary :all: -d "$wheels" "vllm==$version"
    wheel=$(ls "$wheels"/vllm-"$version"-*.whl)
    "$env/bin/pip" install --quiet --no-deps "$wheel"
    # vLLM's Requires-Dist, markers honoured, with the flashinfer pin the index can serve
    "$env/bin/python" - "$flashinfer" > "$env/.requirements.txt" <<'EOF'
import sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement

for line in metadata.distribution("vllm").requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    if req.name == "flashinfer-python":
        print(f"flashinfer-python=={sys.argv[1]}")
    else:
        print(str(req))
EOF
    "$env/bin/pip" install --quiet -r "$env/.requirements.txt"
    touch "$env/.vllm-installed"
fi

# This repository's base package, from a clean copy of the committed tree
copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$copy"
"$env/bin/pip" install --quiet --force-reinstall --no-deps "$copy"
"$env/bin/pip" install --quiet "$copy"  # its own dependencies, if any are missing
# the dask benchmark's cluster (sweep_vllm_dask.py); pip keeps what vLLM pinned when it satisfies dask
"$env/bin/python" -c 'import distributed' 2> /dev/null || "$env/bin/pip" install --quiet distributed
"$env/bin/pip" check || true  # reports the flashinfer pin
"$env/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
touch "$env/READY"
echo "environment $env ready in $(( $(date +%s) - start )) s" >&2
