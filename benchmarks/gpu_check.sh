#!/usr/bin/env bash
# The one prepared script for a lent GPU machine, run from the working tree in one device call
# (see benchmarks/README.md, "GPU check", for the exact `run` command).  Its steps, in order of
# what a short session must not lose:
#   state-bench   the comparison that matters first: compress_state_store, CuTe DSL vs Triton (and
#                 torch) at the seed shapes (benchmarks/state_kernels.py), end to end as vLLM calls
#                 them and the launch alone;
#   state-tests   tests/gpu/test_state_gpu.py: every stored byte of both kernels against the reference;
#   simple-bench  compress_norm_rope_store, CuTe DSL vs Triton at every size (benchmarks/kernels.py);
#   simple-tests  tests/gpu/test_kernels_gpu.py;
#   real-driver   the users' path on the real driver: tests/gpu's scan and replay;
#   memcheck      compute-sanitizer memcheck of both CuTe DSL kernels at small sizes.
# The CuTe DSL kernels need no nvidia-cutlass-dsl there: their PTX for sm_90a ships in
# diagtools/kernels/ptx/ and is loaded with cuModuleLoadData and launched with cuLaunchKernel.
#
# One deadline (DEADLINE_S, default 540 s, inside the device tool's 600 s a call).  The budgets
# below are estimates: the CPU dry run on the device image's versions (benchmarks/gpu_check_dry_run.md)
# measures the script's own overhead, not the GPU's compilation and timing, which no GPU has run yet.
# The script refuses to start when the steps it would run do not fit the deadline with MARGIN_S to
# spare.  Each step's timeout is the smaller of its budget and the time left; a step that no longer
# fits is recorded as "not run".
#
# Nothing is lost when a step is killed: benchmark rows are appended to JSON Lines files as they are
# measured (their JSON and Markdown rewritten after each), pytest prints each test's result to the
# log as it ends, and the summary (summary.txt, with the rows found) is written on every exit,
# a signal included.  A pytest step where any test skipped (torch sees no GPU, no real driver) is a
# failure here, as is a benchmark that finds no GPU.
#
# Environment: OUT (default benchmarks/gpu-run), PYTHON (default python3), DEADLINE_S, ONLY (step
# names separated by commas: run only those), PLAN_ONLY=1 (print the plan and whether it fits, run
# nothing), REQUIRE_GPU=0 (a CPU dry run: benchmarks run without a GPU; pytest skips still fail).
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE_S=${DEADLINE_S:-540}
MARGIN_S=${MARGIN_S:-40}
MACHINE_S=20 # the machine section: nvidia-smi, versions, the compiler check

# name budget-in-seconds title
PLAN=(
  "state-bench 110 faithful variant: CuTe DSL vs Triton at the seed shapes"
  "state-tests 120 faithful variant tests (every stored byte, a CUDA graph replay)"
  "simple-bench 80 simplified kernel: CuTe DSL vs Triton, every size"
  "simple-tests 80 simplified kernel tests"
  "real-driver 45 real-driver path (scan, replay)"
  "memcheck 45 memcheck of the CuTe DSL kernels"
)

selected() { # selected NAME: whether ONLY (if set) names the step
  [ -z "${ONLY:-}" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}

planned=$MACHINE_S
for entry in "${PLAN[@]}"; do
  read -r name budget _ <<<"$entry"
  selected "$name" && planned=$((planned + budget))
done
fits=$([ $((planned + MARGIN_S)) -le "$DEADLINE_S" ] && echo yes || echo no)
if [ "${PLAN_ONLY:-0}" = 1 ]; then
  for entry in "${PLAN[@]}"; do
    read -r name budget title <<<"$entry"
    selected "$name" && printf '%-14s %4s s  %s\n' "$name" "$budget" "$title"
  done
  echo "planned $planned s (machine $MACHINE_S s included) + margin $MARGIN_S s of a $DEADLINE_S s deadline: fits $fits"
  [ "$fits" = yes ]
  exit $?
fi
if [ "$fits" != yes ]; then
  echo "gpu_check.sh: the steps plan $planned s + $MARGIN_S s margin, over the $DEADLINE_S s deadline" >&2
  exit 2
fi

started=$(date +%s)
deadline=$((started + DEADLINE_S))
out="${OUT:-benchmarks/gpu-run}"
python="${PYTHON:-python3}"
require_gpu=$([ "${REQUIRE_GPU:-1}" = 0 ] && echo "" || echo "--require-gpu")
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.xml # this run's results only
log="$out/log.txt"
summary="$out/summary.txt"
steps="$out/.steps"
: >"$log"
: >"$steps"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
step_pid=""
step_title=""

write_summary() { # write_summary STATE: summary.txt as it stands: the steps so far, the rows found, the state
  local file
  {
    cat "$steps"
    for file in "$out"/*.jsonl; do
      [ -e "$file" ] && printf '%-60s %s\n' "rows in $(basename "$file")" "$(grep -c '^{' "$file")"
    done
    echo "elapsed $(($(date +%s) - started)) s of a $DEADLINE_S s deadline"
    echo "overall: $1"
  } >"$summary.tmp" && mv -f "$summary.tmp" "$summary"
}
record() { # record NAME RESULT: one line of the summary, which is rewritten at once
  printf '%-60s %s\n' "$1" "$2" >>"$steps"
  write_summary "running (a kill now leaves this)"
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  write_summary "$([ "$failed" = 0 ] && [ "$rc" = 0 ] && echo ok || echo FAILED)"
  rm -f "$steps"
  printf '\n===== summary =====\n' | tee -a "$log"
  tee -a "$log" <"$summary"
}
interrupted() { # a signal: stop the running step (timeout passes it to the step's whole group), then finish
  if [ -n "$step_pid" ]; then
    kill -TERM "$step_pid" 2>/dev/null
    wait "$step_pid" 2>/dev/null
  fi
  record "interrupted" "by a signal${step_title:+ during: $step_title} (the steps before it are above)"
  failed=1
  exit 130
}
trap finish EXIT
trap interrupted INT TERM

section() { printf '\n===== %s (%s) =====\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$log"; }

skips_fail() { # skips_fail JUNIT: "ok (N passed)" when every test ran and passed; else why not, and exit 1
  "$python" - "$1" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    print(f"FAILED: no readable JUnit report ({type(exc).__name__})")
    sys.exit(1)
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
count = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "skipped", "failures", "errors")}
reasons = sorted({(e.get("message") or "")[:80] for e in root.iter("skipped")})
if count["tests"] == 0:
    print("FAILED: no test ran")
elif count["skipped"]:
    print(f"FAILED: {count['skipped']} of {count['tests']} skipped ({'; '.join(reasons)})")
elif count["failures"] or count["errors"]:
    print(f"FAILED: {count['failures']} failed, {count['errors']} errors of {count['tests']}")
else:
    print(f"ok ({count['tests']} passed)")
    sys.exit(0)
sys.exit(1)
PY
}

missing_tool() { # missing_tool NAME: why the step cannot run on this machine, or nothing
  case "$1" in
  real-driver) command -v cc >/dev/null || echo "no C compiler (cc): the probe and the run agent cannot be built" ;;
  memcheck) command -v compute-sanitizer >/dev/null || echo "no compute-sanitizer on this machine" ;;
  esac
}

step_command() { # step_command NAME JUNIT: the shell command of a step (pytest steps write JUNIT)
  local pytest="'$python' -m pytest -v -p no:cacheprovider -p no:diagtools -rfEs --junitxml='$2'"
  case "$1" in
  state-bench) echo "'$python' benchmarks/state_kernels.py --save-path '$out' --rows '$out/state_kernels.jsonl' $require_gpu" ;;
  state-tests) echo "$pytest tests/gpu/test_state_gpu.py" ;;
  simple-bench) echo "'$python' benchmarks/kernels.py --out '$out' --rows '$out/kernels.jsonl' $require_gpu" ;;
  simple-tests) echo "$pytest tests/gpu/test_kernels_gpu.py" ;;
  real-driver) echo "$pytest tests/gpu --ignore tests/gpu/test_kernels_gpu.py --ignore tests/gpu/test_state_gpu.py" ;;
  memcheck) echo "compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=kernel_cutlass '$python' benchmarks/memcheck_kernels.py" ;;
  esac
}

judge() { # judge TITLE RC BUDGET JUNIT: the step's line of the summary
  local title=$1 rc=$2 budget=$3 xml=$4 verdict
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$title" "timed out after ${budget} s"
    failed=1
  elif [ -e "$xml" ]; then # a pytest step: judged by its report, skips included
    verdict=$(skips_fail "$xml") || failed=1
    [ "$rc" = 0 ] || { failed=1 && verdict="exit $rc; $verdict"; }
    record "$title" "$verdict"
  elif [ "$rc" = 0 ]; then
    record "$title" "ok"
  else
    record "$title" "exit $rc"
    failed=1
  fi
}

run_step() { # run_step NAME BUDGET TITLE: run one planned step within min(BUDGET, time left)
  local name=$1 budget=$2 title=$3 left rc xml missing
  left=$((deadline - $(date +%s) - 5))
  section "$title"
  missing=$(missing_tool "$name")
  if [ -n "$missing" ]; then
    echo "not run: $missing" | tee -a "$log"
    record "$title" "not run: $missing"
    [ "$name" = memcheck ] || failed=1 # a machine without the sanitizer says nothing of the kernels
    return
  fi
  if [ "$left" -lt 10 ]; then
    echo "not run: the deadline leaves ${left} s" | tee -a "$log"
    record "$title" "not run (deadline)"
    failed=1
    return
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  xml="$out/$name.xml"
  # the GPU tests run two children (one per backend) one after the other: each gets under half the step
  export GPU_CHILD_TIMEOUT_S=$(((budget - 10) / 2))
  # in the background, so that a signal to this script is handled at once, not when the step ends
  timeout --kill-after=5 "$budget" bash -c "$(step_command "$name" "$xml")" > >(tee -a "$log") 2>&1 &
  step_pid=$!
  step_title=$title
  wait "$step_pid"
  rc=$?
  step_pid=""
  step_title=""
  judge "$title" "$rc" "$budget" "$xml"
}

versions() {
  "$python" - <<'EOF'
import platform
print("python", platform.python_version())
for name, module in (("torch", "torch"), ("triton", "triton"), ("nvidia-cutlass-dsl", "cutlass"), ("cupy", "cupy")):
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
  echo "cc: $(command -v cc >/dev/null && cc --version | head -n 1 || echo absent)"
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee -a "$log"
record "versions" "$(grep -E '^(python|torch|triton|nvidia-cutlass-dsl|cupy) ' "$log" | paste -sd ';' -)"
record "C compiler" "$(grep -E '^cc: ' "$log" | cut -c5-)"

for entry in "${PLAN[@]}"; do
  read -r name budget title <<<"$entry"
  selected "$name" && run_step "$name" "$budget" "$title"
done
exit "$failed"
