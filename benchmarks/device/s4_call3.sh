#!/usr/bin/env bash
# Session 4, call 3 (.whl and .ab_old carried; .ab_old = `git archive 84bfba5 hypic`, the code
# before this session). Two GPUs when lent (nvidia-h200-x2), else one after the other:
#   A: all-hit A/B, old package then new (benchmarks/allhit_ab_h200.py), then the prefill profile
#      with the compiled glue on (default now), every cold PIC run profiled;
#   B: TTFT part 3 (all_hit + rag at 32k and 8k), then part 5 (RAG at 128k, a process per mode).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
END=${CALL_END:-565}
part_a() {
  PYTHONPATH=/tmp/site:$PWD/.ab_old HYPIC_COMPILE_GLUE=0 timeout 120 python3 benchmarks/allhit_ab_h200.py --tag old --out $R > $R/ab_old.txt 2>&1
  echo "ab old rc=$?" >> $R/ab_old.txt
  PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/allhit_ab_h200.py --tag new --out $R > $R/ab_new.txt 2>&1
  echo "ab new rc=$?" >> $R/ab_new.txt
  left=$(( $1 - ($(date +%s) - T0) ))
  PYTHONPATH=/tmp/site:$PWD PROFILE_COLD=1 PROFILE_IMPL_PAIRS=grouped+flash+glue \
    timeout $left python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds $(( left - 30 )) > $R/profile_stdout.txt 2>&1
  echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt
}
part_b() {
  export PYTHONPATH=/tmp/site:$PWD
  OUT=$R TTFT_MAX_SECONDS=$2 timeout $(( $2 + 80 )) bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
  left=$(( $1 - ($(date +%s) - T0) ))
  if (( left > 60 )); then
    OUT=$R TTFT_MODES=${P5_MODES:-prefix_cache,hypic,full_recompute,transition,addition,transition_rope} timeout $left bash benchmarks/ttft_h200.sh 5 > $R/ttft_part5_stdout.txt 2>&1
    echo "ttft5 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part5_stdout.txt
  fi
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a $END ) &
  ( CUDA_VISIBLE_DEVICES=1 part_b $END 200 ) &
  wait
else
  part_a 330
  part_b $END 150
fi
cat $R/ab_old.txt $R/ab_new.txt | grep -E "prompt_tokens|rc=|Error"
grep -E "ms .*tok/s|rc=|Error" $R/profile_stdout.txt | head; grep -E "^(all_hit|rag) |rc=" $R/ttft_part3_stdout.txt $R/ttft_part5_stdout.txt 2>/dev/null
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
