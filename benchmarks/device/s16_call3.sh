#!/usr/bin/env bash
# Session 16, call 3 (nvidia-h200; carry .whl and .snap): after call 2's kernel table, the
# derivation kernel reads T in column blocks (it took 0.27 ms a layer as one tile) and a chain of
# live spans alone is also tuned over three-stage pipelines. One layer's cold write per mode under
# two gate regimes, with float64 checks (cold_write_h200.py); the new kernels' CUDA tests; cold
# 32k TTFT (walk, the default); then 8k all_hit + rag TTFT in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s16c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
(cd benchmarks && timeout 150 python3 cold_write_h200.py --out $R > $R/cold_write_stdout.txt 2>&1
 echo "cold_write rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_write_stdout.txt); pack
timeout 80 python3 -m pytest -p no:cacheprovider -q tests/ops/linear/test_state_summary.py -k cuda \
  > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
timeout 230 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
  --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
  --no-progress --json $R/ttft_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 70 ] && { timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic \
  --cases all_hit,rag --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 \
  --no-progress --prompt-tokens 8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_8192.json > $R/ttft8192_stdout.txt 2>&1
  echo "ttft8192 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft8192_stdout.txt; pack; }
grep -A 3 "^ bias" $R/cold_write_stdout.txt | cut -c1-200
tail -n 2 $R/cold_write_stdout.txt $R/pytest_cuda.txt | cut -c1-200
grep -hE "^(all_hit|rag|cold) |rc=|Error" $R/cold32k_stdout.txt $R/ttft8192_stdout.txt 2>/dev/null | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
