#!/usr/bin/env bash
# Session 5, call 4 (.whl carried): final measurements of this session's code. Two GPUs when lent:
#   GPU 0: prefill profile, cold full_recompute and cold hypic inline only, each cold run
#          profiled (GPU and host tables) - where the summary overhead goes;
#   GPU 1: the cold 32k case (full_recompute, hypic inline + standalone), then TTFT part 3
#          (all_hit and rag at 32k and 8k, prefix_cache and hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
part_a() {
  PROFILE_COLD=1 PROFILE_PIC=full_recompute:inline,hypic:inline PROFILE_IMPL_PAIRS=grouped+auto+glue \
    timeout 380 python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds 350 > $R/profile_stdout.txt 2>&1
  echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt
}
part_b() {
  timeout 230 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
    --json $R/ttft_h200_cold32k.json --plot-dir $R/ttft_h200_cold32k_plots > $R/cold_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_stdout.txt
  OUT=$R TTFT_MAX_SECONDS=150 timeout 240 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_b
fi
grep -E "ms .*tok/s|rc=|Error|cold_s" $R/profile_stdout.txt | cut -c1-300 | head -12
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold_stdout.txt $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
