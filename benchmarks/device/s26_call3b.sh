#!/usr/bin/env bash
# Session 26, call 3b (nvidia-h200; carry .whl and .snap): call 3's first step alone (the device
# time left after three failed starts): the all-hit 32k acceptance point at this session's head.
set -u
source benchmarks/device/_setup.sh s26c3
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 240 python3 -m hypic bench ttft "${MODEL[@]}" --modes hypic --cases all_hit --query-tokens 64 --no-progress \
  --prompt-tokens 32768 --segment-tokens 512 --num-requests 16 --cold-requests 1 --store-bytes 36GiB \
  --json $R/ttft_allhit_32k.json > $R/ttft_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_stdout.txt; pack
grep -hE "^(all_hit|cold) |rc=|Error" $R/ttft_stdout.txt | cut -c1-220
