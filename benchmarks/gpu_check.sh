#!/usr/bin/env bash
# The one prepared script for a lent GPU machine: checks, then times, everything.
#   1. the real driver is found and used; the GPU test modules (scan, replay, kernels) pass;
#   2. both kernels match the float64 reference at every size on the GPU;
#   3. the full benchmark grid is timed and written to $OUT (or benchmarks/).
# It needs the project installed (pip install -e '.[all]'); the packages the GPU image lacks
# (nvidia-cutlass-dsl) travel as wheels, see the device notes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks}"
python -c "import diagtools._driver as d; print('real driver:', d.real_driver_path())"
python -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu-tests.log"
python benchmarks/kernels.py --out "$out"
