#!/usr/bin/env bash
# Session 14, call 2 (nvidia-h200, .whl carried): the chain kernel walking long live spans
# (HYPIC_CHAIN_LONG=fused, the new default) against the former summaries-scan-state-pass path
# (HYPIC_CHAIN_LONG=scan), one process each: cold 32k TTFT (summary overhead, standalone),
# the CUDA tests of the chain ops, then the 32k and 8k all_hit + rag TTFT in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s14c2.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
cold() {  # $1 tag, env in the caller
  timeout 150 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
    --no-progress --json $R/ttft_cold32k_$1.json > $R/cold32k_$1_stdout.txt 2>&1
  echo "cold $1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_$1_stdout.txt; pack
}
HYPIC_CHAIN_LONG=fused cold fused
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs -k cuda tests/ops/linear/test_chain_forward.py \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
HYPIC_CHAIN_LONG=scan cold scan
for P in 32768 8192; do
  LEFT=$(( 560 - ($(date +%s) - T0) ))
  [ $LEFT -gt 70 ] || break
  timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $P --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$P.json > $R/ttft${P}_stdout.txt 2>&1
  echo "ttft$P rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft${P}_stdout.txt; pack
done
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/cold32k_*_stdout.txt $R/ttft*_stdout.txt | cut -c1-250
tail -15 $R/pytest_cuda.txt
echo "call done after $(( $(date +%s) - T0 )) s"
