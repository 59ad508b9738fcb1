#!/usr/bin/env bash
# Session 13, call 3 (nvidia-h200, .whl carried): bf16x3 scan by default, uint8 MoE sort keys,
# the host-lead cuts (layout, plan, batched conv tails), packed into $OUT/s13c3.tgz:
#   1. CUDA tests: the PIC runner on CUDA against the CPU (graphs, fused chain), the MoE ops;
#      the MoE sort with int64 against uint8 keys;
#   2. the TTFT benchmark's 32k all_hit + rag cases (prefix_cache, hypic);
#   3. all-hit 32k and 8k timelines;
#   4. the TTFT benchmark at 8k in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s13c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ttft() {
  timeout $2 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $1 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$1.json > $R/ttft$1_stdout.txt 2>&1
  echo "ttft$1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft$1_stdout.txt; pack
}
timeout 170 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 160 -k "not interpreter" \
  tests/engine/test_pic_runner_cuda.py tests/ops/test_moe_grouped.py tests/ops/test_moe_rows.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
timeout 60 python3 benchmarks/moe_sort_h200.py --out $R > $R/moe_sort_stdout.txt 2>&1
echo "moe_sort rc=$? after $(( $(date +%s) - T0 )) s" >> $R/moe_sort_stdout.txt; pack
ttft 32768 170
timeout 110 python3 benchmarks/allhit_ab_h200.py --tag s13c3 --prompts 32768,8192 --repeats 6 --timeline \
  --no-profile --out $R > $R/ab_timeline.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_timeline.txt; pack
LEFT=$(( 565 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && ttft 8192 $LEFT
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt | cut -c1-200 | tail -14
tail -7 $R/moe_sort_stdout.txt
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft*_stdout.txt
grep -E "^ttft|rc=" $R/ab_timeline.txt
awk '/timeline ==/{p=1} p' $R/ab_timeline.txt | grep -E "timeline|^ +L[0-4] |L[0-4]end|layout|plan|L39end|return" | cut -c1-200
echo "call done after $(( $(date +%s) - T0 )) s"
