#!/usr/bin/env bash
# Session 7, call 3 (nvidia-h200, .whl carried). Call 2 found: CUDA graphs never ran (device
# "cuda" vs "cuda:0"), the address-table scan slower per layer (a pointer read from memory, two
# dependent scalar loads per step) and RAG requests compiling new kernel variants (index slices
# at varying 8/16-byte alignment). This call checks the fixes:
#   1. CUDA tests: graphs (single and multi-phase), the PIC runner on CUDA vs CPU, the scan;
#   2. TTFT part 3 (all_hit and rag, 32k then 8k, prefix_cache and hypic);
#   3. all-hit A/B at 32k and 8k (profile, op census);
#   4. the scan kernel alone at the all-hit 32k shape (cat path vs table path).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 100 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 80 tests/engine/test_cuda_graphs.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_fla_paths.py -k "graph or cuda or scan" \
  > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
OUT=$R TTFT_MAX_SECONDS=150 timeout 200 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
timeout 130 python3 benchmarks/allhit_ab_h200.py --tag s7c3 --census --out $R > $R/ab_s7c3.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s7c3.txt
(cd benchmarks && timeout 40 python3 scan_h200.py --out $R) > $R/scan_stdout.txt 2>&1
echo "scan rc=$? after $(( $(date +%s) - T0 )) s" >> $R/scan_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu.txt | cut -c1-200 | tail -30
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
grep -E "^\{|rc=|Error" $R/ab_s7c3.txt | cut -c1-300
tail -3 $R/scan_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
