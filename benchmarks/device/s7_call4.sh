#!/usr/bin/env bash
# Session 7, call 4 (nvidia-h200, .whl carried; the last device minutes): the final code.
# CUDA graph outputs shared per phase (memory), every bucket captured at runner start-up (no
# capture inside a measured request), one graph set per process.
#   1. CUDA tests: graphs, the PIC runner on CUDA vs CPU, the scan kernels against torch;
#   2. TTFT part 3 (all_hit and rag, 32k then 8k, prefix_cache and hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 100 tests/engine/test_cuda_graphs.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_fla_paths.py -k "graph or cuda or scan" \
  > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
OUT=$R TTFT_MAX_SECONDS=150 timeout 230 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu.txt | cut -c1-200 | tail -30
grep -E "^(all_hit|rag) |rc=|Error|done" $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
