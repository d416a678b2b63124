#!/usr/bin/env bash
# The one prepared script for a lent H200 machine, run from the working tree in one device call
# (see benchmarks/README.md, "GPU check", for the exact `run` command):
#   1. what the machine is: GPU, driver, python, torch, triton, whether nvidia-cutlass-dsl is there;
#   2. tests/gpu: one test case per (backend, size) against the float64 reference;
#   3. the kernel benchmark over the full grid, run even when some tests failed;
#   4. the other GPU tests (scan and replay on the real driver), in the time left;
#   5. the faithful variant (compress_state_store): tests/gpu/test_state_gpu.py, then
#      benchmarks/state_kernels.py at the KERNEL-NOTES sizes (about a minute together).
# The CuTe DSL kernel needs no nvidia-cutlass-dsl there: its PTX for sm_90a is compiled on a CPU
# machine (benchmarks/build_ptx.py), ships in diagtools/kernels/ptx/, and is loaded with
# cuModuleLoadData and launched with cuLaunchKernel (ctypes on libcuda).
# Writes 11 files to $OUT (or benchmarks/gpu-run/): env.txt, gpu-tests.log, gpu-tests.xml,
# bench.log, kernels.json, kernels.md, other-gpu-tests.log, state-tests.log, state-bench.log,
# state_kernels.json, state_kernels.md.  Each step has its own timeout (300 + 240 + 150 + 120 +
# 90 s at most, about 4 minutes expected), inside a 600 s call: the last steps get what is left.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/gpu-run}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import cutlass" 2>/dev/null && echo "nvidia-cutlass-dsl: present" || echo "nvidia-cutlass-dsl: absent (the shipped PTX is used)"
  python3 -c "import diagtools.driver as d; print('real driver:', d.real_driver_path())"
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee "$out/env.txt"

timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs \
  --junitxml="$out/gpu-tests.xml" tests/gpu/test_kernels_gpu.py 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}

timeout 240 python3 benchmarks/kernels.py --out "$out" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}

# the other GPU modules (scan and replay against the real driver), last, in what time is left
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs tests/gpu \
  --ignore tests/gpu/test_kernels_gpu.py --ignore tests/gpu/test_state_gpu.py 2>&1 | tee "$out/other-gpu-tests.log"
other_rc=${PIPESTATUS[0]}

# the faithful variant: its GPU tests, then its benchmark at the three KERNEL-NOTES sizes
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs \
  tests/gpu/test_state_gpu.py 2>&1 | tee "$out/state-tests.log"
state_rc=${PIPESTATUS[0]}
timeout 90 python3 benchmarks/state_kernels.py --save-path "$out" 2>&1 | tee "$out/state-bench.log"
state_bench_rc=${PIPESTATUS[0]}

echo "kernel tests exit $tests_rc; benchmark exit $bench_rc; other GPU tests exit $other_rc;" \
  "state tests exit $state_rc; state benchmark exit $state_bench_rc"
exit $(( tests_rc != 0 || bench_rc != 0 || other_rc != 0 || state_rc != 0 || state_bench_rc != 0 ))
