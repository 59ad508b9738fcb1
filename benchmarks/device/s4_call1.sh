#!/usr/bin/env bash
# Session 4, call 1 (nvidia-h200-x2; .whl carried):
#   GPU 0: prefill profile, plain 8k/32k with and without the compiled glue (HYPIC_COMPILE_GLUE),
#          then cold full_recompute / hypic inline / hypic standalone and all-hit on 64 x 512 + 64,
#          each cold run profiled and its host syncs counted (PROFILE_COLD=1);
#   GPU 1: TTFT part 3 (all_hit + rag, prefix_cache and hypic, 32k then 8k), default settings.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 PROFILE_COLD=1 PROFILE_IMPL_PAIRS=grouped+flash,grouped+flash+glue \
    timeout ${PROF_TIMEOUT:-560} python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds ${PROF_SECONDS:-500} > $R/profile_stdout.txt 2>&1
  echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt ) &
( CUDA_VISIBLE_DEVICES=1 OUT=$R TTFT_MAX_SECONDS=${TTFT_SECONDS:-380} timeout ${TTFT_TIMEOUT:-540} bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt ) &
wait
grep -v "^\s*$" $R/profile_stdout.txt | grep -E "ms|rc=|Error|error" | head -30; tail -c 2500 $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
