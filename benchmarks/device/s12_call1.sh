#!/usr/bin/env bash
# Session 12, call 1 (nvidia-h200, .whl carried): the chain scan with summaries prefetched one
# element ahead, packed into $OUT/s12c1.tgz:
#   1. the fused scan / bodies-only scan at the all-hit shape under each HYPIC_SCAN_PREFETCH;
#   2. CUDA tests of the scan paths;
#   3. all-hit 32k and 8k TTFT, one process per prefetch setting (graphs are shared per device).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s12c1.tgz -C $R .; }
(cd benchmarks && timeout 200 python3 chain_forward_h200.py --out $R --bodies 64,16 --repeats 20) > $R/chain_stdout.txt 2>&1
echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt; pack
timeout 90 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 80 -k "not interpreter" \
  tests/ops/linear/test_chain_forward.py tests/ops/linear/test_fla_paths.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
for S in on off; do
  LEFT=$(( 520 - ($(date +%s) - T0) ))
  [ $LEFT -gt 40 ] && HYPIC_SCAN_PREFETCH=$S timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s12c1_$S \
    --prompts 32768,8192 --repeats 6 --no-profile --out $R > $R/ab_$S.txt 2>&1
  echo "ab $S rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_$S.txt; pack
done
tail -12 $R/chain_stdout.txt | cut -c1-250
grep -E "FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-250 | tail -12; grep -c PASSED $R/pytest_cuda.txt
grep -h "^{\|rc=" $R/ab_*.txt | python3 -c "
import sys, json
for l in sys.stdin:
    l = l.strip()
    if l.startswith('{'):
        d = json.loads(l); print({k: d.get(k) for k in ('prompt_tokens', 'ttft_p50_ms', 'first_allhit_ms')})
    else: print(l)"
echo "call done after $(( $(date +%s) - T0 )) s"
