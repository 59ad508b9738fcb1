#!/usr/bin/env bash
# Session 24, call 2 (nvidia-h200; carry .whl and .snap): the all-hit 32k acceptance point again
# at this session's head (hypic alone, 16 requests), then the host/GPU timeline of the same
# prompt (allhit_ab_h200.py --timeline), to place the time before layer 0 on this machine.
set -u
source benchmarks/device/_setup.sh s24c2
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 300 python3 -m hypic bench ttft "${MODEL[@]}" --modes hypic --cases all_hit --query-tokens 64 \
  --no-progress --prompt-tokens 32768 --segment-tokens 512 --num-requests 16 --cold-requests 1 \
  --store-bytes 36GiB --json $R/ttft_allhit_32k.json > $R/ttft_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_stdout.txt; pack
grep -hE "^(all_hit|cold) |rc=|Error" $R/ttft_stdout.txt | cut -c1-220
(cd benchmarks && timeout $(left 520) python3 allhit_ab_h200.py --tag s24c2 --out $R --prompts 32768 --repeats 6 \
   --no-profile --timeline > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
tail -25 $R/ab_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
