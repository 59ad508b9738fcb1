#!/usr/bin/env bash
# Session 11, call 3 (nvidia-h200, .whl carried); everything packed into $OUT/s11c3.tgz (the
# device returns at most 8 files):
#   1. all-hit A/B of the MoE paths, one process each: HYPIC_MOE_IMPL=grouped, then the default
#      (rows below 64 rows per expert), 32k and 8k; the default run with its profile (32k);
#   2. the TTFT benchmark's 8k and 32k all_hit + rag cases (prefix_cache, hypic) on the default.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
HYPIC_MOE_IMPL=grouped timeout 100 python3 benchmarks/allhit_ab_h200.py --tag s11grouped --prompts 32768,8192 \
  --repeats 8 --no-profile --out $R > $R/ab_grouped_stdout.txt 2>&1
echo "ab grouped rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_grouped_stdout.txt
timeout 100 python3 benchmarks/allhit_ab_h200.py --tag s11rows --prompts 8192 --repeats 8 --no-profile \
  --out $R/rows8k > $R/ab_rows_stdout.txt 2>&1
timeout 140 python3 benchmarks/allhit_ab_h200.py --tag s11rows --prompts 32768 --repeats 8 --out $R >> $R/ab_rows_stdout.txt 2>&1
echo "ab rows rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_rows_stdout.txt
for P in 8192 32768; do
  timeout 150 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $P --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$P.json > $R/ttft${P}_stdout.txt 2>&1
  echo "ttft$P rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft${P}_stdout.txt
done
tar czf $OUT/s11c3.tgz -C $R .
grep -v "^Autotuning\|^with key\|^best config\|^finished\|^Triton autotuning" $R/ab_grouped_stdout.txt $R/ab_rows_stdout.txt | cut -c1-300
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft*_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
