#!/usr/bin/env bash
# Session 5, call 1 (.whl carried). Two GPUs when lent, else one after the other:
#   A: attention kernels at the 35B-A3B full-attention shape (benchmarks/attention_h200.py),
#      then the all-hit run with host profiles (benchmarks/allhit_ab_h200.py --tag s5);
#   B: the cold 32k case (64 x 512 + 64): full_recompute, hypic inline and standalone (first
#      GPU measurement of session 4's write-path batching and no-summary fast path).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
part_a() {
  timeout 120 python3 benchmarks/attention_h200.py --out $R > $R/attention_stdout.txt 2>&1
  echo "attention rc=$? after $(( $(date +%s) - T0 )) s" >> $R/attention_stdout.txt
  timeout 200 python3 benchmarks/allhit_ab_h200.py --tag s5 --out $R > $R/ab_s5.txt 2>&1
  echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s5.txt
}
part_b() {
  timeout 260 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
    --json $R/ttft_h200_cold32k.json --plot-dir $R/ttft_h200_cold32k_plots > $R/cold_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_a; part_b
fi
tail -25 $R/attention_stdout.txt; grep -E "prompt_tokens|rc=|Error" $R/ab_s5.txt
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
