#!/usr/bin/env bash
# Session 13, call 5 (nvidia-h200, .whl carried, the machine of call 4 still warm): the final
# code's 32k and 8k all_hit + rag TTFT again (a second process: the run-to-run spread), packed
# into $OUT/s13c5.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r5; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
for P in 32768 8192; do
  LEFT=$(( 520 - ($(date +%s) - T0) ))
  [ $LEFT -gt 60 ] || break
  timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $P --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$P.json > $R/ttft${P}_stdout.txt 2>&1
  echo "ttft$P rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft${P}_stdout.txt
  tar czf $OUT/s13c5.tgz -C $R .
done
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft*_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
