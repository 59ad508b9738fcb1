#!/usr/bin/env bash
# Session 7, call 2 (nvidia-h200, .whl carried): the chain scan reading cached bodies in place
# (address table, only the used incoming states written) and CUDA graphs of the MoE blocks.
#   1. CUDA tests: graphs, the PIC runner on CUDA against CPU, the scan kernels;
#   2. the scan kernel alone at the all-hit 32k shape (cat path vs table path);
#   3. the all-hit A/B script (32k and 8k, op census);
#   4. TTFT part 3 (all_hit and rag, 32k then 8k, prefix_cache and hypic).
# Files stay under $OUT/r so a run cut off by its limit still returns what it wrote.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 90 tests/engine/test_cuda_graphs.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_fla_paths.py -k "graph or cuda or scan or interpreter" \
  > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
(cd benchmarks && timeout 60 python3 scan_h200.py --out $R) > $R/scan_stdout.txt 2>&1
echo "scan rc=$? after $(( $(date +%s) - T0 )) s" >> $R/scan_stdout.txt
timeout 170 python3 benchmarks/allhit_ab_h200.py --tag s7c2 --census --out $R > $R/ab_s7c2.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s7c2.txt
OUT=$R TTFT_MAX_SECONDS=150 timeout 250 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=" $R/pytest_gpu.txt | cut -c1-150 | tail -30
cat $R/scan_stdout.txt | tail -3
grep -E "^\{|rc=|Error" $R/ab_s7c2.txt | cut -c1-400
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
