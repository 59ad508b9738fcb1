#!/usr/bin/env bash
# Session 8, call 3 (nvidia-h200, .whl carried): graph replays return views (no clone per output),
# partial rotary converts only the rotated dims, plus call 2's fused chain forward.
#   1. CUDA tests: the PIC runner on CUDA vs CPU (timed out in call 2 while compiling: 240 s now),
#      the graph tests (new: outputs are views);
#   2. TTFT part 3 (all_hit and rag, 32k then 8k, prefix_cache and hypic);
#   3. all-hit profile and op census at 32k and 8k.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 200 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 190 tests/engine/test_pic_runner_cuda.py \
  tests/engine/test_cuda_graphs.py > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
OUT=$R TTFT_MAX_SECONDS=150 timeout 250 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
LEFT=$(( 575 - ($(date +%s) - T0) ))
timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s8c3 --census --repeats 6 --out $R > $R/ab_s8c3.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s8c3.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu.txt | cut -c1-200 | tail -20
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
grep -E "^\{|rc=|Error" $R/ab_s8c3.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
