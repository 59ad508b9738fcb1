#!/usr/bin/env bash
# Session 11, call 2 (nvidia-h200, .whl carried):
#   1. CUDA tests of the row-block MoE kernel (now one program per expert and column tile);
#   2. benchmarks/moe_rows_h200.py: tile sweep, then grouped vs rows as CUDA graph replays;
#   3. all-hit A/B in one process, HYPIC_MOE_IMPL=grouped then auto (rows), 32k and 8k;
#   4. the TTFT benchmark's 32k all_hit + rag cases (prefix_cache, hypic), with the untimed
#      first request of each case.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 100 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 90 \
  tests/ops/test_moe_rows.py tests/ops/test_moe.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
(cd benchmarks && timeout 130 python3 moe_rows_h200.py --out $R) > $R/moe_rows_stdout.txt 2>&1
echo "moe_rows rc=$? after $(( $(date +%s) - T0 )) s" >> $R/moe_rows_stdout.txt
timeout 150 python3 benchmarks/allhit_ab_h200.py --tag s11c2 \
  --prompts 32768,8192 --moe-impls grouped,auto --repeats 6 --no-profile --out $R > $R/ab_stdout.txt 2> $R/ab_stderr.txt
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt
LEFT=$(( 575 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_32k.json > $R/ttft32k_stdout.txt 2>&1
echo "ttft32k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft32k_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | grep -v PASSED | cut -c1-250 | tail -20
grep -c PASSED $R/pytest_cuda.txt
grep -v "^Autotuning\|^with key\|^best config\|^finished\|^Triton autotuning" $R/moe_rows_stdout.txt | tail -16
grep -v "^Autotuning\|^with key\|^best config\|^finished\|^Triton autotuning" $R/ab_stdout.txt
tail -3 $R/ab_stderr.txt | cut -c1-300
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft32k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
