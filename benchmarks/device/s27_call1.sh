#!/usr/bin/env bash
# Session 27, call 1 (nvidia-h200; carry .whl and .snap): launch configs of the all-hit request's
# small kernels (short conv, short WY, short output), then the all-hit 32k request at the head
# with its timeline, kernel table and Chrome trace (per-launch GPU times and idle gaps).
set -u
source benchmarks/device/_setup.sh s27c1
cd benchmarks
timeout 120 python3 short_kernels_h200.py --out $R > $R/short_stdout.txt 2>&1
echo "short rc=$? after $(( $(date +%s) - T0 )) s" >> $R/short_stdout.txt; pack
tail -40 $R/short_stdout.txt | cut -c1-150
timeout $(left 500) python3 allhit_ab_h200.py --tag s27c1 --out $R --prompts 32768 --repeats 6 --timeline --trace \
  > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt
pack; grep -E "ttft p50|rc=|Error|ttft_p50" $R/ab_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
