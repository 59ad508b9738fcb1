#!/usr/bin/env bash
# Session 27, call 3 (nvidia-h200; carry .whl and .snap), the last of the session's device time:
# the pre-split T planes' CUDA tests (the pack kernel against its reference; the all-hit walk,
# fused seams, packed against fp32 bodies, bit for bit), then the acceptance TTFT command (all-hit
# 32k, 16 requests). HYPIC_T_PRESPLIT=0 for the TTFT if those tests failed.
set -u
source benchmarks/device/_setup.sh s27c3
timeout 70 python3 -m pytest -q -p no:warnings tests/ops/linear/test_t_planes.py \
  -k "pack_kernel_equals_the_reference_on_cuda or (fp32_walk_on_cuda and 1-False-False)" > $R/pytest_cuda.txt 2>&1
rc=$?; echo "pytest rc=$rc after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
grep -E "passed|failed|rc=|Error" $R/pytest_cuda.txt | tail -4; pack
PRESPLIT=auto; [ $rc -eq 1 ] && PRESPLIT=0  # a failed test (not a cut-off run: 124)
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ARGS=(--modes hypic --cases all_hit --query-tokens 64 --no-progress --prompt-tokens 32768 --segment-tokens 512
      --num-requests 16 --cold-requests 1 --store-bytes 36GiB)
HYPIC_T_PRESPLIT=$PRESPLIT timeout $(left 245) python3 -m hypic bench ttft "${MODEL[@]}" "${ARGS[@]}" \
  --json $R/ttft_allhit_32k.json > $R/ttft_stdout.txt 2>&1
echo "ttft (HYPIC_T_PRESPLIT=$PRESPLIT) rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_stdout.txt; pack
grep -hE "^(all_hit|cold) |rc=|Error" $R/ttft_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
