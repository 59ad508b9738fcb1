#!/usr/bin/env bash
# Session 13, call 4 (nvidia-h200, .whl carried), the final code, packed into $OUT/s13c4.tgz:
#   1. the TTFT benchmark's cold 32k case (full_recompute, hypic inline and standalone): the
#      summary overhead with the bf16x3 chain scan;
#   2. an all-hit 32k profile (where the GPU time goes now), in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s13c4.tgz -C $R .; }
timeout 300 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
  --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold --prompt-tokens 32768 \
  --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
  --json $R/ttft_h200_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack
LEFT=$(( 500 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s13c4 --prompts 32768 --repeats 4 \
  --out $R > $R/ab_stdout.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt; pack
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/cold32k_stdout.txt
grep -E "rc=" $R/ab_stdout.txt
grep -A22 "all-hit 32768 (" $R/allhit_ab_s13c4_profile.txt | cut -c1-62,100-140
grep -E "Self CUDA time total" $R/allhit_ab_s13c4_profile.txt
echo "call done after $(( $(date +%s) - T0 )) s"
