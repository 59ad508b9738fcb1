#!/usr/bin/env bash
# Session 13, call 1 (nvidia-h200, .whl carried), packed into $OUT/s13c1.tgz:
#   1. CUDA tests of the fused chain kernel (tf32x3 and bf16x3);
#   2. one dense scan step, seven ways (bf16x3 and fp16x3 added);
#   3. one linear layer at the all-hit shape: fused scan in tf32x3 / bf16x3 / tf32;
#   4. all-hit 32k and 8k with per-layer host/GPU timelines (no profiler), tf32x3 then bf16x3
#      (one process each).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s13c1.tgz -C $R .; }
timeout 100 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 90 -k "cuda" \
  tests/ops/linear/test_chain_forward.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
(cd benchmarks && timeout 80 python3 scan_step_h200.py --out $R --steps 64) > $R/scan_step_stdout.txt 2>&1
echo "scan_step rc=$? after $(( $(date +%s) - T0 )) s" >> $R/scan_step_stdout.txt; pack
(cd benchmarks && timeout 100 python3 chain_forward_h200.py --out $R --bodies 64,16) > $R/chain_stdout.txt 2>&1
echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt; pack
timeout 170 python3 benchmarks/allhit_ab_h200.py --tag s13c1_tf32x3 --prompts 32768,8192 --repeats 6 --timeline \
  --no-profile --out $R > $R/ab_tf32x3.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_tf32x3.txt; pack
LEFT=$(( 560 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && HYPIC_SCAN_PRECISION=bf16x3 timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s13c1_bf16x3 \
  --prompts 32768,8192 --repeats 6 --timeline --no-profile --out $R > $R/ab_bf16x3.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_bf16x3.txt; pack
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-200 | tail -12
tail -32 $R/scan_step_stdout.txt | cut -c1-200
tail -5 $R/chain_stdout.txt | cut -c1-300
for f in $R/ab_tf32x3.txt $R/ab_bf16x3.txt; do
  echo "== $f"; grep -E "^ttft|rc=" $f
  grep -h "^{" $f | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l); print({k: d.get(k) for k in ('prompt_tokens', 'ttft_p50_ms', 'first_allhit_ms', 'plan_p50_ms')})"
done
head -60 $R/ab_tf32x3.txt | grep -v "^{" | cut -c1-120
echo "call done after $(( $(date +%s) - T0 )) s"
