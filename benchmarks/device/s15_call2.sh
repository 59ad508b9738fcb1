#!/usr/bin/env bash
# Session 15, call 2 (nvidia-h200; carry .whl and .snap): the three ways the chain walk applies
# a seam and the body after it (HYPIC_CHAIN_FUSE_SEAMS 0: two steps, 1: one step composed in the
# walk, 2: M h + c composed beforehand by one parallel launch, the new default). Call 1's TTFT
# A/B ran in separate processes and moved against the kernel's own gain, so here: one layer at
# the all-hit shape for each mode, the CUDA tests of the chain kernel, then all-hit 32k and 8k
# TTFT with the three modes interleaved request by request in one process, and the per-layer
# timeline of the default (allhit_ab_h200.py --ab-env ... --timeline).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s15c2.tgz -C $R .; }
(cd benchmarks && timeout 170 python3 chain_forward_h200.py --out $R --bodies 64,16 > $R/chain_forward_stdout.txt 2>&1
 echo "chain_forward rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_forward_stdout.txt); pack
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/ops/linear/test_chain_forward.py \
  -k "fused_kernel_matches_reference_on_cuda or one_step_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 580 - ($(date +%s) - T0) ))
(cd benchmarks && timeout $LEFT python3 allhit_ab_h200.py --tag s15c2 --out $R --prompts 32768,8192 --repeats 6 \
   --no-profile --timeline --ab-env HYPIC_CHAIN_FUSE_SEAMS --ab-values 2,1,0 > $R/ab_stdout.txt 2>&1
 echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
tail -3 $R/chain_forward_stdout.txt | cut -c1-300
tail -4 $R/pytest_cuda.txt
grep -E "HYPIC_CHAIN|rc=|Error|ttft_p50" $R/ab_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
