#!/usr/bin/env bash
# The one prepared script for a lent GPU machine: checks, then times, everything.
#   1. the real driver is found and used; the GPU test modules (scan, replay, kernels) pass;
#   2. both kernels match the float64 reference at every size on the GPU (tests/gpu);
#   3. the full benchmark grid is timed and written to $OUT (or benchmarks/).
# It runs from the working tree (no install needed: PYTHONPATH points at it). The GPU image has
# torch, triton, cuda-bindings and pytest; nvidia-cutlass-dsl travels as wheels (see the device
# notes), installed with --target into a folder that PYTHONPATH also names.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import diagtools.driver as d; print('real driver:', d.real_driver_path())"
python3 -c "import cutlass" 2>/dev/null || echo "note: nvidia-cutlass-dsl is missing: the cutedsl rows will say so"
python3 -m pytest -q -p no:cacheprovider -p no:diagtools tests/gpu 2>&1 | tee "$out/gpu-tests.log"
python3 benchmarks/kernels.py --out "$out"
