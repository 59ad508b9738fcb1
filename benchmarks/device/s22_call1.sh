#!/usr/bin/env bash
# Session 22, call 1 (nvidia-h200; carry .whl and .snap): short_wy's kernels (the WY step and
# output of one-chunk spans in tiles of their own length). Their CUDA tests against fla's kernels
# and the chain's float64 reference first (per-test timeout); then all-hit 32k and 8k with
# HYPIC_SHORT_WY=triton against fla, interleaved in one process (each on graphs of its own), and
# a profile of the default.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s22c1.tgz -C $R .; }
timeout 150 python3 -m pytest -p no:cacheprovider -rfs --tb=short --timeout 90 \
  tests/ops/linear/test_short_wy.py "tests/ops/linear/test_chain_forward.py::test_fla_path_matches_reference" \
  "tests/ops/linear/test_short_span.py::test_fla_path_against_reference" \
  "tests/ops/linear/test_short_span.py::test_triton_kernels_match_torch_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 480 - ($(date +%s) - T0) ))
(cd benchmarks && timeout $LEFT python3 allhit_ab_h200.py --tag s22c1 --out $R --prompts 32768,8192 --repeats 6 \
  --ab-env HYPIC_SHORT_WY --ab-values triton,fla --ab-capture > $R/ab_stdout.txt 2>&1
 echo "allhit_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
grep -hE "passed|failed|rc=|^FAILED|^ERROR" $R/pytest_cuda.txt | cut -c1-300
grep -E "HYPIC_SHORT_WY|rc=|Error|prompt_tokens" $R/ab_stdout.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
