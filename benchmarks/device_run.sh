#!/usr/bin/env bash
# Runs a plan of benchmark commands on a device machine; everything it writes goes under $OUT.
#
#   OUT=DIR bash benchmarks/device_run.sh benchmarks/plans/ttft_h200.plan [STEP_TIMEOUT_S] [STEPS] [CALL_BUDGET_S]
#
# STEPS (optional): the plan's command lines to run, counted from 1 without blank and comment
# lines: N, or N-M (a plan longer than one device call runs a part per call).
# CALL_BUDGET_S (optional, default 570): seconds the whole run may take, so that it ends inside
# the device call's 600 s with its results packed: a step's limit is cut to what is left of it
# (less 15 s), and a step with under 20 s left is skipped (logged, counted in the exit code).
#
# A plan is a text file of shell commands, one a line (blank lines and '#' comments skipped), each
# free to use $OUT. The runner installs the carried wheels (.whl/*.whl: fla-core and its
# dependencies, the device README's way) into /tmp/site, puts them and the checkout on PYTHONPATH,
# then runs the lines in order, each under `timeout STEP_TIMEOUT_S` (default 600) with its output
# in $OUT/logs/stepN.txt; a failing line does not stop the ones after it. $OUT/logs/run.txt records
# the plan, the commit (where the checkout has its .git), the GPUs and each line's exit code and
# seconds. Exit code: the number of failed and skipped lines. docs/performance.md lists the plans and what
# each result file is. A device call returns at most 8 files from $OUT: when the plan left more,
# they are packed into $OUT/out.tgz at the end (`tar xzf out.tgz` where they come back).
set -uo pipefail
PLAN=${1:?usage: OUT=DIR bash benchmarks/device_run.sh PLAN [STEP_TIMEOUT_S] [STEPS] [CALL_BUDGET_S]}
STEP_TIMEOUT=${2:-600}
STEPS=${3:-1-1000000}
CALL_BUDGET=${4:-570}
[[ "$STEPS" =~ ^[0-9]+(-[0-9]+)?$ ]] || { echo "STEPS must be N or N-M, got $STEPS" >&2; exit 2; }
[[ "$CALL_BUDGET" =~ ^[0-9]+$ ]] || { echo "CALL_BUDGET_S must be a number of seconds, got $CALL_BUDGET" >&2; exit 2; }
run_start=$(date +%s)
FIRST=${STEPS%-*}
LAST=${STEPS#*-}
: "${OUT:?set OUT to the folder the results go to}"
PLAN=$(realpath "$PLAN")
cd "$(dirname "$0")/.." || exit 1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export OUT PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# stores of tens of GiB are filled and freed mode after mode: expandable segments keep the caching
# allocator from fragmenting into out-of-memory at 128k
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$OUT/logs"
LOG=$OUT/logs/run.txt
{
  echo "plan: $PLAN"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
} > "$LOG"
n=0
ran=0
failed=0
skipped=0
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ -z "${line//[[:space:]]/}" || "$line" =~ ^[[:space:]]*# ]] && continue
  n=$((n + 1))
  (( n < FIRST || n > LAST )) && continue
  start=$(date +%s)
  left=$(( CALL_BUDGET - (start - run_start) - 15 ))
  if (( left < 20 )); then
    skipped=$((skipped + 1))
    echo "step $n skipped: the call's budget is spent: $line" | tee -a "$LOG"
    continue
  fi
  limit=$(( left < STEP_TIMEOUT ? left : STEP_TIMEOUT ))
  ran=$((ran + 1))
  echo "[$n] $line"
  timeout "$limit" bash -c "$line" > "$OUT/logs/step$n.txt" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  [[ $rc -ne 0 ]] && failed=$((failed + 1))
  echo "step $n rc=$rc ${seconds}s (limit ${limit}s): $line" >> "$LOG"
  tail -n 15 "$OUT/logs/step$n.txt"
  echo "[$n] rc=$rc after ${seconds} s"
done < "$PLAN"
echo "$ran steps, $failed failed, $skipped skipped" | tee -a "$LOG"
if (( $(find "$OUT" -type f | wc -l) > 8 )); then
  pack=$(mktemp -d)
  tar czf "$pack/out.tgz" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$pack/out.tgz" "$OUT/out.tgz"
  rm -rf "$pack"
fi
exit $((failed + skipped))
