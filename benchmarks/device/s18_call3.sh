#!/usr/bin/env bash
# Session 18, call 3 (nvidia-h200; carry .whl and .snap): the runner's CUDA tests (the store
# entries filled layer by layer on a side stream, the graphs kept across forwards); the cold 32k
# request under each HYPIC_ENTRY_WRITES mode (side / inline / after, the last the former
# post-forward copy) against full_recompute, interleaved in one process (call 2's cold TTFT could
# not tell the side stream's effect from the faster walk's); the final code's TTFT of the cached
# cases (all_hit and rag at 32k and 8k, prefix_cache against hypic) in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s18c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 110 python3 -m pytest -p no:cacheprovider -v tests/engine/test_pic_runner_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
(cd benchmarks && timeout 170 python3 cold_diff_h200.py --out $R --ab-env HYPIC_ENTRY_WRITES --ab-values side,inline,after \
  --ab-rounds 4 --no-profile > $R/cold_ab_stdout.txt 2>&1
 echo "cold_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_ab_stdout.txt); pack
LEFT=$(( 530 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768,8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_cached.json > $R/ttft_cached_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_cached_stdout.txt; pack
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-160
grep -E "cold A/B|rc=|Error" $R/cold_ab_stdout.txt | cut -c1-300
grep -hE "^(all_hit|rag) |rc=|Error" $R/ttft_cached_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
