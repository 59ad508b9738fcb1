#!/usr/bin/env bash
# Session 6, call 2 (.whl carried): measurements of this session's code. Two GPUs when lent:
#   GPU 0: GPU tests (split-KV attention, short-span summaries, GDN fla paths; -v), then the
#          all-hit A/B of the attention kernel: flex (HYPIC_ATTENTION_IMPL=flex, 32k) against the
#          automatic choice (split-KV; 32k and 8k), each with its profile;
#   GPU 1: a CUDA check of the split-KV kernel (if it fails, the TTFT rows run with flex), the
#          cold 32k case (default summary precision, now tf32), then TTFT part 3 (all_hit and rag
#          at 32k and 8k, prefix_cache and hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
part_a() {
  timeout 150 python3 -m pytest -v -p no:cacheprovider tests/ops/test_attention_split.py \
    tests/ops/linear/test_short_span.py tests/ops/linear/test_fla_paths.py \
    -k "not (delta and not gated) and not kda and not gla and not mamba2" > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
  HYPIC_ATTENTION_IMPL=flex timeout 150 python3 benchmarks/allhit_ab_h200.py --tag s6_flex --prompts 32768 \
    --out $R > $R/ab_s6_flex.txt 2>&1
  echo "ab flex rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s6_flex.txt
  timeout 190 python3 benchmarks/allhit_ab_h200.py --tag s6_split --out $R > $R/ab_s6_split.txt 2>&1
  echo "ab split rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s6_split.txt
}
part_b() {
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/ops/test_attention_split.py -k cuda > $R/split_check.txt 2>&1
  rc=$?; echo "split check rc=$rc after $(( $(date +%s) - T0 )) s" >> $R/split_check.txt
  if (( rc != 0 )); then export HYPIC_ATTENTION_IMPL=flex; fi
  timeout 170 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
    --json $R/ttft_h200_cold32k.json --plot-dir $R/ttft_h200_cold32k_plots > $R/cold_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_stdout.txt
  OUT=$R TTFT_MAX_SECONDS=150 timeout 250 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_b
fi
grep -E "PASS|FAIL|ERROR|rc=" $R/pytest_gpu.txt | cut -c1-150 | tail -40
cat $R/split_check.txt | tail -3
grep -E "^\{|rc=|Error" $R/ab_s6_flex.txt $R/ab_s6_split.txt | cut -c1-400
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold_stdout.txt $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
