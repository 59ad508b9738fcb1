#!/usr/bin/env bash
# Session 15, call 4 (nvidia-h200; carry .whl and .snap; the last ~330 s of device time): the
# acceptance TTFT at the final code (HYPIC_CHAIN_FUSE_SEAMS=1 the default, the compose mode
# removed): 32k all_hit + rag, then 8k in the time left. Call 3's 32k run ran out of its 170 s
# while its process compiled; this one runs on call 3's machine if it is still warm.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s15c4.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ttft() {  # $1 prompt tokens, $2 timeout
  timeout $2 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $1 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$1.json > $R/ttft$1_stdout.txt 2>&1
  echo "ttft$1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft$1_stdout.txt; pack
}
ttft 32768 215
LEFT=$(( 300 - ($(date +%s) - T0) ))
[ $LEFT -gt 45 ] && ttft 8192 $LEFT
grep -hE "^(all_hit|rag) |rc=|Error" $R/ttft*_stdout.txt | cut -c1-200
echo "call done after $(( $(date +%s) - T0 )) s"
