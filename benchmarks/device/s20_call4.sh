#!/usr/bin/env bash
# Session 20, call 4 (nvidia-h200; carry .whl and .snap; the session's last ~400 s of device
# time): the TTFT command's RAG case at 32k (prefix_cache against hypic, one process) with
# HYPIC_FRESH_GRAPHS=auto, the default since call 3 (a forward of >= 512 live tokens on a new
# layout runs its cores eagerly: RAG 32k requests 79.16 vs 82.16 ms in call 3's A/B).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s20c4.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout ${LIMIT_S:-290} python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768 --segment-tokens 512 --num-requests 8 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_rag32k.json > $R/ttft_rag32k_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_rag32k_stdout.txt; pack
grep -hE "^(rag) |rc=|Error" $R/ttft_rag32k_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
