#!/usr/bin/env bash
# Session 15, call 1 (nvidia-h200; carry .whl and .snap): the chain kernel applying each seam
# and the body after it in one step (HYPIC_CHAIN_FUSE_SEAMS=1, the new default) against two
# steps (=0). Runs from .snap/tree.tgz (git archive of the commit under test), so that work in
# progress in the checkout does not travel into the measurement. One layer at the all-hit shape
# (chain_forward_h200.py), the 32k and 8k all_hit + rag TTFT, the chain kernel's CUDA tests,
# then the 32k TTFT with two steps for the A/B, in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s15c1.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ttft() {  # $1 prompt tokens, $2 tag, $3 timeout; env in the caller
  timeout $3 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $1 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$1_$2.json > $R/ttft$1_$2_stdout.txt 2>&1
  echo "ttft$1 $2 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft$1_$2_stdout.txt; pack
}
(cd benchmarks && timeout 150 python3 chain_forward_h200.py --out $R --bodies 64,16 > $R/chain_forward_stdout.txt 2>&1
 echo "chain_forward rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_forward_stdout.txt); pack
ttft 32768 one 220
ttft 8192 one 100
timeout 110 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/ops/linear/test_chain_forward.py \
  -k "fused_kernel_matches_reference_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 575 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && HYPIC_CHAIN_FUSE_SEAMS=0 ttft 32768 two $LEFT
tail -4 $R/chain_forward_stdout.txt | cut -c1-300
grep -hE "^(all_hit|rag) |rc=|Error" $R/ttft*_stdout.txt | cut -c1-200
tail -4 $R/pytest_cuda.txt
echo "call done after $(( $(date +%s) - T0 )) s"
