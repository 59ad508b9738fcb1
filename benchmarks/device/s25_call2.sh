#!/usr/bin/env bash
# Session 25, call 2 (nvidia-h200; carry .whl and .snap): the fused MoE routing
# (hypic.ops.moe_route): its CUDA tests, the glue micro-benchmark (fused vs torch routing as graph
# replays, each launch, the short conv's tiles), then the all-hit 32k request with the two routings
# interleaved in one process, each on graphs of its own.
set -u
source benchmarks/device/_setup.sh s25c2
timeout 150 python3 -m pytest -x -q -p no:warnings tests/ops/test_moe_route.py tests/ops/test_moe_rows.py tests/ops/test_conv_short.py \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$?" >> $R/pytest_cuda.txt; tail -3 $R/pytest_cuda.txt
(cd benchmarks && timeout 150 python3 moe_glue_h200.py --out $R > $R/glue_stdout.txt 2>&1; echo "glue rc=$?" >> $R/glue_stdout.txt)
cat $R/glue_stdout.txt | cut -c1-200; pack
(cd benchmarks && timeout $(left 560) python3 allhit_ab_h200.py --tag s25c2 --out $R --prompts 32768 --repeats 8 --no-profile \
   --ab-settings "HYPIC_MOE_ROUTE=fused;HYPIC_MOE_ROUTE=torch" --ab-capture > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
grep -vE "^\s*$" $R/ab_stdout.txt | tail -8 | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
