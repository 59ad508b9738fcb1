#!/usr/bin/env bash
# Session 8, call 4 (nvidia-h200, .whl carried; the last ~10 device minutes):
#   1. CUDA tests, the PIC runner first (as in call 3, where the start-up capture test that ran
#      after it found no graphs): now both assert that no phase failed to capture, and print why;
#   2. TTFT at 8k (all_hit, rag; prefix_cache and hypic): call 3 ran out of time before 8k rag;
#   3. cold 32k (full_recompute, hypic inline + standalone) with cold writes taken as a slice.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 170 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 160 tests/engine/test_pic_runner_cuda.py \
  tests/engine/test_cuda_graphs.py > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
timeout 140 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag --query-tokens 64 \
  --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress --prompt-tokens 8192 --segment-tokens 512 \
  --num-requests 8 --cold-requests 3 --store-bytes 36GiB --warmup-requests 2 --corpus-factor 3 \
  --json $R/ttft_h200_8k.json > $R/ttft8k_stdout.txt 2>&1
echo "ttft8k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft8k_stdout.txt
LEFT=$(( 470 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold --prompt-tokens 32768 \
  --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
  --json $R/ttft_h200_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=|Error|assert" $R/pytest_gpu.txt | cut -c1-300 | tail -20
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft8k_stdout.txt
grep -E "^cold |rc=|Error" $R/cold32k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
