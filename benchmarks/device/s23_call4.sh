#!/usr/bin/env bash
# Session 23, call 4 (nvidia-h200; carry .whl and .snap): the cached cases at 2048-token segments
# with this code (8k and 128k; the rows in ttft_h200.json at 2048 tokens are sessions 4-5's),
# prefix_cache against hypic in one process.
set -u
source benchmarks/device/_setup.sh s23c4
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 540 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 8192,131072 --segment-tokens 2048 --num-requests 5 --cold-requests 1 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 1.5 --max-seconds 400 --json $R/ttft_2048.json > $R/ttft_2048_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_2048_stdout.txt; pack
grep -hE "^(all_hit|rag) |rc=|Error|done|skipped" $R/ttft_2048_stdout.txt | cut -c1-220
python3 -c "
import json; d=json.load(open('$R/ttft_2048.json'))
for r in d['results']:
    print(r['case'], r['mode'], r['prompt_tokens'], r['segment_tokens'], r.get('ttft_p50_ms'), r.get('floor_ms'), r.get('live_tokens_mean'), r.get('token_hit_rate', r.get('hit_rate')), (r.get('error') or '')[-300:])
print(d.get('skipped'))
"
echo "call done after $(( $(date +%s) - T0 )) s"
