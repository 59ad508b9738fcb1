#!/usr/bin/env bash
# Session 27, call 2 (nvidia-h200; carry .whl and .snap): the short kernels' launch configs and
# tile overlap (short_kernels_h200.py), their CUDA tests, then the all-hit 32k request with the
# tile overlap A/B'd in one process (interleaved rounds), timings only.
set -u
source benchmarks/device/_setup.sh s27c2
timeout 150 python3 -m pytest -q -p no:warnings tests/ops/linear/test_short_wy.py tests/ops/test_conv_short.py -k "cuda" \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
grep -E "passed|failed|rc=|Error" $R/pytest_cuda.txt | tail -5; pack
cd benchmarks
timeout 150 python3 short_kernels_h200.py --out $R > $R/short_stdout.txt 2>&1
echo "short rc=$? after $(( $(date +%s) - T0 )) s" >> $R/short_stdout.txt; pack
grep -vE "^\{" $R/short_stdout.txt | tail -42 | cut -c1-120
timeout $(left 420) python3 allhit_ab_h200.py --tag s27c2 --out $R --prompts 32768 --repeats 6 --no-profile \
  --ab-env HYPIC_SHORT_TILE_OVERLAP --ab-values 1,0 --ab-capture > $R/ab_stdout.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt
pack; grep -E "HYPIC|rc=|Error|ttft_p50" $R/ab_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
