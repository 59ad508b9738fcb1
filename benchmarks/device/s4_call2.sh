#!/usr/bin/env bash
# Session 4, call 2 (nvidia-h200-x2; .whl carried), after removing host syncs (cold write path,
# fla chunk tables, layout copies) and moving the short conv onto fla's kernel:
#   GPU 0: CUDA tests of the new conv path and the MoE combine; the compiled-glue check
#          (benchmarks/glue_check_h200.py); the prefill profile as in call 1;
#   GPU 1: TTFT part 3 (all_hit + rag at 32k and 8k), then part 5 (RAG at 128k, one process
#          per mode) until the call's time runs out.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/linear/test_fla_paths.py -k "conv1d" \
      tests/ops/test_moe_grouped.py > $R/pytest_gpu.txt 2>&1; echo "pytest rc=$?" >> $R/pytest_gpu.txt
  timeout 150 python3 benchmarks/glue_check_h200.py --out $R > $R/glue_stdout.txt 2>&1; echo "glue rc=$?" >> $R/glue_stdout.txt
  left=$(( 560 - ($(date +%s) - T0) ))
  PROFILE_COLD=1 PROFILE_IMPL_PAIRS=grouped+flash,grouped+flash+glue \
    timeout $left python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds $(( left - 40 )) > $R/profile_stdout.txt 2>&1
  echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  OUT=$R TTFT_MAX_SECONDS=200 timeout 260 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
  left=$(( 560 - ($(date +%s) - T0) ))
  OUT=$R TTFT_MODES=${P5_MODES:-prefix_cache,hypic,full_recompute,addition,transition,transition_rope} timeout $left bash benchmarks/ttft_h200.sh 5 > $R/ttft_part5_stdout.txt 2>&1
  echo "ttft5 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part5_stdout.txt ) &
wait
tail -5 $R/pytest_gpu.txt; grep -v "^\s*$" $R/glue_stdout.txt | tail -20
grep -E "ms .*tok/s|rc=|Error" $R/profile_stdout.txt | head; grep -E "^(all_hit|rag) |rc=" $R/ttft_part3_stdout.txt $R/ttft_part5_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
