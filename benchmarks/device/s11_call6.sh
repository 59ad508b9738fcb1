#!/usr/bin/env bash
# Session 11, call 6 (nvidia-h200, .whl carried; call 5's compile error fixed): everything packed
# into $OUT/s11c6.tgz:
#   1. CUDA tests of both conv paths against the reference;
#   2. the TTFT benchmark's 8k and 32k all_hit + rag cases (prefix_cache, hypic);
#   3. all-hit 32k with its profile (default paths: short conv, rows MoE);
#   4. the PIC runner on CUDA against the CPU, in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r; mkdir -p $R; T0=$(date +%s)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 60 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 50 tests/ops/test_conv_short.py \
  "tests/ops/linear/test_fla_paths.py::test_causal_conv1d_fla_matches_reference" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
for P in 8192 32768; do
  timeout 130 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
    --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
    --prompt-tokens $P --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
    --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_$P.json > $R/ttft${P}_stdout.txt 2>&1
  echo "ttft$P rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft${P}_stdout.txt
done
tar czf $OUT/s11c6.tgz -C $R .
LEFT=$(( 300 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && timeout $LEFT python3 benchmarks/allhit_ab_h200.py --tag s11c6 --prompts 32768 --repeats 6 --out $R > $R/ab_stdout.txt 2>&1
echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt
tar czf $OUT/s11c6.tgz -C $R .
LEFT=$(( 330 - ($(date +%s) - T0) ))
[ $LEFT -gt 30 ] && timeout $LEFT python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/engine/test_pic_runner_cuda.py > $R/pytest_runner.txt 2>&1
echo "runner rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_runner.txt
tar czf $OUT/s11c6.tgz -C $R .
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_cuda.txt $R/pytest_runner.txt | grep -v PASSED | cut -c1-250 | tail -20
grep -c PASSED $R/pytest_cuda.txt $R/pytest_runner.txt
grep "^{\|rc=" $R/ab_stdout.txt | cut -c1-300
grep -E "conv|moe_rows|scan_chain|Self CUDA time total" $R/allhit_ab_s11c6_profile.txt | head -8 | cut -c1-60,120-190
grep -E "^(all_hit|rag|cold) |rc=|Error" $R/ttft*_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
