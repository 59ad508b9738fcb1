#!/usr/bin/env bash
# Session 9, call 1 (nvidia-h200, .whl carried):
#   1. every CUDA test file (benchmarks/device/cuda_tests.sh): session 8's changes made after its
#      last device call (graph pool, merge kernel, small-cat gathers, test_engine_cuda) run on a GPU
#      for the first time;
#   2. TTFT at 8k (all_hit, rag; prefix_cache and hypic): the RAG 8k ratio was last measured in
#      session 7.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
bash benchmarks/device/cuda_tests.sh $R 270 > /dev/null 2>&1
echo "tests done after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
LEFT=$(( 500 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag --query-tokens 64 \
  --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress --prompt-tokens 8192 --segment-tokens 512 \
  --num-requests 8 --cold-requests 3 --store-bytes 36GiB --warmup-requests 2 --corpus-factor 3 \
  --json $R/ttft_h200_8k.json > $R/ttft8k_stdout.txt 2>&1
echo "ttft8k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft8k_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=|done after" $R/pytest_cuda.txt | cut -c1-200 | grep -v PASSED | tail -40
grep -c PASSED $R/pytest_cuda.txt
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft8k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
