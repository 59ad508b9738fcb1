#!/usr/bin/env bash
# Session 8, call 2 (nvidia-h200, .whl carried): the fused chain forward (live spans applied from
# their WY factors inside the scan, no live summaries, no separate state pass).
#   1. CUDA tests of the fused kernel and op, then the PIC runner on CUDA vs CPU;
#   2. one layer at the all-hit shape, separate vs fused (benchmarks/chain_forward_h200.py);
#   3. TTFT part 3 (all_hit and rag, 32k then 8k, prefix_cache and hypic);
#   4. the remaining CUDA tests (graphs, scan kernels, short-span kernels) with what time is left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
PT=(python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 120)
timeout 120 "${PT[@]}" tests/ops/linear/test_chain_forward.py tests/engine/test_pic_runner_cuda.py -k "cuda or fla_path" \
  > $R/pytest_gpu.txt 2>&1
echo "pytest1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
(cd benchmarks && timeout 70 python3 chain_forward_h200.py --out $R) > $R/chain_stdout.txt 2>&1
echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt
OUT=$R TTFT_MAX_SECONDS=120 timeout 220 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
LEFT=$(( 570 - ($(date +%s) - T0) ))
timeout $LEFT "${PT[@]}" tests/engine/test_cuda_graphs.py tests/ops/linear/test_fla_paths.py tests/ops/linear/test_short_span.py \
  -k "cuda or scan" > $R/pytest_gpu2.txt 2>&1
echo "pytest2 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu2.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu.txt | cut -c1-200 | tail -20
tail -6 $R/chain_stdout.txt | cut -c1-300
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu2.txt | cut -c1-200 | tail -40
echo "call done after $(( $(date +%s) - T0 )) s"
