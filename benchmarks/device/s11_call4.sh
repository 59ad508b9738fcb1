#!/usr/bin/env bash
# Session 11, call 4 (nvidia-h200, .whl carried; run as one command line, kept here as a file):
# all-hit A/B of the MoE paths on one warm machine, one process each: grouped, rows (default),
# grouped again (the second grouped run overwrote the first one's JSON; both p50s are in the
# call's output, copied into benchmarks/results/README.md).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R
for i in grouped rows grouped; do
  if [ $i = grouped ]; then export HYPIC_MOE_IMPL=grouped; else unset HYPIC_MOE_IMPL; fi
  timeout 110 python3 benchmarks/allhit_ab_h200.py --tag s11c4_$i --prompts 32768,8192 --repeats 8 --no-profile \
    --out $R/$i 2>&1 | grep '^{' | cut -c1-200
done
tar czf $OUT/s11c4.tgz -C $R .
