#!/usr/bin/env bash
# Session 5, call 2 (.whl and .ab_old carried; .ab_old = `git archive 169d38f hypic`, session 4's
# final code). Two GPUs when lent, else one after the other:
#   A: GPU tests of the new paths (cuDNN attention, fla paths, compiled glue), then the all-hit
#      A/B: session 4's package, then this one (benchmarks/allhit_ab_h200.py);
#   B: the cold 32k case (full_recompute, hypic inline + standalone), then TTFT part 3 (all_hit
#      and rag at 32k and 8k, prefix_cache and hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
END=${CALL_END:-540}
part_a() {
  export PYTHONPATH=/tmp/site:$PWD
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_attention_cudnn.py tests/ops/linear/test_fla_paths.py \
    tests/ops/test_fused.py tests/ops/test_attention_flash.py > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
  PYTHONPATH=/tmp/site:$PWD/.ab_old timeout 130 python3 benchmarks/allhit_ab_h200.py --tag old --out $R > $R/ab_old.txt 2>&1
  echo "ab old rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_old.txt
  timeout 130 python3 benchmarks/allhit_ab_h200.py --tag new --out $R > $R/ab_new.txt 2>&1
  echo "ab new rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_new.txt
}
part_b() {
  export PYTHONPATH=/tmp/site:$PWD
  timeout 230 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
    --json $R/ttft_h200_cold32k.json --plot-dir $R/ttft_h200_cold32k_plots > $R/cold_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_stdout.txt
  left=$(( END - ($(date +%s) - T0) ))
  OUT=$R TTFT_MAX_SECONDS=$(( left - 120 )) timeout $left bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_a; part_b
fi
tail -4 $R/pytest_gpu.txt; grep -E "prompt_tokens|rc=|Error" $R/ab_old.txt $R/ab_new.txt
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold_stdout.txt $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
