#!/usr/bin/env bash
# Session 12, call 3 (nvidia-h200, .whl carried): the one-pass K/V gather and adopted decode
# caches, packed into $OUT/s12c3.tgz:
#   1. CUDA tests of the gather and the context caches;
#   2. the gather against the former cat/rotate/index_select sequence, with a launch-shape sweep;
#   3. all-hit 32k and 8k TTFT with a profile (default paths);
#   4. the PIC runner on CUDA against the CPU, in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s12c3.tgz -C $R .; }
timeout 60 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 50 -k "not interpreter" \
  tests/ops/test_kv_gather.py tests/engine/test_context.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
timeout 120 python3 benchmarks/kv_gather_h200.py --out $R > $R/kv_stdout.txt 2>&1
echo "kv rc=$? after $(( $(date +%s) - T0 )) s" >> $R/kv_stdout.txt; pack
timeout 240 python3 benchmarks/allhit_ab_h200.py --tag s12c3 --prompts 32768,8192 --repeats 6 --out $R > $R/ab_stdout.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt; pack
LEFT=$(( 540 - ($(date +%s) - T0) ))
[ $LEFT -gt 30 ] && timeout $LEFT python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/engine/test_pic_runner_cuda.py > $R/pytest_runner.txt 2>&1
echo "runner rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_runner.txt; pack
grep -E "FAILED|ERROR|rc=" $R/pytest_cuda.txt $R/pytest_runner.txt | cut -c1-250 | tail -12
grep -c PASSED $R/pytest_cuda.txt $R/pytest_runner.txt
tail -30 $R/kv_stdout.txt | cut -c1-200
grep -h "^{\|rc=" $R/ab_stdout.txt | python3 -c "
import sys, json
for l in sys.stdin:
    l = l.strip()
    if l.startswith('{'):
        d = json.loads(l); print({k: d.get(k) for k in ('prompt_tokens', 'ttft_p50_ms', 'first_allhit_ms', 'plan_p50_ms')}, d.get('gaps', {}).get('busy_ms'), d.get('gaps', {}).get('lead_ms'))
    else: print(l)"
grep -E "Self CUDA time total" $R/allhit_ab_s12c3_profile.txt
echo "call done after $(( $(date +%s) - T0 )) s"
