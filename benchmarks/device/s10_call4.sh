#!/usr/bin/env bash
# Session 10, call 4 (nvidia-h200, .whl carried):
#   1. the engine on CUDA against the CPU (graphs in prefill and decode; call 3 ran out of time
#      compiling it), now with the per-forward graphs of the linear cores;
#   2. the TTFT benchmark's 32k all_hit + rag cases (prefix_cache, hypic) on the new default.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 170 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 160 \
  tests/engine/test_engine_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
LEFT=$(( 460 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_32k.json > $R/ttft32k_stdout.txt 2>&1
echo "ttft32k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft32k_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-250 | tail -10
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft32k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
