#!/usr/bin/env bash
# Session 3, call 1, GPU 1 (training runs on GPU 0): issue-2 GPU accuracy of Gated DeltaNet and KDA
# (two processes: each spends 100-200 s in fla's Triton compile + autotune), then the CUDA tests of
# the fla paths (the Triton scan kernel recompiled after its session-2 rewrite) and the scan timing.
R=$1
for f in gated_delta kda; do
  ( timeout 300 python3 benchmarks/linear_ops_h200.py --quick --sections accuracy --families $f --tag $f --out $R \
      > $R/accuracy_$f.txt 2>&1; echo "rc=$?" >> $R/accuracy_$f.txt ) &
done
wait
timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/ops/linear/test_fla_paths.py > $R/pytest_fla_paths.txt 2>&1
echo "pytest rc=$?" >> $R/pytest_fla_paths.txt
timeout 60 python3 benchmarks/linear_ops_h200.py --sections scan --tag scan --out $R > $R/scan.txt 2>&1; echo "rc=$?" >> $R/scan.txt
tail -n 4 $R/accuracy_*.txt; tail -c 1500 $R/pytest_fla_paths.txt; tail -n 20 $R/scan.txt
