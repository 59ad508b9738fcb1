#!/usr/bin/env bash
# Session 19, call 1 (nvidia-h200; carry .whl and .snap): the fused chain walk with the next
# step's body tiles loaded during a step (HYPIC_CHAIN_FUSE_SEAMS=2) against the former walk (1)
# and two steps (0): one layer's scan and layer at the all-hit shape (chain_forward_h200.py), the
# all-hit TTFT with 1 and 2 interleaved in one process (no kept graphs during the A/B, so neither
# value replays the other's capture) and mode 2's profile at 32k; then the CUDA tests of the walk
# modes and of the runner (the kept-graphs admission rule of session 18, not run since).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s19c1.tgz -C $R .; }
(cd benchmarks && timeout 150 python3 chain_forward_h200.py --out $R --bodies 64,16 > $R/chain_stdout.txt 2>&1
 echo "chain rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_stdout.txt); pack
(cd benchmarks && HYPIC_CHAIN_FUSE_SEAMS=2 timeout 230 python3 allhit_ab_h200.py --tag s19c1 --out $R --prompts 32768,8192 \
  --repeats 5 --ab-env HYPIC_CHAIN_FUSE_SEAMS --ab-values 1,2 --ab-fixed HYPIC_KEPT_LAYOUTS=0 > $R/ab_stdout.txt 2>&1
 echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
LEFT=$(( 520 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m pytest -p no:cacheprovider -v tests/ops/linear/test_chain_forward.py -k "cuda and seam" \
  tests/engine/test_pic_runner_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
tail -4 $R/chain_stdout.txt | cut -c1-400
grep -E "HYPIC_|rc=|Error|ttft_p50" $R/ab_stdout.txt | cut -c1-300
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-160
echo "call done after $(( $(date +%s) - T0 )) s"
