#!/usr/bin/env bash
# The one prepared script for a lent H200 machine, run from the working tree in one device call
# (see benchmarks/README.md, "GPU check", for the exact `run` command):
#   1. what the machine is: GPU, driver, and the python, torch, Triton, CUDA and nvidia-cutlass-dsl
#      versions it runs with (the machine's own image, not the repository venv's);
#   2. the users' path: tests/gpu's scan and replay on the real driver, first, so that a short
#      session proves it even if the kernels' timing runs out of time;
#   3. tests/gpu/test_state_gpu.py: the faithful variant, Triton and CuTe DSL, every stored byte
#      against the reference quantizer;
#   4. benchmarks/state_kernels.py at realistic batches: the launch alone (CUDA graph replays,
#      host work done once) and the eager call;
#   5. tests/gpu/test_kernels_gpu.py and benchmarks/kernels.py (the simplified kernel);
#   6. compute-sanitizer memcheck of both CuTe DSL kernels at small sizes, or "skipped" without it.
# The CuTe DSL kernels need no nvidia-cutlass-dsl there: their PTX for sm_90a is compiled on a CPU
# machine (benchmarks/build_ptx.py), ships in diagtools/kernels/ptx/, and is loaded with
# cuModuleLoadData and launched with cuLaunchKernel (ctypes on libcuda).
#
# One deadline for the whole script (DEADLINE_S, default 540 s, inside the device tool's 600 s a
# call): each step's timeout is the smaller of its own budget and the time left, a step that no
# longer fits is recorded as "not run", and the summary of what ran is written on every exit.
# Writes at most 8 files to $OUT (or benchmarks/gpu-run/): summary.txt, log.txt, state-tests.xml,
# state_kernels.json, state_kernels.md, gpu-tests.xml, kernels.json, kernels.md.
# PYTHON chooses the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
deadline=$((started + ${DEADLINE_S:-540}))
out="${OUT:-benchmarks/gpu-run}"
python="${PYTHON:-python3}"
mkdir -p "$out"
log="$out/log.txt"
summary="$out/summary.txt"
: >"$log"
: >"$summary"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0

record() {  # record NAME RESULT: one line of the summary
  printf '%-40s %s\n' "$1" "$2" >>"$summary"
}
finish() {
  local rc=$?
  trap - EXIT
  {
    echo "elapsed $(($(date +%s) - started)) s of a ${DEADLINE_S:-540} s deadline"
    echo "overall: $([ "$failed" = 0 ] && [ "$rc" = 0 ] && echo ok || echo FAILED)"
  } >>"$summary"
  printf '\n===== summary =====\n' | tee -a "$log"
  tee -a "$log" <"$summary"
}
trap finish EXIT
trap 'record "interrupted" "signal"; failed=1; exit 130' INT TERM

section() { printf '\n===== %s (%s) =====\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$log"; }
step() {  # step NAME SECONDS COMMAND...: run within min(SECONDS, time left); record its result
  local name=$1 budget=$2 left rc
  shift 2
  left=$((deadline - $(date +%s) - 5))
  section "$name"
  if [ "$left" -lt 10 ]; then
    echo "not run: the deadline leaves ${left} s" | tee -a "$log"
    record "$name" "not run (deadline)"
    failed=1
    return
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  timeout --kill-after=5 "$budget" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then
    record "$name" "ok"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$name" "timed out after ${budget} s"
    failed=1
  else
    record "$name" "exit $rc"
    failed=1
  fi
}

versions() {
  "$python" - <<'EOF'
import platform
print("python", platform.python_version())
for name, module in (("torch", "torch"), ("triton", "triton"), ("nvidia-cutlass-dsl", "cutlass")):
    try:
        print(name, getattr(__import__(module), "__version__", "present"))
    except Exception as exc:
        print(name, f"absent ({type(exc).__name__})")
try:
    import torch
    print("torch CUDA", torch.version.cuda, "GPU", torch.cuda.is_available())
except Exception:
    pass
EOF
}

section "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || echo "no nvidia-smi"
  versions
  "$python" -c "import diagtools.driver as d; print('real driver:', d.real_driver_path())" 2>&1
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee -a "$log"
record "versions" "$(grep -E '^(python|torch|triton|nvidia-cutlass-dsl) ' "$log" | paste -sd ';' -)"

pytest_args=(-q -p no:cacheprovider -p no:diagtools -rfEs)
# The users' path first: scan and replay on the real driver (its result is the first one written), then
# the kernels, which only time and check what the tool found.
step "real-driver path (scan, replay)" 60 "$python" -m pytest "${pytest_args[@]}" tests/gpu \
  --ignore tests/gpu/test_kernels_gpu.py --ignore tests/gpu/test_state_gpu.py
step "faithful variant tests" 150 "$python" -m pytest "${pytest_args[@]}" \
  --junitxml="$out/state-tests.xml" tests/gpu/test_state_gpu.py
step "faithful variant benchmark" 120 "$python" benchmarks/state_kernels.py --save-path "$out"
step "simplified kernel tests" 120 "$python" -m pytest "${pytest_args[@]}" \
  --junitxml="$out/gpu-tests.xml" tests/gpu/test_kernels_gpu.py
step "simplified kernel benchmark" 120 "$python" benchmarks/kernels.py --out "$out"

if command -v compute-sanitizer >/dev/null 2>&1; then
  step "memcheck of the CuTe DSL kernels" 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
    --kernel-name kns=kernel_cutlass "$python" benchmarks/memcheck_kernels.py
else
  section "memcheck of the CuTe DSL kernels"
  echo "compute-sanitizer is not on this machine: memcheck skipped" | tee -a "$log"
  record "memcheck of the CuTe DSL kernels" "skipped (no compute-sanitizer)"
fi
exit "$failed"
