#!/usr/bin/env bash
# Session 8, call 1 (nvidia-h200, .whl carried): session 7's final code (dcf41bf) on the GPU.
#   1. CUDA tests (graphs, PIC runner on CUDA vs CPU, scan and short-span kernels);
#   2. cold 32k rerun (full_recompute, hypic inline + standalone): MFU, summary cost, standalone
#      speed-up after session 7's scan and layout changes;
#   3. the scan kernel alone at the all-hit shape (baseline for this session's scan work).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 100 tests/engine/test_cuda_graphs.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_fla_paths.py tests/ops/linear/test_short_span.py \
  -k "graph or cuda or scan" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
timeout 240 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
  --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold --prompt-tokens 32768 \
  --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress \
  --json $R/ttft_h200_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt
(cd benchmarks && timeout 60 python3 scan_h200.py --out $R) > $R/scan_stdout.txt 2>&1
echo "scan rc=$? after $(( $(date +%s) - T0 )) s" >> $R/scan_stdout.txt
grep -E "PASS|FAIL|ERROR|rc=|Error" $R/pytest_gpu.txt | cut -c1-200 | tail -40
grep -E "^cold |rc=|Error|overhead" $R/cold32k_stdout.txt
tail -5 $R/scan_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
