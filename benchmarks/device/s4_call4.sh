#!/usr/bin/env bash
# Session 4, call 4 (.whl carried), after batching the store-write copies (one multi-tensor copy
# per dtype instead of ~7,000 clones for a cold 64-segment prompt):
#   A: the cold 32k case (64 x 512 + 64): full_recompute, hypic inline (summary overhead) and
#      hypic standalone, 3 requests each (hypic bench ttft --cases cold);
#   B: TTFT part 3 at 32k only (all_hit + rag, prefix_cache and hypic).
# On two GPUs A and B run side by side; on one, one after the other.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
part_a() {
  timeout 200 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
    --json $R/ttft_h200_cold32k.json --plot-dir $R/ttft_h200_cold32k_plots > $R/cold_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_stdout.txt
}
part_b() {
  OUT=$R TTFT_MAX_SECONDS=$1 timeout $(( $1 + 90 )) bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b 115 ) & wait
else
  part_a; part_b 60
fi
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold_stdout.txt $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
