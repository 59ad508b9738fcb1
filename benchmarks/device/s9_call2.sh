#!/usr/bin/env bash
# Session 9, call 2 (nvidia-h200, .whl carried):
#   1. one GDN layer at the all-hit shape: the chain scan with and without prefetching the next
#      dense element's tiles (chain_forward_h200.py pins the autotuner to each);
#   2. all-hit 32k and 8k in the engine (prefetch autotuned), with the GPU idle gaps of one request;
#   3. profiles of one cold 32k request, full_recompute and hypic inline (where the summary cost goes).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
(cd benchmarks && timeout 170 python3 chain_forward_h200.py --out $R > $R/chain_stdout.txt 2>&1)
echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt
timeout 170 python3 benchmarks/allhit_ab_h200.py --tag s9c2 --repeats 6 --out $R > $R/ab_s9c2.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s9c2.txt
LEFT=$(( 520 - ($(date +%s) - T0) ))
PROFILE_COLD=1 PROFILE_PIC=full_recompute:inline,hypic:inline PROFILE_IMPL_PAIRS=grouped+auto+glue \
  timeout $LEFT python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds $(( LEFT - 60 )) > $R/prefill_stdout.txt 2>&1
echo "prefill rc=$? after $(( $(date +%s) - T0 )) s" >> $R/prefill_stdout.txt
tail -12 $R/chain_stdout.txt | cut -c1-250
grep -v "^ " $R/ab_s9c2.txt | tail -6 | cut -c1-400
grep -A12 "GPU idle gaps" $R/allhit_ab_s9c2_profile.txt 2>/dev/null | cut -c1-200
tail -5 $R/prefill_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
