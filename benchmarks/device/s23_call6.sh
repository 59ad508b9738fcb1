#!/usr/bin/env bash
# Session 23, call 6 (nvidia-h200; carry .whl and .snap): all-hit 128k in 512-token segments with
# the in-place write headroom (IN_PLACE_PEAK_FACTOR; call 5 hit 0.93 of the tokens); hypic alone
# (prefix_cache, which this change does not touch, is call 5's row).
set -u
source benchmarks/device/_setup.sh s23c6
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 500 python3 -m hypic bench ttft "${MODEL[@]}" --modes hypic --cases all_hit \
  --query-tokens 64 --no-progress --prompt-tokens 131072 --segment-tokens 512 --num-requests 4 --cold-requests 1 \
  --store-bytes 40GiB --json $R/ttft_128k_512.json > $R/ttft_128k_512_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_128k_512_stdout.txt; pack
grep -hE "^(all_hit|rag) |rc=|Error|done|skipped" $R/ttft_128k_512_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
