#!/usr/bin/env bash
# Session 15, call 3 (nvidia-h200; carry .whl and .snap): call 2 again after its compile error
# (the compose kernel's loop-carried chain end changed type; caught now by
# tests/ops/linear/test_kernels_compile.py on the CPU). One layer at the all-hit shape under
# each HYPIC_CHAIN_FUSE_SEAMS mode, the chain kernel's CUDA tests, the 32k all_hit + rag TTFT
# (default mode 2), the three modes interleaved in one process at 32k with the timeline, then
# the 8k TTFT in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s15c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ttft() {  # $1 prompt tokens, $2 timeout
  timeout $2 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $1 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$1.json > $R/ttft$1_stdout.txt 2>&1
  echo "ttft$1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft$1_stdout.txt; pack
}
(cd benchmarks && timeout 150 python3 chain_forward_h200.py --out $R --bodies 64,16 > $R/chain_forward_stdout.txt 2>&1
 echo "chain_forward rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_forward_stdout.txt); pack
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/ops/linear/test_chain_forward.py \
  -k "fused_kernel_matches_reference_on_cuda or one_step_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
ttft 32768 170
LEFT=$(( 470 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && (cd benchmarks && timeout $LEFT python3 allhit_ab_h200.py --tag s15c3 --out $R --prompts 32768 \
   --repeats 5 --no-profile --timeline --ab-env HYPIC_CHAIN_FUSE_SEAMS --ab-values 2,1,0 > $R/ab_stdout.txt 2>&1
 echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
LEFT=$(( 560 - ($(date +%s) - T0) ))
[ $LEFT -gt 50 ] && ttft 8192 $LEFT
tail -3 $R/chain_forward_stdout.txt | cut -c1-300
tail -3 $R/pytest_cuda.txt
grep -hE "^(all_hit|rag) |HYPIC_CHAIN|rc=|Error" $R/ttft*_stdout.txt $R/ab_stdout.txt | cut -c1-200
echo "call done after $(( $(date +%s) - T0 )) s"
