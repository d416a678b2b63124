#!/usr/bin/env bash
# The GPU check's dry runs on a CPU machine, written to benchmarks/gpu_check_dry_run.md: the whole plan,
# then one step killed after its first rows, then the plan itself.  PYTHON is an interpreter with the
# device image's versions (see the Markdown for how that venv is made); default python3.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
whole=$(mktemp -d)
killed=$(mktemp -d)
trap 'rm -rf "$whole" "$killed"' EXIT
load=$(cut -d' ' -f1 /proc/loadavg)
OUT="$whole" PYTHON="$python" REQUIRE_GPU=0 bash benchmarks/gpu_check.sh >/dev/null 2>&1
whole_rc=$?
OUT="$killed" PYTHON="$python" REQUIRE_GPU=0 ONLY=state-bench setsid bash benchmarks/gpu_check.sh >/dev/null 2>&1 &
script=$!
for _ in $(seq 1 600); do
  grep -q '^| C4 tiny | triton' "$killed/state_kernels.md" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$script"
wait "$script"
killed_rc=$?
versions=$(grep '^versions' "$whole/summary.txt" | cut -c62-)
{
  echo "# gpu_check.sh: dry runs on a CPU machine"
  echo
  echo "Measured $(date -u +%Y-%m-%d) by \`PYTHON=$python bash benchmarks/gpu_check_dry_run.sh\` on a CPU machine"
  echo "($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), no GPU; load average $load"
  echo "before the runs), with the interpreter's versions: $versions."
  echo "The device image has Python 3.12.3, torch 2.11.0+cu130, Triton 3.6.0 and no nvidia-cutlass-dsl; a venv"
  echo "with those versions: \`python3.12 -m venv V && V/bin/pip install torch==2.11.0 triton==3.6.0 numpy pytest"
  echo "pytest-timeout\`.  No GPU: the GPU tests skip, which the script counts as failures, and the benchmarks run"
  echo "their CPU modes (\`REQUIRE_GPU=0\`).  What this measures is the script itself on those versions (its plan,"
  echo "overhead and records), not GPU compilation or timing."
  echo
  echo "## The whole plan (exit $whole_rc)"
  echo
  echo '```'
  cat "$whole/summary.txt"
  echo '```'
  echo
  echo "Each step's start, from \`log.txt\`:"
  echo
  echo '```'
  grep '^===== ' "$whole/log.txt"
  echo '```'
  echo
  echo "Files written: $(ls "$whole" | paste -sd ' ' | sed 's/ /, /g')."
  echo
  echo "## A step killed after its first rows (exit $killed_rc)"
  echo
  echo "\`ONLY=state-bench\`, SIGTERM to the script once the first size's Triton row was in the Markdown:"
  echo
  echo '```'
  cat "$killed/summary.txt"
  echo '```'
  echo
  echo "\`state_kernels.md\` then:"
  echo
  echo '```'
  grep -E '^\*\*Incomplete|^\| C' "$killed/state_kernels.md"
  echo '```'
  echo
  echo "## The plan"
  echo
  echo '```'
  PLAN_ONLY=1 bash benchmarks/gpu_check.sh
  echo '```'
} >benchmarks/gpu_check_dry_run.md
