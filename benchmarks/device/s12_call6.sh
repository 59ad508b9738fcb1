#!/usr/bin/env bash
# Session 12, call 6 (nvidia-h200, .whl carried): the scan's tf32x3 products as three independent
# TF32 products (fp32_dot), packed into $OUT/s12c6.tgz:
#   1. CUDA test of the fused scan against float64;
#   2. one linear layer at the all-hit shape (chain_forward_h200.py, 64 bodies);
#   3. the TTFT benchmark's 32k all_hit + rag cases (prefix_cache, hypic), in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s12c6.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 60 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 50 \
  "tests/ops/linear/test_chain_forward.py::test_fused_kernel_matches_reference_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
(cd benchmarks && timeout 90 python3 chain_forward_h200.py --out $R --bodies 64 --repeats 20) > $R/chain_stdout.txt 2>&1
echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt; pack
LEFT=$(( 250 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_32768.json > $R/ttft32768_stdout.txt 2>&1
echo "ttft32768 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft32768_stdout.txt; pack
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-200
tail -4 $R/chain_stdout.txt | cut -c1-200
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft32768_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
