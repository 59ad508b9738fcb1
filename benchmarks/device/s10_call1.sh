#!/usr/bin/env bash
# Session 10, call 1 (nvidia-h200, .whl carried):
#   1. the CUDA tests of session 9's cold-summary path (HYPIC_COLD_SUMMARIES=states, never run on a
#      GPU) and the PIC runner against the CPU;
#   2. benchmarks/cold_summaries_h200.py: full_recompute, states, scan at 512/500-token segments,
#      plus the two paths' written T/S difference;
#   3. the TTFT benchmark's cold 32k case with HYPIC_COLD_SUMMARIES=states (full_recompute,
#      hypic inline + standalone).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 200 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 180 \
  "tests/ops/linear/test_fla_paths.py::test_forward_of_runs_with_span_summaries" \
  tests/engine/test_pic_runner_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
timeout 200 python3 benchmarks/cold_summaries_h200.py --out $R > $R/cold_summaries_stdout.txt 2>&1
echo "cold_summaries rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_summaries_stdout.txt
LEFT=$(( 560 - ($(date +%s) - T0) ))
[ $LEFT -gt 100 ] && HYPIC_COLD_SUMMARIES=states timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold --prompt-tokens 32768 \
  --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
  --json $R/ttft_h200_cold32k_states.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-250 | tail -20
tail -25 $R/cold_summaries_stdout.txt
grep -E "^cold |rc=|Error" $R/cold32k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
