#!/usr/bin/env bash
# Session 12, call 4 (nvidia-h200, .whl carried): the session's final paths (one-pass K/V gather
# at 8 rows x 4 warps, adopted decode caches), packed into $OUT/s12c4.tgz:
#   1. CUDA tests of the gather (the device-name fix);
#   2. the TTFT benchmark's 8k and 32k all_hit + rag cases (prefix_cache, hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 60 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 50 -k "not interpreter" \
  tests/ops/test_kv_gather.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
for P in 8192 32768; do
  timeout 200 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $P --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$P.json > $R/ttft${P}_stdout.txt 2>&1
  echo "ttft$P rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft${P}_stdout.txt
  tar czf $OUT/s12c4.tgz -C $R .
done
tar czf $OUT/s12c4.tgz -C $R .
grep -E "FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-250 | tail -20
grep -c PASSED $R/pytest_cuda.txt
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft*_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
