#!/usr/bin/env bash
# Session 22, call 5 (nvidia-h200; carry .whl and .snap): call 3's TTFT command again on
# whatever machine is lent next: calls 2 and 3 ran on one machine whose host planned ~1.4-1.9x
# slower than session 21 call 3's (plan p50 1.06-1.19 against 0.78 ms at 32k), which a cached
# request's host-bound parts pay.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r5; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s22c5.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 380 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768,8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_cached.json > $R/ttft_cached_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_cached_stdout.txt; pack
grep -hE "^(all_hit|rag) |rc=|Error|done" $R/ttft_cached_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
