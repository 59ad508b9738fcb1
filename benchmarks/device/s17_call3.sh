#!/usr/bin/env bash
# Session 17, call 3 (nvidia-h200; carry .whl and .snap): call 2's side stream waited for the
# walk to finish (its mark came after the walk was queued), so T ran beside the output kernel
# alone and gained nothing; now T's side stream starts from a mark set before the walk. One
# layer's cold write with T beside and in line; cold 32k TTFT; the CUDA tests; a cold 128k
# request in the time left (no out-of-memory with the new T path).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s17c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
(cd benchmarks && timeout 210 python3 cold_write_h200.py --out $R > $R/cold_write_stdout.txt 2>&1
 echo "cold_write rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_write_stdout.txt); pack
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 120 ] && { timeout 250 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
  --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
  --no-progress --json $R/ttft_cold32k.json > $R/cold32k_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack; }
timeout 200 python3 -m pytest -p no:cacheprovider -v tests/ops/linear/test_transition.py \
  tests/ops/linear/test_state_summary.py -k cuda > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 80 ] && { timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes hypic --cases cold \
  --prompt-tokens 131072 --segment-tokens 2048 --query-tokens 64 --cold-requests 1 --store-bytes 20GiB \
  --no-progress --json $R/ttft_cold128k.json > $R/cold128k_stdout.txt 2>&1
  echo "cold128k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold128k_stdout.txt; pack; }
grep -A 3 "^ bias" $R/cold_write_stdout.txt | cut -c1-250
tail -n 2 $R/cold_write_stdout.txt | cut -c1-200
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-160
grep -hE "^(cold) |rc=|Error" $R/cold32k_stdout.txt $R/cold128k_stdout.txt 2>/dev/null | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
