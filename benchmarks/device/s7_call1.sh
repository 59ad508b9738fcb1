#!/usr/bin/env bash
# Session 7, call 1 (nvidia-h200, .whl carried): the landed code of session 6 measured alone on
# the machine, one step after the other (no host-bound row beside other work):
#   1. the CUDA tests of split-KV attention (its in-place merge had not run on a GPU), short
#      spans and the chain scan;
#   2. TTFT part 3: all_hit and rag at 32k then 8k, prefix_cache and hypic;
#   3. the all-hit A/B script at 32k with the op census (aten ops per issuing hypic line).
# Files stay under $OUT/r so a run cut off by its limit still returns what it wrote.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 100 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 60 tests/ops/test_attention_split.py \
  tests/ops/linear/test_short_span.py tests/ops/linear/test_summary.py -k "cuda or interpreter" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
OUT=$R TTFT_MAX_SECONDS=170 timeout 300 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
timeout 150 python3 benchmarks/allhit_ab_h200.py --tag s7c1 --prompts 32768 --census --out $R > $R/ab_s7c1.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s7c1.txt
grep -E "PASS|FAIL|ERROR|rc=" $R/pytest_gpu.txt | cut -c1-150 | tail -30
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
grep -E "^\{|rc=|Error" $R/ab_s7c1.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
