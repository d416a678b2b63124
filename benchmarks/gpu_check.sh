#!/usr/bin/env bash
# The one prepared script for a lent H200 machine, run from the working tree in one device call
# (see benchmarks/README.md, "GPU check", for the exact `run` command):
#   1. what the machine is: GPU, driver, python, torch, triton, whether nvidia-cutlass-dsl is there;
#   2. tests/gpu/test_kernels_gpu.py: one test case per (backend, size) against the float64 reference;
#   3. the kernel benchmark over the full grid, run even when some tests failed;
#   4. the faithful variant (compress_state_store), Triton and CuTe DSL: tests/gpu/test_state_gpu.py,
#      then benchmarks/state_kernels.py at the KERNEL-NOTES sizes;
#   5. the other GPU tests (scan and replay on the real driver);
#   6. compute-sanitizer memcheck of both CuTe DSL kernels at small sizes, in the time left.
# The CuTe DSL kernels need no nvidia-cutlass-dsl there: their PTX for sm_90a is compiled on a CPU
# machine (benchmarks/build_ptx.py), ships in diagtools/kernels/ptx/, and is loaded with
# cuModuleLoadData and launched with cuLaunchKernel (ctypes on libcuda).
# Writes 7 files to $OUT (or benchmarks/gpu-run/), under the device tool's limit of 8:
#   log.txt (every step's output, one section each), gpu-tests.xml, state-tests.xml,
#   kernels.json, kernels.md, state_kernels.json, state_kernels.md.
# Each step has its own timeout (300 + 200 + 150 + 90 + 120 + 90 s at most, about 5 minutes
# expected), inside a 600 s call: the last steps get what is left.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/gpu-run}"
mkdir -p "$out"
log="$out/log.txt"
: >"$log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

section() { printf '\n===== %s (%s) =====\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$log"; }
step() {  # step SECONDS COMMAND...: run with a timeout, output to the log and the terminal; return its exit
  local seconds=$1
  shift
  timeout "$seconds" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

section "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import cutlass" 2>/dev/null && echo "nvidia-cutlass-dsl: present" || echo "nvidia-cutlass-dsl: absent (the shipped PTX is used)"
  python3 -c "import diagtools.driver as d; print('real driver:', d.real_driver_path())"
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee -a "$log"

section "kernel tests"
step 300 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs \
  --junitxml="$out/gpu-tests.xml" tests/gpu/test_kernels_gpu.py
tests_rc=$?

section "kernel benchmark"
step 200 python3 benchmarks/kernels.py --out "$out"
bench_rc=$?

section "faithful variant tests"
step 150 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs \
  --junitxml="$out/state-tests.xml" tests/gpu/test_state_gpu.py
state_rc=$?

section "faithful variant benchmark"
step 90 python3 benchmarks/state_kernels.py --save-path "$out"
state_bench_rc=$?

section "other GPU tests (scan and replay on the real driver)"
step 120 python3 -m pytest -q -p no:cacheprovider -p no:diagtools -rfEs tests/gpu \
  --ignore tests/gpu/test_kernels_gpu.py --ignore tests/gpu/test_state_gpu.py
other_rc=$?

section "memcheck of the CuTe DSL kernels (compute-sanitizer; Firecracker machines only)"
if command -v compute-sanitizer >/dev/null 2>&1; then
  step 90 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=kernel_cutlass \
    python3 benchmarks/memcheck_kernels.py
  memcheck_rc=$?
else
  echo "compute-sanitizer is not on this machine: memcheck skipped" | tee -a "$log"
  memcheck_rc=0
fi

section "summary"
echo "kernel tests exit $tests_rc; benchmark exit $bench_rc; state tests exit $state_rc;" \
  "state benchmark exit $state_bench_rc; other GPU tests exit $other_rc; memcheck exit $memcheck_rc" | tee -a "$log"
exit $(( tests_rc != 0 || bench_rc != 0 || state_rc != 0 || state_bench_rc != 0 || other_rc != 0 || memcheck_rc != 0 ))
