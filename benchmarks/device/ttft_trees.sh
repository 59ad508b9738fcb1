#!/usr/bin/env bash
# The cached TTFT of hypic (all_hit and rag) under several commits, one process per commit, in one
# call: for a regression's bisection (session 19: hypic's RAG requests took 83-88 ms at 32k and
# 45.5 at 8k in sessions 13-16, 96-97 / 50.6 since session 18, all-hit unchanged or faster).
# Prepare the trees here (commit first):
#     for c in 3a5c1e2 e0ce11a a678143 HEAD; do git archive --format=tar.gz -o .snap/tree_$(git rev-parse --short $c).tgz $c; done
# then run on the device (carry .whl and .snap; the trees' tgz files, ~15 MB each, must fit carry's 64 MiB):
#     bash benchmarks/device/ttft_trees.sh            # PROMPT=8192 by default
# Each tree's rows go to $OUT/ttft_trees/<tree>.json and its stdout beside it. Later processes
# reuse the Triton and inductor caches of earlier ones (same machine), so they compile less.
# ``SMOKE=1``: the embedded tiny model on the CPU (this script's plumbing, anywhere).
set -u
PROMPT=${PROMPT:-8192}
R=${OUT:-/tmp/out}/ttft_trees; mkdir -p $R
HERE=$PWD
if [ "${SMOKE:-0}" = 1 ]; then
  MODEL=(--model tiny --device cpu); SIZES=(--prompt-tokens 256 --segment-tokens 32 --doc-tokens 16,64 --system-tokens 16
    --rag-query-tokens 4,8 --query-tokens 8)
else
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0)
  SIZES=(--prompt-tokens $PROMPT --segment-tokens 512 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64
    --query-tokens 64 --store-bytes 36GiB)
fi
T0=$(date +%s)
for tgz in "$HERE"/.snap/tree_*.tgz; do
  name=$(basename "$tgz" .tgz)
  rm -rf /tmp/$name && mkdir -p /tmp/$name && tar xzf "$tgz" -C /tmp/$name
  (cd /tmp/$name && PYTHONPATH=${PYTHONPATH:-}:/tmp/$name timeout ${PER_TREE_S:-240} python3 -m hypic bench ttft "${MODEL[@]}" \
     --seam 8 --modes hypic --cases ${CASES:-all_hit,rag} "${SIZES[@]}" --num-requests 8 --cold-requests 1 --warmup-requests 2 \
     --corpus-factor 3 --no-progress --json $R/$name.json > $R/$name.txt 2>&1
   echo "rc=$? after $(( $(date +%s) - T0 )) s" >> $R/$name.txt)
  grep -hE "^(all_hit|rag) |rc=" $R/$name.txt | sed "s/^/$name /" | cut -c1-200
done
