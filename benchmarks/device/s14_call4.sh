#!/usr/bin/env bash
# Session 14, call 4 (nvidia-h200, .whl carried): the written bodies' summaries by hypic's span
# summary kernel (HYPIC_SPAN_SUMMARY=triton, the new default) beside the long-span chain walk:
# cold 32k TTFT, the new kernels' CUDA tests, then one layer's kernels (chain_long_h200.py).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s14c4.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 210 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
  --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
  --no-progress --json $R/ttft_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack
timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/ops/linear/test_chain_forward.py \
  -k "span_summary_kernel_matches_reference_on_cuda or (summarize_on_cuda and triton)" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 440 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && (cd benchmarks && timeout $LEFT python3 chain_long_h200.py --out $R --segments 64 \
  > $R/chain_long_stdout.txt 2>&1; echo "chain_long rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_long_stdout.txt)
pack
grep -E "^(cold) |rc=|Error|error" $R/cold32k_stdout.txt | cut -c1-250
tail -6 $R/pytest_cuda.txt
tail -6 $R/chain_long_stdout.txt | cut -c1-250
echo "call done after $(( $(date +%s) - T0 )) s"
