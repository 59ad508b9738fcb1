#!/usr/bin/env bash
# Session 25 (branch s25-gemm), call 1 (nvidia-h200; carry .whl and .snap): the rows MoE GEMMs'
# variants (swap-AB, the stream kernel with and without TMA descriptors). (1) The CUDA tests of
# tests/ops/test_moe_rows.py: every variant in bf16 against the reference and the current kernel
# (~1 min, compiles included); (2) benchmarks/moe_rows_h200.py --variants: each GEMM alone per
# variant at 576, 192 and 1024 tokens, then the whole MoE call current vs the fastest pair
# (~3 min; --budget-s stops it in time, JSON written after every table).
set -u
source benchmarks/device/_setup.sh s25g1
timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/ops/test_moe_rows.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
timeout 290 python3 benchmarks/moe_rows_h200.py --variants --out $R --budget-s 220 > $R/moe_rows_variants_stdout.txt 2>&1
echo "variants rc=$? after $(( $(date +%s) - T0 )) s" >> $R/moe_rows_variants_stdout.txt; pack
grep -E "FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-250 | tail -12
grep -c PASSED $R/pytest_cuda.txt
grep -E "^ +576 |^best |^whole |error|rc=|Traceback" $R/moe_rows_variants_stdout.txt | cut -c1-200
echo "call done after $(( $(date +%s) - T0 )) s"
