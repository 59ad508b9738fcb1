#!/usr/bin/env bash
# Session 22, call 2 (nvidia-h200; carry .whl and .snap): the TTFT command's cached cases
# (prefix_cache against hypic; all-hit and the RAG trace; 32k and 8k prompts; one process) with
# short_wy's kernels (the default since c8f94df); then the RAG trace at 8k with HYPIC_SHORT_WY
# triton against fla, interleaved, each on graphs of its own, with a per-layer timeline and a
# profile of one request per value (where an 8k RAG request's time goes beyond its GPU time).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s22c2.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 300 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768,8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_cached.json > $R/ttft_cached_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_cached_stdout.txt; pack
LEFT=$(( 470 - ($(date +%s) - T0) ))
if [ $LEFT -gt 60 ]; then
  (cd benchmarks && timeout $LEFT python3 rag_ab_h200.py --out $R --prompts 8192 --requests 6 --store-bytes 36GiB \
    --ab-settings "HYPIC_SHORT_WY=triton;HYPIC_SHORT_WY=fla" --ab-capture --timeline --profile > $R/rag_ab_stdout.txt 2>&1
   echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
fi
grep -hE "^(all_hit|rag) |rc=|Error|done" $R/ttft_cached_stdout.txt | cut -c1-220
grep -hE "^rag |rc=|Error" $R/rag_ab_stdout.txt 2>/dev/null | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
