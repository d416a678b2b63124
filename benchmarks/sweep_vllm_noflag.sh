#!/usr/bin/env bash
# The vLLM sweep a user runs, with no flags, against the hand-tuned one, and the incremental rerun after a
# one-file edit (not run in CI; about 45 minutes on 2 cores).
#
# In an environment where vllm is installed with the CUDA torch it pins (vllm_env.sh), one after another,
# each from a new journal, the machine otherwise quiet:
#   1. tuned:  sweep_vllm.sh (the hand-tuned --preload list), with the sweep's default --timeout;
#   2. f0:     diagtools sweep vllm --jobs 2 --driver simulated --json J (no other flag);
#   3. inc:    one line added to vllm/model_executor/models/transformers/__init__.py, then the same command
#              on a copy of f0's journal, with --baseline f0's summary;
#   4. f1:     the same command on the edited tree from a new journal (the full sweep inc must equal);
# the edit is then undone.  Each run's wall time, exit code and the load average before and after are
# appended to OUT/results.txt; sweep_vllm_noflag.py turns OUT into the JSON committed here.
#
# Usage: benchmarks/sweep_vllm_noflag.sh VENV OUT [pair|rest]
# With "pair", only runs 1 and 2 (the tuned and the no-flag sweep, side by side: about 20 minutes); with
# "rest", only runs 3 and 4, from the journals a pair left in OUT (about 10 minutes).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: sweep_vllm_noflag.sh VENV OUT}"
out="${2:?usage: sweep_vllm_noflag.sh VENV OUT}"
diagtools="$venv/bin/diagtools"
vllm_dir="$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')"
edited="$vllm_dir/model_executor/models/transformers/__init__.py"
mkdir -p "$out"
cd "$out" || exit 2

timed() {
    local name=$1 start end before rc
    shift
    before=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s.%N)
    "$@" > "$out/$name.txt" 2> "$out/$name.err"
    rc=$?
    end=$(date +%s.%N)
    echo "$name rc=$rc wall=$(echo "$end - $start" | bc) load_before=$before" \
        "load_after=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%FT%TZ)" >> "$out/results.txt"
}

sweep=("$diagtools" sweep vllm --jobs 2 --driver simulated)
mode="${3:-}"
rm -f "$out"/{inc,f1}.jsonl
[ "$mode" = rest ] || rm -f "$out"/{tuned,f0}.jsonl
# the tuned run differs from the no-flag one by its --preload only: each child gets the default timeout, as there
# (a vLLM module that hangs at import costs each run that timeout)
timeout="$("$venv/bin/python" -c 'from diagtools.model.options import DEFAULT_TIMEOUT_S as t; print(t)')"
if [ "$mode" != rest ]; then
    timed tuned env VENV="$venv" JOURNAL="$out/tuned.jsonl" TIMEOUT="$timeout" "$here/sweep_vllm.sh" "$out/cache" 2
    timed f0 "${sweep[@]}" --json "$out/f0.jsonl" --summary "$out/f0.json"
fi
[ "$mode" = pair ] && exit 0
cp "$edited" "$out/edited.orig"
trap 'cp "$out/edited.orig" "$edited"' EXIT
printf '\nTRANSFORMERS_BACKEND = "transformers"  # one line added, as a pull request would\n' >> "$edited"
cp "$out/f0.jsonl" "$out/inc.jsonl"
timed inc "${sweep[@]}" --json "$out/inc.jsonl" --summary "$out/inc.json" --baseline "$out/f0.json"
timed f1 "${sweep[@]}" --json "$out/f1.jsonl" --summary "$out/f1.json"
