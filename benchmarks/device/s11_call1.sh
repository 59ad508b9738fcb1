#!/usr/bin/env bash
# Session 11, call 1 (nvidia-h200, .whl carried):
#   1. CUDA tests of the row-block MoE kernel (hypic.ops.moe_rows) and the MoE paths;
#   2. benchmarks/moe_rows_h200.py: tile sweep, then grouped vs rows per token count;
#   3. all-hit A/B in one process, HYPIC_MOE_IMPL=grouped then auto (rows), 32k and 8k, timings
#      only, with Triton's autotuning and dynamo's recompiles logged (what the first all-hit
#      request of a shape spends its time on).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 140 \
  tests/ops/test_moe_rows.py tests/ops/test_moe_grouped.py tests/ops/test_moe.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
(cd benchmarks && timeout 200 python3 moe_rows_h200.py --out $R) > $R/moe_rows_stdout.txt 2>&1
echo "moe_rows rc=$? after $(( $(date +%s) - T0 )) s" >> $R/moe_rows_stdout.txt
LEFT=$(( 560 - ($(date +%s) - T0) ))
TRITON_PRINT_AUTOTUNING=1 TORCH_LOGS=recompiles timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s11c1 \
  --prompts 32768,8192 --moe-impls grouped,auto --repeats 6 --no-profile --out $R > $R/ab_stdout.txt 2> $R/ab_stderr.txt
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | grep -v PASSED | cut -c1-250 | tail -20
grep -c PASSED $R/pytest_cuda.txt
cat $R/moe_rows_stdout.txt | tail -20
cat $R/ab_stdout.txt
grep -iE "autotuning|recompil|finished after" $R/ab_stderr.txt | cut -c1-200 | head -40
tail -5 $R/ab_stderr.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
