#!/usr/bin/env bash
# Session 12, call 5 (nvidia-h200): one dense chain-scan step written five ways (scan_step_h200.py),
# packed into $OUT/s12c5.tgz.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
(cd benchmarks && timeout 200 python3 scan_step_h200.py --out $R --steps 64) > $R/scan_step_stdout.txt 2>&1
echo "scan_step rc=$? after $(( $(date +%s) - T0 )) s" >> $R/scan_step_stdout.txt
tar czf $OUT/s12c5.tgz -C $R .
tail -24 $R/scan_step_stdout.txt | cut -c1-200
