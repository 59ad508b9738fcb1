#!/usr/bin/env bash
# Session 10, call 3 (nvidia-h200, .whl carried):
#   1. CUDA tests of the per-forward graphs of the linear cores (hypic.graphs.layer_graphs) in the
#      PIC runner against the CPU, the row-wise graphs and the engine on CUDA;
#   2. benchmarks/host_time_h200.py, HYPIC_LAYER_GRAPHS=1 then 0 per prompt size (8k, 32k all-hit);
#   3. the TTFT benchmark's 8k all_hit + rag cases (prefix_cache, hypic) on the new default.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 170 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 160 \
  tests/engine/test_pic_runner_cuda.py tests/engine/test_layer_graphs.py tests/engine/test_cuda_graphs.py \
  tests/engine/test_engine_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
timeout 200 python3 benchmarks/host_time_h200.py --out $R > $R/host_time_stdout.txt 2>&1
echo "host_time rc=$? after $(( $(date +%s) - T0 )) s" >> $R/host_time_stdout.txt
LEFT=$(( 540 - ($(date +%s) - T0) ))
[ $LEFT -gt 90 ] && timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_8k.json > $R/ttft8k_stdout.txt 2>&1
echo "ttft8k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft8k_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | grep -v PASSED | cut -c1-250 | tail -20
grep -c PASSED $R/pytest_cuda.txt
grep -v Warning $R/host_time_stdout.txt | tail -48
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft8k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
